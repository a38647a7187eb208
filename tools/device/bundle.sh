#!/usr/bin/env bash
# Builds the binaries that run on the lent GPU machine (-c opt, sm_89 + sm_90) and
# collects them, with the shared libraries that machine lacks (abseil, Google
# Benchmark, ...; glibc, libstdc++ and CUDA's own libraries are there), into .carry/.
# Then, with the device tool: run(command="tools/device/gpu_check.sh", carry=[".carry"]).
# BUNDLE_TARGETS="//server:tierd //trainer_ref:tierd-train" bundles only those: the device tool
# carries 64 MiB in all (the checkout's files included), and all of them with the Python
# extension (tools/python/bundle_python.sh, run after this) are more.
# OLD_REV=<commit>: also tierd as of that commit, as .carry/bin/tierd-old (built in a git
# worktree), for a side-by-side run against the daemon before a change (split_check.sh's
# RUNS="old@.carry/bin/tierd-old=...").
# BUNDLE_KPROF=1: tools/kernel_profile and CUPTI as well (below).
set -euo pipefail
cd "$(dirname "$0")/../.."
source tools/bazel_env.sh
targets=(//tools/tierbench //tools/gpu_check:gpu_ipc_check //tools/gpu_check:pin_bench //allocator:offset_allocator_bench
         //server:tierd //tools/tierctl //tools/hotpath_bench //tests:gpu_client_worker
         //tests:gpu_planned_worker //tools/planbench //trainer_ref/kernels:gpu_ops_test
         //trainer_ref/gpu:gpu_model_test //trainer_ref:tierd-train
         //tests:gpu_trainer_tierd_test //trainer_ref/kernels:cudnn_attention_test //trainer_ref:host_adamw_bench //trainer_ref:parallel_bench //trainer_ref/kernels:fp8_gemm_bench //trainer_ref/kernels:fp8_ops_test
         //trainer_ref/kernels:attention_bench //trainer_ref/kernels:elementwise_bench //comm:nccl_collectives_check //trainer_ref:adamw8bit_test)
[ -n "${BUNDLE_TARGETS:-}" ] && read -r -a targets <<< "$BUNDLE_TARGETS"
bazel build "${TIERD_BAZEL_FLAGS[@]}" -c opt "${targets[@]}"
rm -rf .carry
mkdir -p .carry/bin .carry/lib
for target in "${targets[@]}"; do
  path="bazel-bin/${target#//}"
  path="${path/://}"
  [ -f "$path" ] || path="$path/$(basename "$path")"
  cp -L "$path" .carry/bin/
done
if [ -n "${OLD_REV:-}" ]; then
  here=$PWD
  tree=$(mktemp -d /tmp/tierd-old.XXXXXX)
  git worktree add --detach "$tree" "$OLD_REV" >/dev/null
  (cd "$tree" && bazel build "${TIERD_BAZEL_FLAGS[@]}" -c opt //server:tierd &&
     cp -L bazel-bin/server/tierd "$here/.carry/bin/tierd-old" && bazel shutdown)
  git worktree remove --force "$tree"
  echo "tierd-old: //server:tierd at $(git rev-parse --short "$OLD_REV")"
fi
tools/collect_libs.sh .carry/lib .carry/bin/*
# BUNDLE_KPROF=1: the per-kernel profile too (tools/kernel_profile; split_check.sh's KPROF) and
# the CUPTI it opens (4 MiB of the 64 a call carries).
if [ "${BUNDLE_KPROF:-0}" = 1 ]; then
  bazel build "${TIERD_BAZEL_FLAGS[@]}" -c opt //tools/kernel_profile:libkernel_profile.so
  cp -L bazel-bin/tools/kernel_profile/libkernel_profile.so .carry/lib/
  for cupti in /usr/local/cuda/lib64/libcupti.so.13 /usr/local/cuda/extras/CUPTI/lib64/libcupti.so.13; do
    if [ -f "$cupti" ]; then cp -L "$cupti" .carry/lib/ && break; fi
  done
fi
du -sh .carry
echo "carry .carry; on the device: tools/device/gpu_check.sh"
