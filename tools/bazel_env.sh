# Sourced by the README's commands: common Bazel flags. A disk cache outside the clone
# makes repeated builds (CI on the same machine, a second clone) fast.
TIERD_BAZEL_DISK_CACHE="${TIERD_BAZEL_DISK_CACHE:-$HOME/.cache/tierd/bazel-disk}"
mkdir -p "$TIERD_BAZEL_DISK_CACHE"
TIERD_BAZEL_FLAGS=(--disk_cache="$TIERD_BAZEL_DISK_CACHE")
if [ -n "${CI:-}" ]; then
  TIERD_BAZEL_FLAGS+=(--curses=no --color=no --show_progress_rate_limit=30)
fi
# Without a CUDA toolkit, @local_cuda (tools/cuda_configure.bzl) says once, during the
# build, that it is CPU-only and the fake GPU stands in.
