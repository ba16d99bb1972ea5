#!/usr/bin/env bash
# End-to-end checks of the torchlens command-line tool: the bundled trace, the user's
# model and inputs, and one-line errors with exit code 2 for every kind of bad input.
set -uo pipefail
TOOL=$PWD/tools/torchlens
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
grep -qE "^  calls:2 +buffer \(inplace\) +\[1\] +Float .* add__1_1:1$" "$TEST_TMPDIR/summary" || fail "bundled summary lacks the calls write"
# Buffer versions by address (calls:1), as pictures and TorchLens name them; the labels
# (buffer_1:1) are accepted by every flag that takes a node, with the same result.
grep -qE "^  add__1_1:1 .* calls:1$" "$TEST_TMPDIR/summary" || fail "add_'s parent is not named calls:1"
grep -q "buffer_1:" "$TEST_TMPDIR/summary" && fail "the summary names a buffer version by its label"
"$TOOL" --edit calls:1=5 >"$TEST_TMPDIR/by_address.txt" 2>&1 || fail "--edit calls:1 failed"
"$TOOL" --edit buffer_1:1=5 >"$TEST_TMPDIR/by_label.txt" 2>&1 || fail "--edit buffer_1:1 failed"
grep -qF "buffer calls:2 (buffer_1:2): changed (max abs change 5) [1] -> [6]" "$TEST_TMPDIR/by_address.txt" ||
  fail "--edit calls:1=5: $(grep -A2 Intervention "$TEST_TMPDIR/by_address.txt")"
diff <(sed -n '/^Intervention/,$p' "$TEST_TMPDIR/by_address.txt") <(sed -n '/^Intervention/,$p' "$TEST_TMPDIR/by_label.txt") >/dev/null ||
  fail "--edit by address and by label differ"

# The user's model with an input file and a summary file; train mode.
"$TOOL" --model testdata/demo.pt --input testdata/demo_input.pt --mode=train \
    --summary "$TEST_TMPDIR/s.txt" 2>"$TEST_TMPDIR/err" || fail "--input run failed: $(cat "$TEST_TMPDIR/err")"
grep -q "training mode" "$TEST_TMPDIR/s.txt" || fail "--summary file lacks 'training mode'"
grep -qE "^  block1.bn.running_mean:2 +buffer \(fused\)" "$TEST_TMPDIR/s.txt" || fail "train run lacks the fused write"

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
expect_error "truncated model" "is not a valid TorchScript archive" --model "$TEST_TMPDIR/truncated.pt" --input_shape 1
echo "not a model" >"$TEST_TMPDIR/text.pt"
expect_error "text model" "is not a valid TorchScript archive" --model "$TEST_TMPDIR/text.pt" --input_shape 1
expect_error "no inputs for user model" "input_shape" --model testdata/demo.pt
expect_error "bad input file" "torch.save" --input testdata/demo.pt

# Empty and repeated flag values are errors, never the default or the last value.
expect_error "empty --model" "--model is empty" --model=
expect_error "empty --save" "--save is empty" --save ""
expect_error "empty --json" "--json is empty" --json=
expect_error "empty --render" "--render is empty" --render ""
expect_error "repeated --model" "--model is given twice" --model testdata/demo.pt --model=testdata/mlp.pt
expect_error "render extension" "must end in .svg, .png or .pdf" --render "$TEST_TMPDIR/graph.txt"

# Without --model: the model in the binary's runfiles, not a testdata/demo.pt that happens
# to lie in the current directory.
mkdir -p "$TEST_TMPDIR/elsewhere/testdata"
echo "not a model" >"$TEST_TMPDIR/elsewhere/testdata/demo.pt"
(cd "$TEST_TMPDIR/elsewhere" && "$TOOL" >"$TEST_TMPDIR/bundled.txt" 2>"$TEST_TMPDIR/err") ||
  fail "bundled model from another directory: $(cat "$TEST_TMPDIR/err")"
grep -qF "conv2d_1_2:1" "$TEST_TMPDIR/bundled.txt" || fail "bundled run from another directory lacks conv2d_1_2:1"
grep -qF "elsewhere" "$TEST_TMPDIR/bundled.txt" && fail "bundled run traced the current directory's testdata/demo.pt"

# Output that cannot be written: one error line, exit code 2, and every other output written.
# Graphviz used to end the process on a failed write (gvwrite_no_z problem 7, exit 1).
for format in svg png pdf; do
  ln -sf /dev/full "$TEST_TMPDIR/full.$format"
  rm -f "$TEST_TMPDIR/beside.json"
  expect_error "render $format to a full disk" "No space left on device" \
    --render "$TEST_TMPDIR/full.$format" --json "$TEST_TMPDIR/beside.json"
  grep -q '"ops"' "$TEST_TMPDIR/beside.json" 2>/dev/null || fail "render $format to a full disk: --json not written"
  grep -qF "conv2d_1_2:1" "$TEST_TMPDIR/out" || fail "render $format to a full disk: no summary"
