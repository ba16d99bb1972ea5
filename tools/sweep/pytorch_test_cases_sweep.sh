#!/usr/bin/env bash
# The whole sweep over PyTorch's own test cases (tools/sweep/pytorch_test_cases.py), one
# shard per Bazel shard (TEST_SHARD_INDEX of TEST_TOTAL_SHARDS): every shard takes the ops
# and modules whose names hash to it, and must pass every case it builds. Spread over the
# local cores or a remote-execution cluster; about 28 minutes of one core in all.
set -euo pipefail
index=${TEST_SHARD_INDEX:-0}
total=${TEST_TOTAL_SHARDS:-1}
[[ -n "${TEST_SHARD_STATUS_FILE:-}" ]] && touch "$TEST_SHARD_STATUS_FILE"
out="${TEST_UNDECLARED_OUTPUTS_DIR:-$TEST_TMPDIR}/sweep"
/usr/bin/python3 tools/sweep/pytorch_test_cases.py --cli tools/torchlens --out "$out" \
    --shard "$index/$total" | tee "$TEST_TMPDIR/summary.txt"
# Exit status 0 already means every case passed; the line says how many there were.
grep -E "^[0-9]+ cases: [0-9]+ passed, 0 failed, 0 crashed, 0 refused$" "$TEST_TMPDIR/summary.txt"
