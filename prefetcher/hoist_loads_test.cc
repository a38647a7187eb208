#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "prefetcher/random_graph.h"
#include "prefetcher/residency.h"
#include "prefetcher/tiers.h"

namespace tierd::prefetcher {
namespace {

bool Has(const std::vector<TensorIndex>& v, TensorIndex t) { return std::find(v.begin(), v.end(), t) != v.end(); }

// fwd makes an activation, bwd reads it (then it is dead) and makes a gradient, opt updates
// weight and state. 240 B of GPU: the state (100 B) is evicted for the forward and MIN
// brings it back only at opt; from `mid` on the dead activation's room holds it.
Graph Step() {
  Graph g;
  g.tensors = {{"act", 100}, {"w", 50}, {"state", 100}, {"grad", 50}};
  g.ops.push_back({"fwd", {1}, {}, 1, {0}});
  g.ops.push_back({"bwd", {0, 1}, {}, 1, {3}});
  g.ops.push_back({"mid", {1}, {}, 1});
  g.ops.push_back({"opt", {3}, {1, 2}, 1});
  return g;
}

TEST(HoistLoadsTest, ALoadForAWriteMovesIntoTheRoomADeadActivationLeaves) {
  const Graph g = Step();
  auto plan = PlanResidency(g, 240);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_TRUE(Has(plan->loads[3], 2));  // MIN: at the op
  const uint64_t loaded = plan->bytes_loaded;
  EXPECT_EQ(HoistLoads(g, *plan, 240), 1);
  EXPECT_TRUE(Has(plan->loads[2], 2));
  EXPECT_FALSE(Has(plan->loads[3], 2));
  EXPECT_EQ(plan->bytes_loaded, loaded);
  EXPECT_TRUE(ReplayPlan(g, 240, *plan).ok()) << ReplayPlan(g, 240, *plan);
  // Below the GPU the load is exclusive: its DRAM copy goes right after it.
  LowerTierOptions exclusive;
  exclusive.exclusive_loads = true;
  auto lower = PlanLowerTiers(g, *plan, 1000, 1000, exclusive);
  ASSERT_TRUE(lower.ok()) << lower.status();
  bool read = false, dropped_after = false;
  for (const LowerEvent& e : lower->events) {
    if (e.op != 2 || e.tensor != 2) continue;
    if (e.kind == LowerKind::kRead) read = true;
    if (e.kind == LowerKind::kDrop) dropped_after = read;
  }
  EXPECT_TRUE(dropped_after);
  EXPECT_TRUE(ReplayLowerTiers(g, *plan, *lower, 1000, 1000).ok());
  // A read-only load stays where MIN put it: moving it up frees nothing below.
  Graph reading = g;
  reading.ops[3].writes = {1};
  reading.ops[3].reads = {3, 2};
  auto ro = PlanResidency(reading, 240);
  ASSERT_TRUE(ro.ok());
  EXPECT_EQ(HoistLoads(reading, *ro, 240), 0);
}

TEST(HoistLoadsTest, NoRoomNoMove) {
  const Graph g = Step();
  auto plan = PlanResidency(g, 200);  // mid holds w and grad: 100 B free, the state needs 100
  ASSERT_TRUE(plan.ok()) << plan.status();
  auto tight = PlanResidency(g, 199);
  if (tight.ok()) {
    EXPECT_EQ(HoistLoads(g, *tight, 199), 0);
    EXPECT_TRUE(ReplayPlan(g, 199, *tight).ok());
  }
  EXPECT_TRUE(ReplayPlan(g, 200, *plan).ok());
}

// Random graphs and budgets: hoisted plans keep every invariant of ReplayPlan and never load
// more; below them, with MIN's victims and with victims chosen by time, nothing is lost and
// every budget holds (ReplayLowerTiers).
TEST(HoistLoadsTest, RandomGraphsReplayCleanlyHoistedAndWithVictimSlack) {
  std::mt19937_64 rng(29);
  int hoisted_plans = 0, planned = 0;
  for (int trial = 0; trial < 300; ++trial) {
    uint64_t largest = 0;
    const Graph g = RandomGraph(rng, {}, &largest);
    const uint64_t gpu_budget = largest * (1 + rng() % 4), dram = largest * (1 + rng() % 4);
    auto plan = PlanResidency(g, gpu_budget);
    if (!plan.ok()) continue;
    const uint64_t loaded = plan->bytes_loaded, written = plan->bytes_written_back;
    hoisted_plans += HoistLoads(g, *plan, gpu_budget) > 0;
    ASSERT_TRUE(ReplayPlan(g, gpu_budget, *plan).ok()) << ReplayPlan(g, gpu_budget, *plan) << " trial " << trial;
    EXPECT_LE(plan->bytes_loaded, loaded);
    EXPECT_LE(plan->bytes_written_back, written);
    for (double slack : {0.0, 0.25, 0.5}) {
      LowerTierOptions options;
      options.victim_slack = slack;
      options.exclusive_loads = slack != 0.5;
      auto lower = PlanLowerTiers(g, *plan, dram, 1 << 20, options);
      if (!lower.ok()) {
        ASSERT_EQ(lower.status().code(), absl::StatusCode::kResourceExhausted) << lower.status();
        continue;
      }
      ++planned;
      ASSERT_TRUE(ReplayLowerTiers(g, *plan, *lower, dram, 1 << 20).ok())
          << ReplayLowerTiers(g, *plan, *lower, dram, 1 << 20) << " trial " << trial << " slack " << slack;
    }
  }
  EXPECT_GT(hoisted_plans, 20);
  EXPECT_GT(planned, 300);
}

}  // namespace
}  // namespace tierd::prefetcher
