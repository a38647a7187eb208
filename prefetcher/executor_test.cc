#include "prefetcher/executor.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <utility>

#include "base/fake_clock.h"
#include "prefetcher/synthetic.h"
#include "prefetcher/test_graphs.h"

namespace tierd::prefetcher {
namespace {

// A model of the tiers with versions per copy, so a stale or lost value is caught: the
// client's writes bump the GPU copy's version; every read checks it sees the latest.
class ModelTiers : public TierOps {
 public:
  ModelTiers(const Graph& g, uint64_t gpu_budget, Clock& clock)
      : g_(g), budget_(gpu_budget), n_(g.tensors.size()), clock_(clock) {
    written_at_.assign(n_, -1);
    gpu_.assign(n_, -1);
    dram_.assign(n_, 0);  // everything starts in DRAM at version 0
    nvme_.assign(n_, -1);
    latest_.assign(n_, 0);
  }
  absl::Status Load(TensorIndex t) override {
    if (load_delay_.count() > 0) std::this_thread::sleep_for(load_delay_);  // a slow link, on the wall
    std::lock_guard<std::mutex> lock(mutex_);
    if (refuse_loads_) return absl::ResourceExhaustedError("no room, ever");
    if (gpu_[t] >= 0) return absl::OkStatus();
    if (used_ + g_.tensors[t].bytes > budget_) return absl::ResourceExhaustedError("no room");
    if (dead_.count(t)) {  // room for the overwrite to come; the value stays undefined
      gpu_[t] = latest_[t];
      used_ += g_.tensors[t].bytes;
      return absl::OkStatus();
    }
    Bring(t);
    ++loads_;
    // How many ops before the tensor's next use on the GPU this load came.
    const int64_t ops = static_cast<int64_t>(g_.ops.size());
    for (int64_t ahead = 0; current_op_ >= 0 && ahead < ops; ++ahead) {
      const GraphOp& next = g_.ops[(current_op_ + ahead) % ops];
      if (UseOf(next, t) != Use::kNone) {
        most_ahead_ = std::max(most_ahead_, ahead);
        break;
      }
    }
    return absl::OkStatus();
  }
  absl::Status Evict(TensorIndex t, bool dead, int64_t decided_nanos) override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (in_use_.count(t)) return absl::FailedPreconditionError("in use");
    if (dead && written_at_[t] >= decided_nanos) return absl::FailedPreconditionError("written since");
    if (dead) {
      dead_.insert(t);
      dram_[t] = nvme_[t] = -1;
      if (gpu_[t] >= 0) Drop(t);
      return absl::OkStatus();
    }
    if (gpu_[t] < 0) return absl::OkStatus();
    if (dram_[t] != gpu_[t] && nvme_[t] != gpu_[t]) dram_[t] = gpu_[t];  // write back
    Drop(t);
    return absl::OkStatus();
  }
  absl::Status Stage(TensorIndex) override { return absl::OkStatus(); }  // one tier below here
  absl::Status PushDown(TensorIndex) override { return absl::OkStatus(); }
  // (NVMe is not modelled: a drop is only right where the GPU holds the same bytes, as after
  // an exclusive load, or where the value is dead.)
  absl::Status DropDram(TensorIndex t) override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (dram_[t] < 0) return absl::OkStatus();
    if (gpu_[t] != dram_[t] && !dead_.count(t)) {
      ++only_copy_drops_;
      return absl::OkStatus();  // kept: the test fails on the count, not on a lost value
    }
    dram_[t] = -1;
    ++drops_;
    return absl::OkStatus();
  }
  absl::Status DropNvme(TensorIndex) override { return absl::OkStatus(); }

  // The client runs op i: every tensor it touches must be on the GPU (a miss fetches it
  // on demand, evicting the least recently used), with its latest value unless overwritten.
  void RunOp(const GraphOp& op) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (TensorIndex t : Touched(op)) in_use_.insert(t);
    for (TensorIndex t : Touched(op)) {
      const Use use = UseOf(op, t);
      if (gpu_[t] < 0) {
        if (use != Use::kOverwrite) ++misses_;
        while (used_ + g_.tensors[t].bytes > budget_) EvictLru();
        if (use == Use::kOverwrite) {
          gpu_[t] = latest_[t];
          used_ += g_.tensors[t].bytes;
        } else {
          Bring(t);
        }
      }
      if (use != Use::kOverwrite) {
        EXPECT_FALSE(dead_.count(t)) << g_.tensors[t].name << " read after it was discarded";
        EXPECT_EQ(gpu_[t], latest_[t]) << g_.tensors[t].name << " is stale";
      }
      if (use != Use::kRead) {
        written_at_[t] = clock_.NowNanos();
        gpu_[t] = ++latest_[t];
        dram_[t] = nvme_[t] = -1;
        dead_.erase(t);
      }
      last_use_[t] = ++tick_;
      peak_ = std::max(peak_, used_);
    }
    in_use_.clear();
  }
  bool OnGpu(TensorIndex t) {
    std::lock_guard<std::mutex> lock(mutex_);
    return gpu_[t] >= 0;
  }
  void SetLoadDelay(std::chrono::microseconds delay) { load_delay_ = delay; }
  // The op the client is about to run (for most_ahead).
  void SetCurrentOp(int64_t op) {
    std::lock_guard<std::mutex> lock(mutex_);
    current_op_ = op;
  }
  // The most ops any load came before its tensor's next use.
  int64_t most_ahead() const { return most_ahead_; }
  void RefuseLoads(bool refuse = true) {
    std::lock_guard<std::mutex> lock(mutex_);
    refuse_loads_ = refuse;
  }
  uint64_t misses() const { return misses_; }
  uint64_t drops() const { return drops_; }
  uint64_t only_copy_drops() const { return only_copy_drops_; }
  uint64_t loads() const { return loads_; }
  uint64_t peak() const { return peak_; }

 private:
  void Bring(TensorIndex t) {
    const int64_t below = std::max(dram_[t], nvme_[t]);
    EXPECT_TRUE(below >= 0 || dead_.count(t)) << g_.tensors[t].name << " has no copy anywhere";
    gpu_[t] = below;
    used_ += g_.tensors[t].bytes;
  }
  void Drop(TensorIndex t) {
    gpu_[t] = -1;
    used_ -= g_.tensors[t].bytes;
  }
  void EvictLru() {
    int victim = -1;
    for (size_t t = 0; t < n_; ++t) {
      if (gpu_[t] < 0 || in_use_.count(t)) continue;
      if (victim < 0 || last_use_[t] < last_use_[victim]) victim = t;
    }
    ASSERT_GE(victim, 0);
    if (dram_[victim] != gpu_[victim]) dram_[victim] = gpu_[victim];
    Drop(victim);
  }

  const Graph& g_;
  const uint64_t budget_;
  const size_t n_;
  Clock& clock_;
  std::vector<int64_t> written_at_;
  std::mutex mutex_;
  std::vector<int64_t> gpu_, dram_, nvme_, latest_;
  std::set<TensorIndex> dead_, in_use_;
  std::map<TensorIndex, uint64_t> last_use_;
  uint64_t tick_ = 0, used_ = 0, misses_ = 0, loads_ = 0, peak_ = 0, drops_ = 0, only_copy_drops_ = 0;
  std::chrono::microseconds load_delay_{0};
  bool refuse_loads_ = false;
  int64_t current_op_ = -1, most_ahead_ = 0;
};

