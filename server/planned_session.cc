#include "server/planned_session.h"

#include <algorithm>
#include <cmath>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "absl/strings/str_format.h"
#include "base/units.h"

namespace tierd {

namespace tp = prefetcher;

// The executor's moves on the LeaseTable. Names resolve to lease ids when first needed;
// a tensor the client has not leased (yet) is nothing to move.
class PlannedSession::Ops final : public tp::TierOps {
 public:
  // `top`: the tier the plan's loads and evictions are about (the GPU, or DRAM for a
  // client on the host).
  Ops(LeaseTable& leases, SessionId session, std::vector<std::string> names, Tier top)
      : leases_(leases), session_(session), names_(std::move(names)), top_(top) {}

  absl::Status Load(tp::TensorIndex t) override {
    return OnId(t, [&](TensorId id) { return leases_.Prefetch(session_, id, top_, /*evict=*/false); });
  }
  absl::Status Evict(tp::TensorIndex t, bool dead, int64_t decided_nanos) override {
    return OnId(t, [&](TensorId id) { return leases_.Demote(session_, id, top_, dead, decided_nanos); });
  }
  absl::Status Stage(tp::TensorIndex t) override {
    return OnId(t, [&](TensorId id) { return leases_.Prefetch(session_, id, Tier::kDram, /*evict=*/false); });
  }
  absl::Status PushDown(tp::TensorIndex t) override {
    return OnId(t, [&](TensorId id) {
      absl::Status copied = leases_.Prefetch(session_, id, Tier::kNvme, /*evict=*/false);
      if (!copied.ok()) return copied;
      return leases_.Demote(session_, id, Tier::kDram, /*dead=*/false);
    });
  }
  absl::Status DropNvme(tp::TensorIndex t) override {
    return OnId(t, [&](TensorId id) { return leases_.Demote(session_, id, Tier::kNvme, /*dead=*/false); });
  }
  absl::Status DropDram(tp::TensorIndex t) override {
    return OnId(t, [&](TensorId id) { return leases_.Demote(session_, id, Tier::kDram, /*dead=*/false); });
  }

 private:
  template <typename Fn>
  absl::Status OnId(tp::TensorIndex t, Fn&& fn) {
    TensorId id = 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = ids_.find(t);
      if (it != ids_.end()) id = it->second;
    }
    if (id == 0) {
      auto found = leases_.Find(session_, names_[t]);
      if (!found.ok()) return absl::OkStatus();  // not leased: nothing to move
      id = *found;
      std::lock_guard<std::mutex> lock(mutex_);
      ids_[t] = id;
    }
    absl::Status status = fn(id);
    if (status.code() == absl::StatusCode::kNotFound) {  // unleased since: forget the id
      std::lock_guard<std::mutex> lock(mutex_);
      ids_.erase(t);
      return absl::OkStatus();
    }
    return status;
  }

  LeaseTable& leases_;
  const SessionId session_;
  const std::vector<std::string> names_;
  const Tier top_;
  std::mutex mutex_;
  std::map<tp::TensorIndex, TensorId> ids_;
};

// An acquire waiting in the executor for a planned move holds the gate open; the session's
// destructor closes it (no new waits), ends the waits and lets the executor go only once
// none is left.
struct PlannedSession::WaitGate {
  std::mutex mutex;
  std::condition_variable idle;
  tp::Executor* executor = nullptr;
  int active = 0;
};

namespace {
// How long an acquire waits for the plan's move of its tensor: while the executor moves
// something at least every 50 ms (a move in flight counts), 10 s at most; then on demand.
constexpr int64_t kAwaitStuckNanos = 50'000'000;
constexpr int64_t kAwaitMaxNanos = 10'000'000'000;
}  // namespace

// The planner as the tiers see it (session_planner.h): the graph's tensors by the table's
// ids, told as they are leased. All but AwaitPlannedMove run under the session's lock; the id
// map has its own leaf lock since AwaitPlannedMove reads it without that one.
class PlannedSession::TierHooks final : public SessionPlanner {
 public:
  TierHooks(tp::Executor* executor, std::unordered_map<std::string, tp::TensorIndex> index, Tier top,
            std::shared_ptr<WaitGate> gate, std::shared_ptr<RoomRecord> room)
      : executor_(executor), index_(std::move(index)), top_(top), gate_(std::move(gate)), room_(std::move(room)) {}

