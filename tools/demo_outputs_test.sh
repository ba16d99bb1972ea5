#!/usr/bin/env bash
# What the README shows a new user is what the tool gives today: the first session's
# summary (README "A first session", the fenced block after "prints the summary:") and the
# bundled model's picture (testdata/demo_graph.png). Both come from the bundled model on
# its fixed input, and Graphviz draws the same bytes for the same graph.
# To refresh them after a change that alters either:
#   tools/bazelw run //tools:torchlens -- --render "$PWD/testdata/demo_graph.png"
#   tools/bazelw run //tools:torchlens    (and paste the summary into the README)
set -uo pipefail
failures=0

./tools/torchlens >"$TEST_TMPDIR/summary" 2>"$TEST_TMPDIR/err" &&
  ./tools/torchlens --render "$TEST_TMPDIR/demo_graph.png" >/dev/null 2>>"$TEST_TMPDIR/err" ||
  { echo "FAIL: torchlens failed: $(cat "$TEST_TMPDIR/err")"; exit 1; }

if ! cmp -s "$TEST_TMPDIR/demo_graph.png" testdata/demo_graph.png; then
  echo "FAIL: testdata/demo_graph.png is not what --render draws today; regenerate it with"
  echo "  tools/bazelw run //tools:torchlens -- --render \"\$PWD/testdata/demo_graph.png\""
  failures=$((failures + 1))
fi

# The README's block, with its first line's elided path, against the tool's summary.
awk '/prints the summary:/ {found = 1; next}
     found && /^```/ {if (inside) exit; inside = 1; next}
     inside {print}' README.md >"$TEST_TMPDIR/readme_summary"
sed -e '1s|^torchlens trace of .*testdata/demo.pt$|torchlens trace of .../torchlens.runfiles/torchlens/testdata/demo.pt|' \
  "$TEST_TMPDIR/summary" >"$TEST_TMPDIR/tool_summary"
if [[ ! -s "$TEST_TMPDIR/readme_summary" ]]; then
  echo "FAIL: README.md has no fenced block after 'prints the summary:'"
  failures=$((failures + 1))
elif ! diff -u "$TEST_TMPDIR/readme_summary" "$TEST_TMPDIR/tool_summary"; then
  echo "FAIL: README's first session shows another summary than the tool prints (diff above:"
  echo "  - README, + tool); paste the output of tools/bazelw run //tools:torchlens"
  failures=$((failures + 1))
fi

[[ $failures -eq 0 ]] && echo "README's summary and testdata/demo_graph.png match the tool"
exit $((failures > 0))
