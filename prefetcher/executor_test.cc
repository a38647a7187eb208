#include "prefetcher/executor.h"

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <random>
#include <thread>
#include <utility>

#include "prefetcher/executor_test_util.h"

namespace tierd::prefetcher {
namespace {

// Optimizer state loaded for its update, hoisted into the room the backward frees: the DRAM
// copy is dropped once the load has landed, never before (it would be the only copy then).
TEST(ExecutorTest, AnExclusiveLoadsDropWaitsForTheLoad) {
  const Graph g = SmallTraining();
  const Budgets budgets{Total(g) / 3, Total(g), Total(g)};
  auto plan = MakePlan(g, budgets, 0, PlanStyle{true, true, 0});
  ASSERT_TRUE(plan.ok()) << plan.status();
  int exclusive = 0;
  for (const LowerEvent& e : plan->lower.events) exclusive += e.kind == LowerKind::kDrop;
  ASSERT_GT(exclusive, 0);
  FakeClock clock;
  ModelTiers tiers(g, budgets.gpu, clock);
  ExecutorOptions options;
  options.single_thread = true;
  Executor executor(g, *plan, tiers, clock, options);
  for (int lap = 0; lap < 4; ++lap) RunLap(executor, tiers, clock, g);
  EXPECT_GE(tiers.drops(), 3u * exclusive);
  EXPECT_EQ(tiers.only_copy_drops(), 0u);
  EXPECT_EQ(executor.Stats().errors, 0u) << executor.Stats().last_error;
}

TEST(ExecutorTest, FollowingThePlanTheClientNeverMissesAndWaitsOnlyWhereTheSimulatorSaidSo) {
  const Graph g = SmallTraining();
  const Budgets budgets{Total(g) / 3, Total(g), Total(g)};
  const LinkModel link;
  auto plan = PlanBest(g, budgets, link);
  ASSERT_TRUE(plan.ok()) << plan.status();
  auto sim = SimulatePlan(g, *plan, budgets, link, {});
  ASSERT_TRUE(sim.ok()) << sim.status();
  FakeClock clock;
  ModelTiers tiers(g, budgets.gpu, clock);
  Executor executor(g, *plan, tiers, clock);
  uint64_t misses_after_warmup = 0;
  for (int lap = 0; lap < 5; ++lap) {
    const uint64_t before = tiers.misses();
    RunLap(executor, tiers, clock, g);
    if (lap >= 2) misses_after_warmup += tiers.misses() - before;
  }
  EXPECT_EQ(misses_after_warmup, 0u);
  // Loads the client had to wait for happen only before ops the simulator predicted a stall for.
  for (const auto& [op, count] : executor.Stats().just_in_time_by_op) {
    EXPECT_GT(sim->op_stall_seconds[op], 0) << count << " load(s) just in time before op " << op << " '"
                                            << g.ops[op].name << "', where the simulator saw no stall";
  }
  EXPECT_LE(tiers.peak(), budgets.gpu);
  const ExecutorStats stats = executor.Stats();
  EXPECT_GT(stats.loads, 0u);
  EXPECT_EQ(stats.laps, 4u);
  EXPECT_EQ(stats.errors, 0u);
}

// With load_lead_ops, a load issues no sooner than that many ops before the op it serves (the
// plan's, which a hoist may set before the use): the loads come later than up to a lap ahead,
// and the client still never misses after warm-up.
TEST(ExecutorTest, LoadsIssueWithinTheirLeadAndTheClientStillNeverMisses) {
  std::map<int, int64_t> most_ahead;
  for (const int lead : {-1, 1}) {
    SmallStep s;
    ExecutorOptions options;
    options.load_lead_ops = lead;
    Executor executor(s.g, s.plan, s.tiers, s.clock, options);
    uint64_t misses_after_warmup = 0;
    for (int lap = 0; lap < 5; ++lap) {
      const uint64_t before = s.tiers.misses();
      RunLap(executor, s.tiers, s.clock, s.g);
      if (lap >= 2) misses_after_warmup += s.tiers.misses() - before;
    }
    EXPECT_EQ(misses_after_warmup, 0u) << "lead " << lead;
    EXPECT_EQ(executor.Stats().errors, 0u);
    EXPECT_GT(s.tiers.loads(), 0u);
    most_ahead[lead] = s.tiers.most_ahead();
  }
  EXPECT_LT(most_ahead[1], most_ahead[-1]) << "the lead held the loads back";
  std::printf("the most ops a load came before its use: %ld up to a lap ahead, %ld with a lead of 1\n",
              static_cast<long>(most_ahead[-1]), static_cast<long>(most_ahead[1]));
}

TEST(ExecutorTest, AStarvedExecutorOnlyCostsMissesNeverValues) {
  // The client runs ahead without waiting for the executor (seeded): some loads are late,
  // the client fetches on demand, and every value read is still the latest one.
  SmallStep step;
  const Graph& g = step.g;
  ModelTiers& tiers = step.tiers;
  FakeClock& clock = step.clock;
  const Budgets& budgets = step.budgets;
  Executor executor(g, step.plan, tiers, clock);
  std::mt19937_64 rng(42);
  for (int lap = 0; lap < 6; ++lap) {
    for (uint32_t i = 0; i < g.ops.size(); ++i) {
      ASSERT_TRUE(executor.OpBegin(i).ok());
      if (rng() % 3 == 0) executor.WaitIdle();
      tiers.RunOp(g.ops[i]);
      clock.AdvanceNanos(1000);
    }
  }
  executor.WaitIdle();
  EXPECT_LE(tiers.peak(), budgets.gpu);
  EXPECT_EQ(executor.Stats().errors, 0u);
}

// A client far ahead of a slow executor (each load takes 1 ms on the wall; the client never
// waits for the lanes) that, before fetching a missing tensor on demand, waits for the plan's
// load of it: after the first lap it never fetches on demand, and every load the plan makes
// for an op is done by the executor. Without the waits the same client misses (the control).
TEST(ExecutorTest, AClientThatWaitsForThePlannedLoadsNeverFetchesOnDemand) {
  for (bool wait : {false, true}) {
    SmallStep step;
    const Graph& g = step.g;
    ModelTiers& tiers = step.tiers;
    FakeClock& clock = step.clock;
    tiers.SetLoadDelay(std::chrono::microseconds(1000));
    Executor executor(g, step.plan, tiers, clock);
    uint64_t misses_after_first_lap = 0;
    for (int lap = 0; lap < 3; ++lap) {
      const uint64_t before = tiers.misses();
      for (uint32_t i = 0; i < g.ops.size(); ++i) {
        ASSERT_TRUE(executor.OpBegin(i).ok());
        for (TensorIndex t : Touched(g.ops[i])) {
          if (wait && !tiers.OnGpu(t)) executor.AwaitPlannedLoad(t, 2'000'000'000, 20'000'000'000);
        }
        tiers.RunOp(g.ops[i]);
        clock.AdvanceNanos(1000);
      }
      if (lap > 0) misses_after_first_lap += tiers.misses() - before;
    }
    executor.WaitIdle();
    const ExecutorStats stats = executor.Stats();
    EXPECT_EQ(stats.errors, 0u) << stats.last_error;
    if (wait) {
      EXPECT_EQ(misses_after_first_lap, 0u);
      EXPECT_GT(stats.awaited, 0u);
      EXPECT_EQ(stats.await_gave_up, 0u);
    } else {
      EXPECT_GT(misses_after_first_lap, 0u) << "the control: a client this far ahead misses";
    }
  }
}

// The wait cannot hang the client: a load the tiers never find room for is given up on as
// soon as no lane can move (the limits here, a minute each, are not waited for), and
// StopWaits ends every wait.
TEST(ExecutorTest, AWaitForAPlannedLoadThatCannotHappenGivesUp) {
  SmallStep step;
  const Graph& g = step.g;
  const Plan* plan = &step.plan;
  step.tiers.RefuseLoads();
  Executor executor(g, step.plan, step.tiers, step.clock);
  // The first op whose plan loads a tensor.
  uint32_t op = 0;
  while (op < g.ops.size() && plan->gpu.loads[op].empty()) ++op;
  ASSERT_LT(op, g.ops.size());
  for (uint32_t i = 0; i <= op; ++i) ASSERT_TRUE(executor.OpBegin(i).ok());
  const TensorIndex t = plan->gpu.loads[op][0];
  const auto start = std::chrono::steady_clock::now();
  EXPECT_FALSE(executor.AwaitPlannedLoad(t, 60'000'000'000, 60'000'000'000));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(30)) << "it waited for the limits";
  EXPECT_EQ(executor.Stats().await_gave_up, 1u);
  // Why, for the summary: the tensor, that no lane could move, and what each lane waited for.
  const std::string why = executor.Stats().last_gave_up;
  EXPECT_NE(why.find("'" + g.tensors[t].name + "' at op"), std::string::npos) << why;
  EXPECT_NE(why.find("(no lane could move)"), std::string::npos) << why;
  EXPECT_NE(why.find("gpu in at lap 0"), std::string::npos) << why;
  // A tensor this op does not load has nothing queued: false at once, not a wait given up.
  TensorIndex other = 0;
  const auto& loaded = plan->gpu.loads[op];
  const auto& allocated = plan->gpu.allocs[op];
  while (std::count(loaded.begin(), loaded.end(), other) + std::count(allocated.begin(), allocated.end(), other) > 0) {
    ++other;
  }
  EXPECT_FALSE(executor.AwaitPlannedLoad(other, 20'000'000'000, 20'000'000'000));
  EXPECT_EQ(executor.Stats().await_gave_up, 1u);
  executor.StopWaits();
  EXPECT_FALSE(executor.AwaitPlannedLoad(t, 20'000'000'000, 20'000'000'000));
}

// A load hoisted ahead of its use (state brought up in `mid` for `opt`) that cannot be
// issued while `mid` runs is not late when `mid` ends: the client's acquire at `opt` waits
// for it rather than fetching at once, and it is skipped only once `opt` is over. (On the
// H200 such loads were skipped as late, about 22 a lap, and fetched on demand.)
TEST(ExecutorTest, AHoistedLoadIsLateOnlyOnceTheOpThatUsesItIsOver) {
  const Graph g = HoistableStep();
  const Budgets budgets{240, 1000, 1000};
  auto plan = MakePlan(g, budgets, 0, PlanStyle{true, true, 0});
  ASSERT_TRUE(plan.ok()) << plan.status();
  const TensorIndex state = 2;
  ASSERT_EQ(std::count(plan->gpu.loads[2].begin(), plan->gpu.loads[2].end(), state), 1)
      << "the premise: the state's load is hoisted to mid";
  FakeClock clock;
  ModelTiers tiers(g, budgets.gpu, clock);
  Executor executor(g, *plan, tiers, clock);
  RunLap(executor, tiers, clock, g);  // warm-up
  const ExecutorStats before = executor.Stats();
  const uint64_t misses = tiers.misses();
  for (uint32_t i = 0; i < 2; ++i) {
    ASSERT_TRUE(executor.OpBegin(i).ok());
    executor.WaitIdle();
    tiers.RunOp(g.ops[i]);
  }
  tiers.RefuseLoads();  // no room for the hoisted load while mid runs
  ASSERT_TRUE(executor.OpBegin(2).ok());
  executor.WaitIdle();
  tiers.RunOp(g.ops[2]);
  ASSERT_TRUE(executor.OpBegin(3).ok());
  executor.WaitIdle();
  EXPECT_EQ(executor.Stats().late, before.late) << "the hoisted load was skipped as late when mid ended";
  // At opt the client finds the state missing: the planned load is still queued, so its
  // acquire waits for it (here it gives up: the tiers still refuse).
  EXPECT_FALSE(executor.AwaitPlannedLoad(state, 20'000'000, 20'000'000'000));
  EXPECT_EQ(executor.Stats().await_gave_up, before.await_gave_up + 1) << "it found no load to wait for";
  tiers.RefuseLoads(false);
  tiers.RunOp(g.ops[3]);  // fetched on demand
  EXPECT_EQ(tiers.misses(), misses + 1);
  // Once opt is over it is late (skipped), with the other moves the tiers refused meanwhile.
  ASSERT_TRUE(executor.OpBegin(0).ok());
  executor.WaitIdle();
  const ExecutorStats after = executor.Stats();
  EXPECT_GT(after.late, before.late);
  EXPECT_EQ(after.errors, 0u) << after.last_error;
}

// tierctl plan --session shows where each lane is and whose turn it is to take DRAM room;
// the turn moves on as write-backs land.
TEST(ExecutorTest, DescribeSaysWhoseTurnItIsForDramRoom) {
  SmallStep step;
  ExecutorOptions options;
  options.single_thread = true;
  Executor executor(step.g, step.plan, step.tiers, step.clock, options);
  const std::string before = executor.Describe();
  EXPECT_NE(before.find("DRAM room next to evict "), std::string::npos) << before;
  EXPECT_NE(before.find("(lap 0)"), std::string::npos) << before;
  RunLap(executor, step.tiers, step.clock, step.g);
  RunLap(executor, step.tiers, step.clock, step.g);
  executor.WaitIdle();
  const std::string after = executor.Describe();
  EXPECT_EQ(after.find("(lap 0)"), std::string::npos) << "two laps on, the turn is past lap 0: " << after;
}

// A move running now (the lock let go while the tiers copy) is shown as in flight.
TEST(ExecutorTest, DescribeShowsAMoveInFlight) {
  SmallStep step;
  step.tiers.SetLoadDelay(std::chrono::microseconds(200'000));
  Executor executor(step.g, step.plan, step.tiers, step.clock);
  ASSERT_TRUE(executor.OpBegin(0).ok());  // the loads for the first ops may start
  std::string seen;
  for (int i = 0; i < 400 && seen.find("(in flight)") == std::string::npos; ++i) {
    seen = executor.Describe();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_NE(seen.find("gpu in at lap 0"), std::string::npos) << seen;
  EXPECT_NE(seen.find("(in flight)"), std::string::npos) << seen;
}

}  // namespace
}  // namespace tierd::prefetcher
