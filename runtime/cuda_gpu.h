// The real GPU: CUDA runtime API. Only built when the CUDA toolkit is present
// (TIERD_HAVE_CUDA); callers reach it through OpenGpu() in gpu_factory.h. A client maps a
// region this exports through ipc/gpu_import.h.
//
// Each GPU region (a session's arena) is one physical allocation of the driver's
// virtual-memory API (cuMemCreate) with the POSIX-fd handle type, so that another process
// can import exactly this allocation (and nothing else of the daemon's) and map it; copies
// run on non-blocking streams, one per direction, which the driver places on separate
// copy engines.
#ifndef TIERD_RUNTIME_CUDA_GPU_H_
#define TIERD_RUNTIME_CUDA_GPU_H_

#include <memory>

#include "absl/status/statusor.h"
#include "runtime/gpu_device.h"

namespace tierd {

// NOT_FOUND when there is no usable CUDA device (no driver, no GPU); the message
// carries the CUDA error so the caller can say why it fell back to the fake GPU.
absl::StatusOr<std::unique_ptr<GpuDevice>> CreateCudaGpu(int device_ordinal);

}  // namespace tierd

#endif  // TIERD_RUNTIME_CUDA_GPU_H_
