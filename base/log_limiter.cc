#include "base/log_limiter.h"

namespace tierd {

bool LogLimiter::Allow(int64_t* dropped_before) {
  absl::MutexLock lock(&mutex_);
  const int64_t now = clock_.NowNanos();
  *dropped_before = 0;
  if (window_start_ < 0 || now - window_start_ >= window_nanos_) {
    window_start_ = now;
    lines_ = 0;
  }
  if (lines_ >= burst_) {
    ++dropped_;
    return false;
  }
  ++lines_;
  *dropped_before = dropped_;
  dropped_ = 0;
  return true;
}

}  // namespace tierd
