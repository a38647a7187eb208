#include "runtime/cuda_gpu.h"

#include <cuda.h>
#include <cuda_runtime.h>
#include <unistd.h>

#include <cstring>
#include <deque>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "base/units.h"
#include "runtime/cuda_vmm.h"

namespace tierd {
namespace {

using cuda::CudaError;
using cuda::DriverError;
using cuda::GetVmm;
using cuda::MapHandle;
using cuda::Vmm;


CUmemAllocationProp RegionProps(int device) {
  CUmemAllocationProp prop = {};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return prop;
}

// One physical allocation (cuMemCreate), mapped in the daemon and exported as a POSIX fd.
// (It used to be one allocation from a cudaMemPool exported with cudaMemPoolExportPointer;
// on the lent H200, driver 580, importing such a pointer of 19.5 GiB overflowed a stack
// buffer inside libcuda: AddressSanitizer saw a 2,636-byte memcpy run over the caller's
// frame, and without it the client jumped into the heap. 1.7 GiB imported fine.)
class CudaRegion final : public GpuRegion {
 public:
  CudaRegion(const Vmm& vmm, int device, CUmemGenericAllocationHandle handle, CUdeviceptr base, uint64_t bytes,
             uint64_t mapped)
      : vmm_(vmm), device_(device), handle_(handle), base_(base), bytes_(bytes), mapped_(mapped) {}
  ~CudaRegion() override {
    cudaSetDevice(device_);
    cudaDeviceSynchronize();
    vmm_.unmap(base_, mapped_);
    vmm_.free_address(base_, mapped_);
    vmm_.release(handle_);
  }
  void* base() const override { return reinterpret_cast<void*>(base_); }
  uint64_t bytes() const override { return bytes_; }
  absl::StatusOr<GpuRegionExport> Export() const override {
    GpuRegionExport out;
    int fd = -1;
    TIERD_CU_RETURN_IF_ERROR(vmm_.export_handle(&fd, handle_, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0));
    std::memcpy(out.pointer_data.data(), &mapped_, sizeof(mapped_));  // the size to map
    out.pool_fd = fd;
    return out;
  }

 private:
  const Vmm& vmm_;
  int device_;
  CUmemGenericAllocationHandle handle_;
  CUdeviceptr base_;
  uint64_t bytes_, mapped_;
};

// Fences are events from a small free list; WaitFence may run on another thread.
class CudaCopyStream final : public CopyStream {
 public:
  CudaCopyStream(int device, cudaStream_t stream) : device_(device), stream_(stream) {}
  ~CudaCopyStream() override {
    cudaSetDevice(device_);
    cudaStreamSynchronize(stream_);
    absl::MutexLock lock(&mutex_);
    for (auto& [fence, event] : pending_) cudaEventDestroy(event);
    for (cudaEvent_t event : spare_events_) cudaEventDestroy(event);
    cudaStreamDestroy(stream_);
  }

  absl::Status CopyAsync(void* dst, const void* src, uint64_t bytes,
                         CopyDirection direction) override {
    cudaSetDevice(device_);
    TIERD_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
        dst, src, bytes,
        direction == CopyDirection::kHostToDevice   ? cudaMemcpyHostToDevice
        : direction == CopyDirection::kDeviceToHost ? cudaMemcpyDeviceToHost
                                                    : cudaMemcpyDeviceToDevice,
        stream_));
    return absl::OkStatus();
  }

  absl::StatusOr<uint64_t> RecordFence() override {
    cudaSetDevice(device_);
    absl::MutexLock lock(&mutex_);
    cudaEvent_t event;
    if (!spare_events_.empty()) {
      event = spare_events_.back();
      spare_events_.pop_back();
    } else {
      TIERD_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
    }
    TIERD_CUDA_RETURN_IF_ERROR(cudaEventRecord(event, stream_));
    const uint64_t fence = ++last_fence_;
    pending_.push_back({fence, event});
    return fence;
  }

