#!/usr/bin/python3
"""Every cross-reference in the tree resolves.

A NOTE is defined by a comment line that holds only `NOTE [Title]` (`// NOTE [Title]` or
`# NOTE [Title]`), exactly once in the tree; every other `NOTE [Title]` is a reference to
one. A reference `NOTE [Title] in FILE` must name the file that defines it: FILE is the
defining file's path from the root, or a tail of it (`recorder.h`,
`torchlens_dispatch/recorder.h`).

`README "Section"` references a heading of the user guide, README.md, or of one of the
documents its sections moved to (DOCUMENTS below): the title (`#`) or a `##` or `###`
heading. `"Section" in path/to/DOC.md` references a heading of that document (relative
to the referring file's folder or to the root); `"Section" in README.md` is read as
`README "Section"`.

A reference may run over two lines, as comments wrap (`(NOTE\n// [Title])`); the second
line's comment marker is skipped. Links between the DOCUMENTS (`[text](path)`,
`[text](path#anchor)`) must point at files that exist, and anchors at headings.

Exits non-zero listing every dangling reference and every NOTE defined twice.

usage: doc_references_test.py [ROOT]

Without ROOT (as a Bazel test) it checks the source tree its own file lives in: the
runfile is a link into the workspace, and the test is tagged "external" so that it runs
against the tree as it is now, never from the cache.
"""

import os
import re
import sys

# The user guide and the documents that hold what it links to, each beside its code.
DOCUMENTS = (
    "README.md",
    "graph/GRADIENTS.md",
    "graph/HOSTILE_INPUTS.md",
    "graph/TRACE.md",
    "graph/TRACE_FILE.md",
    "tools/BENCH_RESULTS.md",
    "tools/CLI.md",
    "tools/RELIABILITY.md",
    "tools/serve/README.md",
    "tools/zoo/README.md",
    "torchlens_dispatch/CAPTURE.md",
    "torchlens_dispatch/SERVICE_CAPTURE.md",
    "torchlens_dispatch/python/README.md",
    "validation/INTERVENTIONS.md",
    "validation/VALIDATION.md",
)

SOURCES = (".cc", ".h", ".py", ".sh", ".bzl", ".md", "BUILD", "WORKSPACE", "run")
DEFINITION = re.compile(r"^\s*(//|#)\s*NOTE \[([^\]]+)\]\s*$")
NOTE = re.compile(r"NOTE \[([^\]]+)\](?:\)?,? in `?([\w./-]*?\.(?:cc|h|py|sh|bzl|md))\b)?")
README = re.compile(r'README "([^"]+)"')
IN_DOCUMENT = re.compile(r'"([^"\n]+)" in `?([\w./-]+\.md)\b')
HEADING = re.compile(r"^(#{1,3}) (.+?)\s*$")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
# Where a wrapped reference continues: the next line without its comment marker.
CONTINUATION = re.compile(r"^\s*(?://+|#+|\*)?\s*")
# The text of a Markdown fence, which references are not looked for in.
FENCE = re.compile(r"^\s*```")


def files(root):
    for directory, subdirectories, names in os.walk(root):
        subdirectories[:] = [d for d in subdirectories
                             if not d.startswith((".", "bazel-")) or d == ".ci"]
        for name in names:
            if name.endswith(SOURCES) and name != "doc_references_test.py":  # this file
                yield os.path.join(directory, name)


def slug(heading):
    """The anchor GitHub gives a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.lower().replace("`", ""))
    return text.replace(" ", "-")


def headings(path):
    """A Markdown file's headings: {level: set of titles}, titles of all levels."""
    found = {}
    in_fence = False
    with open(path, encoding="utf-8") as document:
        for line in document:
            if FENCE.match(line):
                in_fence = not in_fence
                continue
            match = HEADING.match(line)
            if match and not in_fence:
                found.setdefault(len(match.group(1)), set()).add(match.group(2))
    return found


def joined_lines(path):
    """(number, text) per line; text runs on into the next line, so that a reference that
    wraps is seen whole where it starts. Only matches starting before `len(line)` count."""
    with open(path, encoding="utf-8", errors="replace") as source:
        lines = source.read().split("\n")
    for number, line in enumerate(lines, 1):
        following = lines[number] if number < len(lines) else ""
        following = CONTINUATION.sub("", following, count=1)
        yield number, line, line + " " + following