done
"$TOOL" >/dev/full 2>"$TEST_TMPDIR/err"
[[ $? -eq 2 ]] || fail "summary to a full stdout: exit code is not 2"
[[ $(wc -l <"$TEST_TMPDIR/err") -eq 1 ]] && grep -q "^torchlens: error: cannot write the summary to standard output: No space left on device" "$TEST_TMPDIR/err" ||
  fail "summary to a full stdout: $(cat "$TEST_TMPDIR/err")"
expect_error "summary file on a full disk" "--summary file.*No space left" --summary /dev/full
expect_error "json on a full disk" "JSON file.*No space left" --json /dev/full
expect_error "trace file on a full disk" "trace file.*No space left" --save /dev/full

# Hostile and unusual files (issue 17; tools/fuzz/make_corpus.py wrote them).
INPUTS=tools/fuzz/corpus/input_file
MODELS=tools/fuzz/corpus/model_archive
for name in size_16mb size_4gb offset stride small_overrun truncated_record; do
  expect_error "input $name" "input file '$INPUTS/$name.pt': .*the saved tensor" \
    --model testdata/checks_input.pt --input "$INPUTS/$name.pt"
done
for op in tuple2 tuple3 reduce build newobj; do
  expect_error "model underflow_$op" "takes values the stack does not hold" \
    --model "$MODELS/underflow_$op.pt" --input_shape 1,2
done
expect_error "model parameter oversize" "tensor 'fc.weight' .* reaches element 7" \
  --model "$MODELS/parameter_oversize.pt" --input_shape 1,2
expect_error "model record cut short" "storage data/0 of tensor 'fc.weight' claims 4 Float" \
  --model "$MODELS/record_cut_short.pt" --input_shape 1,2
# NOTE [Calls LibTorch compiles by recursion]: more functions than a chain of them can nest
# on the tool's stack.
expect_error "16,400 functions" "defines 16402 functions and methods, more than 4096" \
  --model "$MODELS/call_chain_16400.pt" --input_shape 2
expect_error "class constant without type" "gives '__btffers__' a value without a type" \
  --model "$MODELS/class_constant_without_type.pt" --input_shape 1,2
expect_error "class constant in a case-folded code folder" "gives '__btffers__' a value without a type" \
  --model "$MODELS/case_folded_code_folder.pt" --input_shape 1,2
expect_error "debug information LibTorch throws on" "debug information LibTorch cannot read safely" \
  --model "$MODELS/debug_info_unknown_global.pt" --input_shape 1,2
expect_error "debug record failing its CRC" "__torch__.py.debug_pkl fails its CRC-32 check" \
  --model "$MODELS/debug_info_unprintable.pt" --input_shape 1,2
expect_error "debug record failing its CRC and marked as a directory" \
  "code/__torch__.py.debug_pkl is named as a file but marked as a directory" \
  --model "$MODELS/crc_debug_record.pt" --input_shape 1,2
expect_error "debug record marked as a directory" \
  "code/__torch__.py.debug_pkl is named as a file but marked as a directory" \
  --model "$MODELS/debug_record_marked_directory.pt" --input_shape 1,2
expect_error "torchvision op" "torchvision::nms.*load the library that registers torchvision::" \
  --model "$MODELS/unknown_op_torchvision.pt" --input_shape 1,2
expect_error "newer aten op" "this LibTorch (1.13) has no aten::relu_of_a_newer_pytorch" \
  --model "$MODELS/unknown_op_aten.pt" --input_shape 1,2

# Files Python writes, once called corrupt: every pickle protocol, [t], a Parameter.
for name in protocol1 protocol2 protocol4 protocol5 list_of_one parameter; do
  "$TOOL" --model testdata/checks_input.pt --input "$INPUTS/$name.pt" >"$TEST_TMPDIR/out" 2>"$TEST_TMPDIR/err" ||
    fail "input $name: $(cat "$TEST_TMPDIR/err")"
  grep -qF "linear_1_4:1  linear  [2, 2]" "$TEST_TMPDIR/out" || fail "input $name: no linear op in the summary"
done
# [[t, t[0]], [t.t()]] is two list arguments: the model's own error, not "corrupt".
expect_error "list of lists" "forward failed.*Expected at most 2 argument" \
  --model testdata/checks_input.pt --input "$INPUTS/list_of_lists.pt"

# Not regular files: process substitution and FIFOs are read; devices and directories
# are refused by name, never read (/dev/zero was read until memory ran out).
"$TOOL" --model <(cat testdata/checks_input.pt) --input <(cat "$INPUTS/protocol4.pt") \
  >"$TEST_TMPDIR/out" 2>"$TEST_TMPDIR/err" || fail "process substitution: $(cat "$TEST_TMPDIR/err")"
