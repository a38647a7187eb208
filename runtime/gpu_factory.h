// OpenGpu: the real CUDA GPU when one is usable, otherwise the fake GPU, with the
// reason. Built CPU-only (no CUDA toolkit), it always returns the fake GPU.
#ifndef TIERD_RUNTIME_GPU_FACTORY_H_
#define TIERD_RUNTIME_GPU_FACTORY_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "runtime/fake_gpu.h"
#include "runtime/gpu_device.h"

namespace tierd {

enum class GpuChoice { kAuto, kCuda, kFake };

struct GpuOptions {
  GpuChoice choice = GpuChoice::kAuto;
  int device_ordinal = 0;
  FakeGpuOptions fake;  // used when the fake GPU is chosen or fallen back to
};

struct OpenedGpu {
  std::unique_ptr<GpuDevice> device;
  // Why the fake GPU stands in, when it does ("built without CUDA", "no CUDA device: ...").
  std::string fallback_reason;
};

// kCuda fails (NOT_FOUND) instead of falling back; kFake never touches CUDA.
absl::StatusOr<OpenedGpu> OpenGpu(const GpuOptions& options);

// True if this binary was built with the CUDA toolkit.
bool BuiltWithCuda();

}  // namespace tierd

#endif  // TIERD_RUNTIME_GPU_FACTORY_H_
