#!/usr/bin/env bash
# The C++ tool writes a trace file, JSON and an SVG; Debian's python3-torch reads them back
# (tools/check_trace_file.py) and checks labels and values against PyTorch in Python, and
# each op's keys against the field table (tools/op_fields). Twice: a file saved after the
# capture (--save), and one written during it (--stream_to, CaptureOptions::trace_file).
set -euo pipefail
tools/op_fields >"$TEST_TMPDIR/fields.txt"
for how in save stream_to; do
  tools/torchlens --mode train "--$how" "$TEST_TMPDIR/$how.pt" --json "$TEST_TMPDIR/$how.json" \
      --render "$TEST_TMPDIR/$how.svg" >/dev/null
  /usr/bin/python3 tools/check_trace_file.py "$TEST_TMPDIR/$how.pt" "$TEST_TMPDIR/$how.json" \
      "$TEST_TMPDIR/$how.svg" "$TEST_TMPDIR/fields.txt"
done