Graph SmallTraining() {
  TraceOptions trace;
  trace.micro_batch_seqs = 1;
  trace.seq_len = 64;
  trace.grad_accum = 2;
  return SyntheticTransformer(*ShapePreset("tiny"), trace);
}

uint64_t Total(const Graph& g) {
  uint64_t total = 0;
  for (const auto& t : g.tensors) total += t.bytes;
  return total;
}

// One iteration by a client that waits for the executor before each op and takes
// `slowdown` times the planned op time (plus `extra_nanos`) on the clock.
// With `slowdown_is_waiting` the time beyond the plan is spent waiting in acquires (and
// reported so), not computing.
// The index of the tensor named `name` (g.tensors.size() when none is).
TensorIndex Named(const Graph& g, const std::string& name) {
  TensorIndex t = 0;
  while (t < g.tensors.size() && g.tensors[t].name != name) ++t;
  return t;
}

void RunLap(Executor& executor, ModelTiers& tiers, FakeClock& clock, const Graph& g, double slowdown = 1,
            int64_t extra_nanos = 0, bool slowdown_is_waiting = false) {
  for (uint32_t i = 0; i < g.ops.size(); ++i) {
    tiers.SetCurrentOp(i);
    ASSERT_TRUE(executor.OpBegin(i).ok());
    executor.WaitIdle();
    tiers.RunOp(g.ops[i]);
    const auto planned = static_cast<int64_t>(g.ops[i].seconds * 1e9);
    const int64_t wall = static_cast<int64_t>(planned * slowdown) + extra_nanos;
    if (slowdown_is_waiting) executor.AcquireWaited(wall - planned);
    clock.AdvanceNanos(wall);
  }
}

// A small training step planned with a third of its state on the GPU, model tiers on a
// fake clock, and an executor whose replans are counted (and shown to `on_replan`).
struct Replanning {
  Graph g = SmallTraining();
  Budgets budgets{Total(g) / 3, Total(g), Total(g)};
  FakeClock clock;
  ModelTiers tiers{g, budgets.gpu, clock};
  int replans = 0;
  std::function<void(const Graph&)> on_replan = [](const Graph&) {};
  std::unique_ptr<Executor> Start() {
    auto plan = MakePlan(g, budgets);
    EXPECT_TRUE(plan.ok()) << plan.status();
    ExecutorOptions options;
    options.replanner = [this](const Graph& measured) -> absl::StatusOr<Plan> {
      ++replans;
      on_replan(measured);
      return MakePlan(measured, budgets);
    };
    return std::make_unique<Executor>(g, *plan, tiers, clock, options);
  }
};

// A small training step planned with a third of its state on the GPU, and model tiers.
struct SmallStep {
  Graph g = SmallTraining();
  Budgets budgets{Total(g) / 3, Total(g), Total(g)};
  Plan plan = *MakePlan(g, budgets);
  FakeClock clock;
  ModelTiers tiers{g, budgets.gpu, clock};
};

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

// The wait cannot hang the client: a load the tiers never find room for is given up on once
// nothing has moved for the stuck limit, and StopWaits ends every wait.
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
  EXPECT_FALSE(executor.AwaitPlannedLoad(t, 20'000'000, 20'000'000'000));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  EXPECT_EQ(executor.Stats().await_gave_up, 1u);
  // Why, for the summary: the tensor, and what each lane waited for then.
  const std::string why = executor.Stats().last_gave_up;
  EXPECT_NE(why.find("'" + g.tensors[t].name + "' at op"), std::string::npos) << why;
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
  options.replanner = [&](const Graph& measured) -> absl::StatusOr<Plan> {
    pinned_seen.push_back(measured.tensors[pinned].pinned_gpu);
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
  options.replanner = [&](const Graph& measured) -> absl::StatusOr<Plan> { return MakePlan(measured, r.budgets); };
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