  absl::Status WaitFence(uint64_t fence) override {
    cudaEvent_t event = nullptr;
    {
      absl::MutexLock lock(&mutex_);
      if (fence > last_fence_) return absl::InvalidArgumentError("waiting on a fence never recorded");
      for (auto& [id, pending_event] : pending_) {
        if (id == fence) event = pending_event;
      }
      if (event == nullptr) return absl::OkStatus();  // already waited for and recycled
    }
    cudaSetDevice(device_);
    const cudaError_t error = cudaEventSynchronize(event);
    absl::MutexLock lock(&mutex_);
    // Every fence up to this one has passed too (stream order): recycle them.
    while (!pending_.empty() && pending_.front().first <= fence) {
      spare_events_.push_back(pending_.front().second);
      pending_.pop_front();
    }
    if (error != cudaSuccess) return CudaError(error, "copy on the GPU copy stream failed");
    return absl::OkStatus();
  }

 private:
  const int device_;
  cudaStream_t stream_;
  absl::Mutex mutex_;
  uint64_t last_fence_ ABSL_GUARDED_BY(mutex_) = 0;
  std::deque<std::pair<uint64_t, cudaEvent_t>> pending_ ABSL_GUARDED_BY(mutex_);
  std::vector<cudaEvent_t> spare_events_ ABSL_GUARDED_BY(mutex_);
};

class CudaImportedEvent final : public ImportedEvent {
 public:
  explicit CudaImportedEvent(cudaEvent_t event) : event(event) {}
  ~CudaImportedEvent() override { cudaEventDestroy(event); }
  cudaEvent_t event;
};

// A client's release event, made into the daemon's own: waited for on the device's one gate
// stream and marked there, so fences pass in the order they were made.
class CudaFence final : public GpuFence {
 public:
  CudaFence(int device, cudaEvent_t done, const void* gate, uint64_t sequence)
      : device_(device), done_(done), gate_(gate), sequence_(sequence) {}
  ~CudaFence() override {
    cudaSetDevice(device_);
    cudaEventDestroy(done_);
  }
  absl::Status Wait() override {
    cudaSetDevice(device_);
    TIERD_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(done_));
    return absl::OkStatus();
  }
  bool Passed() override {
    cudaSetDevice(device_);
    return cudaEventQuery(done_) != cudaErrorNotReady;  // done, or failed (Wait says how)
  }
  // The gate stream reaches this fence's mark only after every wait queued on it before.
  bool Covers(const GpuFence& older) const override {
    const auto* o = dynamic_cast<const CudaFence*>(&older);
    return o != nullptr && o->gate_ == gate_ && o->sequence_ < sequence_;
  }

 private:
  int device_;
  cudaEvent_t done_;
  const void* gate_;   // the device whose gate stream marked it
  uint64_t sequence_;  // its place in that stream's order
};

class CudaGpu final : public GpuDevice {
 public:
  CudaGpu(int device, const cudaDeviceProp& properties)
      : device_(device), properties_(properties) {}

  std::string Describe() const override {
    return absl::StrFormat("%s (GPU %d, sm_%d%d, %s)", properties_.name, device_,
                           properties_.major, properties_.minor,
                           FormatBytes(properties_.totalGlobalMem));
  }
  bool is_fake() const override { return false; }
  std::string PciBusId() const override {
    char id[64] = {};
    return cudaDeviceGetPCIBusId(id, sizeof(id), device_) == cudaSuccess ? std::string(id) : std::string();
  }

