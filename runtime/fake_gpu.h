// FakeGpu: a GpuDevice made of host memory, for machines without a GPU (CI, a user's
// laptop) and for deterministic tests. Copies run on one worker thread per stream, in
// order, like a copy engine; with link_bytes_per_second set, each copy takes at least
// bytes / bandwidth of the injected clock's time (the modelled PCIe link).
#ifndef TIERD_RUNTIME_FAKE_GPU_H_
#define TIERD_RUNTIME_FAKE_GPU_H_

#include <cstdint>
#include <memory>
#include <string>

#include "base/clock.h"
#include "runtime/gpu_device.h"

namespace tierd {

struct FakeGpuOptions {
  // The "device memory" the fake reports; regions are lazily backed host memory.
  uint64_t memory_bytes = uint64_t{24} << 30;
  // Modelled link speed per direction; 0 = as fast as memcpy.
  double link_bytes_per_second = 0;
  // Modelled speed of a copy within the device (which, beside a client's kernels, waits for
  // SMs); 0 = as fast as memcpy.
  double within_bytes_per_second = 0;
  Clock* clock = nullptr;  // RealClock() when null
};

std::unique_ptr<GpuDevice> CreateFakeGpu(const FakeGpuOptions& options);

}  // namespace tierd

#endif  // TIERD_RUNTIME_FAKE_GPU_H_