mkfifo "$TEST_TMPDIR/model.fifo"
cat testdata/checks_input.pt >"$TEST_TMPDIR/model.fifo" &
"$TOOL" --model "$TEST_TMPDIR/model.fifo" --input_shape 2,3 >"$TEST_TMPDIR/out" 2>"$TEST_TMPDIR/err" ||
  fail "FIFO with a writer: $(cat "$TEST_TMPDIR/err")"
wait
expect_error "model /dev/zero" "model file '/dev/zero' is a character device" --model /dev/zero --input_shape 1
expect_error "input /dev/zero" "input file '/dev/zero' is a character device" --input /dev/zero
expect_error "input directory" "input file '$TEST_TMPDIR' is a directory" --input "$TEST_TMPDIR"

# Forward failures: the cause and the model's source line, not "The following operation
# failed in the TorchScript interpreter."
expect_error "model's assert" "AssertionError: expected a 2-D input (at .*gen_testdata.py:[0-9]*: assert x.dim() == 2" \
  --model testdata/checks_input.pt --input_shape 3
expect_error "wrong feature count" "mat1 and mat2 shapes cannot be multiplied (2x5 and 3x2) (at .*linear.py" \
  --model testdata/checks_input.pt --input_shape 2,5

# torch.jit.fork: refused, never a partial trace.
expect_error "fork" "runs work on other threads (Forks.forward forks at .*gen_testdata.py:[0-9]*: future = torch.jit.fork(_double, x)" \
  --model testdata/forks.pt --input_shape 2,3

# A sparse output: no trace file Python cannot read; the other outputs are written.
rm -f "$TEST_TMPDIR/sparse.json"
expect_error "sparse --save" "op 'to_sparse_1_2:1' holds a sparse tensor" \
  --model testdata/sparse_output.pt --input_shape 2,3 --save "$TEST_TMPDIR/sparse.trace.pt" \
  --json "$TEST_TMPDIR/sparse.json"
[[ -e "$TEST_TMPDIR/sparse.trace.pt" ]] && fail "sparse --save wrote a trace file"
grep -q '"ops"' "$TEST_TMPDIR/sparse.json" || fail "sparse --save: --json not written"

# Answers over traces (README "Answers from the command line"): the structure hash, the
# first non-finite value, comparisons with a saved trace and with a second model, a Chrome
# trace of timed ops.
"$TOOL" --hash --seed 1 >"$TEST_TMPDIR/h1.txt" 2>"$TEST_TMPDIR/err" || fail "--hash failed: $(cat "$TEST_TMPDIR/err")"
"$TOOL" --hash --seed 2 >"$TEST_TMPDIR/h2.txt" 2>&1 || fail "--hash --seed 2 failed"
"$TOOL" --hash --mode train >"$TEST_TMPDIR/h3.txt" 2>&1 || fail "--hash --mode train failed"
hash1=$(sed -n 's/^Structure hash: \([0-9a-f]\{16\}\)$/\1/p' "$TEST_TMPDIR/h1.txt")
[[ -n $hash1 ]] || fail "--hash printed no 16-digit hash"
grep -qx "Structure hash: $hash1" "$TEST_TMPDIR/h2.txt" || fail "--hash differs between input values"
grep -qx "Structure hash: $hash1" "$TEST_TMPDIR/h3.txt" && fail "--hash is the same in training mode (BatchNorm writes its buffers)"

"$TOOL" --model testdata/divide_by_zero.pt --input_shape 2,3 --non_finite >"$TEST_TMPDIR/nf.txt" 2>"$TEST_TMPDIR/err" ||
  fail "--non_finite failed: $(cat "$TEST_TMPDIR/err")"
grep -qF "First non-finite value: div_1_4:1 in '' (NaN" "$TEST_TMPDIR/nf.txt" ||
  grep -qF "First non-finite value: div_1_4:1 in '' (Inf" "$TEST_TMPDIR/nf.txt" || fail "--non_finite names the wrong op: $(grep -i finite "$TEST_TMPDIR/nf.txt")"
grep -qF "parents: relu_1_2:1 (finite), sub_1_3:1 (finite)" "$TEST_TMPDIR/nf.txt" || fail "--non_finite lacks the finite parents"
"$TOOL" --non_finite >"$TEST_TMPDIR/nf0.txt" 2>&1 || fail "--non_finite on the demo failed"
grep -qx "Non-finite values: none" "$TEST_TMPDIR/nf0.txt" || fail "--non_finite found a NaN in the demo"
expect_error "non_finite without values" "needs saved values" --non_finite --no_save

# --module: each call of a module and its outputs; call_twice calls fc twice around a relu.
"$TOOL" --model testdata/call_twice.pt --input_shape 1,3 --module fc >"$TEST_TMPDIR/m.txt" 2>"$TEST_TMPDIR/err" ||
  fail "--module failed: $(cat "$TEST_TMPDIR/err")"
