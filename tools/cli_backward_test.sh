#!/usr/bin/env bash
# The command-line tool's --backward (issue 52): gradients in the summary, validation,
# comparison, pictures, JSON and trace files (written after the capture and during it), on
# testdata/grad_mlp.pt and grad_convbn_train.pt (tools/gen_testdata_grads.py).
set -uo pipefail
TOOL=$PWD/tools/torchlens
T=$TEST_TMPDIR
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

MLP=(--model testdata/grad_mlp.pt --input_shape 3,4)

"$TOOL" "${MLP[@]}" --backward --validate --non_finite --json "$T/g.json" --save "$T/g.pt" \
    --render "$T/g.svg" >"$T/g.txt" 2>"$T/err" || fail "--backward run failed: $(cat "$T/err")"
grep -qE "^  label +type +shape +dtype +module +source +grad norm +parents$" "$T/g.txt" ||
  fail "no grad norm column: $(sed -n 3,4p "$T/g.txt")"
grep -qE "^  input_1 +input .* - *$" "$T/g.txt" || fail "the input (no grad) shows a norm"
grep -qx "Backward ops: 14, in execution order" "$T/g.txt" || fail "backward ops missing"
grep -qE "^  TanhBackward0_1 +tanh_1_4:1 " "$T/g.txt" || fail "tanh's backward op missing"
grep -qE "^  fc2 +[0-9.]+$" "$T/g.txt" || fail "no gradient norm for module fc2"
grep -qx "Gradient validation: PASSED (10 gradients checked, 0 failures)" "$T/g.txt" ||
  fail "gradient validation: $(grep -A3 'Gradient validation' "$T/g.txt")"
grep -qx "Non-finite gradients: none" "$T/g.txt" || fail "--non_finite found a non-finite gradient"
grep -q "<title>cluster_backward</title>" "$T/g.svg" || fail "the picture has no backward ops"

/usr/bin/python3 - "$T/g.pt" "$T/g.json" <<'PY' || fail "Python could not read the gradients"
import json, sys, torch
t = torch.load(sys.argv[1])
ops = {op["label"]: op for op in t["ops"]}
assert t["version"] == 4 and t["records_gradients"] is True
assert ops["tanh_1_4:1"]["grad"].shape == (3, 6)
assert ops["input_1"]["grad"] is None
assert [op["type"] for op in t["backward_ops"]][:2] == ["AddmmBackward0", "AccumulateGrad"]
assert t["backward_ops"][4]["forward_label"] == "tanh_1_4:1"
# fc1.bias sums linear_1's gradient over the batch.
assert torch.allclose(t["param_grads"]["fc1.bias"], ops["linear_1_1:1"]["grad"].sum(0))
meta = json.load(open(sys.argv[2]))
assert meta["version"] == 3 and meta["records_gradients"] is True
assert len(meta["backward_ops"]) == 14
norms = {op["label"]: op["grad_norm"] for op in meta["ops"]}
assert abs(norms["tanh_1_4:1"] - ops["tanh_1_4:1"]["grad"].double().norm().item()) < 1e-9
assert norms["input_1"] is None
assert set(meta["param_grad_norms"]) == set(t["param_grads"])
PY

# The file validates its gradients as the capture did; another input's gradients diverge.
"$TOOL" --trace "$T/g.pt" --validate >"$T/read.txt" 2>&1 || fail "--trace of a file with gradients failed"
grep -qx "Gradient validation: PASSED (10 gradients checked, 0 failures)" "$T/read.txt" ||
  fail "the file's gradients: $(grep -A3 'Gradient validation' "$T/read.txt")"
"$TOOL" "${MLP[@]}" --backward --compare "$T/g.pt" >"$T/same.txt" 2>&1 || fail "--compare of the same run diverged"
grep -qx "no gradient divergence" "$T/same.txt" || fail "same run: $(tail -2 "$T/same.txt")"
"$TOOL" "${MLP[@]}" --backward --seed 1 --compare "$T/g.pt" >"$T/other.txt" 2>&1
[[ $? -eq 1 ]] || fail "--compare of another input's gradients did not exit 1"
grep -qx "first gradient divergence: linear_2_3:1" "$T/other.txt" ||
  fail "another input: $(tail -2 "$T/other.txt")"

# Written during the capture, then again with the gradients once the backward ran.
"$TOOL" --model testdata/grad_convbn_train.pt --input_shape 2,2,4,4 --mode train --backward \
    --stream_to "$T/s.pt" >"$T/s.txt" 2>"$T/err" || fail "--stream_to --backward failed: $(cat "$T/err")"
"$TOOL" --trace "$T/s.pt" --validate >"$T/s_read.txt" 2>&1 || fail "the streamed file did not validate"
grep -qx "Gradient validation: PASSED (11 gradients checked, 0 failures)" "$T/s_read.txt" ||
  fail "the streamed file's gradients: $(grep -A3 'Gradient validation' "$T/s_read.txt")"

# Errors, one line each, exit code 2.
expect_error() {
  local name=$1 pattern=$2; shift 2
  "$TOOL" "$@" >"$T/out" 2>"$T/err"
  local code=$?
  [[ $code -eq 2 ]] || fail "$name: exit code $code, expected 2"
  grep -q "^torchlens: error: .*$pattern" "$T/err" || fail "$name: stderr lacks '$pattern': $(cat "$T/err")"
}
expect_error "--trace --backward" "describes" --trace "$T/g.pt" --backward
expect_error "--halt_after --backward" "halted forward" "${MLP[@]}" --backward --halt_after fc2

if [[ $failures -gt 0 ]]; then
  echo "$failures failure(s)"
  exit 1
fi
echo "PASS"
