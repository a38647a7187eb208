// The executor: runs a plan against the real tiers as the client reports its progress.
//
// The plan is replayed as four lanes, one per kind of move, each in plan order, one lap
// (iteration) at a time, like the simulator's queues:
//   gpu in:   loads (DRAM->GPU) and room for overwrites, as far ahead as one lap, taking
//             free room only — a move that does not fit yet waits for room;
//   gpu out:  evictions, each once its tensor's last use before it is over (in any order:
//             one waiting for its tensor's last use does not hold up the others);
//   dram in:  stages (NVMe->DRAM), up to a lap ahead, free DRAM room only;
//   dram out: push-downs (DRAM->NVMe), DRAM drops and discards of values dead after their
//             host use (in any order, like gpu out).
// A tensor's moves keep their plan order across lanes (a load waits for the eviction
// before it, a push-down for the load that read the copy, and so on), and the moves that
// take DRAM room (write-backs, stages) take it in the plan's order, as the simulator grants
// it: a stage a lap ahead cannot take the room a write-back needs now. A load issued only
// once the op that uses the tensor has begun is just in time (the client's acquire waits
// for it: a stall); one whose using op is over is late: the client demand-fetched instead
// (a miss, counted by the tiers), so it is skipped. (A load hoisted to an earlier op is
// neither when only that op has begun or ended.)
// The executor never decides correctness — the tiers (LeaseTable) do; a wrong or stale
// plan costs time, never bytes.
//
// Measured op times replace the graph's estimates: when they drift from the plan's by
// more than `replan_drift` (mean relative difference over a lap), the plan is rebuilt in the
// background and swapped in at the next lap (if it does better: ExecutorOptions::replanner).
// A change of pins (SetPinnedGpu) always replans.
#ifndef TIERD_PREFETCHER_EXECUTOR_H_
#define TIERD_PREFETCHER_EXECUTOR_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
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
  virtual absl::Status DropNvme(TensorIndex t) = 0;           // the NVMe copy away (DRAM has it)
};

struct ExecutorOptions {
  double replan_drift = 0.25;
  // One thread takes the lanes in turn, in a fixed order, instead of a thread per lane:
  // with a client that waits for WaitIdle, every run is the same (deterministic tests).
  bool single_thread = false;
  // Plans a graph (with measured op times) for a replan; PlanBest with the session's
  // budgets and the measured links, in the daemon. `current` is the plan in force when the
  // replan is for drift (op times or links), null when it must change (new pins): the
  // replanner may then answer ALREADY_EXISTS, with the reason, to keep the plan in force and
  // its layout. A new plan lays the GPU out anew and the copies placed by the old one cascade
  // off it, which made the 1.3B step on an H100 16% slower (docs/runs/2026-12-06-s42);
  // that is worth paying only for a plan that does better at the measured times.
  std::function<absl::StatusOr<Plan>(const Graph&, const Plan* current)> replanner;
  // Asked once a lap: have the links drifted from what the plan assumed? (The daemon
  // compares the Mover's measured bandwidths with the plan's.) Yes: replan.
  std::function<bool()> links_drifted;
  // After a replan is swapped in (at a lap's start, in OpBegin), the lanes wait until
  // ResumeLanes: the tiers first settle into the new plan's layout, or its loads race them
  // for the ranges the old layout's copies still hold.
  bool pause_after_replan = false;
  // A load into the GPU issues at most this many ops before the op it serves (-1: up to a lap
  // ahead, as room allows). Issued early, a load takes the room of its layout range's tenant
  // before that one leaves, so it goes elsewhere and the static layout unravels. In the
  // replay of a 1.3B step (tools/planreplay, 18-22 GiB) 1 op put 1.0-2.1x the copies at the
  // layout's offsets and moved 0-43% fewer within the GPU, with no more loads just in time;
  // the replay's client waits for the lanes, so what later loads cost a real GPU's client in
  // slack is not measured yet. (0: loads wait for their op to begin, and the client for them.)
  int load_lead_ops = -1;
};