grep -qx "Module fc (Linear): 2 calls" "$TEST_TMPDIR/m.txt" || fail "--module lacks the two calls: $(cat "$TEST_TMPDIR/m.txt")"
grep -qx "  call 2: 1 op (linear_1_1:2), outputs linear_1_1:2" "$TEST_TMPDIR/m.txt" || fail "--module call 2 is wrong"
expect_error "unknown --module" "no module \"fc2\"; closest: fc" --model testdata/call_twice.pt --input_shape 1,3 --module fc2

# Source positions in the summary: branchy's tanh runs in the else branch for this input
# (seed 3 draws a negative sum).
"$TOOL" --model testdata/branchy.pt --input_shape 2,3 --seed 3 >"$TEST_TMPDIR/b.txt" 2>&1 || fail "branchy run failed"
grep -qE "tanh_1_5:1 .*gen_testdata.py:[0-9]+ \(else of :[0-9]+\)" "$TEST_TMPDIR/b.txt" || fail "the summary lacks the branch op's source: $(cat "$TEST_TMPDIR/b.txt")"

# Collapsed and rolled pictures: the demo at depth 1 draws its four top-level modules as
# boxes; loop_reuse rolled draws input, linear, tanh and output.
"$TOOL" --render "$TEST_TMPDIR/d1.svg" --render_depth 1 >/dev/null 2>"$TEST_TMPDIR/err" || fail "--render_depth failed: $(cat "$TEST_TMPDIR/err")"
[[ $(grep -c "ops\?</text>" "$TEST_TMPDIR/d1.svg") -eq 4 ]] || fail "--render_depth 1 did not draw 4 module boxes"
"$TOOL" --model testdata/loop_reuse.pt --input_shape 2,3 --render "$TEST_TMPDIR/r.svg" --rolled >/dev/null 2>&1 || fail "--rolled failed"
[[ $(grep -c '<g id="node' "$TEST_TMPDIR/r.svg") -eq 4 ]] || fail "--rolled drew $(grep -c '<g id="node' "$TEST_TMPDIR/r.svg") nodes, not 4"

"$TOOL" --save "$TEST_TMPDIR/ref.pt" >/dev/null 2>&1 || fail "--save of the reference failed"
"$TOOL" --compare "$TEST_TMPDIR/ref.pt" >"$TEST_TMPDIR/c0.txt" 2>"$TEST_TMPDIR/err" || fail "--compare failed: $(cat "$TEST_TMPDIR/err")"
grep -qx "no divergence" "$TEST_TMPDIR/c0.txt" || fail "--compare of the same run diverged: $(tail -3 "$TEST_TMPDIR/c0.txt")"
"$TOOL" --seed 1 --compare "$TEST_TMPDIR/ref.pt" >"$TEST_TMPDIR/c1.txt" 2>&1
[[ $? -eq 1 ]] || fail "--compare --seed 1: exit code is not 1 (divergence)"
grep -qx "first divergence: input_1" "$TEST_TMPDIR/c1.txt" || fail "--compare with other inputs: $(tail -1 "$TEST_TMPDIR/c1.txt")"
# --trace: two saved trace files compared, validated and summarized without a model.
"$TOOL" --seed 1 --save "$TEST_TMPDIR/other.pt" >/dev/null 2>&1 || fail "--save of the second trace failed"
"$TOOL" --trace "$TEST_TMPDIR/other.pt" --compare "$TEST_TMPDIR/ref.pt" --validate >"$TEST_TMPDIR/t.txt" 2>"$TEST_TMPDIR/err"
[[ $? -eq 1 ]] || fail "--trace --compare: exit code is not 1 (divergence): $(cat "$TEST_TMPDIR/err")"
grep -q "^torchlens trace file .*other.pt" "$TEST_TMPDIR/t.txt" || fail "--trace summary lacks its header"
grep -qx "first divergence: input_1" "$TEST_TMPDIR/t.txt" || fail "--trace --compare: $(tail -1 "$TEST_TMPDIR/t.txt")"
grep -q "^Validation: PASSED" "$TEST_TMPDIR/t.txt" || fail "--trace --validate did not pass"
"$TOOL" --trace "$TEST_TMPDIR/ref.pt" --compare "$TEST_TMPDIR/ref.pt" >"$TEST_TMPDIR/t0.txt" 2>&1 || fail "--trace --compare itself failed"
grep -qx "no divergence" "$TEST_TMPDIR/t0.txt" || fail "a trace file compared with itself diverged"
expect_error "--trace with a capture flag" "--trace reads a saved trace, but --seed describes" --trace "$TEST_TMPDIR/ref.pt" --seed 2
expect_error "--trace of a missing file" "nope.pt" --trace "$TEST_TMPDIR/nope.pt"

