#!/usr/bin/python3
"""Probes the command-line tool with hostile and unusual inputs, as a careful user would.

    tools/bazelw build //tools:torchlens
    /usr/bin/python3 tools/fuzz/probe_cli.py bazel-bin/tools/torchlens [--seed N]

Every case runs the tool once (30 s limit) and must end the way the README promises: exit
code 0, 1 (a failed validation) or 2, and on code 2 exactly one stderr line
`torchlens: error: ...`. A signal, another exit code, a timeout, a raw stack trace or an
error spread over several lines is a failure; the script prints each failure with its
command and ends with one line of counts (README "Reliability"). Cases:

  models    each test model cut short at 12 points, with 8 runs of random bytes
            overwritten and 4 zeroed spans, and the model archive corpus
  inputs    the input file corpus (valid and hostile metadata), cut and corrupted copies
            of a valid input file
  paths     directories, devices, a FIFO without a writer, missing and empty files
  outputs   every output to /dev/full, to a directory, to a missing folder
  flags     empty, repeated, unknown and malformed flags and values

The mutations are drawn from a seeded generator: a run is reproducible.
"""

import argparse
import os
import random
import shutil
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TESTDATA = os.path.join(ROOT, "testdata")
CORPUS = os.path.join(HERE, "corpus")

# Small models of each kind: plain ops, BatchNorm state, recurrent state, several inputs.
MODELS = {
    "add_then_mul": "2,3",
    "bn2d_train": "2,3,4,4",
    "convbn_eval": "1,3,8,8",
    "view_write": "2,3",
    "chunk_heads": "2,4",
    "nested_150": "1,2",
}


