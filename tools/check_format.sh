#!/usr/bin/env bash
# Checks that every C++ file in git is formatted as .clang-format says (Google style,
# 100 columns), with the clang-format that tools/bazelw installs (Debian's clang-format-14;
# another version may format differently). Exits 1 listing the files that are not.
#
#   tools/check_format.sh          check
#   tools/check_format.sh --fix    format them in place
set -euo pipefail
cd "$(dirname "$0")/.."

format=clang-format-14
command -v "$format" >/dev/null || {
  echo "tools/check_format.sh: $format is missing; run tools/bazelw once to install it" >&2
  exit 1
}
mapfile -t files < <(git ls-files '*.cc' '*.h')
if [[ "${1:-}" == "--fix" ]]; then
  "$format" -i "${files[@]}"
  exit 0
fi
unformatted=()
for file in "${files[@]}"; do
  "$format" --dry-run -Werror "$file" >/dev/null 2>&1 || unformatted+=("$file")
done
if ((${#unformatted[@]} > 0)); then
  echo "tools/check_format.sh: ${#unformatted[@]} file(s) not formatted: ${unformatted[*]}"
  echo "tools/check_format.sh: run tools/check_format.sh --fix and commit the result"
  exit 1
fi
echo "tools/check_format.sh: ${#files[@]} C++ files formatted"