# A second model: the demo with one weight of block2.conv changed, written by Python.
/usr/bin/python3 - "$TEST_TMPDIR/perturbed.pt" <<'PY' || fail "writing the perturbed model failed"
import sys, torch
m = torch.jit.load("testdata/demo.pt")
with torch.no_grad():
    m.block2.conv.weight[0, 0, 0, 0] += 1.0
m.save(sys.argv[1])
PY
"$TOOL" --model testdata/demo.pt --input_shape 1,3,16,16 --compare_model "$TEST_TMPDIR/perturbed.pt" \
    >"$TEST_TMPDIR/c2.txt" 2>"$TEST_TMPDIR/err"
[[ $? -eq 1 ]] || fail "--compare_model: exit code is not 1 (divergence): $(cat "$TEST_TMPDIR/err")"
grep -qx "first divergence: conv2d_3_6:1" "$TEST_TMPDIR/c2.txt" || fail "--compare_model: $(tail -1 "$TEST_TMPDIR/c2.txt")"
grep -E "^conv2d_2_3:1 +0 +0 " "$TEST_TMPDIR/c2.txt" >/dev/null || fail "--compare_model: block1.conv differs"
expect_error "compare with a model file" "trace file" --compare testdata/demo.pt
expect_error "compare twice" "not both" --compare "$TEST_TMPDIR/ref.pt" --compare_model testdata/demo.pt

"$TOOL" --chrome_trace "$TEST_TMPDIR/trace.json" >"$TEST_TMPDIR/t.txt" 2>"$TEST_TMPDIR/err" || fail "--chrome_trace failed: $(cat "$TEST_TMPDIR/err")"
grep -q "Time per module" "$TEST_TMPDIR/t.txt" || fail "--chrome_trace: no per-module times in the summary"
/usr/bin/python3 - "$TEST_TMPDIR/trace.json" <<'PY' || fail "--chrome_trace wrote a wrong trace"
import json, sys
events = json.load(open(sys.argv[1]))["traceEvents"]
ops = {e["name"]: e for e in events if e.get("cat") not in (None, "module")}
assert "conv2d_1_2:1" in ops and "log_softmax_1_13:1" in ops, sorted(ops)
stem = [e for e in events if e.get("cat") == "module" and e["name"].startswith("stem")]
conv = ops["conv2d_1_2:1"]
assert stem and stem[0]["ts"] <= conv["ts"] and conv["ts"] + conv["dur"] <= stem[0]["ts"] + stem[0]["dur"] + 1e-3, (stem, conv)
PY

# Capture in a service (README "Capture in a service: save less, stop early, bound
# memory"): selective saving validates what it saved, a halted forward is a partial trace,
# the memory budget is an error or a partial trace.
"$TOOL" --save_modules block1 --validate >"$TEST_TMPDIR/sel.txt" 2>"$TEST_TMPDIR/err" ||
  fail "--save_modules --validate failed: $(cat "$TEST_TMPDIR/err") $(grep FAIL "$TEST_TMPDIR/sel.txt")"
grep -q "^Values saved for [0-9]* of [0-9]* ops" "$TEST_TMPDIR/sel.txt" || fail "--save_modules: no count of saved ops"
grep -q "^Validation: PASSED" "$TEST_TMPDIR/sel.txt" || fail "--save_modules: validation did not pass"
grep -q "^  not checked (nothing saved to re-run them): .*conv2d_1_2:1" "$TEST_TMPDIR/sel.txt" ||
  fail "--save_modules: the stem's conv2d is not listed as not checked"
"$TOOL" --halt_after block1 >"$TEST_TMPDIR/halt.txt" 2>"$TEST_TMPDIR/err" || fail "--halt_after failed: $(cat "$TEST_TMPDIR/err")"
grep -q "^Partial trace: the forward was halted when module 'block1' had finished (--halt_after)" "$TEST_TMPDIR/halt.txt" ||
  fail "--halt_after: no partial reason: $(head -3 "$TEST_TMPDIR/halt.txt")"
grep -q "conv2d_3_" "$TEST_TMPDIR/halt.txt" && fail "--halt_after block1: block2's conv2d ran"
"$TOOL" --model testdata/divide_by_zero.pt --input_shape 2,3 --stop_at_non_finite >"$TEST_TMPDIR/stop.txt" 2>&1 ||
  fail "--stop_at_non_finite failed"
grep -q "^Partial trace: the forward was halted at div_1_4:1, the first op whose output holds NaN or Inf" \
  "$TEST_TMPDIR/stop.txt" || fail "--stop_at_non_finite: $(grep Partial "$TEST_TMPDIR/stop.txt")"
expect_error "budget" "reached --max_saved_bytes (1000 bytes.* Raise --max_saved_bytes, save fewer ops (--save_modules, --save_types, --save_labels), or give --partial_on_budget" \
  --max_saved_bytes 1000
