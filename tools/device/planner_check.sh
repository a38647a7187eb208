#!/usr/bin/env bash
# Runs on the lent GPU machine (after tools/device/bundle.sh here, with .carry carried):
#   device run: command="tools/device/planner_check.sh", carry=[".carry"]
# The planner on the real GPU, side by side in one call: a training-shaped client
# (gpu_planned_worker) against a fresh tierd, first fetching on demand (lru), then with its
# graph registered (plan). Every word is checked on the GPU; times are wall clock.
# TIERD_FLAGS: more flags for tierd (e.g. --planner_time_aware); MODES: which runs, in order
# (default "lru plan lru plan").
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-/tmp/tierd-out}"
mkdir -p "$out" /var/tmp/tierd-nvme
export LD_LIBRARY_PATH="$PWD/.carry/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
bin=.carry/bin
laps="${LAPS:-8}"
status=0
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
for mode in ${MODES:-lru plan lru plan}; do
  dir=/tmp/tierd-plan-$mode
  $bin/tierd --gpu=cuda --gpu_bytes=4GiB --dram_bytes=8GiB --nvme_dir=/var/tmp/tierd-nvme \
    --nvme_bytes=8GiB --runtime_dir=$dir ${TIERD_FLAGS:-} > "$out/tierd-$mode.log" 2>&1 &
  tierd_pid=$!
  for _ in $(seq 100); do [ -S $dir/tierd.grpc.sock ] && break; sleep 0.1; done
  echo "== $mode"
  # The session's plan as the daemon reports it, sampled while the worker runs (the last
  # sample is printed: measured waits by op next to the predicted stalls).
  ( while sleep 0.5; do
      $bin/tierctl --runtime_dir=$dir plan --session 1 > "$out/plan-$mode.next" 2>&1 && mv "$out/plan-$mode.next" "$out/plan-$mode.txt"
    done ) &
  sampler=$!
  $bin/gpu_planned_worker $dir "$laps" $mode 2>&1 | tee -a "$out/worker-$mode.log" || status=1
  kill $sampler 2>/dev/null; wait $sampler 2>/dev/null
  [ "$mode" = plan ] && [ -f "$out/plan-$mode.txt" ] && grep -E "^(predicted|observed|client waits|acquires)" "$out/plan-$mode.txt"
  $bin/tierctl --runtime_dir=$dir stats | grep -E "stall|prefetch|GPU->|DRAM->|NVMe" || true
  kill -TERM $tierd_pid; wait $tierd_pid || status=1
done
exit $status
