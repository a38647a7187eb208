#include "prefetcher/executor.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_format.h"

namespace tierd::prefetcher {

Executor::Schedule Executor::Build(const Graph& graph, const Plan& plan) {
  Schedule s;
  const int64_t ops = static_cast<int64_t>(graph.ops.size());
  // Previous use of each tensor before op i (relative; < 0 means the previous lap).
  std::vector<int64_t> last_use(graph.tensors.size(), INT64_MIN);
  for (int64_t i = 0; i < ops; ++i) {
    for (TensorIndex t : Touched(graph.ops[i])) last_use[t] = i - ops;
  }
  // next_use_at[i][t] would be ops x tensors; the distances the planner already has do it.
  const auto next = NextUseDistances(graph);
  // Per op in plan order: out-lane evictions, push-downs and drops; then in-lane stages and
  // loads. Each action remembers the other lane's latest action on the same tensor.
  std::vector<int64_t> last_in(graph.tensors.size(), INT64_MIN), last_out(graph.tensors.size(), INT64_MIN);
  size_t lower = 0;
  std::vector<Action> in, out;
  // Two passes: the first only learns each tensor's last action in each lane (for the
  // wrap-around), the second builds the lap.
  for (int pass = 0; pass < 2; ++pass) {
    in.clear();
    out.clear();
    lower = 0;
    auto add_out = [&](Kind kind, TensorIndex t, uint32_t op, int64_t ready_after) {
      // The next use at or after op: op - 1 + distance from op - 1.
      const int64_t before = (op + ops - 1) % ops;
      const int64_t next_use = static_cast<int64_t>(op) - 1 + next[before][t];
      out.push_back({kind, t, op, ready_after, next_use, last_in[t]});
      last_out[t] = static_cast<int64_t>(out.size()) - 1;
    };
    auto add_in = [&](Kind kind, TensorIndex t, uint32_t op) {
      in.push_back({kind, t, op, 0, 0, last_out[t]});
      last_in[t] = static_cast<int64_t>(in.size()) - 1;
    };
    std::vector<int64_t> use = last_use;
    for (uint32_t i = 0; i < ops; ++i) {
      for (const Eviction& e : plan.gpu.evictions[i]) {
        add_out(e.dead ? Kind::kEvictDead : Kind::kEvict, e.tensor, i, use[e.tensor]);
      }
      std::vector<LowerEvent> stages;
      for (; lower < plan.lower.events.size() && plan.lower.events[lower].op == i; ++lower) {
        const LowerEvent& ev = plan.lower.events[lower];
        if (ev.kind == LowerKind::kPushDown) add_out(Kind::kPushDown, ev.tensor, i, i - 1);
        if (ev.kind == LowerKind::kDrop) add_out(Kind::kDrop, ev.tensor, i, i - 1);
        if (ev.kind == LowerKind::kStage) stages.push_back(ev);
      }
      for (const LowerEvent& ev : stages) add_in(Kind::kStage, ev.tensor, i);
      for (TensorIndex t : plan.gpu.loads[i]) add_in(Kind::kLoad, t, i);
      // Room for this op's overwrites, reserved in plan order so later loads cannot take it.
      for (TensorIndex t : plan.gpu.allocs[i]) add_in(Kind::kAlloc, t, i);
      for (TensorIndex t : Touched(graph.ops[i])) use[t] = i;
    }
    if (pass == 0) {
      // Carry the last actions into the next lap as negative (previous-lap) indices.
      for (auto& v : last_in) v = v == INT64_MIN ? INT64_MIN : v - static_cast<int64_t>(in.size());
      for (auto& v : last_out) v = v == INT64_MIN ? INT64_MIN : v - static_cast<int64_t>(out.size());
    }
  }
  s.in.actions = std::move(in);
  s.out.actions = std::move(out);
  return s;
}

Executor::Executor(Graph graph, Plan plan, TierOps& ops, Clock& clock, ExecutorOptions options)
    : graph_(std::move(graph)), ops_(ops), clock_(clock), options_(std::move(options)), plan_(std::move(plan)) {
  schedule_ = Build(graph_, plan_);
  op_begin_nanos_.assign(graph_.ops.size(), -1);
  measured_seconds_.assign(graph_.ops.size(), -1);
  in_thread_ = std::thread([this] { Run(true); });
  out_thread_ = std::thread([this] { Run(false); });
}

Executor::~Executor() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    changed_.notify_all();
  }
  in_thread_.join();
  out_thread_.join();
  if (replanning_.valid()) replanning_.wait();
}

