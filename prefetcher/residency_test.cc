#include "prefetcher/residency.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <utility>

#include "prefetcher/random_graph.h"

namespace tierd::prefetcher {
namespace {

Graph Cycle(int tensors, uint64_t bytes, int laps_of_uses) {
  Graph g;
  for (int t = 0; t < tensors; ++t) g.tensors.push_back({"t" + std::to_string(t), bytes, false});
  for (int k = 0; k < laps_of_uses; ++k) {
    for (int t = 0; t < tensors; ++t) g.ops.push_back({"use" + std::to_string(t), {static_cast<TensorIndex>(t)}, {}, 1});
  }
  return g;
}

TEST(GraphTest, NextUseWrapsAroundTheIteration) {
  Graph g = Cycle(3, 1, 1);  // ops: use0 use1 use2, then again
  auto next = NextUseDistances(g);
  EXPECT_EQ(next[0][1], 1u);  // after op 0, tensor 1 is used 1 op later
  EXPECT_EQ(next[0][0], 3u);  // tensor 0 again after a full lap
  EXPECT_EQ(next[2][0], 1u);  // wraps: op 2 -> op 0
  g.tensors.push_back({"unused", 1, false});
  EXPECT_EQ(NextUseDistances(g)[0][3], 4u);  // never: ops + 1
}

TEST(GraphTest, BadGraphsAreRefusedWithTheReason) {
  EXPECT_EQ(ValidateGraph({}).code(), absl::StatusCode::kInvalidArgument);
  Graph g = Cycle(2, 1, 1);
  g.ops[1].reads.push_back(7);
  EXPECT_NE(ValidateGraph(g).message().find("uses tensor 7; the graph has 2"), absl::string_view::npos);
  g = Cycle(2, 1, 1);
  g.tensors[0].bytes = 0;
  EXPECT_EQ(ValidateGraph(g).code(), absl::StatusCode::kInvalidArgument);
}

TEST(ResidencyTest, EverythingFitsMeansNothingMovesInTheSteadyState) {
  Graph g = Cycle(4, 100, 2);
  auto plan = PlanResidency(g, 400);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->bytes_loaded, 0u);
  EXPECT_EQ(plan->peak_resident_bytes, 400u);
  EXPECT_TRUE(ReplayPlan(g, 400, *plan).ok());
}

TEST(ResidencyTest, FurthestNextUseOnACycleOfThreeInTwoSlots) {
  // A B C A B C ... with room for two: MIN misses one use in two (LRU would miss all).
  Graph g = Cycle(3, 1, 2);  // one iteration = A B C A B C
  auto plan = PlanResidency(g, 2);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->bytes_loaded, 3u);  // 3 of 6 uses are loads
  EXPECT_TRUE(ReplayPlan(g, 2, *plan).ok()) << ReplayPlan(g, 2, *plan);
}

TEST(ResidencyTest, DirtyTensorsAreWrittenBackAndPinsStay) {
  Graph g;
  g.tensors = {{"embed", 10, true}, {"w0", 10, false}, {"w1", 10, false}, {"w2", 10, false}};
  g.ops = {{"fwd0", {0, 1}, {}, 1}, {"fwd1", {2}, {}, 1}, {"fwd2", {3}, {}, 1},
           {"bwd2", {3}, {3}, 1}, {"bwd1", {2}, {2}, 1}, {"bwd0", {1}, {1}, 1}};
  auto plan = PlanResidency(g, 30);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(ReplayPlan(g, 30, *plan).ok()) << ReplayPlan(g, 30, *plan);
  EXPECT_GT(plan->bytes_written_back, 0u);  // updated weights had to go down before eviction
  for (const auto& resident : plan->resident) EXPECT_EQ(resident[0], 0u);  // embed always there
  EXPECT_EQ(PlanResidency(g, 15).status().code(), absl::StatusCode::kResourceExhausted);
  auto tight = PlanResidency(g, 19);  // embed + w0 at op 0 = 20 > 19
  ASSERT_EQ(tight.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(tight.status().message().find("op 0 ('fwd0') needs 20 B"), absl::string_view::npos)
      << tight.status().message();
}

TEST(ResidencyTest, ReplayCatchesBrokenPlans) {
  Graph g;
  g.tensors = {{"a", 10, false}, {"b", 10, false}, {"c", 10, false}};
  g.ops = {{"w", {0}, {0}, 1}, {"r1", {1}, {}, 1}, {"r2", {2}, {}, 1}};
  auto plan = *PlanResidency(g, 20);
  ASSERT_TRUE(ReplayPlan(g, 20, plan).ok());
  ResidencyPlan no_write_back = plan;
  bool changed = false;
  for (auto& evictions : no_write_back.evictions) {
    for (auto& e : evictions) changed |= std::exchange(e.write_back, false);
  }
  ASSERT_TRUE(changed) << "the plan should write 'a' back";
  EXPECT_NE(ReplayPlan(g, 20, no_write_back).message().find("invariant 4"), absl::string_view::npos);
  ResidencyPlan missing_load = plan;
  for (auto& loads : missing_load.loads) loads.clear();
  EXPECT_FALSE(ReplayPlan(g, 20, missing_load).ok());
  EXPECT_NE(ReplayPlan(g, 10, plan).message().find("invariant 1"), absl::string_view::npos);
}

// Random graphs of mixed sizes, with host ops: every plan replays with every invariant holding.
TEST(ResidencyTest, RandomGraphsGivePlansThatKeepEveryInvariant) {
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 300; ++trial) {
    uint64_t largest = 0;
    const Graph g = RandomGraph(rng, {.max_tensors = 12, .max_ops = 30, .max_units = 64, .pinned_one_in = 10},
                                &largest);
    const uint64_t budget = largest * (1 + rng() % 6);
    auto plan = PlanResidency(g, budget);
    if (!plan.ok()) {
      ASSERT_EQ(plan.status().code(), absl::StatusCode::kResourceExhausted) << plan.status();
      continue;
    }
    ASSERT_TRUE(ReplayPlan(g, budget, *plan).ok()) << ReplayPlan(g, budget, *plan) << " trial " << trial;
    ASSERT_LE(plan->peak_resident_bytes, budget);
  }
}

