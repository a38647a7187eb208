#!/usr/bin/env bash
# Runs on the lent GPU machine (carry .carry and .whl):
#   device run: command="tools/device/kernel_gap_check.sh", carry=[".carry", ".whl"]
# Where our kernels stand against PyTorch's best (issue 43), in one call:
#   1. the GEMM plans' tests (a timed search leaves accumulated outputs alone; the disk cache
#      gives the same bits), then fp8_gemm_bench: heuristic first choice against the fastest
#      of 8 candidates, side by side, at the trainer's layer shapes;
#   2. MODEL (default 1.3b) in a 24 GiB budget, fp8 + 8-bit AdamW (BENCHMARKS row C's flags),
#      profiled: torchao float8 + torch.compile, ours with cuBLASLt's first choice, ours with
#      --gemm_candidates=8; each run's GPU time and TFLOP/s by kernel class in one table.
# At most 8 files in $OUT (the device returns no more).
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-/tmp/tierd-out}"; mkdir -p "$out"
work=/tmp/kernel-gap; rm -rf "$work"; mkdir -p "$work"
export LD_LIBRARY_PATH="$PWD/.carry/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
model="${MODEL:-1.3b}"
echo "== machine: $(nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader)"
.carry/bin/gpu_ops_test --gtest_filter='*Gemm*:*Matmul*' > "$out/gemm_tests.log" 2>&1; status=$?
tail -n 3 "$out/gemm_tests.log"
.carry/bin/fp8_gemm_bench > "$out/fp8_gemm_bench.log" 2>&1 || status=1
tail -n 30 "$out/fp8_gemm_bench.log"
flags="--grad_accum_steps=4 --step_order=micro --opt=adamw8bit --precision=fp8"
common="MODELS=$model NONE=0 BUDGETS=24GiB BATCH=2 STEPS=${STEPS:-7} SKIP=3 TIERD_DRAM=32GiB"
env OUT="$work/first" $common TORCH=1 TORCH_RUNS=float8 TORCH_BATCH=8 TIERD_RUN_FLAGS="$flags" \
  tools/bench/run_bench.sh > "$out/bench-first.txt" 2>&1 || status=1
env OUT="$work/searched" $common TORCH=0 TIERD_RUN_FLAGS="$flags --gemm_candidates=8 --gemm_cache_dir=$work/cache" \
  tools/bench/run_bench.sh > "$out/bench-searched.txt" 2>&1 || status=1
cp "$work/first/ours-$model-tierd-24GiB.log" "$out/ours-first.log"
cp "$work/searched/ours-$model-tierd-24GiB.log" "$out/ours-searched.log"
cp "$work/first/torch-$model-float8.log" "$out/torch-float8.log"
sed -n '/== table/,$p' "$out/bench-first.txt"; sed -n '/== table/,$p' "$out/bench-searched.txt"
exit $status