absl::Status Executor::OpBegin(uint32_t op) {
  const size_t ops = graph_.ops.size();
  if (op >= ops) {
    return absl::InvalidArgumentError(absl::StrFormat("op %d: the registered graph has %d ops", op, ops));
  }
  const int64_t now = clock_.NowNanos();
  std::lock_guard<std::mutex> lock(mutex_);
  const int64_t lap = current_ < 0 ? 0 : current_ / static_cast<int64_t>(ops);
  const bool wrapped = current_ >= 0 && op <= last_op_;
  const int64_t next_lap = wrapped ? lap + 1 : lap;
  // The op that just ended: from its begin to this one.
  if (current_ >= 0) {
    const uint32_t prev = last_op_;
    measured_seconds_[prev] = (now - op_begin_nanos_[prev]) * 1e-9;
    timeline_.push_back({Track::kCompute, graph_.ops[prev].name, op_begin_nanos_[prev] * 1e-9, now * 1e-9, 0,
                         static_cast<int>(current_ / static_cast<int64_t>(ops)), prev});
  }
  if (wrapped) {
    if (lap_start_nanos_ >= 0) {
      stats_.last_lap_seconds = (now - lap_start_nanos_) * 1e-9;
      ++stats_.laps;
      if (stats_.laps > 1) {
        stats_.mean_lap_seconds += (stats_.last_lap_seconds - stats_.mean_lap_seconds) / (stats_.laps - 1);
      }
    }
    lap_start_nanos_ = now;
    CheckDrift();
    // Keep two laps of timeline.
    const int keep_from = static_cast<int>(next_lap) - 1;
    timeline_.erase(std::remove_if(timeline_.begin(), timeline_.end(),
                                   [&](const TimelineEvent& e) { return e.iteration < keep_from; }),
                    timeline_.end());
    if (replanning_.valid() &&
        replanning_.wait_for(std::chrono::seconds(0)) == std::future_status::ready) {
      auto plan = replanning_.get();
      if (plan.ok()) {
        plan_ = *std::move(plan);
        schedule_ = Build(graph_, plan_);
        schedule_.in.next = next_lap * static_cast<int64_t>(schedule_.in.actions.size());
        schedule_.out.next = next_lap * static_cast<int64_t>(schedule_.out.actions.size());
        ++stats_.replans;
      }
    }
  } else if (current_ < 0) {
    lap_start_nanos_ = now;
  }
  op_begin_nanos_[op] = now;
  current_ = next_lap * static_cast<int64_t>(ops) + op;
  last_op_ = op;
  ++version_;
  changed_.notify_all();
  return absl::OkStatus();
}

void Executor::CheckDrift() {
  if (!options_.replanner || replanning_.valid()) return;
  double drift = 0;
  int measured = 0;
  for (size_t i = 0; i < graph_.ops.size(); ++i) {
    if (measured_seconds_[i] < 0) continue;
    const double planned = std::max(graph_.ops[i].seconds, 1e-6);
    drift += std::abs(measured_seconds_[i] - planned) / planned;
    ++measured;
  }
  if (measured == 0 || drift / measured <= options_.replan_drift) return;
  Replan();
}

void Executor::Replan() {
  if (!options_.replanner || replanning_.valid()) return;
  Graph measured = graph_;
  for (size_t i = 0; i < measured.ops.size(); ++i) {
    if (measured_seconds_[i] >= 0) measured.ops[i].seconds = measured_seconds_[i];
  }
  // The graph the executor keys on keeps its structure; only the times change.
  replanning_ = std::async(std::launch::async, [replanner = options_.replanner, measured = std::move(measured)] {
    return replanner(measured);
  });
}

bool Executor::Ready(const Lane& lane, const Lane& other, int64_t pos, bool* late) const {
  *late = false;
  const int64_t size = static_cast<int64_t>(lane.actions.size());
  const int64_t ops = static_cast<int64_t>(graph_.ops.size());
  const int64_t lap = pos / size;
  const Action& a = lane.actions[pos % size];
  if (current_ < 0) return false;
  const int64_t target = lap * ops + a.op;  // the op the action serves
  // The other lane's previous action on this tensor must be over.
  if (a.other_lane != INT64_MIN) {
    const int64_t other_size = static_cast<int64_t>(other.actions.size());
    if (other.next <= lap * other_size + a.other_lane) return false;
  }
  switch (a.kind) {
    case Kind::kLoad:
    case Kind::kAlloc:
    case Kind::kStage:
      if (current_ > target) {
        *late = true;  // its op is over: the client fetched on demand
        return true;
      }
      return target <= current_ + ops;  // at most a lap ahead
    case Kind::kEvict:
    case Kind::kEvictDead:
      if (current_ >= lap * ops + a.next_use) {  // the client needs it again already
        *late = true;
        return true;
      }
      return current_ > lap * ops + a.ready_after;  // its last use is over
    case Kind::kPushDown:
    case Kind::kDrop:
      return current_ >= lap * ops + a.ready_after;
  }
  return false;
}

absl::Status Executor::Do(const Action& a, int64_t decided_nanos) {
  switch (a.kind) {
    case Kind::kLoad:
    case Kind::kAlloc: return ops_.Load(a.tensor);
    case Kind::kStage: return ops_.Stage(a.tensor);
    case Kind::kEvict: return ops_.Evict(a.tensor, false, decided_nanos);
    case Kind::kEvictDead: return ops_.Evict(a.tensor, true, decided_nanos);
    case Kind::kPushDown: return ops_.PushDown(a.tensor);
    case Kind::kDrop: return ops_.DropDram(a.tensor);
  }
  return absl::InternalError("unknown action");
}

