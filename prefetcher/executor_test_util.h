// The executor tests' model of the tiers, graphs and client loop (executor_test,
// executor_replan_test).
#ifndef TIERD_PREFETCHER_EXECUTOR_TEST_UTIL_H_
#define TIERD_PREFETCHER_EXECUTOR_TEST_UTIL_H_

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "base/fake_clock.h"
#include "prefetcher/executor.h"
#include "prefetcher/synthetic.h"
#include "prefetcher/test_graphs.h"

namespace tierd::prefetcher {

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

inline Graph SmallTraining() {
  TraceOptions trace;
  trace.micro_batch_seqs = 1;
  trace.seq_len = 64;
  trace.grad_accum = 2;
  return SyntheticTransformer(*ShapePreset("tiny"), trace);
}

inline uint64_t Total(const Graph& g) {
  uint64_t total = 0;
  for (const auto& t : g.tensors) total += t.bytes;
  return total;
}

// The index of the tensor named `name` (g.tensors.size() when none is).
inline TensorIndex Named(const Graph& g, const std::string& name) {
  TensorIndex t = 0;
  while (t < g.tensors.size() && g.tensors[t].name != name) ++t;
  return t;
}

// One iteration by a client that waits for the executor before each op and takes
// `slowdown` times the planned op time (plus `extra_nanos`) on the clock.
// With `slowdown_is_waiting` the time beyond the plan is spent waiting in acquires (and
// reported so), not computing.
inline void RunLap(Executor& executor, ModelTiers& tiers, FakeClock& clock, const Graph& g, double slowdown = 1,
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
  // Set: a drift replan keeps the plan in force (ALREADY_EXISTS), as the daemon's does when a
  // new plan would do no better.
  bool keep = false;
  std::vector<bool> offered_current;  // per replan: whether the plan in force came with it
  std::unique_ptr<Executor> Start() {
    auto plan = MakePlan(g, budgets);
    EXPECT_TRUE(plan.ok()) << plan.status();
    ExecutorOptions options;
    options.replanner = [this](const Graph& measured, const Plan* current) -> absl::StatusOr<Plan> {
      ++replans;
      offered_current.push_back(current != nullptr);
      on_replan(measured);
      if (keep && current != nullptr) return absl::AlreadyExistsError("the plan in force does as well");
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

}  // namespace tierd::prefetcher

#endif  // TIERD_PREFETCHER_EXECUTOR_TEST_UTIL_H_
