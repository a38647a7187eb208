#include <gtest/gtest.h>

#include <algorithm>

#include "prefetcher/residency.h"
#include "prefetcher/test_graphs.h"
#include "prefetcher/tiers.h"

namespace tierd::prefetcher {
namespace {

bool Has(const std::vector<TensorIndex>& v, TensorIndex t) { return std::find(v.begin(), v.end(), t) != v.end(); }

Graph Step() { return HoistableStep(); }  // (test_graphs.h)

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

// `mid` also reads a 60 B tensor: 80 B free there, 40 B in the backward; the state (100 B)
// has nowhere to go before `opt`, so nothing moves.
TEST(HoistLoadsTest, NoRoomNoMove) {
  Graph g = Step();
  g.tensors.push_back({"x", 60});
  g.ops[2].reads.push_back(4);
  auto plan = PlanResidency(g, 240);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_TRUE(Has(plan->loads[3], 2));
  EXPECT_EQ(HoistLoads(g, *plan, 240), 0);
  EXPECT_TRUE(Has(plan->loads[3], 2));
  EXPECT_TRUE(ReplayPlan(g, 240, *plan).ok());
}

}  // namespace
}  // namespace tierd::prefetcher