void Executor::Run(bool in_lane) {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    Lane& lane = in_lane ? schedule_.in : schedule_.out;
    Lane& other = in_lane ? schedule_.out : schedule_.in;
    bool late = false;
    const bool ready = !stopping_ && !lane.actions.empty() && Ready(lane, other, lane.next, &late);
    if (stopping_) return;
    if (!ready) {
      blocked_[in_lane] = version_;
      idle_.notify_all();
      const uint64_t seen = version_;
      changed_.wait(lock, [&] { return stopping_ || version_ != seen; });
      continue;
    }
    const int64_t pos = lane.next;
    const int64_t size = static_cast<int64_t>(lane.actions.size());
    const Action a = lane.actions[pos % size];
    if (late) {
      ++stats_.late;
      ++lane.next;
      ++version_;
      changed_.notify_all();
      continue;
    }
    const uint64_t seen = version_;
    // Read while the client is known to be before the tensor's next use (we hold the lock
    // OpBegin takes): a write the client makes later is stamped at or after this.
    const int64_t decided = clock_.NowNanos();
    lock.unlock();
    const int64_t start = clock_.NowNanos();
    const absl::Status status = Do(a, decided);
    const int64_t end = clock_.NowNanos();
    lock.lock();
    Lane& lane_now = in_lane ? schedule_.in : schedule_.out;
    if (lane_now.next != pos) continue;  // the schedule was swapped meanwhile
    if (status.code() == absl::StatusCode::kResourceExhausted ||
        status.code() == absl::StatusCode::kFailedPrecondition) {
      ++stats_.waits;
      blocked_[in_lane] = version_;
      idle_.notify_all();
      changed_.wait(lock, [&] { return stopping_ || version_ != seen; });
      continue;  // try again (or find it late) after something changed
    }
    if (!status.ok()) ++stats_.errors;
    switch (a.kind) {
      case Kind::kLoad:
      case Kind::kAlloc:
        ++stats_.loads;
        if (current_ >= (pos / size) * static_cast<int64_t>(graph_.ops.size()) + a.op) {
          ++stats_.just_in_time;
          ++stats_.just_in_time_by_op[a.op];
        }
        break;
      case Kind::kStage: ++stats_.stages; break;
      case Kind::kEvict:
      case Kind::kEvictDead: ++stats_.evictions; break;
      case Kind::kPushDown: ++stats_.push_downs; break;
      case Kind::kDrop: ++stats_.drops; break;
    }
    if (status.ok() && a.kind != Kind::kEvictDead && a.kind != Kind::kDrop && a.kind != Kind::kAlloc) {
      static constexpr const char* kNames[] = {"stage ", "load ", "write-back ", "", "push-down ", "", ""};
      const Track track = a.kind == Kind::kLoad ? Track::kH2D : a.kind == Kind::kEvict ? Track::kD2H : Track::kNvme;
      timeline_.push_back({track, kNames[static_cast<int>(a.kind)] + graph_.tensors[a.tensor].name, start * 1e-9,
                           end * 1e-9, graph_.tensors[a.tensor].bytes,
                           static_cast<int>(pos / size), a.op});
    }
    ++lane_now.next;
    ++version_;
    changed_.notify_all();
  }
}

void Executor::WaitIdle() {
  std::unique_lock<std::mutex> lock(mutex_);
  idle_.wait(lock, [&] { return stopping_ || (blocked_[0] == version_ && blocked_[1] == version_); });
  if (replanning_.valid()) replanning_.wait();  // a replan in flight is ready at the next lap
}

std::string Executor::Describe() const {
  std::lock_guard<std::mutex> lock(mutex_);
  static constexpr const char* kKinds[] = {"stage", "load", "evict", "discard", "push-down", "drop", "reserve"};
  std::string out = absl::StrFormat("client at op %d", current_);
  for (bool in_lane : {true, false}) {
    const Lane& lane = in_lane ? schedule_.in : schedule_.out;
    const Lane& other = in_lane ? schedule_.out : schedule_.in;
    if (lane.actions.empty()) continue;
    const int64_t size = static_cast<int64_t>(lane.actions.size());
    const Action& a = lane.actions[lane.next % size];
    bool late = false;
    const bool ready = Ready(lane, other, lane.next, &late);
    out += absl::StrFormat("; %s lane at lap %d #%d: %s %s for op %d (%s)", in_lane ? "in" : "out", lane.next / size,
                           lane.next % size, kKinds[static_cast<int>(a.kind)], graph_.tensors[a.tensor].name, a.op,
                           late ? "late" : ready ? "ready" : "waiting");
  }
  return out;
}

ExecutorStats Executor::Stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return stats_;
}

Plan Executor::CurrentPlan() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return plan_;
}

std::vector<TimelineEvent> Executor::Timeline() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return timeline_;
}

}  // namespace tierd::prefetcher
