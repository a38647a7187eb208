#!/usr/bin/env bash
# Runs on the lent GPU machine from the repository root, with .carry/ (made by
# tools/device/bundle.sh) carried along:
#   device run: command="tools/device/gpu_check.sh", carry=[".carry"]
# 1. gpu_ipc_check: the CUDA GPU tier end to end (two processes, IPC pool + events, mover).
# 2. tierbench: the mover vs the raw ceiling on every link (table for docs/BENCHMARKS.md).
# 3. the allocator benchmark.
# Logs go to $OUT (when set) as well as stdout.
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-/tmp/tierd-out}"
mkdir -p "$out"
export LD_LIBRARY_PATH="$PWD/.carry/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
nvme_dir="${NVME_DIR:-/var/tmp/tierd-nvme}"
mkdir -p "$nvme_dir"
echo "== machine"; nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
df -h "$nvme_dir" | tail -1; free -g | head -2; echo "memlock: $(ulimit -l)"
status=0
echo "== gpu_ipc_check"
.carry/bin/gpu_ipc_check --nvme_dir="$nvme_dir" 2>&1 | tee "$out/gpu_ipc_check.log" || status=1
echo "== tierbench"
.carry/bin/tierbench --gpu=cuda --bytes="${BENCH_BYTES:-4GiB}" --transfer_bytes="${TRANSFER_BYTES:-256MiB}" \
  --repeats="${REPEATS:-3}" --nvme_dir="$nvme_dir" ${TIERBENCH_FLAGS:-} 2>&1 | tee "$out/tierbench.log" || status=1
echo "== offset_allocator_bench"
.carry/bin/offset_allocator_bench --benchmark_min_time=1 2>&1 | tee "$out/allocator_bench.log" | grep BM_ || status=1
exit $status
