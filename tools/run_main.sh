#!/usr/bin/env bash
# The main job: installs what is missing, builds (optimised), and runs tierbench, the
# storage engine's benchmark, on its embedded defaults. Extra arguments go to tierbench
# (try --help). Uses the CUDA GPU if one is usable, the fake GPU otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install_deps.sh
source tools/bazel_env.sh
echo "== building tierbench (bazel build -c opt //tools/tierbench)"
bazel build "${TIERD_BAZEL_FLAGS[@]}" -c opt //tools/tierbench 2>&1 | grep -E '^(ERROR|FAIL)' || true
[ -x bazel-bin/tools/tierbench/tierbench ] || { echo "build failed: rerun with bazel build -c opt //tools/tierbench"; exit 1; }
echo "== running tierbench $*"
exec bazel-bin/tools/tierbench/tierbench "$@"