struct ExecutorStats {
  uint64_t loads = 0, evictions = 0, stages = 0, push_downs = 0, drops = 0;
  uint64_t late = 0;        // skipped: the client was past their op (it fetched on demand)
  uint64_t just_in_time = 0;  // loads issued only once their op had begun: the client waited
  std::map<uint32_t, uint64_t> just_in_time_by_op;  // by the op that uses the tensor
  // Per op, after the first lap: the client's waits in acquires while it ran (seconds, summed)
  // and how many times the op ran; the mean sits next to the plan's predicted stall.
  std::map<uint32_t, std::pair<double, uint64_t>> waited_by_op;
  uint64_t waits = 0;       // tries that found no room or a busy tensor, and waited
  uint64_t awaited = 0;     // client acquires that waited for the planned move (AwaitPlannedLoad)
  uint64_t await_gave_up = 0;  // ... and gave up on it (then fetched on demand)
  std::string last_gave_up;    // the latest: the tensor, the op, and what each lane waited for
  uint64_t errors = 0;      // moves the tiers refused for another reason
  std::string last_error;   // the latest of them, with the move
  uint64_t laps = 0;        // iterations seen complete
  uint64_t replans = 0;
  uint64_t replans_kept = 0;  // drift replans that kept the plan in force (ALREADY_EXISTS)
  std::string last_kept;      // the replanner's reason, the latest
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
  // The client waited this long in an acquire during the current op (a fetch, a move in
  // flight): the op's measured time, which replaces its estimate, leaves it out.
  void AcquireWaited(int64_t nanos);
  // The client is about to fetch t on demand for the op it is on (t is not in the top tier).
  // If the plan's move of t for this op (a load, or room for an overwrite) is still to be
  // done, waits for it while the lanes make progress, and returns true once it is: fetching
  // on demand ahead of the plan moves the same bytes no sooner but makes room by the tiers'
  // own choice, which the plan then pays for in traffic. Returns false at once when no such
  // move is queued; gives up (false) as soon as no lane can move without the client (each
  // found nothing to do since the last change, none has a move in flight, none is paused),
  // when no move has been in flight or finished for `stuck_nanos`, after `max_nanos` in all,
  // or once StopWaits was called. Real time: tests with a fake clock still wait on the wall.
  bool AwaitPlannedLoad(TensorIndex t, int64_t stuck_nanos, int64_t max_nanos);
  // Every AwaitPlannedLoad returns false now and from now on (before the executor goes).
  void StopWaits();
  // Blocks until neither lane can make progress without more client progress, and any
  // replan in flight is done. For tests.
  void WaitIdle();
  // Tensors now pinned to the GPU (by name rules or tierctl pin): the plan must keep them
  // there. Replans.
  void SetPinnedGpu(std::vector<TensorIndex> pinned);

  // How many ops from the client's current op tensor t is next used (0: by the current op);
  // for the tiers' eviction when they must make room on demand.
  int64_t NextUse(TensorIndex t) const;
  // Where the plan's static layout puts t in the top tier's arena now: the offset of t's
  // interval that holds the op the client is on, else of its next one; nullopt when the
  // plan has no layout (or none that fits) or no interval for t. Thread-safe.
  std::optional<uint64_t> LayoutOffset(TensorIndex t) const;
  // Whether t's interval that holds the op the client is on has `offset`. Thread-safe.
  bool LaidOutThereNow(TensorIndex t, uint64_t offset) const;

  ExecutorStats Stats() const;
  // Plans swapped in since the first (each may lay the top tier out anew); lock-free, for
  // the hot path to notice one.
  int64_t Replans() const { return replans_.load(std::memory_order_acquire); }
  // The lanes go on after a replan (ExecutorOptions::pause_after_replan).
  void ResumeLanes();
  // Where each lane is and what its next move waits for, in words.
  std::string Describe() const;
  const Graph& graph() const { return graph_; }
  // The plan in force and a recorded timeline of the last two laps (ops and moves).
  Plan CurrentPlan() const;
  std::vector<TimelineEvent> Timeline() const;

