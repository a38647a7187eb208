#!/usr/bin/env bash
# Runs on the lent GPU machine (carry .carry, made by tools/device/bundle.sh):
#   device run: command="tools/device/moments8_check.sh", carry=[".carry"]
# 8-bit moments end to end: the kernel and GPU model tests (kernels_check.sh), the host
# AdamW's rate beside a triad on this host's cores (host_adamw_bench), the PyTorch
# baseline's script on the tiny model (eager and compiled, a smoke run), then the 7B in a
# 24 GiB GPU budget, layer-major over 4 x 8 micro-batches with 8-bit moments stepped on the
# host (run_bench.sh, no PyTorch rows). SKIP_TESTS=1 skips the tests; TRAIN_FLAGS adds flags
# to the 7B run. Logs in $OUT.
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-/tmp/tierd-out}"; mkdir -p "$out"
export LD_LIBRARY_PATH="$PWD/.carry/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
status=0
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  tools/device/kernels_check.sh > "$out/kernels_check.log" 2>&1; status=$?
  grep -E '^\[  (PASSED|FAILED) |^\[  FAILED  \]|tests? ran' "$out/kernels_check.log" | head -20
fi
echo "== host AdamW"
.carry/bin/host_adamw_bench 2>&1 | tee "$out/host_adamw_bench.log"
echo "== torch baseline smoke (tiny)"
corpus=/tmp/tierd-bench-corpus; mkdir -p "$corpus"
py_lib=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')
find "$py_lib" -maxdepth 1 -name '*.py' | sort | xargs cat > "$corpus/stdlib.txt"
for flags in "" "--compile --timing_skip=2" "--checkpointing"; do
  python3 tools/bench/torch_baseline.py --model_size=tiny --batch_size=2 --seq_len=128 --steps=4 --timing_skip=1 \
    --data="$corpus/stdlib.txt" $flags 2>&1 | tail -n 1
done
echo "== 7B layer-major, 8-bit moments on the host"
OUT="$out" MODELS=7b TORCH=0 NONE=0 BUDGETS=24GiB BATCH=4 STEPS="${STEPS:-4}" SKIP=1 \
  OURS_FLAGS="--grad_accum_steps=8 --grad_checkpointing --step_order=layer --opt=adamw8bit ${TRAIN_FLAGS:-}" \
  tools/bench/run_bench.sh 2>&1 | tail -n 12
exit $status
