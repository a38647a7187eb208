#include "prefetcher/executor.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <iterator>
#include <map>

#include "absl/strings/str_format.h"

namespace tierd::prefetcher {
namespace {

constexpr const char* kKindNames[] = {"stage",   "load",    "evict",  "discard",  "push-down",
                                      "drop",    "reserve", "ensure", "drop-nvme", "discard-below"};

}  // namespace

Executor::Executor(Graph graph, Plan plan, TierOps& ops, Clock& clock, ExecutorOptions options)
    : graph_(std::move(graph)),
      next_use_(NextUseDistances(graph_)),
      ops_(ops),
      clock_(clock),
      options_(std::move(options)),
      plan_(std::move(plan)) {
  schedule_ = Build(graph_, plan_);
  IndexLayout();
  op_begin_nanos_.assign(graph_.ops.size(), -1);
  for (const GraphTensor& t : graph_.tensors) pinned_gpu_.push_back(t.pinned_gpu);
  measured_seconds_.assign(graph_.ops.size(), -1);
  for (const GraphOp& op : graph_.ops) planned_seconds_.push_back(op.seconds);
  if (options_.single_thread) {
    threads_.emplace_back([this] { RunAll(); });
  } else {
    for (int lane = 0; lane < kLanes; ++lane) threads_.emplace_back([this, lane] { Run(lane); });
  }
}

Executor::~Executor() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
    changed_.notify_all();
  }
  for (std::thread& t : threads_) t.join();
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
    measured_seconds_[prev] = std::max<int64_t>(now - op_begin_nanos_[prev] - waited_in_op_nanos_, 0) * 1e-9;
    if (stats_.laps >= 1) {
      auto& [seconds, times] = stats_.waited_by_op[prev];
      seconds += waited_in_op_nanos_ * 1e-9;
      ++times;
    }
    waited_in_op_nanos_ = 0;
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
      if (plan.status().code() == absl::StatusCode::kAlreadyExists) {
        // The plan in force stays; drift is measured against the times it was judged at.
        planned_seconds_ = replanning_seconds_;
        ++stats_.replans_kept;
        stats_.last_kept = std::string(plan.status().message());
      } else if (!plan.ok()) {
        ++stats_.errors;
        stats_.last_error = "replan: " + plan.status().ToString();
      } else {
        plan_ = *std::move(plan);
        planned_seconds_ = replanning_seconds_;
        schedule_ = Build(graph_, plan_);
        IndexLayout();
        for (Lane& lane : schedule_.lanes) lane.next = next_lap * static_cast<int64_t>(lane.actions.size());
        schedule_.next_ticket = next_lap * schedule_.dram_tickets;
        ++replan_generation_;
        ++stats_.replans;
        replans_.fetch_add(1, std::memory_order_release);
        paused_ = options_.pause_after_replan;
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

void Executor::AcquireWaited(int64_t nanos) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (current_ >= 0) waited_in_op_nanos_ += nanos;
}

void Executor::CheckDrift() {
  if (!options_.replanner || replanning_.valid()) return;
  if (options_.links_drifted && options_.links_drifted()) {
    ReplanLocked(/*may_keep=*/true);
    return;
  }
  double drift = 0;
  int measured = 0;
  for (size_t i = 0; i < graph_.ops.size(); ++i) {
    if (measured_seconds_[i] < 0) continue;
    // Below a microsecond both are noise: an op planned at 30 ns and measured at 30 ns
    // has not drifted.
    const double planned = std::max(planned_seconds_[i], 1e-6);
    drift += std::abs(std::max(measured_seconds_[i], 1e-6) - planned) / planned;
    ++measured;
  }
  if (measured == 0 || drift / measured <= options_.replan_drift) return;
  ReplanLocked(/*may_keep=*/true);
}