 private:
  enum class Kind : uint8_t { kStage, kLoad, kEvict, kEvictDead, kPushDown, kDrop, kAlloc, kEnsure, kDropNvme, kDiscard };
  static constexpr int kLanes = 4;  // gpu in, gpu out, dram in, dram out
  static constexpr int64_t kNone = INT64_MIN;
  struct Action {
    Kind kind;
    TensorIndex tensor;
    uint32_t op;          // the op it serves (happens before it runs)
    int64_t ready_after;  // the op (relative to this lap; may be < 0) whose end frees it
    int64_t next_use;     // the tensor's next use at or after `op` (relative; may be >= ops): an
                          // eviction is too late then, a load or stage once it is over
    // Per lane: the index of this tensor's previous action there (< 0: the previous lap).
    int64_t after[kLanes];
    // Moves that take DRAM room (write-backs, stages) take it in the plan's order, like the
    // simulator's: this one's place in the lap's order of them (-1: takes none).
    int64_t dram_ticket = -1;
  };
  struct Lane {
    std::vector<Action> actions;  // one lap
    int64_t next = 0;             // global position (lap * size + index) of the first not done
    bool in_order = true;         // loads and stages keep plan order; evictions need not
    std::set<int64_t> done_ahead;       // out of order: positions after `next` already done
    std::map<int64_t, uint64_t> tried;  // out of order: version at which a position last failed
    bool Done(int64_t pos) const { return pos < next || done_ahead.count(pos) > 0; }
  };
  struct Schedule {
    Lane lanes[kLanes];
    int64_t dram_tickets = 0;      // per lap
    std::vector<std::pair<int, int64_t>> ticket_holders;  // per ticket of a lap: (lane, index)
    int64_t next_ticket = 0;       // global (lap * dram_tickets + index): the next to take DRAM room
    std::set<int64_t> tickets_done_ahead;  // skipped (late) ones after it
  };
  static Schedule Build(const Graph& graph, const Plan& plan);
  void Run(int lane);  // a thread per lane
  void RunAll();       // one thread, the lanes in turn (deterministic)
  // Tries the lane's next action; false when none may start now. Lets the lock go while a
  // move runs.
  bool Step(int lane, std::unique_lock<std::mutex>& lock);
  // Whether the action at global position `pos` of the lane may start now; *late if skipped.
  bool Ready(int lane, int64_t pos, bool* late) const;
  absl::Status Do(const Action& a, int64_t decided_nanos);
  std::string DescribeLocked() const;  // Describe, with mutex_ held
  void CheckDrift();
  void ReplanLocked(bool may_keep);  // with mutex_ held; may_keep: ExecutorOptions::replanner

  const Graph graph_;
  const std::vector<std::vector<uint32_t>> next_use_;  // NextUseDistances(graph_)
  TierOps& ops_;
  Clock& clock_;
  ExecutorOptions options_;

  void IndexLayout();  // layout_ from plan_.layout, with mutex_ held or before any thread
  LayoutIndex layout_;  // the plan's, when it fits; empty otherwise
  mutable std::mutex mutex_;
  std::condition_variable changed_, idle_;
  uint64_t version_ = 0;                 // bumped on every change a lane may wait for
  uint64_t blocked_[kLanes] = {UINT64_MAX, UINT64_MAX, UINT64_MAX, UINT64_MAX};  // version each blocked at
  Plan plan_;
  Schedule schedule_;
  int64_t current_ = -1;  // global op index the client is on (lap * ops + op)
  uint32_t last_op_ = 0;
  bool stopping_ = false;
  bool waits_stopped_ = false;
  bool paused_ = false;  // ExecutorOptions::pause_after_replan, until ResumeLanes
  int64_t in_flight_pos_[kLanes] = {-1, -1, -1, -1};  // per lane: its move running now (lock let go), or -1
  std::vector<int64_t> op_begin_nanos_;  // per op of the current and previous lap
  std::vector<double> measured_seconds_;
  // The op times the plan in force was made with (the graph's, then a replan's measured
  // ones): drift is measured against these, so a replan at the measured times settles it.
  std::vector<double> planned_seconds_, replanning_seconds_;
  int64_t waited_in_op_nanos_ = 0;  // the current op's acquire waits
  std::vector<bool> pinned_gpu_;  // per tensor, the graph's pins and the tiers' since
  int64_t lap_start_nanos_ = -1;
  ExecutorStats stats_;
  std::vector<TimelineEvent> timeline_;
  std::future<absl::StatusOr<Plan>> replanning_;
  int64_t replan_generation_ = 0;  // bumped when a new schedule is swapped in
  std::atomic<int64_t> replans_{0};  // the same, for Replans()
  std::vector<std::thread> threads_;
};

}  // namespace tierd::prefetcher

#endif  // TIERD_PREFETCHER_EXECUTOR_H_
