// Time, injected: policy code and fakes read a Clock&, so tests can
// run on a fake clock. RealClock is the steady monotonic clock.
#ifndef TIERD_BASE_CLOCK_H_
#define TIERD_BASE_CLOCK_H_

#include <cstdint>

namespace tierd {

class Clock {
 public:
  virtual ~Clock() = default;
  // Monotonic nanoseconds since an arbitrary epoch.
  virtual int64_t NowNanos() = 0;
  // Blocks the calling thread for (at least) `nanos` of this clock's time.
  virtual void SleepNanos(int64_t nanos) = 0;
};

// The process-wide monotonic clock. Thread-safe.
Clock& RealClock();

}  // namespace tierd

#endif  // TIERD_BASE_CLOCK_H_
