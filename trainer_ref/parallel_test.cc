#include "trainer_ref/parallel.h"

#include <gtest/gtest.h>

#include <atomic>
#include <vector>

namespace tierd::trainer {
namespace {

// Each index in exactly one call, calls within [0, count), for counts below, at and above the
// pieces the threads share, and a small work that stays on the caller's thread.
TEST(ParallelForTest, EveryIndexOnceWhateverTheCountAndThreads) {
  for (int64_t count : {1, 3, 16, 127, 128, 129, 100000}) {
    for (int threads : {1, 2, 4, 16}) {
      std::vector<std::atomic<int>> seen(static_cast<size_t>(count));
      std::atomic<int> calls{0};
      ParallelFor(
          count, 1e9,
          [&](int64_t begin, int64_t end) {
            ASSERT_LE(0, begin);
            ASSERT_LT(begin, end);
            ASSERT_LE(end, count);
            calls.fetch_add(1);
            for (int64_t i = begin; i < end; ++i) seen[static_cast<size_t>(i)].fetch_add(1);
          },
          threads);
      for (int64_t i = 0; i < count; ++i) ASSERT_EQ(seen[static_cast<size_t>(i)].load(), 1) << count << " " << i;
      EXPECT_LE(calls.load(), std::min<int64_t>(count, 8 * threads)) << count << " " << threads;
    }
  }
  int calls = 0;
  ParallelFor(1000, 10.0, [&](int64_t begin, int64_t end) {
    ++calls;
    EXPECT_EQ(begin, 0);
    EXPECT_EQ(end, 1000);
  });
  EXPECT_EQ(calls, 1);
}

}  // namespace
}  // namespace tierd::trainer
