#include "base/log_limiter.h"

#include <gtest/gtest.h>

#include "base/fake_clock.h"

namespace tierd {
namespace {

constexpr int64_t kSecond = 1'000'000'000;

// A flood of 100 lines in a minute prints 5; the first line of the next minute says that 95
// were dropped; a quiet source prints everything.
TEST(LogLimiterTest, AFloodPrintsABurstThenSaysHowManyItDropped) {
  FakeClock clock;
  LogLimiter limiter(clock, /*burst=*/5, /*window_nanos=*/60 * kSecond);
  int printed = 0;
  int64_t dropped = 0;
  for (int i = 0; i < 100; ++i) {
    if (limiter.Allow(&dropped)) {
      ++printed;
      EXPECT_EQ(dropped, 0);
    }
    clock.AdvanceNanos(kSecond / 10);  // 10 s in all
  }
  EXPECT_EQ(printed, 5);
  clock.AdvanceNanos(60 * kSecond);
  ASSERT_TRUE(limiter.Allow(&dropped));
  EXPECT_EQ(dropped, 95);
  ASSERT_TRUE(limiter.Allow(&dropped));
  EXPECT_EQ(dropped, 0) << "said once";
  for (int i = 0; i < 3; ++i) {
    clock.AdvanceNanos(61 * kSecond);
    EXPECT_TRUE(limiter.Allow(&dropped));
    EXPECT_EQ(dropped, 0);
  }
}

}  // namespace
}  // namespace tierd