  void Leased(TensorId tensor, const std::string& name) override {
    auto it = index_.find(name);
    if (it == index_.end()) return;  // not in the graph
    std::lock_guard<std::mutex> lock(mutex_);
    by_id_[tensor] = it->second;
  }
  void Unleased(TensorId tensor) override {
    std::lock_guard<std::mutex> lock(mutex_);
    by_id_.erase(tensor);
  }
  int64_t NextUse(TensorId tensor) override {
    const std::optional<tp::TensorIndex> t = IndexOf(tensor);
    return t ? executor_->NextUse(*t) : INT64_MAX / 2;
  }
  // Copies made in the top tier go where the plan's static layout puts them, if free.
  std::optional<uint64_t> LayoutOffset(TensorId tensor, Tier tier) override {
    if (tier != top_) return std::nullopt;
    const std::optional<tp::TensorIndex> t = IndexOf(tensor);
    return t ? executor_->LayoutOffset(*t) : std::nullopt;
  }
  bool LaidOutThereNow(TensorId tensor, Tier tier, uint64_t offset) override {
    if (tier != top_) return false;
    const std::optional<tp::TensorIndex> t = IndexOf(tensor);
    return t && executor_->LaidOutThereNow(*t, offset);
  }
  // An acquire that finds its tensor elsewhere waits for the plan's move of it, if queued.
  void AwaitPlannedMove(TensorId tensor, Tier tier) override {
    if (tier != top_) return;
    const std::optional<tp::TensorIndex> t = IndexOf(tensor);
    if (!t) return;
    tp::Executor* executor = nullptr;
    {
      std::lock_guard<std::mutex> lock(gate_->mutex);
      if (gate_->executor == nullptr) return;
      executor = gate_->executor;
      ++gate_->active;
    }
    executor->AwaitPlannedLoad(*t, kAwaitStuckNanos, kAwaitMaxNanos);
    std::lock_guard<std::mutex> lock(gate_->mutex);
    if (--gate_->active == 0) gate_->idle.notify_all();
  }
  // What the tiers move on their own for room: counted and kept for the trace.
  void ObserveRoomMove(const RoomMove& m) override {
    std::lock_guard<std::mutex> lock(room_->mutex);
    if (!m.to) {  // a drop moves no bytes: counted, not drawn
      ++(m.from == Tier::kNvme ? room_->counts.nvme_dropped : room_->counts.dropped);
      return;
    }
    if (*m.to == Tier::kDram) {
      ++room_->counts.to_dram;
      room_->counts.to_dram_bytes += m.bytes;
    } else {
      ++room_->counts.to_nvme;
      room_->counts.to_nvme_bytes += m.bytes;
    }
    if (room_->latest.size() >= kRoomMovesKept) {
      room_->latest.erase(room_->latest.begin(), room_->latest.begin() + kRoomMovesKept / 2);
    }
    room_->latest.push_back(m);
  }

 private:
  std::optional<tp::TensorIndex> IndexOf(TensorId tensor) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = by_id_.find(tensor);
    if (it == by_id_.end()) return std::nullopt;
    return it->second;
  }

  tp::Executor* const executor_;  // outlives the hooks: the session unhooks them first
  const std::unordered_map<std::string, tp::TensorIndex> index_;
  const Tier top_;
  const std::shared_ptr<WaitGate> gate_;
  const std::shared_ptr<RoomRecord> room_;
  std::mutex mutex_;
  std::unordered_map<TensorId, tp::TensorIndex> by_id_;
};

absl::StatusOr<std::unique_ptr<PlannedSession>> PlannedSession::Create(LeaseTable& leases, SessionId session,
                                                                       tp::Graph graph, const tp::Budgets& budgets,
                                                                       Clock& clock, const PlanningOptions& options) {
  auto draft = Prepare(std::move(graph), budgets, options);
  if (!draft.ok()) return draft.status();
  return Start(leases, session, *std::move(draft), clock, options);
}

