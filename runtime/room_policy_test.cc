#include "runtime/room_policy.h"

#include <gtest/gtest.h>

namespace tierd {
namespace {

TEST(RoomPolicyTest, RankedTheFurthestNextUseGoesCleanFirstOnTies) {
  const std::vector<RoomCandidate> c = {{false, 5, 1}, {false, 9, 2}, {false, 9, 3}, {true, 9, 4}, {true, 2, 0}};
  EXPECT_EQ(PickVictim(c, /*ranked=*/true), 3u) << "next use 9, and clean";
  const std::vector<RoomCandidate> tie = {{false, 9, 7}, {false, 9, 1}};
  EXPECT_EQ(PickVictim(tie, true), 0u) << "an exact tie keeps the earliest";
}

// A lower eviction priority goes first, ahead of every other ranking (the furthest next use,
// clean, the least recently used); within one priority those rank as before.
TEST(RoomPolicyTest, TheLowestEvictionPriorityGoesFirst) {
  const std::vector<RoomCandidate> ranked = {{true, 90, 1, 1}, {false, 5, 2, 0}, {false, 7, 3, 0}, {true, 99, 0, 2}};
  EXPECT_EQ(PickVictim(ranked, /*ranked=*/true), 2u) << "priority 0, and of those the furthest next use";
  const std::vector<RoomCandidate> unranked = {{true, 0, 1, 1}, {false, 0, 9, 0}, {false, 0, 4, 0}};
  EXPECT_EQ(PickVictim(unranked, /*ranked=*/false), 2u) << "priority 0 though dirty, then the least recently used";
  const std::vector<RoomCandidate> negative = {{true, 0, 1, 0}, {false, 0, 9, -3}};
  EXPECT_EQ(PickVictim(negative, false), 1u) << "a negative priority goes before the default";
}

TEST(RoomPolicyTest, UnrankedCleanCopiesGoFirstThenTheLeastRecentlyUsed) {
  const std::vector<RoomCandidate> c = {{false, 0, 1}, {true, 0, 9}, {true, 0, 4}, {false, 0, 0}};
  EXPECT_EQ(PickVictim(c, /*ranked=*/false), 2u) << "clean, and used longest ago of the clean ones";
  const std::vector<RoomCandidate> dirty = {{false, 0, 8}, {false, 0, 3}, {false, 0, 5}};
  EXPECT_EQ(PickVictim(dirty, false), 1u);
  EXPECT_EQ(PickVictim({}, false), std::nullopt);
}

// An arena of 4 MiB: [free 512K][A 1M][free 512K][B 1M][free 512K][C 512K], room for 1.5 MiB:
// by next use alone C (furthest) would go, joining only 1 MiB; as one block, B (with the
// gaps on either side) holds it, and of the runs that do, B's soonest next use is furthest.
TEST(RoomPolicyTest, TheBlockComesFromTheRunUsedFurthestThatHoldsIt) {
  constexpr uint64_t K = 1024;
  std::vector<HeldRange> held = {{512 * K, 1536 * K, true, false, 10},
                                 {2048 * K, 3072 * K, true, false, 50},
                                 {3584 * K, 4096 * K, true, false, 100}};
  EXPECT_EQ(PickForBlock(held, 4096 * K, 1536 * K), 1u);
  // B pinned (not evictable): the run of A alone holds it too (512K + 1M + 512K): A goes.
  held[1].evictable = false;
  EXPECT_EQ(PickForBlock(held, 4096 * K, 1536 * K), 0u);
  // A held as well: C alone leaves 1 MiB; no run holds 1.5 MiB.
  held[0].evictable = false;
  EXPECT_EQ(PickForBlock(held, 4096 * K, 1536 * K), std::nullopt);
}

// Two runs with the same soonest use: the one with fewer dirty bytes; within the run, the
// furthest-used copy, clean first on ties.
TEST(RoomPolicyTest, TiesGoToTheRunWithFewerDirtyBytesThenItsFurthestCleanCopy) {
  std::vector<HeldRange> held = {{0, 100, true, false, 7},
                                 {100, 200, true, false, 9},
                                 {300, 400, true, true, 7},
                                 {400, 500, true, true, 9},
                                 {500, 600, true, false, 9}};
  // 200 bytes: the run 0..1 (dirty 200) or 2..3 (clean) both have soonest use 7.
  EXPECT_EQ(PickForBlock(held, 600, 300), 3u) << "the clean run, its copy used at 9";
  // Copy 2 used at 9 too: the runs 1..2 (dirty 100) and 2..3 (clean) both have soonest use 9;
  // 2..3 wins on dirty bytes, and within it 2 and 3 tie (9, clean): the earlier goes.
  held[2].next_use = 9;
  EXPECT_EQ(PickForBlock(held, 600, 300), 2u);
}

// Gaps of 10 around idle A and C and held B, D, E: 30 bytes come from moving A (10) into the
// smallest gap outside its window that holds it, joining [0, 30); C's window moves no fewer.
TEST(RoomPolicyTest, AJoinMovesTheFewestBytesIntoGapsOutsideTheWindow) {
  const std::vector<HeldRange> held = {
      {10, 20, true}, {30, 40, false}, {50, 60, true}, {70, 80, false}, {90, 95, false}};
  const std::optional<JoinPlan> join = PlanJoin(held, 100, 30, /*may_slide=*/false);
  ASSERT_TRUE(join.has_value());
  EXPECT_FALSE(join->slide);
  ASSERT_EQ(join->moves.size(), 1u);
  EXPECT_EQ(join->moves[0].copy, 0u);
  EXPECT_EQ(join->moves[0].to, 40u) << "the first smallest gap outside the window that holds 10";
  EXPECT_EQ(join->begin, 0u);
  EXPECT_FALSE(PlanJoin(held, 100, 31, false).has_value()) << "no window of idle copies spans 31";
}

// No gap outside any window holds its copies; in DRAM the window of A and B slides to its low
// end, joining the gaps inside it (15 bytes); on the GPU nothing joins.
TEST(RoomPolicyTest, InDramAWindowSlidesTogetherWhereNoGapTakesItsCopies) {
  const std::vector<HeldRange> held = {{5, 15, true}, {20, 30, true}, {35, 40, true}};
  const std::optional<JoinPlan> join = PlanJoin(held, 40, 15, /*may_slide=*/true);
  ASSERT_TRUE(join.has_value());
  EXPECT_TRUE(join->slide);
  EXPECT_EQ(join->first, 0u);
  EXPECT_EQ(join->last, 1u);
  EXPECT_FALSE(PlanJoin(held, 40, 15, /*may_slide=*/false).has_value());
}

}  // namespace
}  // namespace tierd
