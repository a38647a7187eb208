// PlannedSession: a session's registered iteration graph, the plan made for it under the
// session's quotas, and the executor that carries the plan out on the LeaseTable as the
// client reports its ops. Misses still work (the LeaseTable fetches on demand); the plan
// only decides what moves early. An acquire of a tensor the plan is about to move where the
// client wants it waits for that move (while the executor makes progress) rather than
// fetching it on demand.
//
// Thread-safety: thread-safe.
#ifndef TIERD_SERVER_PLANNED_SESSION_H_
#define TIERD_SERVER_PLANNED_SESSION_H_

#include <array>
#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "base/clock.h"
#include "prefetcher/executor.h"
#include "prefetcher/simulate.h"
#include "runtime/lease_table.h"
#include "runtime/mover.h"

namespace tierd {

// The room a session's plan leaves free in its quotas for what the tiers' allocators lose
// to fragmentation: the GPU (the top tier) max(gpu_fraction of its quota, gpu_tensors of the
// graph's largest tensors), DRAM below it dram_tensors of them; each at most a quarter of its
// quota. Both tiers join free space by moving copies within themselves, so little is kept.
struct PlanningHeadroom {
  double gpu_fraction = 0.035;
  int gpu_tensors = 1;
  int dram_tensors = 1;
};

// How a session is planned besides its graph and quotas.
struct PlanningOptions {
  prefetcher::LinkModel links;  // the link speeds the first plan assumes
  // One executor thread (tests).
  bool deterministic = false;
  // Set: replans use the links as measured, and a link more than 25% off the speed the plan
  // assumed triggers one.
  std::function<prefetcher::LinkModel()> measured_links;
  // PlanBest also tries prefetcher::TimeAwareStyles (first plan and replans).
  bool time_aware = false;
  PlanningHeadroom headroom;  // what the plan leaves free of the quotas
  int load_lead_ops = -1;     // prefetcher::ExecutorOptions::load_lead_ops
  // At the start, the session's GPU copies go to the layout's offsets or leave the GPU
  // (LeaseTable::SettleIntoLayout): off, copies made online before the plan keep their places.
  bool settle_layout = true;
  // The same after each replan (which lays the GPU out anew), the plan's lanes paused until
  // it is done; the client waits for it in that lap's first OpBegin, counted as a wait, not
  // as the op's time. An experiment: in the planner's replay it kept the new layout (571
  // copies at its offsets against 109), but its first form on an H100 made the 1.3B step 16-19%
  // slower: the settle's time counted as op 0's, drifted the op times and replanned every
  // other lap, each time settling again (docs/runs/2026-12-05-s39).
  bool settle_after_replan = false;
  double replan_drift = 0.25;  // prefetcher::ExecutorOptions::replan_drift
  // A drift replan swaps a new plan in only when it predicts a step at least this share
  // shorter than the plan in force at the same measured op times and links; else the plan in
  // force and its GPU layout stay (the simulation's own spread is ~1-2%). Below 0: always
  // swapped in (before 2026-12-06).
  double keep_plan_margin = 0.05;
  // Set (by another thread) while Prepare runs: it stops soon with CANCELLED (a deadline).
  const std::atomic<bool>* cancel = nullptr;
};

class PlannedSession {
 public:
  // A plan made and simulated, not yet carried out: Prepare's pure part (no lease table, no
  // threads), which may run anywhere and be abandoned.
  struct Draft;
  // Plans `graph` (PlanBest) under `budgets` and `options.links` and simulates it for the
  // prediction. The plan's errors (a graph that cannot fit, ...) come back as they are. A
  // host graph (graph.host: the client acquires in DRAM) is planned one tier lower: then
  // `budgets.gpu` is the DRAM quota, the links' DRAM->GPU/GPU->DRAM are NVMe read/write, and
  // the NVMe quota must hold every tensor (nothing is planned below NVMe).
  static absl::StatusOr<std::unique_ptr<Draft>> Prepare(prefetcher::Graph graph, const prefetcher::Budgets& budgets,
                                                        const PlanningOptions& options);
  // Starts the draft's executor on the session's leases. Tensors of the graph need not be
  // leased yet: moves of unleased ones are no-ops.
  static absl::StatusOr<std::unique_ptr<PlannedSession>> Start(LeaseTable& leases, SessionId session,
                                                               std::unique_ptr<Draft> draft, Clock& clock,
                                                               const PlanningOptions& options);
  // Prepare, then Start.
  static absl::StatusOr<std::unique_ptr<PlannedSession>> Create(LeaseTable& leases, SessionId session,
                                                                prefetcher::Graph graph,
                                                                const prefetcher::Budgets& budgets, Clock& clock,
                                                                const PlanningOptions& options);
  ~PlannedSession();