absl::StatusOr<std::unique_ptr<PlannedSession::Draft>> PlannedSession::Prepare(tp::Graph graph,
                                                                               const tp::Budgets& budgets,
                                                                               const PlanningOptions& options) {
  if (absl::Status valid = tp::ValidateGraph(graph); !valid.ok()) return valid;
  const Tier top = graph.host ? Tier::kDram : Tier::kGpu;
  const tp::LinkModel& links = options.links;
  // The tiers' allocators fragment, most when tensors are large next to the quota: plan
  // the top tier under its quota by a share of it or by some of the largest tensors (at
  // most a quarter of the quota), whichever is more (PlanningHeadroom), so the planned moves
  // find the room the plan counts on. Both tiers join their free space by moving idle
  // copies within themselves (LeaseTable's relocation) before anything spills, so each keeps
  // about one of the largest tensors free: in DRAM 3 made the 7B trainer's step 10% slower on
  // the H200 (same moves within DRAM); on the GPU 10% or 3 tensors (the old default) planned
  // 21.5 s a step against 18.6 at 3.5% or one tensor, and ran 22.7 s against 21.2 (5 laps
  // each): headroom beyond what the joins need is room the plan cannot use.
  uint64_t largest = 0;
  for (const tp::GraphTensor& t : graph.tensors) largest = std::max(largest, t.bytes);
  const PlanningHeadroom& headroom_of = options.headroom;
  const uint64_t dram_kept = static_cast<uint64_t>(std::max(0, headroom_of.dram_tensors)) * largest;
  const uint64_t gpu_kept = static_cast<uint64_t>(std::max(0, headroom_of.gpu_tensors)) * largest;
  const double fraction = std::clamp(headroom_of.gpu_fraction, 0.0, 0.25);
  auto headroom = [dram_kept, gpu_kept, fraction](uint64_t quota, bool relocates) {
    if (relocates) return quota - std::min(dram_kept, quota / 4);
    const uint64_t share = static_cast<uint64_t>(fraction * static_cast<double>(quota));
    return quota - std::min(std::max(share, gpu_kept), quota / 4);
  };
  const tp::Budgets planning{headroom(budgets.gpu, /*relocates=*/false),
                             headroom(budgets.dram, /*relocates=*/top == Tier::kGpu), budgets.nvme};
  const std::vector<tp::PlanStyle> styles = options.time_aware ? tp::TimeAwareStyles() : tp::DaemonStyles();
  auto plan = tp::PlanBest(graph, planning, links, nullptr, budgets.gpu, styles, options.cancel);
  if (!plan.ok()) return plan.status();
  if (top == Tier::kDram && (plan->lower.nvme_read_bytes > 0 || plan->lower.nvme_write_bytes > 0)) {
    uint64_t total = 0;
    for (const tp::GraphTensor& t : graph.tensors) total += t.bytes;
    return absl::ResourceExhaustedError(
        absl::StrFormat("a client on the host keeps its tensors in DRAM and NVMe: the NVMe quota (%s) must hold all "
                        "of them (%s)",
                        FormatBytes(budgets.dram), FormatBytes(total)));
  }
  tp::SimOptions sim_options;
  sim_options.iterations = 3;
  sim_options.cancel = options.cancel;
  auto sim = tp::SimulatePlan(graph, *plan, planning, links, sim_options);
  if (!sim.ok()) return sim.status();
  auto prediction = std::make_shared<Prediction>();
  prediction->sim = *std::move(sim);
  prediction->links = links;
  prediction->graph = graph;
  prediction->planned_under = planning;
  prediction->bound = tp::ComputeLowerBound(graph, links, budgets);
  prediction->style = tp::DescribeStyle(plan->style);
  prediction->reserve_bytes = plan->reserve_bytes;
  auto draft = std::make_unique<Draft>();
  draft->graph = std::move(graph);
  draft->plan = *std::move(plan);
  draft->budgets = budgets;
  draft->planning = planning;
  draft->styles = styles;
  draft->prediction = std::move(prediction);
  return draft;
}

