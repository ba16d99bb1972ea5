#!/usr/bin/env bash
# End-to-end checks of the torchlens command-line tool: the bundled trace, the user's
# model and inputs, and one-line errors with exit code 2 for every kind of bad input.
set -uo pipefail
TOOL=tools/torchlens
failures=0

fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

# expect_error NAME PATTERN ARGS...: exit code 2 and exactly one stderr line with PATTERN.
expect_error() {
  local name=$1 pattern=$2; shift 2
  "$TOOL" "$@" >"$TEST_TMPDIR/out" 2>"$TEST_TMPDIR/err"
  local code=$?
  [[ $code -eq 2 ]] || fail "$name: exit code $code, expected 2"
  [[ $(wc -l <"$TEST_TMPDIR/err") -eq 1 ]] || fail "$name: stderr is not one line: $(cat "$TEST_TMPDIR/err")"
  grep -q "^torchlens: error: .*$pattern" "$TEST_TMPDIR/err" || fail "$name: stderr lacks '$pattern': $(cat "$TEST_TMPDIR/err")"
}

# The bundled model, no flags.
"$TOOL" >"$TEST_TMPDIR/summary" 2>"$TEST_TMPDIR/err" || fail "bundled run failed: $(cat "$TEST_TMPDIR/err")"
for expected in "conv2d_1_2:1" " stem " "block1.conv" "block2.bn.running_mean" "calls" "input_1" "output_1" \
    "head.weight" "[1, 10]" "Parameters:" "Buffers:"; do
  grep -qF -- "$expected" "$TEST_TMPDIR/summary" || fail "bundled summary lacks '$expected'"
done
grep -qE "buffer calls \(inplace\)" "$TEST_TMPDIR/summary" || fail "bundled summary lacks the calls write"

# The user's model with an input file and a summary file; train mode.
"$TOOL" --model testdata/demo.pt --input testdata/demo_input.pt --mode=train \
    --summary "$TEST_TMPDIR/s.txt" 2>"$TEST_TMPDIR/err" || fail "--input run failed: $(cat "$TEST_TMPDIR/err")"
grep -q "training mode" "$TEST_TMPDIR/s.txt" || fail "--summary file lacks 'training mode'"
grep -qE "buffer block1.bn.running_mean \(fused\)" "$TEST_TMPDIR/s.txt" || fail "train run lacks the fused write"

# --validate: the verdict, in train mode too (fused running-stat transitions).
"$TOOL" --validate --mode train >"$TEST_TMPDIR/v.txt" 2>"$TEST_TMPDIR/err" || fail "--validate failed: $(cat "$TEST_TMPDIR/err")"
grep -q "^Validation: PASSED" "$TEST_TMPDIR/v.txt" || fail "--validate lacks the PASSED verdict"
expect_error "validate without values" "needs saved values" --validate --no_save

# --edit: the changed outputs.
"$TOOL" --edit "log_softmax_1_13:1=-2.5" >"$TEST_TMPDIR/e.txt" 2>"$TEST_TMPDIR/err" || fail "--edit failed: $(cat "$TEST_TMPDIR/err")"
grep -q "output_1: changed" "$TEST_TMPDIR/e.txt" || fail "--edit lacks the changed output"
grep -qF -- "-2.5, -2.5" "$TEST_TMPDIR/e.txt" || fail "--edit lacks the new values"
expect_error "edit of an unknown label" "not found" --edit "nope_1_1:1=3"
expect_error "malformed edit" "LABEL=VALUE" --edit "relu_1_5:1"
expect_error "edit value" "not a number" --edit "relu_1_5:1=abc"

# Several inputs for a model that takes one: the model's own error, one line.
expect_error "wrong input count" "forward failed" --model testdata/demo.pt --input_shape "1,3,16,16;1,3"
expect_error "wrong input shape" "forward failed" --model testdata/demo.pt --input_shape 1,2
expect_error "unknown flag" "unknown flag --bogus" --bogus
expect_error "bad shape" "input_shape" --input_shape 1,x
expect_error "missing model" "does not exist" --model "$TEST_TMPDIR/nope.pt" --input_shape 1
: >"$TEST_TMPDIR/empty.pt"
expect_error "empty model" "is empty" --model "$TEST_TMPDIR/empty.pt" --input_shape 1
head -c 4000 testdata/demo.pt >"$TEST_TMPDIR/truncated.pt"
expect_error "truncated model" "not a complete TorchScript archive" --model "$TEST_TMPDIR/truncated.pt" --input_shape 1
echo "not a model" >"$TEST_TMPDIR/text.pt"
expect_error "text model" "not a complete TorchScript archive" --model "$TEST_TMPDIR/text.pt" --input_shape 1
expect_error "no inputs for user model" "input_shape" --model testdata/demo.pt
expect_error "bad input file" "torch.save" --input testdata/demo.pt

if [[ $failures -gt 0 ]]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all checks passed"
