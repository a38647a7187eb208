#!/usr/bin/env bash
# Runs on the lent GPU machine (carry .carry and .whl):
#   device run: command="tools/device/kernel_gap_check.sh", carry=[".carry", ".whl"]
# Where our kernels stand against PyTorch's best (issue 43), in one call, MODEL (default
# 1.3b) in a 24 GiB budget, fp8 + 8-bit AdamW (BENCHMARKS row C's flags), cuDNN on the
# library path (tools/device/cudnn_env.sh: --attention=auto takes cuDNN's fused attention):
#   1. the headline, unprofiled: torchao float8 + torch.compile against ours;
#   2. profiled, each run's GPU time and TFLOP/s by kernel class in one table: torchao float8 +
#      compile, ours (cuDNN's attention), ours with our own attention (--attention=ours);
#   GEMM=1 first runs the GEMM plans' tests and fp8_gemm_bench (cuBLASLt's first choice against
#   the fastest of 8 candidates).
# At most 8 files in $OUT (the device returns no more).
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-/tmp/tierd-out}"; mkdir -p "$out"
work=/tmp/kernel-gap; rm -rf "$work"; mkdir -p "$work"
export LD_LIBRARY_PATH="$PWD/.carry/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
source tools/device/cudnn_env.sh
model="${MODEL:-1.3b}"; status=0
echo "== machine: $(nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader)"
if [ "${GEMM:-0}" = 1 ]; then
  .carry/bin/gpu_ops_test --gtest_filter='*Gemm*:*Matmul*' > "$out/gemm_tests.log" 2>&1 || status=1
  tail -n 3 "$out/gemm_tests.log"
  .carry/bin/fp8_gemm_bench > "$out/fp8_gemm_bench.log" 2>&1 || status=1
  tail -n 30 "$out/fp8_gemm_bench.log"
fi
flags="--grad_accum_steps=4 --step_order=micro --opt=adamw8bit --precision=fp8"
common="MODELS=$model NONE=0 BUDGETS=24GiB BATCH=2 STEPS=${STEPS:-8} SKIP=3 TIERD_DRAM=32GiB"
env OUT="$work/headline" $common PROFILE=0 TORCH=1 TORCH_RUNS=float8 TORCH_BATCH=8 TIERD_RUN_FLAGS="$flags" \
  tools/bench/run_bench.sh > "$out/bench-headline.txt" 2>&1 || status=1
env OUT="$work/profiled" $common TORCH=1 TORCH_RUNS=float8 TORCH_BATCH=8 TIERD_RUN_FLAGS="$flags" \
  tools/bench/run_bench.sh > "$out/bench-profiled.txt" 2>&1 || status=1
env OUT="$work/ours-attention" $common TORCH=0 TIERD_RUN_FLAGS="$flags --attention=ours" \
  tools/bench/run_bench.sh > "$out/bench-ours-attention.txt" 2>&1 || status=1
cp "$work/headline/ours-$model-tierd-24GiB.log" "$out/ours-headline.log"
cp "$work/profiled/ours-$model-tierd-24GiB.log" "$out/ours-profiled.log"
for f in headline profiled ours-attention; do sed -n '/== table/,$p' "$out/bench-$f.txt"; done
grep -h '^attention:' "$work"/*/ours-*.log
exit $status
