#!/usr/bin/env bash
# tools/bazelw run //tools:install_python: makes `import torchlens_cpp` work in any session
# of Debian's /usr/bin/python3 for this user, by copying the package Bazel built into the
# user's site-packages (python3 -m site --user-site). Run it again after updating torchlens.
# With --uninstall, removes that copy.
set -euo pipefail
runfiles="${RUNFILES_DIR:-$0.runfiles}"
package="$runfiles/torchlens/torchlens_dispatch/python/torchlens_cpp"
site=$(/usr/bin/python3 -m site --user-site)
if [[ "${1:-}" == "--uninstall" ]]; then
  rm -rf "$site/torchlens_cpp"
  echo "removed $site/torchlens_cpp"
  exit 0
fi
if [[ ! -f "$package/__init__.py" ]]; then
  echo "tools/install_python: the package is missing from $runfiles; run 'tools/bazelw run //tools:install_python'" >&2
  exit 2
fi
mkdir -p "$site"
rm -rf "$site/torchlens_cpp"
cp -rL "$package" "$site/torchlens_cpp"
chmod -R u+w "$site/torchlens_cpp"
echo "installed torchlens_cpp into $site; try: /usr/bin/python3 -c 'import torchlens_cpp'"