grep -q "CaptureOptions\|save_if" "$TEST_TMPDIR/err" && fail "budget error names the C++ API: $(cat "$TEST_TMPDIR/err")"
"$TOOL" --max_saved_bytes 1000 --partial_on_budget >"$TEST_TMPDIR/budget.txt" 2>&1 || fail "--partial_on_budget failed"
grep -q "^Partial trace: saving stopped at " "$TEST_TMPDIR/budget.txt" || fail "--partial_on_budget: no partial reason"
expect_error "partial without budget" "--partial_on_budget needs --max_saved_bytes" --partial_on_budget

# Issue 54, the tool as a new user meets it.
# A mistake only the trace can reveal (an --edit label, a --module name, a --compare file)
# costs nothing else that was asked: the summary, the trace file and the verdict are
# there, then the one error line and exit code 2.
rm -f "$TEST_TMPDIR/typo.pt"
expect_error "edit typo" "--edit counter:9=7: label \"counter:9\" not found; closest: calls:1, calls:2, .*(everything else asked was done)" \
  --edit counter:9=7 --save "$TEST_TMPDIR/typo.pt" --validate --module fc2
grep -q "^Validation: PASSED" "$TEST_TMPDIR/out" || fail "edit typo: no validation verdict"
grep -qF "conv2d_1_2:1" "$TEST_TMPDIR/out" || fail "edit typo: no summary"
grep -q "^Trace file written to $TEST_TMPDIR/typo.pt" "$TEST_TMPDIR/out" || fail "edit typo: no written line"
[[ -s "$TEST_TMPDIR/typo.pt" ]] || fail "edit typo: --save not written"
grep -qF -- '--module the trace has no module "fc2"' "$TEST_TMPDIR/err" || fail "edit typo: the --module mistake is not reported: $(cat "$TEST_TMPDIR/err")"
expect_error "compare file missing, the rest done" "--compare: .*nope.pt" --compare "$TEST_TMPDIR/nope.pt" --hash
grep -q "^Structure hash: " "$TEST_TMPDIR/out" || fail "compare file missing: no hash"

# Integer nodes take integers only, exactly; 7.5 into the Long counter is refused naming
# the dtype. In training num_batches_tracked is read (0) then written (+1): 7 gives 8.
expect_error "fractional edit of a Long" "--edit block1.bn.num_batches_tracked:1=7.5: the node holds Long values, and 7.5 is not an integer" \
  --mode train --edit block1.bn.num_batches_tracked:1=7.5
"$TOOL" --mode train --edit block1.bn.num_batches_tracked:1=7 >"$TEST_TMPDIR/int_edit.txt" 2>&1 || fail "integer edit failed"
grep -qF "buffer block1.bn.num_batches_tracked:2 (buffer_2:2): changed (max abs change 7) [1] -> [8]" "$TEST_TMPDIR/int_edit.txt" ||
  fail "integer edit: $(grep -A3 Intervention "$TEST_TMPDIR/int_edit.txt")"
grep -q "^Intervention: 2 nodes re-executed" "$TEST_TMPDIR/int_edit.txt" || fail "integer edit: count"
# Singular after 1: the head's linear feeds log_softmax alone.
"$TOOL" --edit linear_1_12:1=1 >"$TEST_TMPDIR/one.txt" 2>&1 || fail "linear edit failed"
grep -qx "Intervention: 1 node re-executed" "$TEST_TMPDIR/one.txt" || fail "edit: $(grep Intervention "$TEST_TMPDIR/one.txt")"

# --compare: relative differences from a zero are infinite, not 0 (the demo's relu is zero
# in other places for another seed); exit 0 for no divergence, 1 for one (as diff), 2 for errors.
"$TOOL" --save "$TEST_TMPDIR/cmp_ref.pt" >/dev/null 2>&1 || fail "--save for --compare failed"
"$TOOL" --compare "$TEST_TMPDIR/cmp_ref.pt" >"$TEST_TMPDIR/cmp0.txt" 2>&1
[[ $? -eq 0 ]] || fail "--compare without divergence: exit code is not 0"
"$TOOL" --seed 1 --compare "$TEST_TMPDIR/cmp_ref.pt" >"$TEST_TMPDIR/cmp1.txt" 2>&1
[[ $? -eq 1 ]] || fail "--compare with a divergence: exit code is not 1"
grep -qE "^relu_1_5:1 +[0-9.e+-]+ +inf " "$TEST_TMPDIR/cmp1.txt" || fail "--compare: relu's relative difference is not inf: $(grep relu_1_5 "$TEST_TMPDIR/cmp1.txt")"

# --seed seeds the forward whatever the inputs' source: dropout in training draws the same
# mask for the same seed, another for another seed.
/usr/bin/python3 -c "import sys, torch; torch.save(torch.randn(3, 6, generator=torch.Generator().manual_seed(1)), sys.argv[1])" \
  "$TEST_TMPDIR/dropout_in.pt"
