# Sourced by the README's commands: common Bazel flags. A disk cache outside the clone
# makes repeated builds (CI on the same machine, a second clone) fast.
TIERD_BAZEL_DISK_CACHE="${TIERD_BAZEL_DISK_CACHE:-$HOME/.cache/tierd/bazel-disk}"
mkdir -p "$TIERD_BAZEL_DISK_CACHE"
TIERD_BAZEL_FLAGS=(--disk_cache="$TIERD_BAZEL_DISK_CACHE")
if [ -n "${CI:-}" ]; then
  TIERD_BAZEL_FLAGS+=(--curses=no --color=no --show_progress_rate_limit=30)
fi
# Say once whether this is a CUDA or a CPU-only build.
tierd_cuda_path="${TIERD_CUDA_PATH:-/usr/local/cuda}"
if [ ! -x "$tierd_cuda_path/bin/nvcc" ]; then
  echo "tierd: no CUDA toolkit at $tierd_cuda_path: building CPU-only; the fake GPU stands in for the GPU tier."
fi
