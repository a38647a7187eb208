// The executor: runs a plan against the real tiers as the client reports its progress.
//
// The plan is replayed as two lanes, each in plan order, one lap (iteration) at a time:
//   in:  stages (NVMe->DRAM) and loads (DRAM->GPU) of each op, as far ahead as one lap,
//        taking free room only — a move that does not fit yet waits for the out lane;
//   out: GPU evictions (each once its tensor's last use before it is over), push-downs
//        (DRAM->NVMe) and DRAM drops.
// A tensor's actions keep their plan order across lanes (a load waits for the eviction
// before it, and the other way round). A load issued only once its op has begun is just in
// time (the client's acquire waits for it: a stall); one whose op is over is late: the
// client demand-fetched instead (a miss, counted by the tiers), so it is skipped.
// The executor never decides correctness — the tiers (LeaseTable) do; a wrong or stale
// plan costs time, never bytes.
//
// Measured op times replace the graph's estimates: when they drift from the plan's by
// more than `replan_drift` (mean relative difference over a lap), the plan is rebuilt in the
// background and swapped in at the next lap. Replan() forces it (pins, budgets changed).
#ifndef TIERD_PREFETCHER_EXECUTOR_H_
#define TIERD_PREFETCHER_EXECUTOR_H_

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <future>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "base/clock.h"
#include "prefetcher/graph.h"
#include "prefetcher/simulate.h"

namespace tierd::prefetcher {

// What the executor asks of the tiers; the daemon implements it over its LeaseTable.
// RESOURCE_EXHAUSTED: no free room yet (try again later); FAILED_PRECONDITION: the tensor
// is in use or pinned (try again later); any other error is counted and the move skipped.
class TierOps {
 public:
  virtual ~TierOps() = default;
  // A GPU copy, from free room; for a tensor whose value is dead (discarded, or never
  // written), room reserved for the overwrite to come.
  virtual absl::Status Load(TensorIndex t) = 0;
  // The GPU copy away. dead: every copy goes, nothing is written — unless the tensor was
  // written at or after `decided_nanos` (the client got to its next use first): then
  // FAILED_PRECONDITION, and nothing happens.
  virtual absl::Status Evict(TensorIndex t, bool dead, int64_t decided_nanos) = 0;
  virtual absl::Status Stage(TensorIndex t) = 0;              // a DRAM copy, from free room
  virtual absl::Status PushDown(TensorIndex t) = 0;           // an NVMe copy, then no DRAM copy
  virtual absl::Status DropDram(TensorIndex t) = 0;           // the DRAM copy away
};

struct ExecutorOptions {
  double replan_drift = 0.25;
  // Plans a graph (with measured op times) for a replan; PlanBest with the session's
  // budgets and the measured links, in the daemon.
  std::function<absl::StatusOr<Plan>(const Graph&)> replanner;
};

struct ExecutorStats {
  uint64_t loads = 0, evictions = 0, stages = 0, push_downs = 0, drops = 0;
  uint64_t late = 0;        // skipped: the client was past their op (it fetched on demand)
  uint64_t just_in_time = 0;  // loads issued only once their op had begun: the client waited
  std::map<uint32_t, uint64_t> just_in_time_by_op;
  uint64_t waits = 0;       // tries that found no room or a busy tensor, and waited
  uint64_t errors = 0;      // moves the tiers refused for another reason
  uint64_t laps = 0;        // iterations seen complete
  uint64_t replans = 0;
  double last_lap_seconds = 0;    // measured step time
  double mean_lap_seconds = 0;    // over the laps after the first
};

class Executor {
 public:
  // `ops` must outlive the executor. The plan must be for `graph`.
  Executor(Graph graph, Plan plan, TierOps& ops, Clock& clock, ExecutorOptions options = {});
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // The client is about to run `op` (0-based index in the graph). Wrapping to a smaller
  // index starts the next lap. INVALID_ARGUMENT for an index outside the graph.
  absl::Status OpBegin(uint32_t op);
  // Blocks until neither lane can make progress without more client progress, and any
  // replan in flight is done. For tests.
  void WaitIdle();
  // Rebuild the plan from measured op times now (in the background).
  void Replan();

  ExecutorStats Stats() const;
  // Where each lane is and what its next move waits for, in words.
  std::string Describe() const;
  const Graph& graph() const { return graph_; }
  // The plan in force and a recorded timeline of the last two laps (ops and moves).
  Plan CurrentPlan() const;
  std::vector<TimelineEvent> Timeline() const;

 private:
  enum class Kind : uint8_t { kStage, kLoad, kEvict, kEvictDead, kPushDown, kDrop, kAlloc };
  struct Action {
    Kind kind;
    TensorIndex tensor;
    uint32_t op;          // the op it serves (happens before it runs)
    int64_t ready_after;  // evictions: the op (relative to this lap; may be < 0) whose end frees it
    int64_t next_use;     // evictions: the tensor's next use (relative; may be >= ops): too late then
    int64_t other_lane;   // index in the other lane of this tensor's previous action (may be < 0: last lap)
  };
  struct Lane {
    std::vector<Action> actions;  // one lap
    int64_t next = 0;             // global position: lap * size + index
    int64_t done = -1;            // last global position finished
  };
  struct Schedule {
    Lane in, out;
  };
  static Schedule Build(const Graph& graph, const Plan& plan);
  void Run(bool in_lane);
  // Whether the action at global position `pos` of the lane may start now; *late if skipped.
  bool Ready(const Lane& lane, const Lane& other, int64_t pos, bool* late) const;
  absl::Status Do(const Action& a, int64_t decided_nanos);
  void CheckDrift();

  const Graph graph_;
  TierOps& ops_;
  Clock& clock_;
  ExecutorOptions options_;

  mutable std::mutex mutex_;
  std::condition_variable changed_, idle_;
  uint64_t version_ = 0;                 // bumped on every change a lane may wait for
  uint64_t blocked_[2] = {UINT64_MAX, UINT64_MAX};  // per lane (out, in): version it blocked at
  Plan plan_;
  Schedule schedule_;
  int64_t current_ = -1;  // global op index the client is on (lap * ops + op)
  uint32_t last_op_ = 0;
  bool stopping_ = false;
  int busy_lanes_ = 0;
  std::vector<int64_t> op_begin_nanos_;  // per op of the current and previous lap
  std::vector<double> measured_seconds_;
  int64_t lap_start_nanos_ = -1;
  ExecutorStats stats_;
  std::vector<TimelineEvent> timeline_;
  std::future<absl::StatusOr<Plan>> replanning_;
  bool swap_at_lap_ = false;
  std::thread in_thread_, out_thread_;
};

}  // namespace tierd::prefetcher

#endif  // TIERD_PREFETCHER_EXECUTOR_H_
