#include "allocator/static_assigner.h"

#include <gtest/gtest.h>

#include <random>

namespace tierd {
namespace {

void ExpectNoClash(uint32_t steps, const std::vector<LiveRange>& ranges, const StaticAssignment& a) {
  for (size_t i = 0; i < ranges.size(); ++i) {
    ASSERT_LE(a.offsets[i] + ranges[i].bytes, a.size_bytes);
    for (size_t j = i + 1; j < ranges.size(); ++j) {
      if (!Overlaps(steps, ranges[i], ranges[j])) continue;
      const bool disjoint = a.offsets[i] + ranges[i].bytes <= a.offsets[j] || a.offsets[j] + ranges[j].bytes <= a.offsets[i];
      ASSERT_TRUE(disjoint) << "ranges " << i << " and " << j << " share addresses while both live";
    }
  }
}

TEST(StaticAssignerTest, ArcsOnACycleOverlapAcrossTheWrap) {
  EXPECT_TRUE(Overlaps(10, {8, 4, 1}, {0, 1, 1}));   // 8,9,0,1 vs 0
  EXPECT_FALSE(Overlaps(10, {8, 2, 1}, {0, 8, 1}));  // 8,9 vs 0..7
  EXPECT_TRUE(Overlaps(10, {0, 10, 1}, {5, 1, 1}));
}

TEST(StaticAssignerTest, DisjointLifetimesShareTheSameAddresses) {
  // A ping-pong of two tensors alive in turn needs room for one.
  std::vector<LiveRange> ranges = {{0, 2, 1024}, {2, 2, 1024}, {4, 2, 1024}};
  auto a = AssignStaticOffsets(6, ranges);
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->size_bytes, 1024u);
  EXPECT_EQ(a->peak_live_bytes, 1024u);
}

TEST(StaticAssignerTest, BadRangesAreRefused) {
  EXPECT_EQ(AssignStaticOffsets(0, {}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(AssignStaticOffsets(4, {{0, 5, 1}}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(AssignStaticOffsets(4, {{4, 1, 1}}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(AssignStaticOffsets(4, {{0, 1, 0}}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(AssignStaticOffsets(4, {{0, 1, 1}}, 3).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(StaticAssignerTest, RandomRangesNeverClashAndStayNearTheLowerBound) {
  std::mt19937_64 rng(3);
  double worst = 1;
  for (int trial = 0; trial < 200; ++trial) {
    const uint32_t steps = 1 + rng() % 40;
    std::vector<LiveRange> ranges;
    for (int i = 0, n = 1 + rng() % 40; i < n; ++i) {
      ranges.push_back({static_cast<uint32_t>(rng() % steps), static_cast<uint32_t>(1 + rng() % steps),
                        (1 + rng() % 64) * 256});
    }
    auto a = AssignStaticOffsets(steps, ranges);
    ASSERT_TRUE(a.ok()) << a.status();
    ExpectNoClash(steps, ranges, *a);
    ASSERT_GE(a->size_bytes, a->peak_live_bytes);
    worst = std::max(worst, static_cast<double>(a->size_bytes) / a->peak_live_bytes);
  }
  // Greedy by size is a heuristic; on these random sets it stays within 2x of the bound.
  EXPECT_LT(worst, 2.0);
  std::printf("worst size / peak live over 200 random sets: %.3f\n", worst);
}

}  // namespace
}  // namespace tierd