"$TOOL" --model testdata/dropout_train.pt --mode train --input "$TEST_TMPDIR/dropout_in.pt" --save "$TEST_TMPDIR/drop.pt" >/dev/null 2>&1 ||
  fail "dropout --save failed"
"$TOOL" --model testdata/dropout_train.pt --mode train --input "$TEST_TMPDIR/dropout_in.pt" --compare "$TEST_TMPDIR/drop.pt" \
  >"$TEST_TMPDIR/drop0.txt" 2>&1 || fail "two runs with the same --seed diverge: $(tail -1 "$TEST_TMPDIR/drop0.txt")"
"$TOOL" --model testdata/dropout_train.pt --mode train --input "$TEST_TMPDIR/dropout_in.pt" --seed 5 --compare "$TEST_TMPDIR/drop.pt" \
  >"$TEST_TMPDIR/drop5.txt" 2>&1
grep -q "^first divergence: dropout_" "$TEST_TMPDIR/drop5.txt" || fail "--seed 5 drew the same dropout mask: $(tail -1 "$TEST_TMPDIR/drop5.txt")"

# A reader that closes the pipe early is no error (as for `git log | head`): the tool runs
# for a while, `true` has closed the pipe long before the summary is written.
for attempt in 1 2 3; do
  "$TOOL" --validate 2>"$TEST_TMPDIR/pipe_err" | true
  code=${PIPESTATUS[0]}
  [[ $code -eq 0 && ! -s "$TEST_TMPDIR/pipe_err" ]] || fail "closed pipe $attempt: exit $code, $(cat "$TEST_TMPDIR/pipe_err")"
done

# Flags that say what they do: render-only flags need --render; -h and --version; a
# mistyped flag gets a suggestion; --halt_after takes a label without its pass; a model
# archive given as a trace is named as one; --stream_to says where it wrote.
expect_error "rolled without render" "--render_depth, --rolled say how to draw the graph, but no --render" --rolled --render_depth 1
expect_error "show_buffers without render" "--show_buffers says how to draw" --show_buffers always
expect_error "mistyped flag" "unknown flag --vaildate; did you mean --validate?" --vaildate
"$TOOL" -h >"$TEST_TMPDIR/h.txt" 2>&1 && grep -q "^usage: torchlens" "$TEST_TMPDIR/h.txt" || fail "-h: $(head -2 "$TEST_TMPDIR/h.txt")"
"$TOOL" --version >"$TEST_TMPDIR/v.txt" 2>&1 && grep -qx "torchlens: trace files version 4, JSON schema version 3, LibTorch 1.13.[0-9]*" "$TEST_TMPDIR/v.txt" ||
  fail "--version: $(cat "$TEST_TMPDIR/v.txt")"
"$TOOL" --halt_after relu_1_5 >"$TEST_TMPDIR/halt_label.txt" 2>&1 || fail "--halt_after relu_1_5: $(cat "$TEST_TMPDIR/halt_label.txt")"
grep -q "^Partial trace: the forward was halted right after relu_1_5:1 (--halt_after)" "$TEST_TMPDIR/halt_label.txt" ||
  fail "--halt_after relu_1_5: $(grep Partial "$TEST_TMPDIR/halt_label.txt")"
expect_error "halt_after typo" "--halt_after is \"blok1\", which is neither a module address" --halt_after blok1
expect_error "model archive as a trace" "'testdata/demo.pt': a TorchScript model archive (torch.jit.save), not a trace file: .*--model" \
  --trace testdata/demo.pt
"$TOOL" --stream_to "$TEST_TMPDIR/streamed.pt" >"$TEST_TMPDIR/stream.txt" 2>&1 || fail "--stream_to failed"
grep -qx "Trace file written to $TEST_TMPDIR/streamed.pt during the capture" "$TEST_TMPDIR/stream.txt" || fail "--stream_to: no written line"

# What input a model wants: the forward's signature in the missing-inputs error, and
# --describe, which prints it with the modules, parameters and buffers, running nothing.
cat >"$TEST_TMPDIR/two_args.py" <<'PY'
import sys
from typing import Optional, Tuple
import torch

class TwoArgs(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(3, 2)
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))

    def forward(self, x: torch.Tensor, h: Optional[torch.Tensor] = None,
                scale: float = 1.0) -> Tuple[torch.Tensor, int]:
        return self.fc(x) * scale, 2

torch.jit.script(TwoArgs().train()).save(sys.argv[1])
PY
/usr/bin/python3 "$TEST_TMPDIR/two_args.py" "$TEST_TMPDIR/two_args.pt" || fail "writing two_args.pt failed"
expect_error "missing inputs" "give the model's inputs with --input_shape .* its forward is forward(x: Tensor, h: Optional\[Tensor\] = ..., scale: float = ...) -> Tuple\[Tensor, int\]" \
  --model "$TEST_TMPDIR/two_args.pt"
