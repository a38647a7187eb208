#!/usr/bin/env bash
# The main job: installs what is missing, builds (optimised), starts tierd with small
# budgets, trains the reference model (tiny) on the embedded corpus with every parameter,
# gradient, Adam moment and saved activation leased from tierd, its step registered with
# tierd's planner (a DRAM quota smaller than the model's state,
# so tensors move through NVMe), prints progress and a summary, and stops tierd cleanly.
# Extra arguments go to tierd-train (try --help), e.g. tools/run_main.sh --steps=500.
# TIERD_MAIN=tierbench runs the storage engine's benchmark instead.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/install_deps.sh
source tools/bazel_env.sh
if [ "${TIERD_MAIN:-train}" = tierbench ]; then
  bazel build "${TIERD_BAZEL_FLAGS[@]}" -c opt //tools/tierbench 2>&1 | grep -E '^(ERROR|FAIL)' || true
  exec bazel-bin/tools/tierbench/tierbench "$@"
fi
echo "== building tierd and tierd-train (bazel build -c opt //runtime:tierd //trainer_ref:tierd-train)"
bazel build "${TIERD_BAZEL_FLAGS[@]}" -c opt //runtime:tierd //trainer_ref:tierd-train //tools/tierctl 2>&1 \
  | grep -E '^(ERROR|FAIL)' || true
for b in bazel-bin/runtime/tierd bazel-bin/trainer_ref/tierd-train; do
  [ -x "$b" ] || { echo "build failed: rerun bazel build -c opt //runtime:tierd //trainer_ref:tierd-train"; exit 1; }
done
work="${TMPDIR:-/tmp}/tierd-main-$$"
mkdir -p "$work/nvme"
echo "== starting tierd (fake GPU unless a CUDA GPU is usable; DRAM 64 MiB, NVMe 512 MiB under $work)"
bazel-bin/runtime/tierd --gpu_bytes=64MiB --dram_bytes=64MiB --nvme_dir="$work/nvme" --nvme_bytes=512MiB \
  --runtime_dir="$work/run" > "$work/tierd.log" 2>&1 &
tierd_pid=$!
stop() { kill -TERM "$tierd_pid" 2>/dev/null && wait "$tierd_pid" 2>/dev/null; rm -rf "$work"; }
trap stop EXIT
for _ in $(seq 100); do [ -S "$work/run/tierd.grpc.sock" ] && break; sleep 0.1; done
[ -S "$work/run/tierd.grpc.sock" ] || { cat "$work/tierd.log"; echo "tierd did not start"; exit 1; }
grep '^tierd:' "$work/tierd.log" | head -6
echo "== training (tierd-train --offload_policy=tierd --tierd_dram=4MiB $*)"
bazel-bin/trainer_ref/tierd-train --offload_policy=tierd --tierd_dir="$work/run" --tierd_dram=4MiB \
  --tierd_nvme=64MiB --steps=300 --eval_every=100 --metrics="${TIERD_METRICS:-/tmp/tierd-train-metrics.jsonl}" \
  --plot="${TIERD_PLOT:-/tmp/tierd-train.png}" "$@"
echo "== tierd after the run"
bazel-bin/tools/tierctl/tierctl --runtime_dir="$work/run" stats | head -20
echo "metrics: ${TIERD_METRICS:-/tmp/tierd-train-metrics.jsonl}; plot: ${TIERD_PLOT:-/tmp/tierd-train.png}"