def outcome(binary, args, timeout=30):
    """'ok', or what went wrong."""
    try:
        done = subprocess.run([binary] + args, stdin=subprocess.DEVNULL, capture_output=True,
                              timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return "hang (more than %d s)" % timeout
    err = done.stderr.decode(errors="replace")
    # LibTorch and glog warnings ("W2026...") are not errors; anything else on stderr is.
    lines = [l for l in err.splitlines() if l.strip() and not l.startswith("W20")]
    if done.returncode < 0:
        return "signal %d: %s" % (-done.returncode, " | ".join(lines[-3:]))
    if done.returncode not in (0, 1, 2):
        return "exit code %d: %s" % (done.returncode, " | ".join(lines[-3:]))
    if done.returncode == 2:
        if len(lines) != 1 or not lines[0].startswith("torchlens: error: "):
            return "error not one line: %s" % " | ".join(lines[:3])
        if len(lines[0]) < len("torchlens: error: ") + 10:
            return "error names no cause: %s" % lines[0]
    elif lines:
        return "exit %d with stderr: %s" % (done.returncode, " | ".join(lines[:3]))
    return "ok"


def mutations(data, rng):
    """Cut and corrupted copies of `data`: (name, bytes)."""
    n = len(data)
    for i in range(12):
        cut = rng.randrange(0, n)
        yield "cut at %d" % cut, data[:cut]
    for i in range(8):
        start = rng.randrange(0, n)
        length = rng.choice([1, 2, 4, 8, 64])
        junk = bytes(rng.randrange(256) for _ in range(length))
        yield "%d random bytes at %d" % (length, start), data[:start] + junk + data[start + length:]
    for i in range(4):
        start = rng.randrange(0, n)
        length = rng.choice([16, 256, 4096])
        yield "%d zeros at %d" % (length, start), (data[:start] + b"\0" * length +
                                                    data[start + length:])[:n]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("binary")
    parser.add_argument("--seed", type=int, default=17)
    options = parser.parse_args()
    binary = os.path.abspath(options.binary)
    rng = random.Random(options.seed)
    tmp = tempfile.mkdtemp(prefix="torchlens_probe_")
    cases = []  # (kind, description, args)

    for model, shape in MODELS.items():
        with open(os.path.join(TESTDATA, model + ".pt"), "rb") as f:
            data = f.read()
        for name, mutated in mutations(data, rng):
            path = os.path.join(tmp, "m%d.pt" % len(cases))
            with open(path, "wb") as f:
                f.write(mutated)
            cases.append(("models", "%s %s" % (model, name),
                          ["--model", path, "--input_shape", shape, "--validate"]))
    for name in sorted(os.listdir(os.path.join(CORPUS, "model_archive"))):
        cases.append(("models", "corpus " + name,
                      ["--model", os.path.join(CORPUS, "model_archive", name),
                       "--input_shape", "2,3"]))

    demo = os.path.join(TESTDATA, "demo.pt")
    for name in sorted(os.listdir(os.path.join(CORPUS, "input_file"))):
        cases.append(("inputs", "corpus " + name,
                      ["--model", demo, "--input", os.path.join(CORPUS, "input_file", name)]))
    valid_input = os.path.join(CORPUS, "input_file", "protocol2.pt")
    if os.path.exists(valid_input):
        with open(valid_input, "rb") as f:
            data = f.read()
        for name, mutated in mutations(data, rng):
            path = os.path.join(tmp, "i%d.pt" % len(cases))
            with open(path, "wb") as f:
                f.write(mutated)
            cases.append(("inputs", "input " + name, ["--model", demo, "--input", path]))

    fifo = os.path.join(tmp, "fifo")
    os.mkfifo(fifo)
    empty = os.path.join(tmp, "empty.pt")
    open(empty, "wb").close()
    for flag in ("--model", "--input"):
        for path in (tmp, "/dev/zero", "/dev/null", "/dev/full", fifo, empty,
                     os.path.join(tmp, "missing.pt"), "/proc/self/mem"):
            cases.append(("paths", "%s %s" % (flag, path), [flag, path]))

    for flag, extension in (("--render", ".svg"), ("--render", ".png"), ("--render", ".pdf"),
                            ("--json", ".json"), ("--save", ".pt"), ("--summary", ".txt")):
        for target in ("/dev/full", tmp, os.path.join(tmp, "no", "such", "dir", "x")):
            path = target if target == tmp else target + (extension if target != "/dev/full"
                                                          else "")
            if flag == "--render" and target == "/dev/full":
                continue  # no extension: refused before anything runs, covered below
            cases.append(("outputs", "%s %s" % (flag, path), [flag, path]))
    for extension in (".svg", ".png", ".pdf"):
        link = os.path.join(tmp, "full" + extension)
        os.symlink("/dev/full", link)
        cases.append(("outputs", "--render to /dev/full as " + extension,
                      ["--render", link, "--json", os.path.join(tmp, "ok.json")]))

    for args in (["--model="], ["--save", ""], ["--json="], ["--render", ""], ["--seed="],
                 ["--mode", "test"], ["--seed", "x"], ["--seed", "99999999999999999999"],
                 ["--input_shape", "2,-3"], ["--input_shape", "0"], ["--input_shape", "2,,3"],
                 ["--input_shape", "99999999,99999999"], ["--input_shape", "1e9"],
                 ["--edit", "nosuch=1"], ["--edit", "relu_1_1:1"], ["--edit", "=1"],
                 ["--edit", "output_1=nan"], ["--edit", "relu_1_1:1=1e999"],
                 ["--show_buffers", "sometimes"], ["--nosuchflag"], ["-x"], ["--"],
                 ["--mode", "eval", "--mode", "train"], ["--render", "x.svg", "--render",
                                                         "y.svg"],
                 ["--input_shape", "2,3", "--input", valid_input], ["extra_argument"],
                 ["--model", demo, "--input_shape", "2,3;2,3"],
                 ["--model", demo, "--input_shape", "3,5"]):
        cases.append(("flags", " ".join(args) or "(none)", args))

    failures = []
    counts = {}
    for kind, description, args in cases:
        result = outcome(binary, args)
        ok, total = counts.get(kind, (0, 0))
        counts[kind] = (ok + (result == "ok"), total + 1)
        if result != "ok":
            failures.append("%s: %s\n    %s\n    torchlens %s" % (kind, description, result,
                                                                 " ".join(args)))
    shutil.rmtree(tmp, ignore_errors=True)
    for failure in failures:
        print(failure)
    print("probe: %d cases, %d failures (%s)" % (
        len(cases), len(failures),
        ", ".join("%s %d/%d" % (k, ok, total) for k, (ok, total) in counts.items())))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
