// The CUDA driver's virtual-memory API (cuMemCreate and friends), reached through the
// runtime's entry-point lookup so nothing links libcuda directly; shared by the daemon's GPU
// (cuda_gpu.cc: creating and exporting regions) and a client's import of one (ipc/gpu_import).
// Only built with a CUDA toolkit.
#ifndef TIERD_RUNTIME_CUDA_VMM_H_
#define TIERD_RUNTIME_CUDA_VMM_H_

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tierd::cuda {

// The driver's virtual-memory API (cuMemCreate and friends), reached through the runtime's
// entry-point lookup so nothing links libcuda directly.
struct Vmm {
  CUresult (*create)(CUmemGenericAllocationHandle*, size_t, const CUmemAllocationProp*, unsigned long long) = nullptr;
  CUresult (*release)(CUmemGenericAllocationHandle) = nullptr;
  CUresult (*reserve)(CUdeviceptr*, size_t, size_t, CUdeviceptr, unsigned long long) = nullptr;
  CUresult (*free_address)(CUdeviceptr, size_t) = nullptr;
  CUresult (*map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long) = nullptr;
  CUresult (*unmap)(CUdeviceptr, size_t) = nullptr;
  CUresult (*set_access)(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t) = nullptr;
  CUresult (*export_handle)(void*, CUmemGenericAllocationHandle, CUmemAllocationHandleType, unsigned long long) = nullptr;
  CUresult (*import_handle)(CUmemGenericAllocationHandle*, void*, CUmemAllocationHandleType) = nullptr;
  CUresult (*granularity)(size_t*, const CUmemAllocationProp*, CUmemAllocationGranularity_flags) = nullptr;
};

// FAILED_PRECONDITION naming the entry point a driver older than CUDA 12 lacks.
absl::StatusOr<const Vmm*> GetVmm();

absl::Status CudaError(cudaError_t error, const char* what);
absl::Status DriverError(CUresult result, const char* what);

// Reserves an address range for `bytes` (a multiple of the granularity), maps `handle` there
// and gives `device` read-write access. On failure nothing stays reserved or mapped.
absl::StatusOr<CUdeviceptr> MapHandle(const Vmm& vmm, CUmemGenericAllocationHandle handle, uint64_t bytes,
                                      int device);

}  // namespace tierd::cuda

#define TIERD_CUDA_RETURN_IF_ERROR(call)                          \
  do {                                                            \
    const cudaError_t tierd_cuda_error_ = (call);                 \
    if (tierd_cuda_error_ != cudaSuccess) return ::tierd::cuda::CudaError(tierd_cuda_error_, #call); \
  } while (0)

#define TIERD_CU_RETURN_IF_ERROR(call)                                          \
  do {                                                                          \
    const CUresult tierd_cu_result_ = (call);                                   \
    if (tierd_cu_result_ != CUDA_SUCCESS) return ::tierd::cuda::DriverError(tierd_cu_result_, #call); \
  } while (0)

#endif  // TIERD_RUNTIME_CUDA_VMM_H_
