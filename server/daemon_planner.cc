// The daemon's planner hooks: a session registers its iteration graph, reports the op it
// is about to run, and tierctl asks what the plan is and how the run compares with it.
#include <malloc.h>

#include <chrono>
#include <limits>
#include <map>
#include <optional>
#include <thread>

#include "absl/strings/str_format.h"
#include "base/units.h"
#include "server/planned_session.h"
#include "server/daemon.h"

namespace tierd {
namespace {

namespace tp = prefetcher;

// What one RegisterGraph may ask, from the planner's measured cost (planbench, dev box, the
// plan and its simulations): 7B with 128 micro-batches one after the other is ~8,600 ops
// and plans in 3.9 s; 13B with 256 is ~21,000 ops, 15.6 s and 240 MB. A layer-major step is
// ~3 ops a layer whatever the micro-batches. Beyond 16,384 ops a request could hold the
// planner for tens of seconds and a GB (an outside probe: 40,000 random ops, 63 s, 1.8 GB).
constexpr int kGraphTensorsMax = 65536;
constexpr int kGraphOpsMax = 16384;
constexpr int kGraphUsesMax = 1 << 20;  // tensor references over all ops
// The planner's next-use table holds 4 bytes per op and tensor: at most 256 MiB of it. 7B or
// 13B with 128 micro-batches one after the other is ~40-60 M cells.
constexpr int64_t kGraphCellsMax = int64_t{1} << 26;

absl::StatusOr<tp::Graph> GraphFromProto(const v1::GraphSpec& spec) {
  if (spec.tensors_size() > kGraphTensorsMax || spec.ops_size() > kGraphOpsMax) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "a graph of %d tensors and %d ops; tierd plans at most %d and %d (a layer-major step needs ~3 ops a "
        "layer; one micro-batch after the other ~2 a layer per micro-batch)",
        spec.tensors_size(), spec.ops_size(), kGraphTensorsMax, kGraphOpsMax));
  }
  const int64_t cells = int64_t{spec.ops_size()} * spec.tensors_size();
  if (cells > kGraphCellsMax) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "a graph of %d ops and %d tensors: the planner keeps a next use per op and tensor, %d of them (%s); tierd "
        "plans at most %d (%s)",
        spec.ops_size(), spec.tensors_size(), cells, FormatBytes(4 * cells), kGraphCellsMax,
        FormatBytes(4 * kGraphCellsMax)));
  }
  int64_t uses = 0;
  for (const v1::GraphOpSpec& o : spec.ops()) {
    uses += o.reads_size() + o.writes_size() + o.overwrites_size() + o.host_reads_size() + o.host_writes_size() +
            o.host_overwrites_size();
  }
  if (uses > kGraphUsesMax) {
    return absl::InvalidArgumentError(
        absl::StrFormat("the graph's ops use tensors %d times; tierd plans at most %d", uses, kGraphUsesMax));
  }
  tp::Graph g;
  g.host = spec.host();
  std::map<std::string, tp::TensorIndex> index;
  for (const v1::GraphTensorSpec& t : spec.tensors()) {
    if (!index.emplace(t.name(), g.tensors.size()).second) {
      return absl::InvalidArgumentError(absl::StrFormat("the graph lists tensor '%s' twice", t.name()));
    }
    g.tensors.push_back({t.name(), t.bytes(), t.pinned()});
  }
  for (const v1::GraphOpSpec& o : spec.ops()) {
    tp::GraphOp op{o.name(), {}, {}, o.seconds()};
    if (!(o.seconds() >= 0) || o.seconds() == std::numeric_limits<double>::infinity()) {
      return absl::InvalidArgumentError(absl::StrFormat("op '%s' has a duration of %g s", o.name(), o.seconds()));
    }
    for (auto [names, list] :
         {std::pair{&o.reads(), &op.reads}, std::pair{&o.writes(), &op.writes},
          std::pair{&o.overwrites(), &op.overwrites}, std::pair{&o.host_reads(), &op.host_reads},
          std::pair{&o.host_writes(), &op.host_writes}, std::pair{&o.host_overwrites(), &op.host_overwrites}}) {
      for (const std::string& name : *names) {
        auto it = index.find(name);
        if (it == index.end()) {
          return absl::InvalidArgumentError(
              absl::StrFormat("op '%s' uses tensor '%s', which the graph's tensors do not list", o.name(), name));
        }
        list->push_back(it->second);
      }
    }
    g.ops.push_back(std::move(op));
  }
  if (absl::Status valid = tp::ValidateGraph(g); !valid.ok()) return valid;
  return g;
}

