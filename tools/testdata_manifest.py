#!/usr/bin/python3
"""The checked-in test models and their generator agree.

testdata/MANIFEST holds the SHA-256 of the generator's sources (tools/gen_testdata.py and
the modules it imports) and of every file it wrote into testdata/. The generator rewrites
it after a full run; a run limited to some models rewrites the lines of the files it wrote
and leaves the generator's lines alone. As a Bazel test this script recomputes every hash
and fails, naming the files, when:
  - a generator source changed since the last full run (the scripted models carry its
    source lines: a model scripted from an older generator prints the wrong line), or
  - a generated file changed, appeared or went missing without the generator writing it.
The fix in every case is to run the generator over all models:
    /usr/bin/python3 tools/gen_testdata.py

usage: testdata_manifest.py [write [FILE ...]]
  (no argument)  check; the Bazel test runs it from its runfiles, where the data it
                 depends on sits at the same paths as in the source tree
  write          rewrite every line of testdata/MANIFEST
  write FILE...  rewrite the lines of these testdata files only
"""

import hashlib
import os
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
MANIFEST = "testdata/MANIFEST"
# The generator's sources: a change to any of them may change what it writes.
GENERATOR = ("tools/gen_testdata.py", "tools/gen_testdata_grads.py")


def sha256(path):
    digest = hashlib.sha256()
    with open(os.path.join(ROOT, path), "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def generated_files():
    """The generator's outputs in testdata/: every .pt file (models, their expected values
    and the demo's input)."""
    return sorted("testdata/" + name for name in os.listdir(os.path.join(ROOT, "testdata"))
                  if name.endswith(".pt"))


def read_manifest():
    entries = {}
    with open(os.path.join(ROOT, MANIFEST)) as f:
        for line in f:
            if line.strip() and not line.startswith("#"):
                digest, path = line.split()
                entries[path] = digest
    return entries


def write_manifest(only):
    entries = read_manifest() if only and os.path.exists(os.path.join(ROOT, MANIFEST)) else {}
    paths = ["testdata/" + os.path.basename(p) for p in only] if only else (
        list(GENERATOR) + generated_files())
    for path in paths:
        entries[path] = sha256(path)
    with open(os.path.join(ROOT, MANIFEST), "w") as f:
        f.write("# SHA-256 of testdata's generator and of what it wrote "
                "(tools/testdata_manifest.py).\n")
        f.write("# Regenerate with: /usr/bin/python3 tools/gen_testdata.py\n")
        for path in sorted(entries, key=lambda p: (not p.startswith("tools/"), p)):
            f.write(f"{entries[path]}  {path}\n")


def check():
    entries = read_manifest()
    problems = []
    for path in GENERATOR:
        if entries.get(path) != sha256(path):
            problems.append(f"{path} changed since testdata was generated from it")
    present = set(generated_files())
    for path in sorted(present - set(entries)):
        problems.append(f"{path} is not in {MANIFEST}: the generator did not write it")
    for path in sorted(p for p in entries if p.startswith("testdata/")):
        if path not in present:
            problems.append(f"{path} is in {MANIFEST} but missing")
        elif entries[path] != sha256(path):
            problems.append(f"{path} differs from what the generator wrote")
    for problem in problems:
        print(problem)
    if problems:
        print(f"{len(problems)} problems: testdata and its generator disagree; run "
              "/usr/bin/python3 tools/gen_testdata.py (all models)")
        return 1
    print(f"testdata agrees with its generator ({len(entries)} files)")
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["write"]:
        write_manifest(sys.argv[2:])
    else:
        sys.exit(check())
