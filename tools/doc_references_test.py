#!/usr/bin/python3
"""Every cross-reference in the tree resolves.

A NOTE is defined by a comment line that holds only `NOTE [Title]` (`// NOTE [Title]` or
`# NOTE [Title]`), exactly once in the tree; every other `NOTE [Title]` is a reference to
one. `README "Section"` references a `##` or `###` heading of README.md. Exits non-zero
listing every dangling reference and every NOTE defined twice.

usage: doc_references_test.py [ROOT]

Without ROOT (as a Bazel test) it checks the source tree its own file lives in: the
runfile is a link into the workspace, and the test is tagged "external" so that it runs
against the tree as it is now, never from the cache.
"""

import os
import re
import sys

SOURCES = (".cc", ".h", ".py", ".sh", ".bzl", ".md", "BUILD", "WORKSPACE", "run")
DEFINITION = re.compile(r"^\s*(//|#)\s*NOTE \[([^\]]+)\]\s*$")
NOTE = re.compile(r"NOTE \[([^\]]+)\]")
README = re.compile(r'README "([^"]+)"')
HEADING = re.compile(r"^#{2,3} (.+?)\s*$")


def files(root):
    for directory, subdirectories, names in os.walk(root):
        subdirectories[:] = [d for d in subdirectories
                             if not d.startswith((".", "bazel-")) or d == ".ci"]
        for name in names:
            if name.endswith(SOURCES) and name != "doc_references_test.py":  # this file
                yield os.path.join(directory, name)


def main(root):
    definitions = {}
    references = []
    headings = set()
    with open(os.path.join(root, "README.md"), encoding="utf-8") as readme:
        for line in readme:
            match = HEADING.match(line)
            if match:
                headings.add(match.group(1))
    for path in files(root):
        with open(path, encoding="utf-8", errors="replace") as source:
            for number, line in enumerate(source, 1):
                where = f"{os.path.relpath(path, root)}:{number}"
                definition = DEFINITION.match(line)
                if definition:
                    definitions.setdefault(definition.group(2), []).append(where)
                    continue
                references += [("NOTE", title, where) for title in NOTE.findall(line)]
                references += [("README", title, where) for title in README.findall(line)]
    problems = []
    for title, places in sorted(definitions.items()):
        if len(places) > 1:
            problems.append(f"NOTE [{title}] is defined {len(places)} times: {', '.join(places)}")
    for kind, title, where in references:
        if kind == "NOTE" and title not in definitions:
            problems.append(f"{where}: NOTE [{title}] is not defined anywhere")
        if kind == "README" and title not in headings:
            problems.append(f'{where}: README "{title}" is not a heading of README.md')
    for problem in problems:
        print(problem)
    print(f"{len(definitions)} notes, {len(references)} references, {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    default_root = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else default_root))