void Executor::ReplanLocked(bool may_keep) {
  if (!options_.replanner || replanning_.valid()) return;
  Graph measured = graph_;
  for (size_t i = 0; i < measured.ops.size(); ++i) {
    if (measured_seconds_[i] >= 0) measured.ops[i].seconds = measured_seconds_[i];
  }
  for (size_t t = 0; t < measured.tensors.size(); ++t) measured.tensors[t].pinned_gpu = pinned_gpu_[t];
  replanning_seconds_.clear();
  for (const GraphOp& op : measured.ops) replanning_seconds_.push_back(op.seconds);
  // The graph the executor keys on keeps its structure; only the times change.
  std::shared_ptr<const Plan> current = may_keep ? std::make_shared<const Plan>(plan_) : nullptr;
  replanning_ = std::async(std::launch::async,
                           [replanner = options_.replanner, measured = std::move(measured), current = std::move(current)] {
                             return replanner(measured, current.get());
                           });
}

bool Executor::Ready(int lane_index, int64_t pos, bool* late) const {
  *late = false;
  const Lane& lane = schedule_.lanes[lane_index];
  const int64_t size = static_cast<int64_t>(lane.actions.size());
  const int64_t ops = static_cast<int64_t>(graph_.ops.size());
  const int64_t lap = pos / size;
  const Action& a = lane.actions[pos % size];
  if (current_ < 0) return false;
  const int64_t target = lap * ops + a.op;  // the op the action serves
  // This tensor's previous moves in the other lanes must be over.
  for (int l = 0; l < kLanes; ++l) {
    if (a.after[l] == kNone) continue;
    const int64_t other_size = static_cast<int64_t>(schedule_.lanes[l].actions.size());
    if (!schedule_.lanes[l].Done(lap * other_size + a.after[l])) return false;
  }
  // DRAM room goes to the moves that take it in plan order (a late one is skipped anyway).
  const bool next_for_dram = a.dram_ticket < 0 || lap * schedule_.dram_tickets + a.dram_ticket == schedule_.next_ticket;
  switch (a.kind) {
    case Kind::kLoad:
    case Kind::kAlloc:
    case Kind::kEnsure:
    case Kind::kStage:
      // Late once the op that uses the tensor is over (the client fetched it on demand): a
      // load hoisted ahead of its use (HoistLoads, HoistStages) is not late when the op it
      // was hoisted to is.
      if (current_ > lap * ops + a.next_use) {
        *late = true;
        return true;
      }
      if (a.kind == Kind::kLoad && options_.load_lead_ops >= 0 && target > current_ + options_.load_lead_ops) {
        return false;  // not yet: ExecutorOptions::load_lead_ops
      }
      return next_for_dram && target <= current_ + ops;  // at most a lap ahead
    case Kind::kEvict:
    case Kind::kEvictDead:
      if (current_ >= lap * ops + a.next_use) {  // the client needs it again already
        *late = true;
        return true;
      }
      return next_for_dram && current_ > lap * ops + a.ready_after;  // its last use is over
    case Kind::kDiscard:
      if (current_ >= lap * ops + a.next_use) {  // the client rewrites it already
        *late = true;
        return true;
      }
      [[fallthrough]];
    case Kind::kPushDown:
    case Kind::kDrop:
    case Kind::kDropNvme:
      // After the moves it follows (above) and the host op that last used the copy; a lap
      // ahead at most.
      if (a.ready_after != kNone && current_ <= lap * ops + a.ready_after) return false;
      return target <= current_ + ops;
  }
  return false;
}

absl::Status Executor::Do(const Action& a, int64_t decided_nanos) {
  switch (a.kind) {
    case Kind::kLoad:
    case Kind::kAlloc:
    case Kind::kEnsure: return ops_.Load(a.tensor);
    case Kind::kStage: return ops_.Stage(a.tensor);
    case Kind::kEvict: return ops_.Evict(a.tensor, false, decided_nanos);
    case Kind::kEvictDead: return ops_.Evict(a.tensor, true, decided_nanos);
    case Kind::kPushDown: return ops_.PushDown(a.tensor);
    case Kind::kDrop: return ops_.DropDram(a.tensor);
    case Kind::kDropNvme: return ops_.DropNvme(a.tensor);
    case Kind::kDiscard: return ops_.Evict(a.tensor, /*dead=*/true, decided_nanos);  // every copy, unless rewritten
  }
  return absl::InternalError("unknown action");
}

