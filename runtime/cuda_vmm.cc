#include "runtime/cuda_vmm.h"

#include <utility>

#include "absl/strings/str_format.h"

namespace tierd::cuda {

absl::Status CudaError(cudaError_t error, const char* what) {
  return absl::InternalError(
      absl::StrFormat("%s: %s (%s)", what, cudaGetErrorString(error), cudaGetErrorName(error)));
}

absl::Status DriverError(CUresult result, const char* what) {
  return absl::InternalError(absl::StrFormat("%s: CUDA driver error %d", what, static_cast<int>(result)));
}

absl::StatusOr<const Vmm*> GetVmm() {
  static const absl::StatusOr<Vmm> vmm = []() -> absl::StatusOr<Vmm> {
    Vmm v;
    const std::pair<const char*, void**> symbols[] = {
        {"cuMemCreate", reinterpret_cast<void**>(&v.create)},
        {"cuMemRelease", reinterpret_cast<void**>(&v.release)},
        {"cuMemAddressReserve", reinterpret_cast<void**>(&v.reserve)},
        {"cuMemAddressFree", reinterpret_cast<void**>(&v.free_address)},
        {"cuMemMap", reinterpret_cast<void**>(&v.map)},
        {"cuMemUnmap", reinterpret_cast<void**>(&v.unmap)},
        {"cuMemSetAccess", reinterpret_cast<void**>(&v.set_access)},
        {"cuMemExportToShareableHandle", reinterpret_cast<void**>(&v.export_handle)},
        {"cuMemImportFromShareableHandle", reinterpret_cast<void**>(&v.import_handle)},
        {"cuMemGetAllocationGranularity", reinterpret_cast<void**>(&v.granularity)},
    };
    for (const auto& [name, slot] : symbols) {
      cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
      const cudaError_t error = cudaGetDriverEntryPointByVersion(name, slot, 12000, cudaEnableDefault, &found);
      if (error != cudaSuccess || found != cudaDriverEntryPointSuccess || *slot == nullptr) {
        return absl::FailedPreconditionError(absl::StrFormat("the CUDA driver has no %s (needs CUDA 12+)", name));
      }
    }
    return v;
  }();
  if (!vmm.ok()) return vmm.status();
  return &*vmm;
}

absl::StatusOr<CUdeviceptr> MapHandle(const Vmm& vmm, CUmemGenericAllocationHandle handle, uint64_t bytes,
                                      int device) {
  CUdeviceptr address = 0;
  TIERD_CU_RETURN_IF_ERROR(vmm.reserve(&address, bytes, 0, 0, 0));
  if (const CUresult r = vmm.map(address, bytes, 0, handle, 0); r != CUDA_SUCCESS) {
    vmm.free_address(address, bytes);
    return DriverError(r, "cuMemMap");
  }
  CUmemAccessDesc access = {};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = device;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  if (const CUresult r = vmm.set_access(address, bytes, &access, 1); r != CUDA_SUCCESS) {
    vmm.unmap(address, bytes);
    vmm.free_address(address, bytes);
    return DriverError(r, "cuMemSetAccess");
  }
  return address;
}

}  // namespace tierd::cuda
