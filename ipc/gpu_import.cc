#include "ipc/gpu_import.h"

#include <unistd.h>

#include <cstring>
#include <map>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "runtime/cuda_vmm.h"

namespace tierd {

using cuda::DriverError;
using cuda::GetVmm;
using cuda::MapHandle;

namespace {
absl::Mutex imported_mutex;
// Imported regions: address -> mapped bytes (for the unmap).
std::map<CUdeviceptr, uint64_t>& Imported() ABSL_EXCLUSIVE_LOCKS_REQUIRED(imported_mutex) {
  static auto* imported = new std::map<CUdeviceptr, uint64_t>();
  return *imported;
}
}  // namespace

absl::StatusOr<void*> ImportGpuRegion(int device_ordinal, const GpuRegionExport& exported) {
  auto vmm = GetVmm();
  if (!vmm.ok()) {
    close(exported.pool_fd);
    return vmm.status();
  }
  TIERD_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_ordinal));
  uint64_t mapped = 0;
  std::memcpy(&mapped, exported.pointer_data.data(), sizeof(mapped));
  CUmemGenericAllocationHandle handle = 0;
  const CUresult imported = (*vmm)->import_handle(
      &handle, reinterpret_cast<void*>(static_cast<intptr_t>(exported.pool_fd)), CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  close(exported.pool_fd);
  if (imported != CUDA_SUCCESS) return DriverError(imported, "cuMemImportFromShareableHandle");
  auto base = MapHandle(**vmm, handle, mapped, device_ordinal);
  (*vmm)->release(handle);  // the mapping keeps the memory until it is unmapped
  if (!base.ok()) return base.status();
  absl::MutexLock lock(&imported_mutex);
  Imported()[*base] = mapped;
  return reinterpret_cast<void*>(*base);
}

absl::Status ReleaseImportedGpuRegion(void* address) {
  auto vmm = GetVmm();
  if (!vmm.ok()) return vmm.status();
  const auto base = reinterpret_cast<CUdeviceptr>(address);
  uint64_t mapped = 0;
  {
    absl::MutexLock lock(&imported_mutex);
    auto it = Imported().find(base);
    if (it == Imported().end()) return absl::NotFoundError("not an imported GPU region");
    mapped = it->second;
    Imported().erase(it);
  }
  TIERD_CU_RETURN_IF_ERROR((*vmm)->unmap(base, mapped));
  TIERD_CU_RETURN_IF_ERROR((*vmm)->free_address(base, mapped));
  return absl::OkStatus();
}

}  // namespace tierd
