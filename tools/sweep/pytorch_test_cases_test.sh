#!/usr/bin/env bash
# A fast subset of the sweep over PyTorch's own test cases (tools/sweep/pytorch_test_cases.py):
# the first OpInfo sample of 25 op_db ops across families; index_put's in-place variant on
# the input, on a clone made in the model and on a non-contiguous input; and, in eval and
# train mode, BatchNorm2d (scripted and traced), InstanceNorm1d tracking running stats
# (scripted) and GRU (traced). Each case is validated by the tool, and its saved trace is
# validated read back. About 35 s on 2 cores.
set -euo pipefail
sweep() {
  /usr/bin/python3 tools/sweep/pytorch_test_cases.py --cli tools/torchlens --samples 1 \
      --round_trip_every 1 "$@"
}
ops=add,mul,div.no_rounding_mode,matmul,addmm,pow,clamp,where,masked_fill,cumsum,sort,topk
ops+=,softmax,log_softmax,cat,stack,index_select,gather,index_put,scatter_add
ops+=,nn.functional.conv2d,nn.functional.max_pool2d,nn.functional.avg_pool2d
ops+=,nn.functional.batch_norm,nn.functional.layer_norm
ops+=,nn.BatchNorm2d,nn.GRU,InstanceNorm1d_tracking_stats
# The exact counts catch cases that start being skipped while generating.
sweep --out "$TEST_TMPDIR/functions" --sources opinfo,modules,nn --ops "$ops" |
  tee "$TEST_TMPDIR/functions.txt"
grep -qx "33 cases: 33 passed, 0 failed, 0 crashed, 0 refused" "$TEST_TMPDIR/functions.txt"
sweep --out "$TEST_TMPDIR/in_place" --sources inplace,noncontiguous --ops index_put |
  tee "$TEST_TMPDIR/in_place.txt"
grep -qx "4 cases: 4 passed, 0 failed, 0 crashed, 0 refused" "$TEST_TMPDIR/in_place.txt"