void FillReply(const PlannedSession& planned, v1::PlanReply* reply) {
  const tp::SimResult& p = planned.predicted();
  reply->set_summary(planned.Summary());
  reply->set_predicted_step_seconds(p.step_seconds);
  reply->set_predicted_stall_seconds(p.stall_seconds);
  reply->set_predicted_h2d_bytes(p.h2d_bytes);
  reply->set_predicted_d2h_bytes(p.d2h_bytes);
  reply->set_predicted_nvme_read_bytes(p.nvme_read_bytes);
  reply->set_predicted_nvme_write_bytes(p.nvme_write_bytes);
  reply->set_reserve_bytes(planned.reserve_bytes());
  const tp::ExecutorStats seen = planned.observed();
  reply->set_laps(seen.laps);
  reply->set_observed_step_seconds(seen.mean_lap_seconds);
  reply->set_loads(seen.loads);
  reply->set_just_in_time(seen.just_in_time);
  reply->set_late(seen.late);
  reply->set_replans(seen.replans);
}

}  // namespace

absl::StatusOr<v1::PlanReply> Daemon::RegisterGraph(SessionId session, const v1::GraphSpec& spec) {
  auto graph = GraphFromProto(spec);
  if (!graph.ok()) return graph.status();
  {
    absl::MutexLock lock(&recorders_mutex_);
    recorders_.erase(session);  // a registered graph replaces a recording
    RecordersChanged();
  }
  return PlanGraph(session, *std::move(graph));
}

// One graph being planned on its own thread. The request waits for it until the deadline;
// past it, the request sets `cancel` and leaves, and the thread drops its draft soon after.
struct Daemon::PlanningJob {
  std::atomic<bool> cancel{false};
  absl::Mutex mutex;
  bool done ABSL_GUARDED_BY(mutex) = false;
  absl::StatusOr<std::unique_ptr<PlannedSession::Draft>> draft ABSL_GUARDED_BY(mutex);
  std::thread thread;
};

void Daemon::JoinPlanning(bool all) {
  std::vector<std::shared_ptr<PlanningJob>> finished;
  {
    absl::MutexLock lock(&planning_mutex_);
    for (auto it = planning_.begin(); it != planning_.end();) {
      if (all) (*it)->cancel.store(true);
      bool done = all;
      if (!done) {
        absl::MutexLock job_lock(&(*it)->mutex);
        done = (*it)->done;
      }
      if (!done) {
        ++it;
        continue;
      }
      finished.push_back(*it);
      it = planning_.erase(it);
    }
  }
  for (auto& job : finished) job->thread.join();
}

void Daemon::StopPlanning() {
  absl::MutexLock lock(&planning_mutex_);
  planning_stopped_ = true;
  for (auto& job : planning_) job->cancel.store(true);
}

