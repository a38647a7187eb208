// In a client process: map the GPU region tierd exported for its session (one cuMemCreate
// allocation passed as a POSIX fd over the hello socket, runtime/cuda_gpu.h) into this
// process. Only built with a CUDA toolkit: a client without one cannot map a real GPU's region
// and says so (clients/client.cc).
#ifndef TIERD_IPC_GPU_IMPORT_H_
#define TIERD_IPC_GPU_IMPORT_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "runtime/gpu_device.h"

namespace tierd {

// Maps a region exported by GpuRegion::Export(). Takes ownership of exported.pool_fd.
// Returns the device address of the region in this process. The mapping lives until
// ReleaseImportedGpuRegion (or process exit).
absl::StatusOr<void*> ImportGpuRegion(int device_ordinal, const GpuRegionExport& exported);
absl::Status ReleaseImportedGpuRegion(void* address);

}  // namespace tierd

#endif  // TIERD_IPC_GPU_IMPORT_H_