// Brute force: the fewest loads any eviction choice achieves over one lap from empty.
int MinLoads(const Graph& g, size_t op, std::vector<bool>& resident, int slots) {
  if (op == g.ops.size()) return 0;
  const std::vector<TensorIndex> needed = Touched(g.ops[op]);
  int used = 0, missing = 0;
  for (size_t t = 0; t < resident.size(); ++t) used += resident[t];
  for (TensorIndex t : needed) missing += !resident[t];
  const int must_evict = std::max(0, used + missing - slots);
  std::vector<TensorIndex> candidates;
  for (size_t t = 0; t < resident.size(); ++t) {
    if (resident[t] && !std::binary_search(needed.begin(), needed.end(), t)) candidates.push_back(t);
  }
  int best = INT32_MAX;
  // Every subset of candidates of size must_evict.
  for (uint32_t mask = 0; mask < (1u << candidates.size()); ++mask) {
    if (__builtin_popcount(mask) != must_evict) continue;
    std::vector<bool> next = resident;
    for (size_t k = 0; k < candidates.size(); ++k) {
      if (mask & (1u << k)) next[candidates[k]] = false;
    }
    for (TensorIndex t : needed) next[t] = true;
    const int rest = MinLoads(g, op + 1, next, slots);
    if (rest != INT32_MAX) best = std::min(best, missing + rest);
  }
  return best;
}

TEST(ResidencyTest, FurthestNextUseIsOptimalAgainstBruteForceOnSmallEqualSizeGraphs) {
  std::mt19937_64 rng(5);
  int compared = 0;
  for (int trial = 0; trial < 400; ++trial) {
    Graph g;
    const int tensors = 3 + rng() % 4;
    for (int t = 0; t < tensors; ++t) g.tensors.push_back({"t" + std::to_string(t), 1, false});
    const int ops = 3 + rng() % 7;
    for (int i = 0; i < ops; ++i) {
      GraphOp op{"op" + std::to_string(i), {static_cast<TensorIndex>(rng() % tensors)}, {}, 1};
      if (rng() % 3 == 0) op.writes.push_back(rng() % tensors);
      g.ops.push_back(op);
    }
    const int slots = 2 + rng() % 2;
    std::vector<bool> empty(tensors, false);
    auto plan = PlanResidencyFrom(g, slots, {}, empty);
    const int brute = MinLoads(g, 0, empty, slots);
    if (brute == INT32_MAX) {
      EXPECT_FALSE(plan.ok());
      continue;
    }
    ASSERT_TRUE(plan.ok()) << plan.status();
    ASSERT_TRUE(ReplayPlan(g, slots, *plan, /*cyclic=*/false).ok());
    EXPECT_EQ(plan->bytes_loaded, static_cast<uint64_t>(brute)) << "trial " << trial;
    ++compared;
  }
  EXPECT_GT(compared, 300);
}

TEST(ResidencyTest, OverwrittenValuesAreAllocatedNotLoadedAndDeadValuesAreNeverWrittenBack) {
  // fwd writes an activation, bwd reads it; after bwd it is dead until the next fwd.
  Graph g;
  g.tensors = {{"w", 10, false}, {"act", 10, false}, {"big", 10, false}};
  g.ops = {{"fwd", {0}, {}, 1, {1}}, {"other", {2}, {}, 1}, {"bwd", {0, 1}, {}, 1}, {"other2", {2}, {}, 1}};
  auto plan = PlanResidency(g, 20);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_TRUE(ReplayPlan(g, 20, *plan).ok()) << ReplayPlan(g, 20, *plan);
  EXPECT_EQ(plan->allocs[0], std::vector<TensorIndex>{1});
  for (const auto& loads : plan->loads) {
    EXPECT_EQ(std::count(loads.begin(), loads.end(), TensorIndex{1}), 0) << "act is never loaded";
  }
  bool dropped_dead = false;
  for (const auto& evictions : plan->evictions) {
    for (const Eviction& e : evictions) {
      if (e.tensor == 1) {
        EXPECT_FALSE(e.write_back);
        dropped_dead |= e.dead;
      }
    }
  }
  EXPECT_TRUE(dropped_dead);
  // Replay refuses a plan that calls a live value dead.
  ResidencyPlan wrong = *plan;
  for (auto& evictions : wrong.evictions) {
    for (Eviction& e : evictions) {
      if (e.tensor == 1) e.dead = false;  // a dirty drop now
    }
  }
  EXPECT_NE(ReplayPlan(g, 20, wrong).message().find("invariant 4"), absl::string_view::npos);
}

}  // namespace
}  // namespace tierd::prefetcher
