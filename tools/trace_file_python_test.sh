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

# Views whose dtype differs from their base's (NOTE [One dtype per storage]): Python reads
# the values the model returns for the input the file holds.
tools/torchlens --model testdata/dtype_views.pt --input_shape 3,2 --save "$TEST_TMPDIR/dtype.pt" \
    >/dev/null
/usr/bin/python3 - "$TEST_TMPDIR/dtype.pt" testdata/dtype_views.pt <<'PY'
import sys
import torch
trace = torch.load(sys.argv[1])
ops = {op["label"]: op for op in trace["ops"]}
expected = torch.jit.load(sys.argv[2])(ops["input_1"]["out"])
for i, value in enumerate(expected):
    out = ops[f"output_{i + 1}"]["out"]
    assert out.dtype == value.dtype and torch.equal(out, value), (i, out, value)
print("dtype views read back:", [str(v.dtype) for v in expected])
PY

# A lazy conjugate view (NOTE [One dtype per storage]): Python reads it conjugated, and
# the product it fed equals the model's result.
tools/torchlens --model testdata/conj_view.pt --input_shape 3 --save "$TEST_TMPDIR/conj.pt" \
    >/dev/null
/usr/bin/python3 - "$TEST_TMPDIR/conj.pt" testdata/conj_view.pt <<'PY'
import sys
import torch
trace = torch.load(sys.argv[1])
ops = {op["label"]: op for op in trace["ops"]}
x = ops["input_1"]["out"]
expected = torch.jit.load(sys.argv[2])(x)
assert torch.equal(ops["output_1"]["out"], expected)
(conj,) = [op for op in trace["ops"] if op["type"] == "conj"]
assert torch.equal(conj["out"], torch.complex(x, x.flip(0)).conj().resolve_conj())
print("conjugate view read back")
PY

# TorchScript's torch.tensor([1, 2, 0]) is `empty` filled without dispatch (NOTE [Streaming
# memory written without dispatch]): a file written during the capture holds the numbers,
# not the memory `empty` returned, and validates.
tools/torchlens --model testdata/index_writes.pt --input_shape 2,3 \
    --stream_to "$TEST_TMPDIR/consts.pt" >/dev/null
tools/torchlens --trace "$TEST_TMPDIR/consts.pt" --validate | grep -q "Validation: PASSED"
/usr/bin/python3 - "$TEST_TMPDIR/consts.pt" <<'PY'
import sys
import torch
trace = torch.load(sys.argv[1])
(perm,) = [op for op in trace["ops"] if op["type"] == "empty"]
assert torch.equal(perm["out"], torch.tensor([1, 2, 0])), perm["out"]
print("constant tensor streamed after its fill")
PY

# The buffer entity (NOTE [The buffer entity in trace files]): a file written before each
# buffer listed its versions, overwrites and write kinds loads as before, with the same
# buffer table; a file whose lists contradict its ops is refused, naming the buffer.
tools/torchlens --mode train --save "$TEST_TMPDIR/entity.pt" >"$TEST_TMPDIR/entity.txt"
/usr/bin/python3 - "$TEST_TMPDIR/entity.pt" "$TEST_TMPDIR/old.pt" "$TEST_TMPDIR/contradicts.pt" <<'PY'
import sys
import torch
trace = torch.load(sys.argv[1])
for buffer in trace["buffers"]:
    for key in ("versions", "num_overwrites", "write_kinds"):
        del buffer[key]
torch.save(trace, sys.argv[2])
trace = torch.load(sys.argv[1])
calls = [b for b in trace["buffers"] if b["address"] == "calls"][0]
calls["write_kinds"] = ["reassign"]
torch.save(trace, sys.argv[3])
PY
tools/torchlens --trace "$TEST_TMPDIR/old.pt" >"$TEST_TMPDIR/old.txt"
diff <(sed -n '/^Buffers:/,$p' "$TEST_TMPDIR/entity.txt" | grep -v "written to") \
  <(sed -n '/^Buffers:/,$p' "$TEST_TMPDIR/old.txt")
if tools/torchlens --trace "$TEST_TMPDIR/contradicts.pt" >/dev/null 2>"$TEST_TMPDIR/err"; then
  echo "a file whose write kinds contradict its ops loaded"; exit 1
fi
grep -q 'buffer "calls" lists versions \[buffer_1:1, buffer_1:2\] with 1 overwrites (reassign) but its ops give .* (inplace)' \
  "$TEST_TMPDIR/err" || { cat "$TEST_TMPDIR/err"; exit 1; }
