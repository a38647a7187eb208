#include "runtime/dram_segment.h"

#include <fcntl.h>
#include <sys/file.h>

#include <boost/interprocess/mapped_region.hpp>
#include <boost/interprocess/shared_memory_object.hpp>
#include <cstring>

#include "absl/strings/str_format.h"
#include "base/units.h"

namespace tierd {

namespace bip = boost::interprocess;

struct DramSegment::Handles {
  bip::shared_memory_object shm;
  bip::mapped_region region;
};

absl::StatusOr<std::unique_ptr<DramSegment>> DramSegment::Create(const std::string& name,
                                                                 uint64_t bytes, GpuDevice* gpu) {
  if (bytes == 0) return absl::InvalidArgumentError("dram tier: budget of 0 bytes");
  std::unique_ptr<DramSegment> segment(new DramSegment());
  segment->name_ = name;
  segment->bytes_ = bytes;
  segment->handles_ = std::make_unique<Handles>();
  try {
    segment->handles_->shm =
        bip::shared_memory_object(bip::create_only, name.c_str(), bip::read_write);
  } catch (const bip::interprocess_exception& e) {
    return absl::AlreadyExistsError(absl::StrFormat(
        "dram tier: cannot create shared-memory segment /dev/shm/%s: %s (a daemon of the same "
        "name running, or a stale segment: remove it)", name, e.what()));
  }
  // From here on the destructor unlinks the segment on any error.
  segment->fd_ = segment->handles_->shm.get_mapping_handle().handle;
  // Held for the segment's life: a sweep that can take the lock exclusively knows the
  // owner is gone, whatever pid namespace either of them is in.
  flock(segment->fd_, LOCK_SH);
  // Reserve every page now: ENOSPC at start instead of SIGBUS on first touch.
  if (const int error = posix_fallocate(segment->fd_, 0, static_cast<off_t>(bytes)); error != 0) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "dram tier: cannot reserve %s in /dev/shm/%s: %s", FormatBytes(bytes), name,
        std::strerror(error)));
  }
  try {
    segment->handles_->region = bip::mapped_region(segment->handles_->shm, bip::read_write, 0, bytes);
  } catch (const bip::interprocess_exception& e) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("dram tier: cannot map %s: %s", FormatBytes(bytes), e.what()));
  }
  segment->base_ = static_cast<uint8_t*>(segment->handles_->region.get_address());
  if (gpu != nullptr) {
    if (absl::Status status = gpu->RegisterHostMemory(segment->base_, bytes); !status.ok()) {
      return absl::Status(status.code(), absl::StrFormat("dram tier: pinning %s for the GPU: %s",
                                                         FormatBytes(bytes), status.message()));
    }
    segment->registered_with_ = gpu;
  }
  return segment;
}

DramSegment::~DramSegment() {
  if (registered_with_ != nullptr) registered_with_->UnregisterHostMemory(base_).IgnoreError();
  if (handles_ != nullptr && fd_ >= 0) {
    handles_.reset();  // unmaps and closes
    bip::shared_memory_object::remove(name_.c_str());
  }
}

}  // namespace tierd
