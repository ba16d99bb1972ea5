#!/usr/bin/env bash
# The command-line tool's verdicts and interventions: dead computation and the validation
# report (also in JSON), edits of every output of a node, edits that change an output's
# shape, buffer versions an edit changed, and gaps. Expected values are hand arithmetic
# on the edit values.
set -uo pipefail
TOOL=tools/torchlens
failures=0

fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

run() {  # run NAME ARGS...: the tool's stdout in $TEST_TMPDIR/NAME, failing on exit code != 0
  local name=$1; shift
  "$TOOL" "$@" >"$TEST_TMPDIR/$name" 2>"$TEST_TMPDIR/err" || fail "$name: exit $?: $(cat "$TEST_TMPDIR/err")"
}

expect() {  # expect NAME TEXT: NAME's output holds TEXT
  grep -qF -- "$2" "$TEST_TMPDIR/$1" || fail "$1 lacks '$2': $(cat "$TEST_TMPDIR/$1")"
}

# Dead computation validates, is listed, and is in the JSON report.
run dead --model testdata/dead_branch.pt --input_shape 2,3 --validate --json "$TEST_TMPDIR/dead.json"
expect dead "Validation: PASSED"
expect dead "dead (computed, never used; checked, not failures): sigmoid_1_3:1, mul_1_4:1"
/usr/bin/python3 - "$TEST_TMPDIR/dead.json" <<'PY' || fail "dead.json lacks the validation report"
import json, sys
report = json.load(open(sys.argv[1]))["validation"]
assert report["passed"] is True, report
assert report["dead"] == ["sigmoid_1_3:1", "mul_1_4:1"], report
assert report["failures"] == [], report
PY

# chunk has two outputs: the edit sets both, and both heads change: 3 * 2 and 3 + 1.
run chunk --model testdata/chunk_heads.pt --input_shape 2,4 --edit chunk_1_2:1=3
expect chunk "output_1: changed"
expect chunk "-> [6, 6, 6, 6]"
expect chunk "output_2: changed"
expect chunk "-> [4, 4, 4, 4]"

# y[y > 0] with every y set to 1 selects all six values: the output's shape changes.
run select --model testdata/positive_select.pt --input_shape 2,3 --edit linear_1_1:1=1
expect select "output_1: changed shape or dtype:"
expect select "-> [6] Float [1, 1, 1, 1, 1, 1]"

# momentum 0 in training: both running_mean versions carry the edited value.
run momentum --model testdata/bn_momentum0_train.pt --mode train --input_shape 4,3 \
    --edit bn.running_mean:1=2
expect momentum "buffer bn.running_mean:2 (buffer_2:2): changed"
expect momentum "-> [2, 2, 2]"
expect momentum "buffer bn.running_mean:3 (buffer_2:3): changed"

# momentum None: the edited count reaches float(num_batches_tracked): a gap, named.
run cumulative --model testdata/bn_cumulative_train.pt --mode train --input_shape 4,3 \
    --edit bn.num_batches_tracked:1=4
expect cumulative "warning (non_tensor_gap at item_1_2:1)"
expect cumulative "buffer bn.num_batches_tracked:2 (buffer_1:2): changed (max abs change 4) [1] -> [5]"

# Complex values print as Python prints them, and change by their difference's modulus:
# with x = 0, z.real *= x zeroes every real part, and z[1].imag = x[0] every imaginary
# part of row 1, so buffer z's third version is all zeros.
run complex --model testdata/complex_view_writes.pt --input_shape 3,4 --edit input_1=0
expect complex "buffer z:3 (buffer_1:3): changed (max abs change"
expect complex "-> [0+0j, 0+0j, 0+0j, 0+0j, 0+0j, 0+0j, 0+0j, 0+0j, 0+0j, 0+0j, 0+0j, 0+0j]"

# Complex values (issue 54): a product with an all-zero complex factor, a complex branch
# `where` never selects, a complex power with exponent 0j. No perturbation changes these
# outputs, and the saved values prove why: PASSED, nothing unproved, and no check that
# converts a complex element to a double (which once threw, and the throw was a FAIL).
cat >"$TEST_TMPDIR/complex_model.py" <<'PY'
import sys
import torch

class ComplexZeros(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("w", torch.zeros(2, 2, dtype=torch.complex64))

    def forward(self, x):
        y = x @ self.w + x @ torch.zeros(2, 2, dtype=torch.complex64)
        kept = torch.where(x.real > 100.0, x, torch.zeros_like(x))
        return y, kept, torch.pow(x, 0j)

torch.jit.script(ComplexZeros()).save(sys.argv[1])
g = torch.Generator().manual_seed(5)
torch.save(torch.complex(torch.rand(3, 2, generator=g) + 0.5, torch.rand(3, 2, generator=g) + 0.5), sys.argv[2])
PY
/usr/bin/python3 "$TEST_TMPDIR/complex_model.py" "$TEST_TMPDIR/complex_zeros.pt" "$TEST_TMPDIR/complex_input.pt" ||
  fail "writing the complex model failed"
run complex_zeros --model "$TEST_TMPDIR/complex_zeros.pt" --input "$TEST_TMPDIR/complex_input.pt" --validate
expect complex_zeros "Validation: PASSED"
grep -qE "FAIL|unproved|not checkable" "$TEST_TMPDIR/complex_zeros" && fail "complex zeros: $(cat "$TEST_TMPDIR/complex_zeros")"

if [[ $failures -gt 0 ]]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all checks passed"
