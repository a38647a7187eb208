// The GPU behind an interface, so policy code runs without one: the real one is CUDA (cuda_gpu.h),
// the fake one is host memory with a modelled link (fake_gpu.h). Policy code and the
// mover see only this header.
#ifndef TIERD_RUNTIME_GPU_DEVICE_H_
#define TIERD_RUNTIME_GPU_DEVICE_H_

#include <array>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tierd {

// What another process needs to map a GpuRegion: the physical allocation's POSIX fd
// (passed over a Unix socket or inherited) and a record of how to map it (CUDA: the mapped
// size, 8 bytes little-endian, then zeros).
struct GpuRegionExport {
  int pool_fd = -1;  // owned by the caller; for the fake GPU, a memfd to mmap
  std::array<unsigned char, 64> pointer_data{};
};

// One contiguous block of device memory, owned by the daemon, sized by the GPU tier's
// budget. Thread-safe (immutable after creation). Destroy it before its GpuDevice.
class GpuRegion {
 public:
  virtual ~GpuRegion() = default;
  // Device address (for the fake GPU, a host address). Valid for the region's life.
  virtual void* base() const = 0;
  virtual uint64_t bytes() const = 0;
  // The fake GPU exports its memfd (pointer record zero).
  virtual absl::StatusOr<GpuRegionExport> Export() const = 0;
};

// kDeviceToDevice: within the device (the GPU tier moving a copy inside its region to
// join free space); HBM, no host link.
enum class CopyDirection : uint8_t { kHostToDevice, kDeviceToHost, kDeviceToDevice };

// An ordered queue of asynchronous copies on one copy engine (a CUDA stream).
// Copies run in issue order. Thread-compatible: the owner serialises calls, except
// WaitFence, which may run on another thread concurrently with issuing.
class CopyStream {
 public:
  virtual ~CopyStream() = default;
  // Host memory must be registered (pinned) for full speed; `host` is the host side.
  virtual absl::Status CopyAsync(void* dst, const void* src, uint64_t bytes,
                                 CopyDirection direction) = 0;
  // A marker after every copy issued so far. Fences are increasing integers.
  virtual absl::StatusOr<uint64_t> RecordFence() = 0;
  // Blocks until `fence` has passed. An error if a copy before it failed.
  virtual absl::Status WaitFence(uint64_t fence) = 0;
};

// Completes after GPU work another process had queued when the fence was made (CUDA:
// the other process's interprocess event, waited for on a daemon gate stream). The daemon
// waits on it before it copies out of, or reuses, memory that work may still write.
class GpuFence {
 public:
  virtual ~GpuFence() = default;
  // Blocks until the fenced work is done; an error if it failed.
  virtual absl::Status Wait() = 0;
  // Whether Wait would return at once (the work is over, or failed); false when unknown.
  virtual bool Passed() { return false; }
  // Whether this fence passing implies `older` has passed (fences chained in one order), so
  // a tensor released twice with work in flight keeps this one without waiting for `older`.
  virtual bool Covers(const GpuFence& older) const {
    (void)older;
    return false;
  }
};

// Another process's interprocess event, opened in this one (cudaIpcOpenEventHandle).
class ImportedEvent {
 public:
  virtual ~ImportedEvent() = default;
};

class GpuDevice {
 public:
  virtual ~GpuDevice() = default;
  // "NVIDIA H200, sm_90, 139.8 GiB" or "fake GPU (host memory, link 55.0 GB/s)".
  virtual std::string Describe() const = 0;
  virtual bool is_fake() const = 0;
  // Its PCI bus id as cudaDeviceGetPCIBusId writes it (for NVML); "" on the fake GPU.
  virtual std::string PciBusId() const { return ""; }
  // Device memory free now (what a new region could get).
  virtual absl::StatusOr<uint64_t> FreeBytes() = 0;
  // RESOURCE_EXHAUSTED, naming the numbers, when `bytes` exceed free memory.
  virtual absl::StatusOr<std::unique_ptr<GpuRegion>> AllocateRegion(uint64_t bytes) = 0;
  // Pins host memory for fast DMA (cudaHostRegister); a no-op on the fake GPU.
  virtual absl::Status RegisterHostMemory(void* address, uint64_t bytes) = 0;
  virtual absl::Status UnregisterHostMemory(void* address) = 0;
  virtual absl::StatusOr<std::unique_ptr<CopyStream>> CreateCopyStream() = 0;
  // UNIMPLEMENTED on the fake GPU (its clients have no streams to order).
  virtual absl::StatusOr<std::unique_ptr<ImportedEvent>> ImportEvent(const std::string& ipc_handle) = 0;
  // A fence after the work queued before `event`'s most recent record, captured now: the
  // other process may record the event again at once.
  virtual absl::StatusOr<std::unique_ptr<GpuFence>> FenceAfter(ImportedEvent& event) = 0;
};

}  // namespace tierd

#endif  // TIERD_RUNTIME_GPU_DEVICE_H_