void Executor::Run(int lane_index) {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    if (stopping_) return;
    if (Step(lane_index, lock)) continue;
    blocked_[lane_index] = version_;
    idle_.notify_all();
    const uint64_t seen = version_;
    changed_.wait(lock, [&] { return stopping_ || version_ != seen; });
  }
}

void Executor::RunAll() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    if (stopping_) return;
    bool any = false;
    for (int lane = 0; lane < kLanes; ++lane) any |= Step(lane, lock);
    if (any) continue;
    for (uint64_t& b : blocked_) b = version_;
    idle_.notify_all();
    const uint64_t seen = version_;
    changed_.wait(lock, [&] { return stopping_ || version_ != seen; });
  }
}

bool Executor::Step(int lane_index, std::unique_lock<std::mutex>& lock) {
  if (paused_) return false;
  {
    Lane& lane = schedule_.lanes[lane_index];
    const int64_t size = static_cast<int64_t>(lane.actions.size());
    // The next action to try: the first in order, or for an out-of-order lane the first
    // ready one within a lap that has not failed since the last change.
    int64_t pos = -1;
    bool late = false;
    if (size > 0) {
      const int64_t last = lane.in_order ? lane.next : lane.next + size - 1;
      for (int64_t q = lane.next; q <= last && pos < 0; ++q) {
        if (lane.Done(q)) continue;
        auto tried = lane.tried.find(q);
        if (tried != lane.tried.end() && tried->second == version_) continue;
        bool q_late = false;
        if (Ready(lane_index, q, &q_late)) {
          pos = q;
          late = q_late;
        }
      }
    }
    if (pos < 0) return false;
    const Action a = lane.actions[pos % size];
    auto finish = [&](Lane& l) {
      l.tried.erase(pos);
      if (pos == l.next) {
        ++l.next;
        while (l.done_ahead.erase(l.next) > 0) ++l.next;
      } else {
        l.done_ahead.insert(pos);
      }
      if (a.dram_ticket >= 0) {
        Schedule& sc = schedule_;
        const int64_t ticket = (pos / size) * sc.dram_tickets + a.dram_ticket;
        if (ticket == sc.next_ticket) {
          ++sc.next_ticket;
          while (sc.tickets_done_ahead.erase(sc.next_ticket) > 0) ++sc.next_ticket;
        } else {
          sc.tickets_done_ahead.insert(ticket);
        }
      }
      ++version_;
      changed_.notify_all();
    };
    if (late) {
      ++stats_.late;
      finish(lane);
      return true;
    }
    const uint64_t seen = version_;
    // Read while the client is known to be before the tensor's next use (we hold the lock
    // OpBegin takes): a write the client makes later is stamped at or after this.
    const int64_t decided = clock_.NowNanos();
    const int64_t generation = replan_generation_;
    in_flight_pos_[lane_index] = pos;
    lock.unlock();
    const int64_t start = clock_.NowNanos();
    const absl::Status status = Do(a, decided);
    const int64_t end = clock_.NowNanos();
    lock.lock();
    in_flight_pos_[lane_index] = -1;
    if (generation != replan_generation_) return true;  // the schedule was swapped meanwhile
    Lane& lane_now = schedule_.lanes[lane_index];
    if (status.code() == absl::StatusCode::kResourceExhausted ||
        status.code() == absl::StatusCode::kFailedPrecondition) {
      ++stats_.waits;
      lane_now.tried[pos] = seen;  // not again until something changes
      return true;
    }
    if (!status.ok()) {
      ++stats_.errors;
      stats_.last_error = absl::StrFormat("%s of '%s' for op %d: %s", kKindNames[static_cast<int>(a.kind)],
                                          graph_.tensors[a.tensor].name, a.op, status.ToString());
    }
    switch (a.kind) {
      case Kind::kEnsure:
        break;  // counted by the tiers if it moved anything
      case Kind::kLoad:
      case Kind::kAlloc:
        ++stats_.loads;
        if (current_ >= (pos / size) * static_cast<int64_t>(graph_.ops.size()) + a.next_use) {
          ++stats_.just_in_time;
          ++stats_.just_in_time_by_op[static_cast<uint32_t>(a.next_use % static_cast<int64_t>(graph_.ops.size()))];
        }
        break;
      case Kind::kStage: ++stats_.stages; break;
      case Kind::kEvict:
      case Kind::kEvictDead: ++stats_.evictions; break;
      case Kind::kPushDown: ++stats_.push_downs; break;
      case Kind::kDrop:
      case Kind::kDropNvme:
      case Kind::kDiscard: ++stats_.drops; break;
    }
    if (status.ok() && a.kind != Kind::kEvictDead && a.kind != Kind::kDrop && a.kind != Kind::kAlloc &&
        a.kind != Kind::kEnsure && a.kind != Kind::kDropNvme && a.kind != Kind::kDiscard) {
      static constexpr const char* kNames[] = {"stage ", "load ", "write-back ", "", "push-down ", "", "", "", ""};
      const Track track = a.kind == Kind::kLoad ? Track::kH2D : a.kind == Kind::kEvict ? Track::kD2H : Track::kNvme;
      timeline_.push_back({track, kNames[static_cast<int>(a.kind)] + graph_.tensors[a.tensor].name, start * 1e-9,
                           end * 1e-9, graph_.tensors[a.tensor].bytes,
                           static_cast<int>(pos / size), a.op});
    }
    finish(lane_now);
    return true;
  }
}

