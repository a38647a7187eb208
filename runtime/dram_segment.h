// DramSegment: the DRAM tier's memory, one POSIX shared-memory segment
// (Boost.Interprocess) that the daemon maps and later shares with its clients.
//
// Created with every page reserved up front (fallocate on the tmpfs file), so a full
// /dev/shm fails here, at start, never as a SIGBUS mid-run; registered with the GPU
// (pinned) so copies to and from it run at full PCIe speed. While it lives, its file is
// flock()ed (shared): a segment nobody holds locked was left by a process that died
// (SweepStaleSegments). The destructor unregisters, unmaps and unlinks the segment.
//
// Thread-safety: immutable after Create; the bytes are shared by design.
#ifndef TIERD_RUNTIME_DRAM_SEGMENT_H_
#define TIERD_RUNTIME_DRAM_SEGMENT_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "runtime/gpu_device.h"

namespace tierd {

class DramSegment {
 public:
  // `name` is the shm name without the leading slash ("tierd-1234-dram").
  // `gpu` may be null (no registration). Budget checks are the caller's (host_memory.h).
  static absl::StatusOr<std::unique_ptr<DramSegment>> Create(const std::string& name,
                                                             uint64_t bytes, GpuDevice* gpu);
  ~DramSegment();
  DramSegment(const DramSegment&) = delete;
  DramSegment& operator=(const DramSegment&) = delete;

  uint8_t* base() const { return base_; }
  uint64_t bytes() const { return bytes_; }
  const std::string& name() const { return name_; }
  // The segment's fd, for passing to clients (SCM_RIGHTS). Owned by the segment.
  int fd() const { return fd_; }
  // What Create spent, for the daemon's log: reserving the pages, pinning them.
  double reserve_seconds() const { return reserve_seconds_; }
  double pin_seconds() const { return pin_seconds_; }

 private:
  DramSegment() = default;
  std::string name_;
  uint8_t* base_ = nullptr;
  uint64_t bytes_ = 0;
  int fd_ = -1;
  double reserve_seconds_ = 0, pin_seconds_ = 0;
  GpuDevice* registered_with_ = nullptr;
  struct Handles;
  std::unique_ptr<Handles> handles_;
};

}  // namespace tierd

#endif  // TIERD_RUNTIME_DRAM_SEGMENT_H_