  absl::StatusOr<uint64_t> FreeBytes() override {
    cudaSetDevice(device_);
    size_t free_bytes = 0, total_bytes = 0;
    TIERD_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes));
    return free_bytes;
  }

  absl::StatusOr<std::unique_ptr<GpuRegion>> AllocateRegion(uint64_t bytes) override {
    if (bytes == 0) return absl::InvalidArgumentError("GPU region of 0 bytes");
    auto free_bytes = FreeBytes();
    if (!free_bytes.ok()) return free_bytes.status();
    if (bytes > *free_bytes) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "gpu tier: budget %s exceeds the free GPU memory (%s free of %s on %s)",
          FormatBytes(bytes), FormatBytes(*free_bytes), FormatBytes(properties_.totalGlobalMem),
          Describe()));
    }
    auto vmm = GetVmm();
    if (!vmm.ok()) return vmm.status();
    cudaSetDevice(device_);
    const CUmemAllocationProp prop = RegionProps(device_);
    size_t granularity = 0;
    TIERD_CU_RETURN_IF_ERROR((*vmm)->granularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM));
    const uint64_t mapped = (bytes + granularity - 1) / granularity * granularity;
    CUmemGenericAllocationHandle handle = 0;
    TIERD_CU_RETURN_IF_ERROR((*vmm)->create(&handle, mapped, &prop, 0));
    auto base = MapHandle(**vmm, handle, mapped, device_);
    if (!base.ok()) {
      (*vmm)->release(handle);
      return absl::Status(base.status().code(),
                          "allocating the GPU tier's region: " + std::string(base.status().message()));
    }
    return std::unique_ptr<GpuRegion>(new CudaRegion(**vmm, device_, handle, *base, bytes, mapped));
  }

  absl::Status RegisterHostMemory(void* address, uint64_t bytes) override {
    cudaSetDevice(device_);
    TIERD_CUDA_RETURN_IF_ERROR(cudaHostRegister(address, bytes, cudaHostRegisterPortable));
    return absl::OkStatus();
  }
  absl::Status UnregisterHostMemory(void* address) override {
    cudaSetDevice(device_);
    TIERD_CUDA_RETURN_IF_ERROR(cudaHostUnregister(address));
    return absl::OkStatus();
  }

  absl::StatusOr<std::unique_ptr<CopyStream>> CreateCopyStream() override {
    cudaSetDevice(device_);
    cudaStream_t stream;
    TIERD_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    return std::unique_ptr<CopyStream>(new CudaCopyStream(device_, stream));
  }

  absl::StatusOr<std::unique_ptr<ImportedEvent>> ImportEvent(const std::string& ipc_handle) override {
    cudaIpcEventHandle_t handle;
    if (ipc_handle.size() != sizeof(handle)) return absl::InvalidArgumentError("not a CUDA IPC event handle");
    std::memcpy(&handle, ipc_handle.data(), sizeof(handle));
    cudaSetDevice(device_);
    cudaEvent_t event;
    TIERD_CUDA_RETURN_IF_ERROR(cudaIpcOpenEventHandle(&event, handle));
    return std::unique_ptr<ImportedEvent>(new CudaImportedEvent(event));
  }

  absl::StatusOr<std::unique_ptr<GpuFence>> FenceAfter(ImportedEvent& event) override {
    cudaSetDevice(device_);
    absl::MutexLock lock(&gate_mutex_);
    if (gate_ == nullptr) TIERD_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&gate_, cudaStreamNonBlocking));
    // The wait binds to the event's most recent record now; our own event then marks it.
    TIERD_CUDA_RETURN_IF_ERROR(cudaStreamWaitEvent(gate_, static_cast<CudaImportedEvent&>(event).event, 0));
    cudaEvent_t done;
    TIERD_CUDA_RETURN_IF_ERROR(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
    if (const cudaError_t error = cudaEventRecord(done, gate_); error != cudaSuccess) {
      cudaEventDestroy(done);
      return CudaError(error, "cudaEventRecord on the gate stream");
    }
    return std::unique_ptr<GpuFence>(new CudaFence(device_, done, this, ++fences_made_));
  }

 private:
  const int device_;
  const cudaDeviceProp properties_;
  absl::Mutex gate_mutex_;
  cudaStream_t gate_ ABSL_GUARDED_BY(gate_mutex_) = nullptr;
  uint64_t fences_made_ ABSL_GUARDED_BY(gate_mutex_) = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<GpuDevice>> CreateCudaGpu(int device_ordinal) {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    return absl::NotFoundError(absl::StrFormat("no usable CUDA device: %s (%s)",
                                               cudaGetErrorString(error), cudaGetErrorName(error)));
  }
  if (device_ordinal < 0 || device_ordinal >= count) {
    return absl::NotFoundError(
        absl::StrFormat("GPU %d asked for, but %d CUDA device(s) found", device_ordinal, count));
  }
  cudaDeviceProp properties;
  TIERD_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&properties, device_ordinal));
  TIERD_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_ordinal));
  return std::unique_ptr<GpuDevice>(new CudaGpu(device_ordinal, properties));
}

}  // namespace tierd
