#!/usr/bin/env bash
# The C++ tool writes a trace file, JSON and an SVG; Debian's python3-torch reads them back
# (tools/check_trace_file.py) and checks labels and values against PyTorch in Python, and
# each op's keys against the field table (tools/op_fields).
set -euo pipefail
tools/torchlens --mode train --save "$TEST_TMPDIR/t.pt" --json "$TEST_TMPDIR/t.json" \
    --render "$TEST_TMPDIR/g.svg" >/dev/null
tools/op_fields >"$TEST_TMPDIR/fields.txt"
/usr/bin/python3 tools/check_trace_file.py "$TEST_TMPDIR/t.pt" "$TEST_TMPDIR/t.json" \
    "$TEST_TMPDIR/g.svg" "$TEST_TMPDIR/fields.txt"
