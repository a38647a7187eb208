// Byte, move and busy-time accounting for one link and direction. Busy time is the
// union of the intervals in which at least one move was executing on the link, so
// bytes / busy time is the throughput the link achieved while it had work.
//
// Thread-safe.
#ifndef TIERD_RUNTIME_LINK_METER_H_
#define TIERD_RUNTIME_LINK_METER_H_

#include <cstdint>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "base/clock.h"

namespace tierd {

enum class Link : uint8_t { kDramToGpu = 0, kGpuToDram = 1, kDramToNvme = 2, kNvmeToDram = 3 };
inline constexpr int kLinkCount = 4;

inline const char* LinkName(Link link) {
  switch (link) {
    case Link::kDramToGpu: return "dram->gpu";
    case Link::kGpuToDram: return "gpu->dram";
    case Link::kDramToNvme: return "dram->nvme";
    case Link::kNvmeToDram: return "nvme->dram";
  }
  return "?";
}

struct LinkStats {
  uint64_t bytes = 0;        // moved successfully
  uint64_t moves = 0;        // completed successfully
  uint64_t failed_moves = 0;
  int64_t busy_nanos = 0;
  double BytesPerSecond() const { return busy_nanos > 0 ? 1e9 * bytes / busy_nanos : 0.0; }
};

// Speeds for a model that runs a device's reads and writes one at a time (the planner's
// NVMe), from meters that saw them overlap: each direction's speed while it was busy, both
// scaled by (read busy + write busy) / device busy, so the model takes as long as the device
// did for the bytes measured. {read, write} bytes per second; {0, 0} for a direction that
// moved nothing.
inline std::pair<double, double> SerialDeviceSpeeds(const LinkStats& read, const LinkStats& write,
                                                    const LinkStats& device) {
  const double r = read.BytesPerSecond(), w = write.BytesPerSecond();
  const int64_t apart = read.busy_nanos + write.busy_nanos;
  if (device.busy_nanos <= 0 || apart <= 0) return {r, w};
  const double overlap = static_cast<double>(apart) / static_cast<double>(device.busy_nanos);
  return {r * overlap, w * overlap};
}

class LinkMeter {
 public:
  explicit LinkMeter(Clock& clock) : clock_(clock) {}

  void Begin() { BeginAt(clock_.NowNanos()); }
  void End(uint64_t bytes, bool ok) { EndAt(clock_.NowNanos(), bytes, ok); }
  // With a time read once for several meters (a link's and its device's): the device's
  // busy union then contains each link's interval exactly, whatever the scheduler does
  // between the calls.
  void BeginAt(int64_t now_nanos) {
    absl::MutexLock lock(&mutex_);
    if (active_++ == 0) busy_since_nanos_ = now_nanos;
  }
  void EndAt(int64_t now_nanos, uint64_t bytes, bool ok) {
    absl::MutexLock lock(&mutex_);
    if (ok) {
      stats_.bytes += bytes;
      ++stats_.moves;
    } else {
      ++stats_.failed_moves;
    }
    if (--active_ == 0) stats_.busy_nanos += now_nanos - busy_since_nanos_;
  }
  Clock& clock() const { return clock_; }
  LinkStats Stats() const {
    absl::MutexLock lock(&mutex_);
    LinkStats stats = stats_;
    if (active_ > 0) stats.busy_nanos += clock_.NowNanos() - busy_since_nanos_;
    return stats;
  }

 private:
  Clock& clock_;
  mutable absl::Mutex mutex_;
  LinkStats stats_ ABSL_GUARDED_BY(mutex_);
  int active_ ABSL_GUARDED_BY(mutex_) = 0;
  int64_t busy_since_nanos_ ABSL_GUARDED_BY(mutex_) = 0;
};

}  // namespace tierd

#endif  // TIERD_RUNTIME_LINK_METER_H_