"$TOOL" --describe --model "$TEST_TMPDIR/two_args.pt" >"$TEST_TMPDIR/describe.txt" 2>"$TEST_TMPDIR/err" ||
  fail "--describe failed: $(cat "$TEST_TMPDIR/err")"
for expected in "Forward: forward(x: Tensor, h: Optional[Tensor] = ..., scale: float = ...) -> Tuple[Tensor, int]" \
    "Saved in training mode; captures run in eval mode unless --mode train says otherwise" \
    "Modules: 2" "Parameters: 2 (8 values)" "Buffers: 1"; do
  grep -qxF -- "$expected" "$TEST_TMPDIR/describe.txt" || fail "--describe lacks '$expected': $(cat "$TEST_TMPDIR/describe.txt")"
done
grep -qE "^  fc\.weight +\[2, 3\] +Float$" "$TEST_TMPDIR/describe.txt" || fail "--describe lacks fc.weight"
grep -qE "^  steps +\[\] +Long$" "$TEST_TMPDIR/describe.txt" || fail "--describe lacks the buffer"
grep -qE "^  fc +Linear$" "$TEST_TMPDIR/describe.txt" || fail "--describe lacks the module fc"
expect_error "describe runs nothing" "--describe prints the model without running it and takes --model and --summary only, not --validate" \
  --describe --validate

# Pictures and verdicts that do not mislead. A halted forward's last values are cut off,
# not dead; a rolled buffer keeps its writes; meaningful hides BatchNorm's batch counter
# with its add_; PyTorch's own branches only on request.
"$TOOL" --halt_after block1 --validate >"$TEST_TMPDIR/halt_v.txt" 2>&1 || fail "--halt_after --validate: $(cat "$TEST_TMPDIR/halt_v.txt")"
grep -q "^  not reached (the halt cut off what reads them; checked, not dead): .*relu_1_5:1" "$TEST_TMPDIR/halt_v.txt" ||
  fail "--halt_after --validate: $(sed -n '/^Validation/,$p' "$TEST_TMPDIR/halt_v.txt")"
grep -q "^  dead " "$TEST_TMPDIR/halt_v.txt" && fail "--halt_after --validate calls cut-off nodes dead"
"$TOOL" --model testdata/counter_cell.pt --input_shape 1,4 --rolled --render "$TEST_TMPDIR/cc.svg" >/dev/null 2>&1 || fail "rolled counter_cell"
grep -qF ">read, 3 writes (inplace) [4]<" "$TEST_TMPDIR/cc.svg" || fail "rolled buffer lost its writes: $(grep -A2 '>b<' "$TEST_TMPDIR/cc.svg")"
"$TOOL" --mode train --render "$TEST_TMPDIR/train.svg" >"$TEST_TMPDIR/train.txt" 2>&1 || fail "train render"
grep -qF ">add_ []<" "$TEST_TMPDIR/train.svg" && fail "meaningful draws num_batches_tracked's add_"
grep -qF "of if at batchnorm.py" "$TEST_TMPDIR/train.svg" && fail "the picture shows BatchNorm's internal branch"
grep -qE "^  log_softmax_1_15:1 .* functional.py:[0-9]+ +linear_1_14:1$" "$TEST_TMPDIR/train.txt" ||
  fail "the summary shows functional.py's branch: $(grep log_softmax "$TEST_TMPDIR/train.txt")"
"$TOOL" --mode train --library_branches >"$TEST_TMPDIR/lib.txt" 2>&1 || fail "--library_branches"
grep -qE "^  log_softmax_1_15:1 .* functional.py:[0-9]+ \(then of :[0-9]+\)" "$TEST_TMPDIR/lib.txt" ||
  fail "--library_branches: $(grep log_softmax "$TEST_TMPDIR/lib.txt")"

# --save_labels takes a layer without its pass too: every pass of it (call_twice runs
# linear_1_1 twice around a relu).
"$TOOL" --model testdata/call_twice.pt --input_shape 1,3 --save_labels linear_1_1 --validate >"$TEST_TMPDIR/sl.txt" 2>&1 ||
  fail "--save_labels linear_1_1: $(cat "$TEST_TMPDIR/sl.txt")"
grep -qx "Values saved for 2 of 3 ops (selective saving or the memory budget)" "$TEST_TMPDIR/sl.txt" ||
  fail "--save_labels linear_1_1: $(grep 'Values saved' "$TEST_TMPDIR/sl.txt")"
grep -qx "  not checked (nothing saved to re-run them): relu_1_2:1" "$TEST_TMPDIR/sl.txt" || fail "--save_labels linear_1_1: not checked"

if [[ $failures -gt 0 ]]; then
  echo "$failures check(s) failed"
  exit 1
fi
echo "all checks passed"
