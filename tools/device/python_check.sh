#!/usr/bin/env bash
# Runs on the lent GPU machine: the tierd Python package there (issue 44), carry .carry after
#   tools/python/bundle_python.sh   (the extension for the device's Python 3.12, tierd, their libraries)
#   device run: command="tools/device/python_check.sh", carry=[".carry"]
# 1. the package's tests with tierd on the real GPU (TIERD_TEST_GPU=cuda): the client, and
#    OffloadOptimizer with its GPU case (CUDA parameters against torch's AdamW);
# 2. tools/bench/offload_optimizer_bench.py: the same loop with PyTorch's fused AdamW and with
#    OffloadOptimizer, side by side (MODEL, BATCH, VARIANTS, ACCUM, HF, BENCH_FLAGS); BENCH2_FLAGS: a
#    second run of it with those flags. SKIP_TESTS=1: the benchmarks only; BENCH=0: not the first. AFTER: a command run
#    last, with the daemon stopped (a peer's run in the same call). With .carry/bin/parallel_bench
#    (BUNDLE_TARGETS), first the host thread pool against threads started per call (HOST_BENCH=0: not).
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-/tmp/tierd-out}"; mkdir -p "$out"
export LD_LIBRARY_PATH="$PWD/.carry/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
status=0
echo "== machine: $(nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader); $(python3 --version);" \
  "$(python3 -c 'import torch, transformers; print("torch", torch.__version__, "transformers", transformers.__version__)' 2>&1 | tail -n 1)"
for t in $([ "${SKIP_TESTS:-0}" = 1 ] || echo client_test offload_optimizer_test offload_test); do
  TEST_TMPDIR=$(mktemp -d) XML_OUTPUT_FILE="$out/$t.xml" TIERD_TEST_GPU=cuda \
    python/run_python_test.sh python3 "python/$t.py" .carry/bin/tierd .carry/python/_tierd.so > "$out/$t.log" 2>&1 || status=1
  tail -n 4 "$out/$t.log"
  # A failure's traceback in the call's own output (the logs come back too, but a glance should do).
  grep -E -A 14 "^(FAIL|ERROR): " "$out/$t.log" | head -n 80
done
if [ -x .carry/bin/parallel_bench ] && [ "${HOST_BENCH:-1}" = 1 ]; then  # the host step's thread pool, side by side
  .carry/bin/parallel_bench 2>&1 | tee "$out/parallel_bench.log"
fi
runtime=/tmp/tierd-pybench; rm -rf "$runtime" /var/tmp/tierd-pybench-nvme; mkdir -p /var/tmp/tierd-pybench-nvme
.carry/bin/tierd --gpu=cuda --gpu_bytes="${TIERD_GPU:-2GiB}" --dram_bytes="${TIERD_DRAM:-72GiB}" --nvme_dir=/var/tmp/tierd-pybench-nvme \
  --nvme_bytes=8GiB --runtime_dir="$runtime" > "$out/tierd-bench.log" 2>&1 &
pid=$!
for _ in $(seq 300); do [ -S "$runtime/tierd.grpc.sock" ] && break; sleep 0.1; done
site=$(mktemp -d); mkdir -p "$site/tierd"; cp python/tierd/*.py "$site/tierd/"; cp .carry/python/_tierd.so "$site/tierd/"
if [ "${BENCH:-1}" = 1 ]; then
  PYTHONPATH="$site" TIERD_DIR="$runtime" python3 tools/bench/offload_optimizer_bench.py --model_size="${MODEL:-1.3b}" \
    --batch_size="${BATCH:-8}" --variants="${VARIANTS:-adamw:clip}" --grad_accum="${ACCUM:-1}" ${HF:+--hf} \
    --dram="${BENCH_DRAM:-64GiB}" ${BENCH_FLAGS:-} 2>&1 | tee "$out/bench.log" || status=1
fi
if [ -n "${BENCH2_FLAGS:-}" ]; then  # a second run in the same call (e.g. 7B offloaded, ours only)
  PYTHONPATH="$site" TIERD_DIR="$runtime" python3 tools/bench/offload_optimizer_bench.py $BENCH2_FLAGS 2>&1 |
    tee "$out/bench2.log" || status=1
fi
kill -TERM $pid; wait $pid
if [ -n "${AFTER:-}" ]; then bash -c "$AFTER" || status=1; fi
exit $status
