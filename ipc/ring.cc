#include "ipc/ring.h"

#include <linux/futex.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <new>
#include <string>

#include "absl/strings/str_format.h"

namespace tierd::ipc {
namespace {

void FutexWait(std::atomic<uint32_t>* word, uint32_t expected, int timeout_ms) {
  timespec timeout{timeout_ms / 1000, (timeout_ms % 1000) * 1'000'000L};
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected,
          timeout_ms >= 0 ? &timeout : nullptr, nullptr, 0);
}

inline void CpuRelax() {
#if defined(__x86_64__)
  __builtin_ia32_pause();
#endif
}

}  // namespace

bool RingPush(Ring& ring, const RingMessage& message) {
  const uint32_t head = ring.head.load(std::memory_order_relaxed);
  const uint32_t tail = ring.tail.load(std::memory_order_acquire);
  if (head - tail >= kRingSlots) return false;
  ring.slots[head % kRingSlots] = message;
  ring.head.store(head + 1, std::memory_order_release);
  if (ring.sleepers.load(std::memory_order_seq_cst) != 0) RingWake(ring);
  return true;
}

void RingWake(Ring& ring) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(&ring.head), FUTEX_WAKE, 1, nullptr, nullptr, 0);
}

absl::StatusOr<RingMessage> RingPop(Ring& ring, const std::atomic<uint32_t>& closed, int timeout_ms) {
  const uint32_t tail = ring.tail.load(std::memory_order_relaxed);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (int spin = 0;; ++spin) {
    const uint32_t head = ring.head.load(std::memory_order_acquire);
    if (head != tail) {
      if (head - tail > kRingSlots) {
        return absl::DataLossError(absl::StrFormat(
            "ring counters broken (head %d, tail %d): the peer wrote garbage", head, tail));
      }
      RingMessage message = ring.slots[tail % kRingSlots];
      ring.tail.store(tail + 1, std::memory_order_release);
      return message;
    }
    if (closed.load(std::memory_order_acquire) != 0) return absl::UnavailableError("the ring was closed");
    if (spin < kRingSpinIterations) {
      // On an oversubscribed machine the peer may need this very core: offer it now and
      // then; with cores to spare, sched_yield returns at once.
      if (spin % 256 == 255) sched_yield();
      else CpuRelax();
      continue;
    }
    int wait_ms = 100;  // wake now and then regardless: a lost wake-up costs at most this
    if (timeout_ms >= 0) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                            deadline - std::chrono::steady_clock::now()).count();
      if (left <= 0) return absl::DeadlineExceededError("nothing on the ring");
      wait_ms = std::min<int>(wait_ms, static_cast<int>(left));
    }
    ring.sleepers.store(1, std::memory_order_seq_cst);
    if (ring.head.load(std::memory_order_seq_cst) == tail && closed.load() == 0) {
      FutexWait(&ring.head, tail, wait_ms);
    }
    ring.sleepers.store(0, std::memory_order_relaxed);
  }
}

absl::StatusOr<int> CreateRingSegment() {
  const int fd = memfd_create("tierd-ring", MFD_CLOEXEC);
  if (fd < 0 || ftruncate(fd, sizeof(RingSegment)) != 0) {
    const int error = errno;
    if (fd >= 0) close(fd);
    return absl::ResourceExhaustedError(absl::StrFormat("ring segment: %s", std::strerror(error)));
  }
  void* base = mmap(nullptr, sizeof(RingSegment), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) {
    close(fd);
    return absl::ResourceExhaustedError("mapping the ring segment failed");
  }
  auto* segment = new (base) RingSegment{};
  segment->magic = kRingMagic;
  segment->version = kRingVersion;
  munmap(base, sizeof(RingSegment));
  return fd;
}

absl::StatusOr<RingSegment*> MapRingSegment(int fd) {
  void* base = mmap(nullptr, sizeof(RingSegment), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) return absl::InternalError(absl::StrFormat("mapping the ring: %s", std::strerror(errno)));
  auto* segment = static_cast<RingSegment*>(base);
  if (segment->magic != kRingMagic || segment->version != kRingVersion) {
    munmap(base, sizeof(RingSegment));
    return absl::FailedPreconditionError("not a tierd ring segment (or another version)");
  }
  return segment;
}

void UnmapRingSegment(RingSegment* segment) { munmap(segment, sizeof(RingSegment)); }

void SetRingErrorText(RingSegment& segment, uint64_t sequence, absl::string_view text) {
  char* slot = segment.errors[sequence % kRingSlots];
  const size_t n = std::min<size_t>(text.size(), kRingErrorBytes - 1);
  std::memcpy(slot, text.data(), n);
  slot[n] = '\0';
}

std::string RingErrorText(const RingSegment& segment, uint64_t sequence) {
  const char* slot = segment.errors[sequence % kRingSlots];
  return std::string(slot, strnlen(slot, kRingErrorBytes));
}

}  // namespace tierd::ipc
