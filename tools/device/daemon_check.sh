#!/usr/bin/env bash
# Runs on the lent GPU machine (after tools/device/bundle.sh here, with .carry carried):
#   device run: command="tools/device/daemon_check.sh", carry=[".carry"]
# 1. tierd on the real GPU; two gpu_client_worker processes lease GPU tensors, write them
#    with kernels, are evicted to DRAM/NVMe by small quotas and fetch them back, verified.
#    The second releases right after queuing slow kernels (no sync): CUDA IPC events order it.
# 2. hotpath_bench: acquire/release latency, ring vs gRPC, 4 client processes (GPU place).
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-/tmp/tierd-out}"
mkdir -p "$out" /var/tmp/tierd-nvme
export LD_LIBRARY_PATH="$PWD/.carry/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
bin=.carry/bin
dir=/tmp/tierd-gpu
status=0
echo "== tierd on the GPU, two client processes"
$bin/tierd --gpu=cuda --gpu_bytes=4GiB --dram_bytes=8GiB --nvme_dir=/var/tmp/tierd-nvme \
  --nvme_bytes=8GiB --runtime_dir=$dir > "$out/tierd.log" 2>&1 &
tierd_pid=$!
for _ in $(seq 100); do [ -S $dir/tierd.grpc.sock ] && break; sleep 0.1; done
cat "$out/tierd.log"
$bin/gpu_client_worker $dir 1 > "$out/worker1.log" 2>&1 & w1=$!
$bin/gpu_client_worker $dir 2 async > "$out/worker2.log" 2>&1 & w2=$!
wait $w1 || status=1
wait $w2 || status=1
cat "$out/worker1.log" "$out/worker2.log"
if $bin/gpu_client_worker $dir 3 unsafe > "$out/control.log" 2>&1; then
  echo "control: releasing with no event and no sync went unnoticed (the race was not exercised)"; status=1
else
  echo "control: releasing with no event and no sync came back wrong, as it must: $(tail -1 "$out/control.log")"
fi
$bin/tierctl --runtime_dir=$dir stats
kill -TERM $tierd_pid; wait $tierd_pid || status=1
tail -2 "$out/tierd.log"
echo "== hotpath_bench"
$bin/hotpath_bench --tierd=$bin/tierd --gpu=cuda --clients=4 --pairs=20000 2>&1 | grep -v '^tierd:' | tee "$out/hotpath.log" || status=1
$bin/hotpath_bench --tierd=$bin/tierd --gpu=fake --clients=4 --pairs=20000 2>&1 | grep -v '^tierd:' | tee -a "$out/hotpath.log" || status=1
exit $status
