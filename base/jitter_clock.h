// JitterClock: a FakeClock's time, advanced by each sleep times a seeded factor in
// [1 - jitter, 1 + jitter] — a fake GPU's link time that varies copy to copy, yet repeats run to
// run (the planner's simulation and replay). Optionally each sleep also takes some wall time,
// so the copies fall behind a client that does not wait for them.
//
// Thread-safe.
#ifndef TIERD_BASE_JITTER_CLOCK_H_
#define TIERD_BASE_JITTER_CLOCK_H_

#include <chrono>
#include <cstdint>
#include <mutex>
#include <random>
#include <thread>

#include "base/fake_clock.h"

namespace tierd {

class JitterClock final : public Clock {
 public:
  JitterClock(FakeClock& base, uint64_t seed, double jitter) : base_(base), rng_(seed), jitter_(jitter) {}
  int64_t NowNanos() override { return base_.NowNanos(); }
  void set_wall_per_copy(std::chrono::microseconds wall) { wall_ = wall; }
  void SleepNanos(int64_t nanos) override {
    if (wall_.count() > 0) std::this_thread::sleep_for(wall_);
    std::lock_guard<std::mutex> lock(mutex_);
    std::uniform_real_distribution<double> f(1 - jitter_, 1 + jitter_);
    base_.AdvanceNanos(static_cast<int64_t>(nanos * f(rng_)));
  }

 private:
  FakeClock& base_;
  std::mutex mutex_;
  std::mt19937_64 rng_;
  double jitter_;
  std::chrono::microseconds wall_{0};
};

}  // namespace tierd

#endif  // TIERD_BASE_JITTER_CLOCK_H_
