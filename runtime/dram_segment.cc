#include "runtime/dram_segment.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <unistd.h>

#include <boost/interprocess/mapped_region.hpp>
#include <boost/interprocess/shared_memory_object.hpp>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "base/units.h"

namespace tierd {

namespace bip = boost::interprocess;

namespace {

// Allocates and maps every page of [base, base + bytes) from several threads, in one pass:
// MADV_POPULATE_WRITE (Linux 5.14) returns an error where the tmpfs is out of room instead
// of the SIGBUS a touch would get. On the lent H200 box (a VM) mapping is what costs:
// fallocate then cudaHostRegister (which maps the pages one by one on one thread) took
// 1.9 + 5.0 s for 16 GiB; pages touched from 16 threads, then registered, 3.2 + 0.6 s
// (tools/gpu_check/pin_bench). A kernel before 5.14 has no such advice: then nothing is done
// here and the registration maps the pages itself, slowly.
absl::Status PopulateInParallel(uint8_t* base, uint64_t bytes) {
  const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  const unsigned threads = std::max(1u, std::min(16u, std::thread::hardware_concurrency()));
  const uint64_t per = (bytes / threads + page - 1) / page * page;
  std::vector<int> errors(threads, 0);
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < threads; ++t) {
    const uint64_t from = std::min(bytes, per * t), to = std::min(bytes, per * (t + 1));
    if (from == to) continue;
    pool.emplace_back([=, &errors] {
      if (madvise(base + from, to - from, MADV_POPULATE_WRITE) != 0) errors[t] = errno;
    });
  }
  for (std::thread& t : pool) t.join();
  for (int error : errors) {
    if (error != 0 && error != EINVAL) return absl::ResourceExhaustedError(std::strerror(error));
  }
  return absl::OkStatus();
}

}  // namespace

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
  // Reserve every page now: ENOSPC at start instead of SIGBUS on first touch. For a real GPU
  // the pages are first allocated and mapped from several threads (what pinning needs
  // anyway), then fallocate confirms the reservation cheaply.
  const auto reserve_start = std::chrono::steady_clock::now();
  auto cannot_reserve = [&](const std::string& why) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("dram tier: cannot reserve %s in /dev/shm/%s: %s", FormatBytes(bytes), name, why));
  };
  if (ftruncate(segment->fd_, static_cast<off_t>(bytes)) != 0) return cannot_reserve(std::strerror(errno));
  try {
    segment->handles_->region = bip::mapped_region(segment->handles_->shm, bip::read_write, 0, bytes);
  } catch (const bip::interprocess_exception& e) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("dram tier: cannot map %s: %s", FormatBytes(bytes), e.what()));
  }
  segment->base_ = static_cast<uint8_t*>(segment->handles_->region.get_address());
  if (gpu != nullptr && !gpu->is_fake()) {
    if (absl::Status s = PopulateInParallel(segment->base_, bytes); !s.ok()) {
      return cannot_reserve(std::string(s.message()));
    }
  }
  if (const int error = posix_fallocate(segment->fd_, 0, static_cast<off_t>(bytes)); error != 0) {
    return cannot_reserve(std::strerror(error));
  }
  const auto pin_start = std::chrono::steady_clock::now();
  segment->reserve_seconds_ = std::chrono::duration<double>(pin_start - reserve_start).count();
  if (gpu != nullptr) {
    if (absl::Status status = gpu->RegisterHostMemory(segment->base_, bytes); !status.ok()) {
      return absl::Status(status.code(), absl::StrFormat("dram tier: pinning %s for the GPU: %s",
                                                         FormatBytes(bytes), status.message()));
    }
    segment->registered_with_ = gpu;
  }
  segment->pin_seconds_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - pin_start).count();
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
