#!/usr/bin/env bash
# tools/bazelw run //tools:python -- SCRIPT.py [ARGS]: runs Debian's /usr/bin/python3 on
# SCRIPT.py from the caller's directory, with `import torchlens_cpp` working (the package
# built by Bazel, from this target's runfiles). With no arguments, an interactive session.
set -euo pipefail
runfiles="${RUNFILES_DIR:-$0.runfiles}"
package="$runfiles/torchlens/torchlens_dispatch/python"
if [[ ! -f "$package/torchlens_cpp/__init__.py" ]]; then
  echo "tools/python: torchlens_cpp is missing from $runfiles; run through 'tools/bazelw run //tools:python -- SCRIPT.py'" >&2
  exit 2
fi
export PYTHONPATH="$package${PYTHONPATH:+:$PYTHONPATH}"
cd "${BUILD_WORKING_DIRECTORY:-.}"
exec /usr/bin/python3 "$@"
