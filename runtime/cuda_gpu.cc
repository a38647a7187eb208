#include "runtime/cuda_gpu.h"

#include <cuda_runtime.h>
#include <unistd.h>

#include <cstring>
#include <deque>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "base/units.h"

namespace tierd {
namespace {

absl::Status CudaError(cudaError_t error, const char* what) {
  return absl::InternalError(
      absl::StrFormat("%s: %s (%s)", what, cudaGetErrorString(error), cudaGetErrorName(error)));
}

#define TIERD_CUDA_RETURN_IF_ERROR(call)                          \
  do {                                                            \
    const cudaError_t tierd_cuda_error_ = (call);                 \
    if (tierd_cuda_error_ != cudaSuccess) return CudaError(tierd_cuda_error_, #call); \
  } while (0)

class CudaRegion final : public GpuRegion {
 public:
  CudaRegion(int device, cudaMemPool_t pool, void* base, uint64_t bytes)
      : device_(device), pool_(pool), base_(base), bytes_(bytes) {}
  ~CudaRegion() override {
    cudaSetDevice(device_);
    cudaFree(base_);
    cudaMemPoolDestroy(pool_);
  }
  void* base() const override { return base_; }
  uint64_t bytes() const override { return bytes_; }
  absl::StatusOr<GpuRegionExport> Export() const override {
    GpuRegionExport out;
    int fd = -1;
    TIERD_CUDA_RETURN_IF_ERROR(cudaMemPoolExportToShareableHandle(
        &fd, pool_, cudaMemHandleTypePosixFileDescriptor, 0));
    cudaMemPoolPtrExportData data;
    const cudaError_t error = cudaMemPoolExportPointer(&data, base_);
    if (error != cudaSuccess) {
      close(fd);
      return CudaError(error, "cudaMemPoolExportPointer");
    }
    static_assert(sizeof(data) == sizeof(out.pointer_data));
    std::memcpy(out.pointer_data.data(), &data, sizeof(data));
    out.pool_fd = fd;
    return out;
  }

 private:
  int device_;
  cudaMemPool_t pool_;
  void* base_;
  uint64_t bytes_;
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
        direction == CopyDirection::kHostToDevice ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost,
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

class CudaFence final : public GpuFence {
 public:
  CudaFence(int device, cudaEvent_t done) : device_(device), done_(done) {}
  ~CudaFence() override {
    cudaSetDevice(device_);
    cudaEventDestroy(done_);
  }
  absl::Status Wait() override {
    cudaSetDevice(device_);
    TIERD_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(done_));
    return absl::OkStatus();
  }

 private:
  int device_;
  cudaEvent_t done_;
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
    cudaMemPoolProps props = {};
    props.allocType = cudaMemAllocationTypePinned;
    props.handleTypes = cudaMemHandleTypePosixFileDescriptor;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = device_;
    cudaMemPool_t pool;
    TIERD_CUDA_RETURN_IF_ERROR(cudaMemPoolCreate(&pool, &props));
    void* base = nullptr;
    cudaError_t error = cudaMallocFromPoolAsync(&base, bytes, pool, /*stream=*/0);
    if (error == cudaSuccess) error = cudaStreamSynchronize(0);
    if (error != cudaSuccess) {
      cudaMemPoolDestroy(pool);
      return CudaError(error, "allocating the GPU tier's region from its IPC pool");
    }
    return std::unique_ptr<GpuRegion>(new CudaRegion(device_, pool, base, bytes));
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
    return std::unique_ptr<GpuFence>(new CudaFence(device_, done));
  }

 private:
  const int device_;
  const cudaDeviceProp properties_;
  absl::Mutex gate_mutex_;
  cudaStream_t gate_ ABSL_GUARDED_BY(gate_mutex_) = nullptr;
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

absl::StatusOr<void*> ImportGpuRegion(int device_ordinal, const GpuRegionExport& exported) {
  TIERD_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_ordinal));
  cudaMemPool_t pool;
  TIERD_CUDA_RETURN_IF_ERROR(cudaMemPoolImportFromShareableHandle(
      &pool, reinterpret_cast<void*>(static_cast<intptr_t>(exported.pool_fd)),
      cudaMemHandleTypePosixFileDescriptor, 0));
  close(exported.pool_fd);
  // The importing device is the pool's own: access is implied (no SetAccess).
  cudaMemPoolPtrExportData data;
  std::memcpy(&data, exported.pointer_data.data(), sizeof(data));
  void* address = nullptr;
  TIERD_CUDA_RETURN_IF_ERROR(cudaMemPoolImportPointer(&address, pool, &data));
  return address;
}

absl::Status ReleaseImportedGpuRegion(void* address) {
  TIERD_CUDA_RETURN_IF_ERROR(cudaFree(address));
  return absl::OkStatus();
}

}  // namespace tierd