bool Executor::AwaitPlannedLoad(TensorIndex t, int64_t stuck_nanos, int64_t max_nanos) {
  using Wall = std::chrono::steady_clock;
  std::unique_lock<std::mutex> lock(mutex_);
  if (current_ < 0 || waits_stopped_ || stopping_) return false;
  // The load (or room) for t that serves the op the client is on, not done yet (planned
  // for this op, or hoisted to an earlier one).
  const Lane& in = schedule_.lanes[0];
  const int64_t size = static_cast<int64_t>(in.actions.size());
  const int64_t ops = static_cast<int64_t>(graph_.ops.size());
  int64_t pos = -1;
  for (int64_t q = in.next; size > 0 && q < in.next + size; ++q) {
    const Action& a = in.actions[q % size];
    const int64_t target = (q / size) * ops + a.op;
    if (target > current_) break;  // the lane is in op order: the rest serve later ops
    if (a.tensor == t && (q / size) * ops + a.next_use == current_ && (a.kind == Kind::kLoad || a.kind == Kind::kAlloc) &&
        !in.Done(q)) {
      pos = q;
      break;
    }
  }
  if (pos < 0) return false;
  const int64_t generation = replan_generation_;
  const Wall::time_point start = Wall::now();
  Wall::time_point moved = start;
  uint64_t seen = version_;
  bool stuck = false;
  for (;;) {
    if (stopping_ || waits_stopped_ || generation != replan_generation_) break;
    if (schedule_.lanes[0].Done(pos)) {
      ++stats_.awaited;
      return true;
    }
    const Wall::time_point now = Wall::now();
    const bool moving = std::any_of(std::begin(in_flight_pos_), std::end(in_flight_pos_), [](int64_t p) { return p >= 0; });
    if (version_ != seen || moving) {
      seen = version_;
      moved = now;
    }
    // Every lane found nothing it could do since the last change and none has a move in
    // flight: only the client's next op changes that, and the client is here. The move waits
    // for room that a later op frees (a discard after the backward, say), so the stuck limit
    // would only delay the demand fetch (at 1.3B, 50 ms a time, 2-4 times a run).
    stuck = !moving && !paused_ && std::all_of(std::begin(blocked_), std::end(blocked_), [&](uint64_t b) {
      return b == version_;
    });
    if (stuck || now - moved > std::chrono::nanoseconds(stuck_nanos) ||
        now - start > std::chrono::nanoseconds(max_nanos)) {
      break;
    }
    changed_.wait_for(lock, std::chrono::milliseconds(1));
  }
  ++stats_.await_gave_up;
  stats_.last_gave_up = absl::StrFormat("'%s' at op %d after %.3f s%s: %s", graph_.tensors[t].name, current_,
                                        std::chrono::duration<double>(Wall::now() - start).count(),
                                        stuck ? " (no lane could move)" : "", DescribeLocked());
  return false;
}

void Executor::ResumeLanes() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!paused_) return;
  paused_ = false;
  ++version_;
  changed_.notify_all();
}

