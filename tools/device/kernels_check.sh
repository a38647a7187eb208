#!/usr/bin/env bash
# Runs on the lent GPU machine (carry .carry, made by tools/device/bundle.sh):
#   device run: command="tools/device/kernels_check.sh", carry=[".carry"]
# The reference trainer's CUDA kernels against the CPU reference on random data, the whole
# GPU model against the CPU model, and the GPU model trained through the real tierd.
# Logs go to $OUT (when set) as well as stdout.
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-/tmp/tierd-out}"
mkdir -p "$out"
export LD_LIBRARY_PATH="$PWD/.carry/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
echo "== machine"; nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
# A bundle of only some targets (BUNDLE_TARGETS) may lack a test: say so (its run below fails).
for t in gpu_ops_test fp8_ops_test gpu_model_test gpu_trainer_tierd_test tierd; do
  [ -x ".carry/bin/$t" ] || echo "== NOT RUN: .carry/bin/$t is not in the bundle (tools/device/bundle.sh's BUNDLE_TARGETS)"
done
echo "== gpu_ops_test"
.carry/bin/gpu_ops_test 2>&1 | tee "$out/gpu_ops_test.log"; status=${PIPESTATUS[0]}
echo "== fp8_ops_test"
.carry/bin/fp8_ops_test 2>&1 | tee "$out/fp8_ops_test.log"; status=$(( status | ${PIPESTATUS[0]} ))
echo "== gpu_model_test"
.carry/bin/gpu_model_test 2>&1 | tee "$out/gpu_model_test.log"; status=$(( status | ${PIPESTATUS[0]} ))
echo "== gpu_trainer_tierd_test"
mkdir -p /var/tmp/tierd-test
TIERD_BIN=.carry/bin/tierd TEST_TMPDIR=/var/tmp/tierd-test .carry/bin/gpu_trainer_tierd_test 2>&1 |
  tee "$out/gpu_trainer_tierd_test.log"
exit $(( status | ${PIPESTATUS[0]} ))
