// FakeClock: time that moves only when told to, or when a thread sleeps on it (the
// sleep advances the clock instead of waiting). Deterministic tests of anything that
// models time: the fake GPU's link, the planner's schedules.
//
// Thread-safe.
#ifndef TIERD_BASE_FAKE_CLOCK_H_
#define TIERD_BASE_FAKE_CLOCK_H_

#include <atomic>

#include "base/clock.h"

namespace tierd {

class FakeClock final : public Clock {
 public:
  int64_t NowNanos() override { return now_nanos_.load(); }
  void SleepNanos(int64_t nanos) override {
    if (nanos > 0) now_nanos_.fetch_add(nanos);
  }
  void AdvanceNanos(int64_t nanos) { now_nanos_.fetch_add(nanos); }

 private:
  std::atomic<int64_t> now_nanos_{0};
};

}  // namespace tierd

#endif  // TIERD_BASE_FAKE_CLOCK_H_