absl::StatusOr<v1::PlanReply> Daemon::PlanGraph(SessionId session, tp::Graph graph) {
  // Tensors the tiers already keep on the GPU (config pins, tierctl pin) stay there in the plan.
  for (const LeaseView& view : leases_->List(session)) {
    if (view.pinned != Tier::kGpu) continue;
    for (tp::GraphTensor& t : graph.tensors) t.pinned_gpu |= t.name == view.spec.name;
  }
  auto quota = leases_->Quota(session);
  if (!quota.ok()) return quota.status();
  // A client on the host plans DRAM over NVMe: the same planner, one tier lower.
  const bool host = graph.host;
  const tp::Budgets budgets = host ? tp::Budgets{quota->dram_bytes, quota->nvme_bytes, quota->nvme_bytes}
                                   : tp::Budgets{quota->gpu_bytes, quota->dram_bytes, quota->nvme_bytes};
  // A new graph replaces the old plan: stop the old executor first.
  {
    absl::MutexLock lock(&planned_mutex_);
    planned_.erase(session);
  }
  // Measured link speeds, once a link has carried enough to say (64 MiB), else as configured.
  Mover* mover = mover_.get();
  const tp::LinkModel configured = options_.planner_links;
  auto measured = [mover, configured] {
    tp::LinkModel links = configured;
    // A link's measured speed once it has carried enough to say, else the configured one.
    auto speed = [](const LinkStats& stats, double measured_speed, double fallback) {
      return stats.bytes >= (uint64_t{64} << 20) && measured_speed > 0 ? measured_speed : fallback;
    };
    const LinkStats h2d = mover->Stats(Link::kDramToGpu), d2h = mover->Stats(Link::kGpuToDram);
    links.h2d_bytes_per_s = speed(h2d, h2d.BytesPerSecond(), configured.h2d_bytes_per_s);
    links.d2h_bytes_per_s = speed(d2h, d2h.BytesPerSecond(), configured.d2h_bytes_per_s);
    // The planner runs NVMe reads and writes one at a time; the device overlaps them, so each
    // direction's speed while busy is scaled by how much they overlapped.
    const LinkStats read = mover->Stats(Link::kNvmeToDram), write = mover->Stats(Link::kDramToNvme);
    const auto [r, w] = SerialDeviceSpeeds(read, write, mover->NvmeDeviceStats());
    links.nvme_read_bytes_per_s = speed(read, r, configured.nvme_read_bytes_per_s);
    links.nvme_write_bytes_per_s = speed(write, w, configured.nvme_write_bytes_per_s);
    return links;
  };
  // One tier lower, the top's links are NVMe's.
  auto lowered = [](tp::LinkModel links) {
    links.h2d_bytes_per_s = links.nvme_read_bytes_per_s;
    links.d2h_bytes_per_s = links.nvme_write_bytes_per_s;
    return links;
  };
  PlanningOptions options;
  options.links = host ? lowered(options_.planner_links) : options_.planner_links;
  options.time_aware = options_.planner_time_aware;
  options.load_lead_ops = options_.planner_load_lead_ops;
  options.settle_layout = options_.planner_settle_layout;
  options.settle_after_replan = options_.planner_settle_after_replan;
  options.replan_drift = options_.planner_replan_drift;
  options.keep_plan_margin = options_.planner_keep_plan_margin;
  options.headroom = options_.planner_headroom;
  const size_t ops = graph.ops.size(), tensors = graph.tensors.size();

  // The planning itself (seconds for thousands of ops) runs on its own thread, so a request
  // never holds the daemon past the deadline, and a cancelled one frees its memory promptly.
  auto job = std::make_shared<PlanningJob>();
  // Slots held by plannings already stopped free within moments: wait for one (2 s at most)
  // rather than refuse, so a client that retries after a deadline is not turned away by the
  // planning it abandoned.
  const absl::Time wait_until = absl::Now() + absl::Seconds(2);
  for (bool full = true; full;) {
    JoinPlanning(/*all=*/false);
    bool stopping = false;
    {
      absl::MutexLock lock(&planning_mutex_);
      full = planning_.size() >= kPlanningMax;
      for (const auto& running : planning_) stopping |= running->cancel.load();
    }
    if (full && (!stopping || absl::Now() >= wait_until)) break;  // refused below
    if (full) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  {
    absl::MutexLock lock(&planning_mutex_);
    if (planning_stopped_) return absl::UnavailableError("tierd is stopping");
    if (planning_.size() >= kPlanningMax) {
      return absl::ResourceExhaustedError(
          absl::StrFormat("%d graphs are being planned, at most %d at once; register this one when one of them is done",
                          planning_.size(), kPlanningMax));
    }
    options.cancel = &job->cancel;
    job->thread = std::thread([job, graph = std::move(graph), budgets, options]() mutable {
      auto draft = PlannedSession::Prepare(std::move(graph), budgets, options);
      if (job->cancel.load()) {  // its request has gone: the memory goes back now
        draft = absl::CancelledError("planning was cancelled");
        malloc_trim(0);
      }
      absl::MutexLock lock(&job->mutex);
      job->draft = std::move(draft);
      job->done = true;
    });
    planning_.push_back(job);
  }
  const auto seconds = absl::Seconds(options_.planner_deadline_seconds);
  absl::StatusOr<std::unique_ptr<PlannedSession::Draft>> draft;
  {
    absl::MutexLock lock(&job->mutex);
    if (!job->mutex.AwaitWithTimeout(absl::Condition(&job->done), seconds)) {
      job->cancel.store(true);
      return absl::DeadlineExceededError(absl::StrFormat(
          "planning a graph of %d ops and %d tensors took longer than %g s (planner.deadline_s, "
          "--planner_deadline_s) and was stopped; a layer-major step is ~3 ops a layer, one micro-batch after the "
          "other ~2 a layer per micro-batch",
          ops, tensors, options_.planner_deadline_seconds));
    }
    draft = std::move(job->draft);
  }
  if (!draft.ok()) {
    return absl::Status(draft.status().code(),
                        "cannot plan this graph under the session's quotas: " + std::string(draft.status().message()));
  }
  std::function<tp::LinkModel()> links_now = measured;
  if (host) links_now = [measured, lowered] { return lowered(measured()); };
  options.measured_links = links_now;
  options.cancel = nullptr;
  auto planned = PlannedSession::Start(*leases_, session, *std::move(draft), RealClock(), options);
  if (!planned.ok()) return planned.status();
  (*planned)->SetLinkBytes([mover] { return PlannedSession::MovedBy(*mover); });
  v1::PlanReply reply;
  FillReply(**planned, &reply);
  absl::MutexLock lock(&planned_mutex_);
  planned_[session] = std::shared_ptr<PlannedSession>(std::move(*planned));
  return reply;
}

absl::StatusOr<v1::PlanReply> Daemon::MarkIteration(SessionId session) {
  std::optional<tp::Graph> recorded;
  tp::IterationRecorder::Phase phase;
  {
    absl::MutexLock lock(&recorders_mutex_);
    auto& recorder = recorders_[session];
    if (recorder == nullptr) recorder = std::make_unique<tp::IterationRecorder>();
    RecordersChanged();
    recorder->Mark(RealClock().NowNanos());
    phase = recorder->phase();
    if (phase == tp::IterationRecorder::Phase::kFollowing && !HasPlan(session)) {
      std::map<TensorId, tp::IterationRecorder::TensorInfo> known;
      for (const LeaseView& view : leases_->List(session)) known[view.id] = {view.spec.name, view.bytes};
      auto graph = recorder->MakeGraph([&known](uint64_t id) -> std::optional<tp::IterationRecorder::TensorInfo> {
        auto it = known.find(id);
        if (it == known.end()) return std::nullopt;
        return it->second;
      });
      if (!graph.ok()) {
        recorders_.erase(session);  // the next mark starts a new recording
        RecordersChanged();
        return graph.status();
      }
      recorded = *std::move(graph);
    }
  }
  if (phase == tp::IterationRecorder::Phase::kRecording) {
    v1::PlanReply reply;
    reply.set_summary("recording this iteration's acquires and releases: the plan follows at the next mark\n");
    return reply;
  }
  if (recorded.has_value()) {
    const size_t ops = recorded->ops.size(), tensors = recorded->tensors.size();
    auto reply = PlanGraph(session, *std::move(recorded));
    if (!reply.ok()) {
      absl::MutexLock lock(&recorders_mutex_);
      recorders_.erase(session);
      RecordersChanged();
      return reply.status();
    }
    reply->set_summary(absl::StrFormat("recorded one iteration: %d ops over %d tensors\n", ops, tensors) +
                       reply->summary());
    return reply;
  }
  return GetPlan(session, "", false, false);
}

bool Daemon::HasPlan(SessionId session) {
  absl::MutexLock lock(&planned_mutex_);
  return planned_.count(session) > 0;
}

void Daemon::Acquired(SessionId session, TensorId tensor, Access access, Place place, int64_t waited_nanos) {
  if (waited_nanos >= kAcquireWaitWorthNoting) {
    // The client was held up, not computing: the executor takes it off the op's time.
    std::shared_ptr<PlannedSession> planned;
    {
      absl::MutexLock lock(&planned_mutex_);
      auto it = planned_.find(session);
      if (it != planned_.end()) planned = it->second;
    }
    if (planned != nullptr) planned->AcquireWaited(waited_nanos);
  }
  if (!recording_.load(std::memory_order_acquire)) return;
  std::optional<uint32_t> op;
  {
    absl::MutexLock lock(&recorders_mutex_);
    auto it = recorders_.find(session);
    if (it == recorders_.end()) return;
    op = it->second->Acquired(tensor, access, place == Place::kHost, RealClock().NowNanos());
  }
  // Progress only steers the moves: a lost one costs a demand fetch, not a value.
  if (op.has_value()) OpBegin(session, *op).IgnoreError();
}

void Daemon::Released(SessionId session, TensorId tensor) {
  if (!recording_.load(std::memory_order_acquire)) return;
  absl::MutexLock lock(&recorders_mutex_);
  auto it = recorders_.find(session);
  if (it != recorders_.end()) it->second->Released(tensor);
}

absl::Status Daemon::OpBegin(SessionId session, uint32_t op) {
  std::shared_ptr<PlannedSession> planned;
  {
    absl::MutexLock lock(&planned_mutex_);
    auto it = planned_.find(session);
    if (it == planned_.end()) {
      return absl::FailedPreconditionError("op progress before a graph was registered (RegisterGraph first)");
    }
    planned = it->second;
  }
  return planned->OpBegin(op);
}

void Daemon::PinsChanged(SessionId session) {
  std::shared_ptr<PlannedSession> planned;
  {
    absl::MutexLock lock(&planned_mutex_);
    auto it = planned_.find(session);
    if (it == planned_.end()) return;
    planned = it->second;
  }
  std::vector<std::string> pinned_gpu;
  for (const LeaseView& view : leases_->List(session)) {
    if (view.pinned == Tier::kGpu) pinned_gpu.push_back(view.spec.name);
  }
  planned->SetPinnedGpu(pinned_gpu);
}

absl::StatusOr<v1::PlanReply> Daemon::GetPlan(SessionId session, const std::string& explain, bool trace, bool graph) {
  std::shared_ptr<PlannedSession> planned;
  {
    absl::MutexLock lock(&planned_mutex_);
    auto it = planned_.find(session);
    if (it == planned_.end()) {
      return absl::NotFoundError(absl::StrFormat("session %d has registered no graph", session));
    }
    planned = it->second;
  }
  v1::PlanReply reply;
  FillReply(*planned, &reply);
  reply.set_summary(reply.summary() + "executor: " + planned->Describe() + "\n");
  if (!explain.empty()) {
    auto text = planned->Explain(explain);
    if (!text.ok()) return text.status();
    reply.set_explain(*text);
  }
  if (trace) reply.set_trace_json(planned->TraceJson());
  if (graph) reply.set_graph_yaml(planned->GraphYaml());
  return reply;
}

}  // namespace tierd
