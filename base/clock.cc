#include "base/clock.h"

#include <chrono>
#include <thread>

namespace tierd {
namespace {

class SteadyClock final : public Clock {
 public:
  int64_t NowNanos() override {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  void SleepNanos(int64_t nanos) override {
    if (nanos > 0) std::this_thread::sleep_for(std::chrono::nanoseconds(nanos));
  }
};

}  // namespace

Clock& RealClock() {
  static SteadyClock* clock = new SteadyClock();
  return *clock;
}

}  // namespace tierd