void Executor::StopWaits() {
  std::lock_guard<std::mutex> lock(mutex_);
  waits_stopped_ = true;
  changed_.notify_all();
}

void Executor::WaitIdle() {
  std::unique_lock<std::mutex> lock(mutex_);
  idle_.wait(lock, [&] {
    if (stopping_) return true;
    for (uint64_t b : blocked_) {
      if (b != version_) return false;
    }
    return true;
  });
  if (replanning_.valid()) replanning_.wait();  // a replan in flight is ready at the next lap
}

void Executor::SetPinnedGpu(std::vector<TensorIndex> pinned) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<bool> now(graph_.tensors.size(), false);
  for (const GraphTensor& t : graph_.tensors) now[&t - graph_.tensors.data()] = t.pinned_gpu;
  for (TensorIndex t : pinned) {
    if (t < now.size()) now[t] = true;
  }
  if (now == pinned_gpu_) return;
  pinned_gpu_ = std::move(now);
  if (replanning_.valid()) replanning_.wait();  // the one in flight did not know; plan again
  replanning_ = {};
  ReplanLocked(/*may_keep=*/false);
}

std::string Executor::Describe() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return DescribeLocked();
}

std::string Executor::DescribeLocked() const {
  const auto& kKinds = kKindNames;
  static constexpr const char* kLaneNames[] = {"gpu in", "gpu out", "dram in", "dram out"};
  std::string out = absl::StrFormat("client at op %d", current_);
  for (int l = 0; l < kLanes; ++l) {
    const Lane& lane = schedule_.lanes[l];
    if (lane.actions.empty()) continue;
    const int64_t size = static_cast<int64_t>(lane.actions.size());
    // The move running now, if any (it has the lock let go); else the first not done.
    const bool running = in_flight_pos_[l] >= 0;
    const int64_t pos = running ? in_flight_pos_[l] : lane.next;
    const Action& a = lane.actions[pos % size];
    bool late = false;
    const bool ready = Ready(l, pos, &late);
    out += absl::StrFormat("; %s at lap %d #%d: %s %s for op %d (%s)", kLaneNames[l], pos / size, pos % size,
                           kKinds[static_cast<int>(a.kind)], graph_.tensors[a.tensor].name, a.op,
                           running ? "in flight" : late ? "late" : ready ? "ready" : "waiting");
  }
  // Whose turn it is to take DRAM room (write-backs and stages take it in plan order).
  if (schedule_.dram_tickets > 0) {
    const int64_t lap = schedule_.next_ticket / schedule_.dram_tickets;
    const auto [l, index] = schedule_.ticket_holders[schedule_.next_ticket % schedule_.dram_tickets];
    const Action& a = schedule_.lanes[l].actions[index];
    const bool running = in_flight_pos_[l] == lap * static_cast<int64_t>(schedule_.lanes[l].actions.size()) + index;
    out += absl::StrFormat("; DRAM room next to %s %s for op %d (lap %d%s)", kKinds[static_cast<int>(a.kind)],
                           graph_.tensors[a.tensor].name, a.op, lap, running ? ", in flight" : "");
  }
  return out;
}

int64_t Executor::NextUse(TensorIndex t) const {
  std::lock_guard<std::mutex> lock(mutex_);
  if (t >= graph_.tensors.size()) return INT64_MAX / 2;
  const uint32_t op = current_ < 0 ? 0 : last_op_;
  if (UseOf(graph_.ops[op], t) != Use::kNone) return 0;
  return next_use_[op][t];
}

void Executor::IndexLayout() {
  layout_ = plan_.layout_fits ? LayoutIndex(plan_.layout, graph_.tensors.size(), static_cast<uint32_t>(graph_.ops.size()))
                              : LayoutIndex();
}

std::optional<uint64_t> Executor::LayoutOffset(TensorIndex t) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return layout_.Offset(t, current_ < 0 ? 0 : last_op_);
}

bool Executor::LaidOutThereNow(TensorIndex t, uint64_t offset) const {
  std::lock_guard<std::mutex> lock(mutex_);
  return layout_.OffsetNow(t, current_ < 0 ? 0 : last_op_) == offset;
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