def title_of(text):
    """A reference's title as written: wrapped lines and string literals joined."""
    text = re.sub(r'\s*"\s*"\s*', " ", text)  # "...compiles " "by recursion" in C++
    return " ".join(text.split())


def main(root):
    definitions = {}  # title -> [where]
    defined_in = {}  # title -> [relative path]
    references = []
    for path in files(root):
        relative = os.path.relpath(path, root)
        for number, line, text in joined_lines(path):
            where = f"{relative}:{number}"
            definition = DEFINITION.match(line)
            if definition:
                definitions.setdefault(definition.group(2), []).append(where)
                defined_in.setdefault(definition.group(2), []).append(relative)
                continue
            for match in NOTE.finditer(text):
                if match.start() < len(line):
                    references.append(("NOTE", title_of(match.group(1)), match.group(2), where))
            for match in README.finditer(text):
                if match.start() < len(line):
                    references.append(("README", title_of(match.group(1)), None, where))
            for match in IN_DOCUMENT.finditer(text):
                if match.start() < len(line):
                    references.append(("DOCUMENT", title_of(match.group(1)), match.group(2),
                                       where))

    problems = []
    guide_headings = set()
    document_headings = {}
    for document in DOCUMENTS:
        path = os.path.join(root, document)
        if not os.path.isfile(path):
            problems.append(f"{document}: listed in DOCUMENTS but does not exist")
            continue
        found = headings(path)
        document_headings[document] = found
        for titles in found.values():
            guide_headings |= titles

    for title, places in sorted(definitions.items()):
        if len(places) > 1:
            problems.append(f"NOTE [{title}] is defined {len(places)} times: {', '.join(places)}")
    for kind, title, target, where in references:
        if kind == "NOTE":
            if title not in definitions:
                problems.append(f"{where}: NOTE [{title}] is not defined anywhere")
            elif target and not any(p == target or p.endswith("/" + target)
                                    for p in defined_in[title]):
                problems.append(f"{where}: NOTE [{title}] is defined in "
                                f"{', '.join(defined_in[title])}, not in {target}")
        elif kind == "README" and title not in guide_headings:
            problems.append(f'{where}: README "{title}" is not a heading of README.md or of '
                            f"the documents it links to")
        elif kind == "DOCUMENT":
            source_directory = os.path.dirname(where.split(":")[0])
            candidates = [os.path.normpath(os.path.join(source_directory, target)),
                          os.path.normpath(target)]
            existing = [c for c in candidates if os.path.isfile(os.path.join(root, c))]
            if existing and existing[0] == "README.md":  # the guide, as README "Section"
                if title not in guide_headings:
                    problems.append(f'{where}: "{title}" in README.md is not a heading of '
                                    f"README.md or of the documents it links to")
            elif not existing:
                problems.append(f'{where}: "{title}" in {target}: no such document')
            else:
                found = headings(os.path.join(root, existing[0]))
                titles = set().union(*found.values()) if found else set()
                if title not in titles:
                    problems.append(f'{where}: "{title}" is not a heading of {existing[0]}')

    for document in DOCUMENTS:
        path = os.path.join(root, document)
        if not os.path.isfile(path):
            continue
        in_fence = False
        with open(path, encoding="utf-8") as text:
            for number, line in enumerate(text, 1):
                if FENCE.match(line):
                    in_fence = not in_fence
                if in_fence:
                    continue
                for link in LINK.findall(line):
                    if re.match(r"[a-z]+:", link):  # https:, mailto:
                        continue
                    file_part, _, anchor = link.partition("#")
                    target = os.path.normpath(os.path.join(os.path.dirname(document),
                                                           file_part)) if file_part else document
                    if not os.path.exists(os.path.join(root, target)):
                        problems.append(f"{document}:{number}: link to {link}: no such file")
                    elif anchor:
                        found = headings(os.path.join(root, target))
                        anchors = {slug(h) for level in found.values() for h in level}
                        if anchor not in anchors:
                            problems.append(f"{document}:{number}: link to {link}: no such heading")

    for problem in problems:
        print(problem)
    print(f"{len(definitions)} notes, {len(references)} references, {len(DOCUMENTS)} documents, "
          f"{len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    default_root = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else default_root))