  absl::Status OpBegin(uint32_t op);
  // Bytes moved so far per link, in the order DRAM->GPU, GPU->DRAM, NVMe read, NVMe write
  // (the daemon's mover: every session's moves): with it the summary gives each lap's bytes
  // per link next to the prediction's. Set once, before the first OpBegin.
  using LinkBytes = std::array<uint64_t, 4>;
  void SetLinkBytes(std::function<LinkBytes()> moved) { link_bytes_ = std::move(moved); }
  // The mover's bytes per link so far, in that order (for SetLinkBytes).
  static LinkBytes MovedBy(const Mover& mover);
  // The bytes of the last whole lap per link (zeros before the second lap starts).
  LinkBytes LastLapMoved() const;
  void AcquireWaited(int64_t nanos) { executor_->AcquireWaited(nanos); }
  // The tensors now pinned to the GPU, by name (names not in the graph are ignored): replans.
  void SetPinnedGpu(const std::vector<std::string>& names);
  void WaitIdle() { executor_->WaitIdle(); }

  // The simulator's prediction for the plan in force: the first plan's, then each replan's
  // (made at the links as measured, when they drifted).
  prefetcher::SimResult predicted() const;
  uint64_t reserve_bytes() const;
  // The first plan's static layout, and whether it fits the arena (then used).
  const prefetcher::GpuLayout& layout() const { return layout_; }
  bool layout_fits() const { return layout_fits_; }
  prefetcher::ExecutorStats observed() const { return executor_->Stats(); }
  // Predicted next to observed, in words (tierctl plan --session).
  std::string Summary() const;
  absl::StatusOr<std::string> Explain(const std::string& name) const;
  // The graph the plan in force was made with (op times as measured once replanned) as YAML,
  // headed by the links it assumed, for `tierctl plan --graph` offline.
  std::string GraphYaml() const;
  // The tiers' own moves for room since the plan was made (SessionPlanner::ObserveRoomMove).
  struct RoomCounts {
    uint64_t to_dram = 0, to_dram_bytes = 0, to_nvme = 0, to_nvme_bytes = 0, dropped = 0, nvme_dropped = 0;
  };
  RoomCounts room_counts() const;
  // The same in the last whole lap (none before the second lap starts): what a planned lap
  // still leaves to the tiers, apart from the first lap's.
  std::optional<RoomCounts> LastLapRoom() const;
  // The recorded timeline of the last two iterations as Chrome/Perfetto JSON, with the
  // tiers' own write-backs for room in them.
  std::string TraceJson() const;
  // Where each executor lane is and what it waits for (tierctl plan --session).
  std::string Describe() const { return executor_->Describe(); }

 private:
  class Ops;
  class TierHooks;
  struct WaitGate;
  // The tiers' own moves for room (SessionPlanner::ObserveRoomMove), counted, and the latest
  // kept for the trace; written under the session's lock, so its own lock is a leaf.
  struct RoomRecord {
    std::mutex mutex;
    std::vector<RoomMove> latest;  // at most kRoomMovesKept, oldest first
    RoomCounts counts;
  };
  static constexpr size_t kRoomMovesKept = 20000;
  // The latest plan's prediction and what it assumed; the replanner (on the executor's
  // replan thread) writes it, Summary and RegisterGraph's reply read it.
  struct Prediction {
    mutable std::mutex mutex;
    prefetcher::SimResult sim;
    prefetcher::LinkModel links;
    prefetcher::Budgets planned_under;  // the quotas less their headroom for fragmentation
    prefetcher::Graph graph;  // as planned: the registered one, then at the measured op times
    prefetcher::LowerBound bound;  // of that graph on those links, under the session's budgets
    std::string style;
    uint64_t reserve_bytes = 0;
    int replans = 0;
  };
  PlannedSession() = default;

  std::unique_ptr<Ops> ops_;
  std::shared_ptr<WaitGate> gate_;  // client acquires waiting in the executor (see Create)
  std::shared_ptr<RoomRecord> room_ = std::make_shared<RoomRecord>();
  std::function<LinkBytes()> link_bytes_;
  mutable std::mutex laps_mutex_;  // OpBegin's lap boundaries, read by Summary; then only room_'s
  int64_t last_op_ = -1;
  bool lap_started_ = false;
  LinkBytes lap_start_bytes_{}, last_lap_bytes_{};
  RoomCounts lap_start_room_;
  std::optional<RoomCounts> last_lap_room_;
  std::unique_ptr<prefetcher::Executor> executor_;
  std::shared_ptr<Prediction> prediction_;
  prefetcher::GpuLayout layout_;  // as first planned (replans may change it)
  bool layout_fits_ = false;
  // PlanningOptions::settle_layout: what settling into the layout did at the start, and
  // after each replan (a new plan lays the GPU out anew: the copies of the old layout hold
  // the new one's ranges, as copies made before any plan do).
  bool settle_after_replan_ = false;
  Clock* clock_ = nullptr;
  std::optional<LeaseTable::Settled> settled_;
  int64_t settled_replans_ = 0;  // the executor's replans settled after (OpBegin's thread)
  LeaseTable::Settled settled_after_replans_;
  uint64_t quota_ = 0;
  LeaseTable* leases_ = nullptr;
  SessionId session_ = 0;
};

struct PlannedSession::Draft {
  prefetcher::Graph graph;
  prefetcher::Plan plan;
  prefetcher::Budgets budgets;   // the quotas
  prefetcher::Budgets planning;  // less their headroom
  std::vector<prefetcher::PlanStyle> styles;
  std::shared_ptr<Prediction> prediction;
};

}  // namespace tierd

#endif  // TIERD_SERVER_PLANNED_SESSION_H_