absl::StatusOr<std::unique_ptr<PlannedSession>> PlannedSession::Start(LeaseTable& leases, SessionId session,
                                                                      std::unique_ptr<Draft> draft, Clock& clock,
                                                                      const PlanningOptions& options) {
  tp::Graph& graph = draft->graph;
  const Tier top = graph.host ? Tier::kDram : Tier::kGpu;
  const tp::Budgets budgets = draft->budgets;
  const tp::Budgets planning = draft->planning;
  const std::vector<tp::PlanStyle> styles = draft->styles;
  const tp::LinkModel links = options.links;
  const auto& measured_links = options.measured_links;
  std::unique_ptr<PlannedSession> planned(new PlannedSession());
  auto prediction = draft->prediction;
  planned->prediction_ = prediction;
  planned->layout_ = draft->plan.layout;
  planned->layout_fits_ = draft->plan.layout_fits;
  planned->quota_ = budgets.gpu;
  tp::ExecutorOptions executor_options;
  executor_options.single_thread = options.deterministic;
  executor_options.load_lead_ops = options.load_lead_ops;
  executor_options.replan_drift = options.replan_drift;
  executor_options.pause_after_replan = options.settle_layout && options.settle_after_replan && top == Tier::kGpu;
  auto current_links = [links, measured_links] { return measured_links ? measured_links() : links; };
  executor_options.replanner = [planning, budgets, current_links, quota = budgets.gpu, styles, prediction,
                                 keep_margin = options.keep_plan_margin](const tp::Graph& measured,
                                             const tp::Plan* current) -> absl::StatusOr<tp::Plan> {
    const tp::LinkModel now = current_links();
    auto replanned = tp::PlanBest(measured, planning, now, nullptr, quota, styles);
    if (!replanned.ok()) return replanned;
    // What the new plan predicts, at the measured op times and links: what the observed
    // figures are compared with from now on.
    tp::SimOptions quick;
    quick.iterations = 3;
    auto predicted = tp::SimulatePlan(measured, *replanned, planning, now, quick);
    if (!predicted.ok()) return predicted.status();
    if (current != nullptr && keep_margin >= 0) {
      // The plan in force, at the same times and links: unless the new one is clearly faster,
      // keep it and the layout its copies are in (a new layout costs real steps; see
      // ExecutorOptions::replanner).
      auto kept = tp::SimulatePlan(measured, *current, planning, now, quick);
      if (kept.ok() && kept->step_seconds <= predicted->step_seconds * (1 + keep_margin)) {
        const std::string why = absl::StrFormat(
            "the plan in force takes %.3f s a step at the measured op times and links, a new one %.3f s: kept",
            kept->step_seconds, predicted->step_seconds);
        std::lock_guard<std::mutex> lock(prediction->mutex);
        prediction->sim = *std::move(kept);
        prediction->links = now;
        prediction->graph = measured;
        prediction->bound = tp::ComputeLowerBound(measured, now, budgets);
        return absl::AlreadyExistsError(why);
      }
    }
    std::lock_guard<std::mutex> lock(prediction->mutex);
    prediction->sim = *std::move(predicted);
    prediction->links = now;
    prediction->graph = measured;
    prediction->bound = tp::ComputeLowerBound(measured, now, budgets);
    prediction->style = tp::DescribeStyle(replanned->style);
    prediction->reserve_bytes = replanned->reserve_bytes;
    ++prediction->replans;
    return replanned;
  };
  if (measured_links) {
    // A replan is due when a link runs more than 25% off the speed the plan assumed.
    auto planned_with = std::make_shared<tp::LinkModel>(links);
    executor_options.links_drifted = [planned_with, measured_links] {
      const tp::LinkModel now = measured_links();
      auto off = [](double a, double b) { return a > 0 && b > 0 && std::abs(a - b) > 0.25 * b; };
      if (!off(now.h2d_bytes_per_s, planned_with->h2d_bytes_per_s) &&
          !off(now.d2h_bytes_per_s, planned_with->d2h_bytes_per_s) &&
          !off(now.nvme_read_bytes_per_s, planned_with->nvme_read_bytes_per_s) &&
          !off(now.nvme_write_bytes_per_s, planned_with->nvme_write_bytes_per_s)) {
        return false;
      }
      *planned_with = now;  // the replan uses these
      return true;
    };
  }
  std::vector<std::string> names;
  for (const tp::GraphTensor& t : graph.tensors) names.push_back(t.name);
  planned->ops_ = std::make_unique<Ops>(leases, session, std::move(names), top);
  std::unordered_map<std::string, tp::TensorIndex> index;
  for (tp::TensorIndex t = 0; t < graph.tensors.size(); ++t) index[graph.tensors[t].name] = t;
  planned->executor_ =
      std::make_unique<tp::Executor>(std::move(graph), std::move(draft->plan), *planned->ops_, clock, executor_options);
  planned->leases_ = &leases;
  planned->session_ = session;
  planned->gate_ = std::make_shared<WaitGate>();
  planned->gate_->executor = planned->executor_.get();
  absl::Status hooked = leases.SetPlanner(
      session,
      std::make_shared<TierHooks>(planned->executor_.get(), std::move(index), top, planned->gate_, planned->room_));
  if (!hooked.ok()) return hooked;
  planned->settle_after_replan_ = executor_options.pause_after_replan;
  planned->clock_ = &clock;
  if (options.settle_layout && top == Tier::kGpu && planned->layout_fits_) {
    auto settled = leases.SettleIntoLayout(session);
    if (!settled.ok()) return settled.status();
    planned->settled_ = *settled;
  }
  return planned;
}

