// LogLimiter: at most `burst` lines a window from one source, then silence until the window
// ends, when the next line is preceded by how many were dropped. For log lines a client can
// cause (a malformed request each time): it must not be able to flood the daemon's log.
//
// Thread-safe.
#ifndef TIERD_BASE_LOG_LIMITER_H_
#define TIERD_BASE_LOG_LIMITER_H_

#include <cstdint>

#include "absl/synchronization/mutex.h"
#include "base/clock.h"

namespace tierd {

class LogLimiter {
 public:
  LogLimiter(Clock& clock, int burst, int64_t window_nanos)
      : clock_(clock), burst_(burst), window_nanos_(window_nanos) {}
  // Whether to print this line now. *dropped_before: lines dropped in the windows since the
  // last printed one (print that first when it is not 0).
  bool Allow(int64_t* dropped_before);

 private:
  Clock& clock_;
  const int burst_;
  const int64_t window_nanos_;
  absl::Mutex mutex_;
  int64_t window_start_ ABSL_GUARDED_BY(mutex_) = -1;
  int lines_ ABSL_GUARDED_BY(mutex_) = 0;
  int64_t dropped_ ABSL_GUARDED_BY(mutex_) = 0;
};

}  // namespace tierd

#endif  // TIERD_BASE_LOG_LIMITER_H_
