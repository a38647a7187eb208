// The executor's replans: when drift or a pin swaps a new plan in, at a lap's start, what the
// measured op times leave out, and the lanes' pause for the tiers to settle into its layout.
#include <gtest/gtest.h>

#include <utility>
#include <vector>

#include "prefetcher/executor.h"
#include "prefetcher/executor_test_util.h"

namespace tierd::prefetcher {
namespace {

TEST(ExecutorTest, DriftingOpTimesTriggerAReplanThatIsSwappedInAtALap) {
  Replanning r;
  r.on_replan = [&r](const Graph& measured) {
    EXPECT_GT(measured.ops[1].seconds, 2 * r.g.ops[1].seconds) << "the measured times are used";
  };
  auto executor = r.Start();
  for (int lap = 0; lap < 4; ++lap) {
    RunLap(*executor, r.tiers, r.clock, r.g, /*slowdown=*/3, /*extra_nanos=*/1000);  // 3x slower than planned
  }
  EXPECT_GE(r.replans, 1);
  EXPECT_GE(executor->Stats().replans, 1u);
  EXPECT_EQ(executor->OpBegin(r.g.ops.size()).code(), absl::StatusCode::kInvalidArgument);
}

// Once the plan is rebuilt at the measured op times, the same times are no drift: a client
// steadily 3x slower than the graph's estimates replans once, not every other lap (the
// drift was measured against the registered estimates, not the plan in force).
TEST(ExecutorTest, AReplanAtTheMeasuredTimesSettlesTheDrift) {
  Replanning r;
  auto executor = r.Start();
  for (int lap = 0; lap < 10; ++lap) RunLap(*executor, r.tiers, r.clock, r.g, /*slowdown=*/3, /*extra_nanos=*/1000);
  executor->WaitIdle();
  EXPECT_EQ(r.replans, 1);
  EXPECT_EQ(executor->Stats().replans, 1u);
}

// A drift replan whose replanner keeps the plan in force (a new one would do no better):
// nothing is swapped in, so the GPU keeps its layout; the drift is then measured against the
// times the plan was judged at, so the same times do not ask again every lap.
TEST(ExecutorTest, ADriftReplanMayKeepThePlanInForce) {
  Replanning r;
  r.keep = true;
  auto executor = r.Start();
  const uint64_t generation = executor->Replans();
  for (int lap = 0; lap < 10; ++lap) RunLap(*executor, r.tiers, r.clock, r.g, /*slowdown=*/3, /*extra_nanos=*/1000);
  executor->WaitIdle();
  EXPECT_EQ(r.replans, 1);
  ASSERT_EQ(r.offered_current.size(), 1u);
  EXPECT_TRUE(r.offered_current[0]) << "a drift replan comes with the plan in force";
  const ExecutorStats stats = executor->Stats();
  EXPECT_EQ(stats.replans, 0u);
  EXPECT_EQ(executor->Replans(), static_cast<int64_t>(generation));
  EXPECT_EQ(stats.replans_kept, 1u);
  EXPECT_EQ(stats.last_kept, "the plan in force does as well");
  EXPECT_EQ(stats.errors, 0u) << stats.last_error;
}

// The time the client waits in acquires is not the op's: ops that take 3x their plan on the
// wall, two thirds of it waiting for their tensors, are measured at their plan and nothing
// replans (a replan on such times would plan stalls as compute); the waits are counted by op.
TEST(ExecutorTest, AcquireWaitsAreNotTheOpsTime) {
  Replanning r;
  auto executor = r.Start();
  for (int lap = 0; lap < 4; ++lap) {
    RunLap(*executor, r.tiers, r.clock, r.g, /*slowdown=*/3, /*extra_nanos=*/0, /*slowdown_is_waiting=*/true);
  }
  executor->WaitIdle();
  EXPECT_EQ(r.replans, 0);
  EXPECT_EQ(executor->Stats().replans, 0u);
  // The waits are kept per op instead, after the first lap: laps 2-4 (the last op of lap 4
  // is still running), each op waiting twice its planned time.
  const auto waited = executor->Stats().waited_by_op;
  ASSERT_EQ(waited.size(), r.g.ops.size());
  for (uint32_t i = 0; i < r.g.ops.size(); ++i) {
    const auto& [seconds, times] = waited.at(i);
    EXPECT_EQ(times, i + 1 < r.g.ops.size() ? 3u : 2u) << r.g.ops[i].name;
    const double planned = static_cast<double>(static_cast<int64_t>(r.g.ops[i].seconds * 1e9)) * 1e-9;
    EXPECT_NEAR(seconds / times, 2 * planned, 1e-9) << r.g.ops[i].name;
  }
}

TEST(ExecutorTest, PinsAndDriftingLinksReplanToo) {
  const Graph g = SmallTraining();
  const Budgets budgets{Total(g) / 3, Total(g), Total(g)};
  auto plan = MakePlan(g, budgets);
  ASSERT_TRUE(plan.ok());
  FakeClock clock;
  ModelTiers tiers(g, budgets.gpu, clock);
  const TensorIndex pinned = Named(g, "layers.1.w");
  ASSERT_LT(pinned, g.tensors.size());
  std::vector<bool> pinned_seen;
  bool drifted = false;
  ExecutorOptions options;
  options.replanner = [&](const Graph& measured, const Plan* current) -> absl::StatusOr<Plan> {
    pinned_seen.push_back(measured.tensors[pinned].pinned_gpu);
    // A pin must change the plan; drifting links may keep it.
    EXPECT_EQ(current == nullptr, pinned_seen.size() == 1) << "replan " << pinned_seen.size();
    return MakePlan(measured, budgets);
  };
  options.links_drifted = [&] { return std::exchange(drifted, false); };
  Executor executor(g, *plan, tiers, clock, options);
  executor.SetPinnedGpu({pinned});
  executor.WaitIdle();
  ASSERT_EQ(pinned_seen.size(), 1u);
  EXPECT_TRUE(pinned_seen[0]) << "the replan keeps the newly pinned tensor on the GPU";
  auto lap = [&] { RunLap(executor, tiers, clock, g); };
  lap();
  lap();  // the pin's replan is swapped in at a lap boundary
  EXPECT_EQ(executor.Stats().replans, 1u);
  drifted = true;  // the links run slower than planned
  lap();
  lap();
  EXPECT_EQ(pinned_seen.size(), 2u);
  EXPECT_EQ(executor.Stats().replans, 2u);
  EXPECT_EQ(executor.Stats().errors, 0u) << executor.Stats().last_error;
}

// With pause_after_replan, the lanes stop when a replan is swapped in (at a lap's start, in
// OpBegin) and act again only after ResumeLanes: the tiers settle into the new layout first.
TEST(ExecutorTest, AfterAReplanTheLanesWaitUntilResumed) {
  SmallStep r;
  const Graph& g = r.g;
  FakeClock& clock = r.clock;
  ModelTiers& tiers = r.tiers;
  const TensorIndex pinned = Named(g, "layers.1.w");
  ASSERT_LT(pinned, g.tensors.size());
  ExecutorOptions options;
  options.replanner = [&](const Graph& measured, const Plan*) -> absl::StatusOr<Plan> {
    return MakePlan(measured, r.budgets);
  };
  options.pause_after_replan = true;
  options.single_thread = true;
  Executor executor(g, r.plan, tiers, clock, options);
  executor.SetPinnedGpu({pinned});  // a replan, swapped in at the next lap's start
  executor.WaitIdle();
  RunLap(executor, tiers, clock, g);
  EXPECT_EQ(executor.Replans(), 0);
  tiers.SetCurrentOp(0);
  ASSERT_TRUE(executor.OpBegin(0).ok());
  ASSERT_EQ(executor.Replans(), 1);
  executor.WaitIdle();
  const uint64_t loads = tiers.loads();
  // The client goes on through half the lap (fetching what it misses): the plan moves
  // nothing for it while paused.
  const uint32_t half = static_cast<uint32_t>(g.ops.size() / 2);
  for (uint32_t i = 0; i < half; ++i) {
    if (i > 0) {
      tiers.SetCurrentOp(i);
      ASSERT_TRUE(executor.OpBegin(i).ok());
      executor.WaitIdle();
    }
    tiers.RunOp(g.ops[i]);
    clock.AdvanceNanos(static_cast<int64_t>(g.ops[i].seconds * 1e9));
  }
  EXPECT_EQ(tiers.loads(), loads) << "paused: the new plan's lanes wait";
  executor.ResumeLanes();
  executor.WaitIdle();
  EXPECT_GT(tiers.loads(), loads) << "resumed: the new plan loads";
  for (uint32_t i = half; i < g.ops.size(); ++i) {
    tiers.SetCurrentOp(i);
    ASSERT_TRUE(executor.OpBegin(i).ok());
    executor.WaitIdle();
    tiers.RunOp(g.ops[i]);
    clock.AdvanceNanos(static_cast<int64_t>(g.ops[i].seconds * 1e9));
  }
  const uint64_t misses = tiers.misses();
  RunLap(executor, tiers, clock, g);
  EXPECT_EQ(tiers.misses(), misses) << "a whole lap after, every tensor where the plan wants it";
  EXPECT_EQ(executor.Stats().errors, 0u) << executor.Stats().last_error;
}

}  // namespace
}  // namespace tierd::prefetcher