PlannedSession::~PlannedSession() {
  // The hooks point into the executor: the tiers stop asking them first (the session may
  // be closed already, which is fine).
  if (leases_ != nullptr) leases_->SetPlanner(session_, nullptr).IgnoreError();
  if (gate_ != nullptr) {
    std::unique_lock<std::mutex> lock(gate_->mutex);
    gate_->executor = nullptr;  // no new waits
    executor_->StopWaits();     // and those in progress end
    gate_->idle.wait(lock, [&] { return gate_->active == 0; });
  }
  executor_.reset();  // stops the lanes before the ops they call go
}

tp::SimResult PlannedSession::predicted() const {
  std::lock_guard<std::mutex> lock(prediction_->mutex);
  return prediction_->sim;
}

uint64_t PlannedSession::reserve_bytes() const {
  std::lock_guard<std::mutex> lock(prediction_->mutex);
  return prediction_->reserve_bytes;
}

void PlannedSession::SetPinnedGpu(const std::vector<std::string>& names) {
  const tp::Graph& graph = executor_->graph();
  std::vector<tp::TensorIndex> pinned;
  for (tp::TensorIndex t = 0; t < graph.tensors.size(); ++t) {
    if (std::find(names.begin(), names.end(), graph.tensors[t].name) != names.end()) pinned.push_back(t);
  }
  executor_->SetPinnedGpu(std::move(pinned));
}

absl::Status PlannedSession::OpBegin(uint32_t op) {
  {
    // A lap starts at op 0 or wherever the ops wrap (the executor counts laps the same way).
    std::lock_guard<std::mutex> lock(laps_mutex_);
    if (last_op_ < 0 || static_cast<int64_t>(op) <= last_op_) {
      const LinkBytes now = link_bytes_ ? link_bytes_() : LinkBytes{};
      const RoomCounts room = room_counts();
      if (lap_started_) {
        for (size_t k = 0; k < now.size(); ++k) last_lap_bytes_[k] = now[k] - lap_start_bytes_[k];
        const RoomCounts& was = lap_start_room_;
        last_lap_room_ = RoomCounts{room.to_dram - was.to_dram, room.to_dram_bytes - was.to_dram_bytes,
                                    room.to_nvme - was.to_nvme, room.to_nvme_bytes - was.to_nvme_bytes,
                                    room.dropped - was.dropped, room.nvme_dropped - was.nvme_dropped};
      }
      lap_start_bytes_ = now;
      lap_start_room_ = room;
      lap_started_ = true;
    }
    last_op_ = op;
  }
  absl::Status begun = executor_->OpBegin(op);
  if (!begun.ok() || !settle_after_replan_) return begun;
  const int64_t replans = executor_->Replans();
  {
    std::lock_guard<std::mutex> lock(laps_mutex_);
    if (replans == settled_replans_) return begun;
    settled_replans_ = replans;
  }
  // A replan took effect at this lap's start: settled once, on this op's thread, before the
  // lanes (paused since the swap) load into the new layout's ranges. The client waits for it
  // once.
  const int64_t settling = clock_->NowNanos();
  auto settled = leases_->SettleIntoLayout(session_);
  // Not the op's time: counted as op 0's, it reads as drift and replans again.
  executor_->AcquireWaited(clock_->NowNanos() - settling);
  executor_->ResumeLanes();
  if (!settled.ok()) return settled.status();
  std::lock_guard<std::mutex> lock(laps_mutex_);
  settled_after_replans_.moved += settled->moved;
  settled_after_replans_.demoted += settled->demoted;
  settled_after_replans_.demoted_bytes += settled->demoted_bytes;
  return begun;
}

PlannedSession::LinkBytes PlannedSession::MovedBy(const Mover& mover) {
  return {mover.Stats(Link::kDramToGpu).bytes, mover.Stats(Link::kGpuToDram).bytes,
          mover.Stats(Link::kNvmeToDram).bytes, mover.Stats(Link::kDramToNvme).bytes};
}

PlannedSession::LinkBytes PlannedSession::LastLapMoved() const {
  std::lock_guard<std::mutex> lock(laps_mutex_);
  return last_lap_bytes_;
}

PlannedSession::RoomCounts PlannedSession::room_counts() const {
  std::lock_guard<std::mutex> lock(room_->mutex);
  return room_->counts;
}

std::optional<PlannedSession::RoomCounts> PlannedSession::LastLapRoom() const {
  std::lock_guard<std::mutex> lock(laps_mutex_);
  return last_lap_room_;
}

}  // namespace tierd
