#!/usr/bin/env bash
# The main job: installs what is missing, builds (optimised), then tools/main_job.sh runs it:
# tierd with small budgets and the reference trainer with every tensor leased from it, on
# the GPU when a usable one is there (a model larger than its GPU budget), else the tiny
# model on the CPU through NVMe; progress, a summary, a plot. Extra arguments go to
# tierd-train (try --help), e.g. tools/run_main.sh --steps=500.
# TIERD_MAIN=tierbench runs the storage engine's benchmark instead.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install_deps.sh
source tools/bazel_env.sh
if [ "${TIERD_MAIN:-train}" = tierbench ]; then
  bazel build "${TIERD_BAZEL_FLAGS[@]}" -c opt //tools/tierbench 2>&1 | grep -E '^(ERROR|FAIL)' || true
  exec bazel-bin/tools/tierbench/tierbench "$@"
fi
echo "== building tierd and tierd-train (bazel build -c opt //server:tierd //trainer_ref:tierd-train //tools/tierctl)"
bazel build "${TIERD_BAZEL_FLAGS[@]}" -c opt //server:tierd //trainer_ref:tierd-train //tools/tierctl 2>&1 \
  | grep -E '^(ERROR|FAIL)|CPU-only' || true
for b in bazel-bin/server/tierd bazel-bin/trainer_ref/tierd-train bazel-bin/tools/tierctl/tierctl; do
  [ -x "$b" ] || { echo "build failed: rerun bazel build -c opt //server:tierd //trainer_ref:tierd-train //tools/tierctl"; exit 1; }
done
exec tools/main_job.sh bazel-bin "$@"
