#include "runtime/gpu_factory.h"

#ifdef TIERD_HAVE_CUDA
#include "runtime/cuda_gpu.h"
#endif

namespace tierd {

bool BuiltWithCuda() {
#ifdef TIERD_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

absl::StatusOr<OpenedGpu> OpenGpu(const GpuOptions& options) {
  OpenedGpu opened;
  if (options.choice == GpuChoice::kFake) {
    opened.device = CreateFakeGpu(options.fake);
    opened.fallback_reason = "the fake GPU was asked for";
    return opened;
  }
#ifdef TIERD_HAVE_CUDA
  auto cuda = CreateCudaGpu(options.device_ordinal);
  if (cuda.ok()) {
    opened.device = std::move(*cuda);
    return opened;
  }
  if (options.choice == GpuChoice::kCuda) return cuda.status();
  opened.fallback_reason = std::string(cuda.status().message());
#else
  if (options.choice == GpuChoice::kCuda) {
    return absl::NotFoundError("a CUDA GPU was asked for, but this build has no CUDA support "
                               "(no CUDA toolkit when it was built)");
  }
  opened.fallback_reason = "built without the CUDA toolkit";
#endif
  opened.device = CreateFakeGpu(options.fake);
  return opened;
}

}  // namespace tierd
