#include "tools/kernel_profile/gaps.h"

#include <gtest/gtest.h>

namespace tierd::tools {
namespace {

TEST(GapsTest, BucketsByLength) {
  EXPECT_EQ(GapBucket(1), 0);
  EXPECT_EQ(GapBucket(1999), 0);
  EXPECT_EQ(GapBucket(2000), 1);
  EXPECT_EQ(GapBucket(19999), 2);
  EXPECT_EQ(GapBucket(99999), 3);
  EXPECT_EQ(GapBucket(100000), 4);
}

// Kernel 2's launch returned before kernel 1 ended (queued: its 3 us gap is the device's);
// kernel 3's after (the host late: its 30 us gap); kernel 4 overlaps kernel 3 (no gap);
// kernel 5's call is unknown (counted by length only).
TEST(GapsTest, SplitsTheGapsTheHostCausedFromTheQueuedOnes) {
  const std::vector<KernelRun> runs = {
      {0, 1000, 1}, {4000, 5000, 2}, {35000, 40000, 3}, {39000, 41000, 4}, {141000, 142000, 5}};
  const std::map<uint32_t, uint64_t> call_end = {{2, 900}, {3, 20000}, {4, 30000}};
  const GapTable t = SplitGaps(runs, call_end);
  EXPECT_EQ(t.count[1], 1u);
  EXPECT_EQ(t.ns[1], 3000u);
  EXPECT_EQ(t.count[3], 1u);
  EXPECT_EQ(t.ns[3], 30000u);
  EXPECT_EQ(t.count[4], 1u);
  EXPECT_EQ(t.ns[4], 100000u);
  EXPECT_EQ(t.known, 2u);  // kernel 4 left no gap; kernel 5's call is not known
  EXPECT_EQ(t.late_count[1], 0u);
  EXPECT_EQ(t.late_count[3], 1u);
  EXPECT_EQ(t.late_ns[3], 30000u);
  EXPECT_EQ(t.late_count[4], 0u);
}

TEST(GapsTest, WithoutCallsThereIsNoHostSplit) {
  const GapTable t = SplitGaps({{0, 10, 1}, {20, 30, 2}}, {});
  EXPECT_EQ(t.count[0], 1u);
  EXPECT_EQ(t.known, 0u);
  EXPECT_EQ(t.late_count[0], 0u);
}

}  // namespace
}  // namespace tierd::tools
