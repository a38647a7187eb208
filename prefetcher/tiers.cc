#include "prefetcher/tiers.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_format.h"
#include "base/units.h"

namespace tierd::prefetcher {

const char* LowerKindName(LowerKind kind) {
  switch (kind) {
    case LowerKind::kWriteBack:
      return "write-back";
    case LowerKind::kRead:
      return "read";
    case LowerKind::kStage:
      return "stage";
    case LowerKind::kPushDown:
      return "push-down";
    case LowerKind::kDrop:
      return "drop";
    case LowerKind::kInvalidate:
      return "invalidate";
    case LowerKind::kDropNvme:
      return "drop-nvme";
    case LowerKind::kHostRead:
      return "host read";
    case LowerKind::kHostWrite:
      return "host write";
    case LowerKind::kHostOverwrite:
      return "host overwrite";
    case LowerKind::kDiscard:
      return "discard";
  }
  return "?";
}

namespace {

constexpr size_t kNever = std::numeric_limits<size_t>::max();

// What the GPU plan and the host ops ask of the tiers below, in order: discards of values
// that died with the host op before, write-backs, host uses, reads, invalidations.
std::vector<LowerEvent> Demands(const Graph& graph, const ResidencyPlan& gpu) {
  std::vector<LowerEvent> out;
  const auto dead = DeadAfter(graph);
  const uint32_t ops = static_cast<uint32_t>(graph.ops.size());
  for (uint32_t i = 0; i < ops; ++i) {
    // A host op's last reader: its copies go once that op is over, before this one runs
    // (so the room is free for this op's own moves, and a lap ends as it began).
    const uint32_t before = (i + ops - 1) % ops;
    for (TensorIndex t : HostTouched(graph.ops[before])) {
      if (dead[before][t]) out.push_back({i, LowerKind::kDiscard, t});
    }
    for (const Eviction& e : gpu.evictions[i]) {
      if (e.dead)
        out.push_back({i, LowerKind::kInvalidate, e.tensor});
      else if (e.write_back)
        out.push_back({i, LowerKind::kWriteBack, e.tensor});
    }
    for (TensorIndex t : HostTouched(graph.ops[i])) {
      const Use use = HostUseOf(graph.ops[i], t);
      out.push_back({i,
                     use == Use::kRead    ? LowerKind::kHostRead
                     : use == Use::kWrite ? LowerKind::kHostWrite
                                          : LowerKind::kHostOverwrite,
                     t});
    }
    for (TensorIndex t : gpu.loads[i]) out.push_back({i, LowerKind::kRead, t});
    for (TensorIndex t : Touched(graph.ops[i])) {
      if (UseOf(graph.ops[i], t) != Use::kRead) out.push_back({i, LowerKind::kInvalidate, t});
    }
  }
  return out;
}

// Whether the GPU keeps t, loaded before op `op`, until an op that changes it: then no copy
// below is needed from the moment the load lands (the write makes them stale, and the GPU
// copy is written back if it leaves later).
bool LoadIsForAWrite(const Graph& graph, const ResidencyPlan& gpu, uint32_t op, TensorIndex t) {
  const size_t ops = graph.ops.size();
  for (size_t k = 0; k < ops; ++k) {
    const size_t i = (op + k) % ops;
    if (!std::binary_search(gpu.resident[i].begin(), gpu.resident[i].end(), t)) return false;
    const Use use = UseOf(graph.ops[i], t);
    if (use != Use::kNone) return use == Use::kWrite;
  }
  return false;
}

struct LowerState {
  std::vector<bool> dram, nvme;
  uint64_t dram_bytes = 0, nvme_bytes = 0;
};

// MIN at the DRAM level over the demands of the GPU plan and the host ops (PlanLowerTiers):
// lap after lap from the state the last one ended in, until a lap ends as it began.
class LowerTierPlanner {
 public:
  LowerTierPlanner(const Graph& graph, const ResidencyPlan& gpu, uint64_t dram_budget, const LowerTierOptions& options)
      : graph_(graph),
        options_(options),
        dram_budget_(dram_budget),
        n_(graph.tensors.size()),
        lap_(Demands(graph, gpu)),
        len_(lap_.size()) {
    exclusive_.assign(len_, false);
    for (size_t j = 0; j < len_; ++j) {
      exclusive_[j] = options.exclusive_loads && lap_[j].kind == LowerKind::kRead &&
                      LoadIsForAWrite(graph, gpu, lap_[j].op, lap_[j].tensor);
    }
    // gap_[j]: how many positions after demand j the same tensor is demanded again (cyclic).
    gap_.assign(len_, 0);
    std::vector<size_t> seen(n_, kNever);
    for (size_t p = 2 * len_; p-- > 0;) {
      const TensorIndex t = lap_[p % len_].tensor;
      if (p < len_) gap_[p] = seen[t] - p;
      seen[t] = p;
    }
    cur_next_ = seen;
    busy_op_.assign(n_, -1);
    s_.dram.assign(n_, false);
    s_.nvme.assign(n_, false);
    std::vector<bool> gpu_resident_start(n_, false);
    for (TensorIndex t : gpu.resident_at_start) gpu_resident_start[t] = true;
    // Bytes start below the GPU unless the GPU holds the only copy or the tensor lives there:
    // in DRAM while the budget holds them, in the order the lap first wants them there, the
    // rest on NVMe. (All on NVMe made a model that fits DRAM keep an NVMe copy of every
    // tensor for ever: nothing ever needs the room, so nothing drops them.)
    std::vector<size_t> first_demand(n_, kNever);
    for (size_t j = 0; j < len_; ++j) {
      const LowerKind k = lap_[j].kind;
      if (k == LowerKind::kRead || k == LowerKind::kHostRead || k == LowerKind::kHostWrite) {
        first_demand[lap_[j].tensor] = std::min(first_demand[lap_[j].tensor], j);
      }
    }
    std::vector<size_t> order(n_);
    for (size_t t = 0; t < n_; ++t) order[t] = t;
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return first_demand[a] < first_demand[b]; });
    for (size_t t : order) {
      const bool gpu_dirty_start = gpu_resident_start[t] && gpu.dirty_at_start[t];
      if (gpu_dirty_start || graph.tensors[t].pinned_gpu) continue;
      if (s_.dram_bytes + Bytes(t) <= dram_budget_) {
        s_.dram[t] = true;
        s_.dram_bytes += Bytes(t);
      } else {
        s_.nvme[t] = true;
        s_.nvme_bytes += Bytes(t);
      }
    }
  }

  size_t len() const { return len_; }
  LowerTierPlan& plan() { return plan_; }
  uint64_t nvme_bytes() const { return s_.nvme_bytes; }

  // Lap `index` into a fresh plan: true when it ends in the state it began with.
  absl::StatusOr<bool> Lap(int index) {
    const LowerState lap_start = s_;
    plan_ = LowerTierPlan{};
    plan_.dram_at_start = s_.dram;
    plan_.nvme_at_start = s_.nvme;
    for (size_t p = index * len_; p < (index + 1) * len_; ++p) {
      if (options_.cancel != nullptr && options_.cancel->load(std::memory_order_relaxed)) {
        return absl::CancelledError("planning was cancelled");
      }
      if (absl::Status s = Demand(p); !s.ok()) return s;
      plan_.peak_dram_bytes = std::max(plan_.peak_dram_bytes, s_.dram_bytes);
      plan_.peak_nvme_bytes = std::max(plan_.peak_nvme_bytes, s_.nvme_bytes);
    }
    return s_.dram == lap_start.dram && s_.nvme == lap_start.nvme;
  }

  // From the state the last lap ends in (E) back to the one it started from (S), with moves
  // at the end of its last op: room first (copies down, drops), then stages.
  absl::Status CloseLap() {
    const uint32_t last = static_cast<uint32_t>(graph_.ops.size() - 1);
    const std::vector<bool> s_dram = plan_.dram_at_start, s_nvme = plan_.nvme_at_start;
    auto emit = [&](LowerKind kind, size_t t) { plan_.events.push_back({last, kind, static_cast<TensorIndex>(t)}); };
    auto push_down = [&](size_t t) {
      emit(LowerKind::kPushDown, t);  // the DRAM copy goes with it
      plan_.nvme_write_bytes += Bytes(t);
      if (!s_.nvme[t]) s_.nvme_bytes += Bytes(t);
      s_.nvme[t] = true;
      s_.dram[t] = false;
      s_.dram_bytes -= Bytes(t);
    };
    for (size_t t = 0; t < n_; ++t) {
      if (!s_.dram[t]) continue;
      if (s_nvme[t] && !s_.nvme[t]) {
        push_down(t);  // S wants the NVMe copy; the stage below restores DRAM if S has it too
      } else if (!s_dram[t]) {
        if (!s_.nvme[t] && s_nvme[t]) {
          push_down(t);
        } else {
          emit(LowerKind::kDrop, t);  // NVMe has it, or S keeps nothing of it below
          s_.dram[t] = false;
          s_.dram_bytes -= Bytes(t);
        }
      }
    }
    plan_.peak_nvme_bytes = std::max(plan_.peak_nvme_bytes, s_.nvme_bytes);
    for (size_t t = 0; t < n_; ++t) {
      if (s_dram[t] && !s_.dram[t]) {
        if (!s_.nvme[t]) {
          return absl::InternalError(absl::StrFormat("closing the lap: '%s' must be in DRAM but no tier below holds it",
                                                     graph_.tensors[t].name));
        }
        emit(LowerKind::kStage, t);
        plan_.nvme_read_bytes += Bytes(t);
        s_.dram[t] = true;
        s_.dram_bytes += Bytes(t);
      }
      if (s_.nvme[t] && !s_nvme[t]) {
        emit(LowerKind::kDropNvme, t);
        s_.nvme[t] = false;
        s_.nvme_bytes -= Bytes(t);
      }
    }
    if (s_.dram != s_dram || s_.nvme != s_nvme) {
      return absl::InternalError("closing the lap did not reach the state it started from");
    }
    plan_.peak_dram_bytes = std::max(plan_.peak_dram_bytes, s_.dram_bytes);
    plan_.peak_nvme_bytes = std::max(plan_.peak_nvme_bytes, s_.nvme_bytes);
    return absl::OkStatus();
  }

 private:
  uint64_t Bytes(size_t t) const { return graph_.tensors[t].bytes; }
  // The op (lap * ops + op) position p is in: a copy the current op's moves still use is no victim.
  int64_t OpAt(size_t p, uint32_t op) const { return static_cast<int64_t>(p / len_ * graph_.ops.size() + op); }
  bool IsDead(size_t t) const {
    const LowerKind next = cur_next_[t] == kNever ? LowerKind::kInvalidate : lap_[cur_next_[t] % len_].kind;
    return next == LowerKind::kInvalidate || next == LowerKind::kHostOverwrite || next == LowerKind::kDiscard;
  }
  void Emit(uint32_t op, LowerKind kind, TensorIndex tensor) { plan_.events.push_back({op, kind, tensor}); }

  // With victim slack: MIN's victim needs a push-down; any DRAM copy that also needs one, is
  // no smaller and is next used at least (1 - slack) as far ahead will do about as well for
  // traffic. Take the one demanded longest ago: an idle copy, whose push-down and the stage
  // that brings it back fall in other parts of the lap than the burst MIN's victim is in.
  int IdlerVictim(int min_victim, TensorIndex demanding, size_t p, uint32_t op) const {
    const int64_t now = OpAt(p, op);
    const double far = static_cast<double>(cur_next_[min_victim] - p);
    int best = min_victim;
    for (size_t v = 0; v < n_; ++v) {
      if (!s_.dram[v] || s_.nvme[v] || v == demanding || busy_op_[v] == now || IsDead(v)) continue;
      const double ahead = static_cast<double>(cur_next_[v] - p);
      if (Bytes(v) < Bytes(min_victim) || ahead < (1 - options_.victim_slack) * far) continue;
      if (busy_op_[v] < busy_op_[best]) best = static_cast<int>(v);
    }
    return best;
  }

  // Room in DRAM for demand d's tensor: MIN's victims (dead values first) pushed down or dropped.
  absl::Status MakeRoom(size_t p, const LowerEvent& d) {
    const TensorIndex t = d.tensor;
    if (Bytes(t) > dram_budget_) {
      return absl::ResourceExhaustedError(absl::StrFormat("tensor '%s' (%s) does not fit the DRAM budget of %s",
                                                          graph_.tensors[t].name, FormatBytes(Bytes(t)),
                                                          FormatBytes(dram_budget_)));
    }
    while (s_.dram_bytes + Bytes(t) > dram_budget_) {
      int victim = -1;
      for (size_t v = 0; v < n_; ++v) {
        if (!s_.dram[v] || v == t || busy_op_[v] == OpAt(p, d.op)) continue;
        if (victim < 0) {
          victim = static_cast<int>(v);
          continue;
        }
        const bool dv = IsDead(v), dw = IsDead(victim);
        if ((dv && !dw) || (dv == dw && cur_next_[v] > cur_next_[victim])) victim = static_cast<int>(v);
      }
      if (victim >= 0 && options_.victim_slack > 0 && !IsDead(victim) && !s_.nvme[victim]) {
        victim = IdlerVictim(victim, t, p, d.op);
      }
      if (victim < 0) {
        return absl::ResourceExhaustedError(
            absl::StrFormat("op %d ('%s') needs %s in DRAM at once for its own moves; the DRAM budget is %s", d.op,
                            graph_.ops[d.op].name, FormatBytes(s_.dram_bytes + Bytes(t)), FormatBytes(dram_budget_)));
      }
      const TensorIndex v = static_cast<TensorIndex>(victim);
      if (!s_.nvme[v] && !IsDead(v)) {
        Emit(d.op, LowerKind::kPushDown, v);
        s_.nvme[v] = true;
        s_.nvme_bytes += Bytes(v);
        plan_.nvme_write_bytes += Bytes(v);
      } else {
        Emit(d.op, LowerKind::kDrop, v);
      }
      s_.dram[v] = false;
      s_.dram_bytes -= Bytes(v);
    }
    return absl::OkStatus();
  }

  // The demand at absolute position p: room made, then its effect on the tiers below.
  absl::Status Demand(size_t p) {
    const LowerEvent& d = lap_[p % len_];
    const TensorIndex t = d.tensor;
    cur_next_[t] = p + gap_[p % len_];
    const bool needs_room = d.kind != LowerKind::kInvalidate && d.kind != LowerKind::kDiscard && !s_.dram[t];
    if (needs_room) {
      if (absl::Status room = MakeRoom(p, d); !room.ok()) return room;
    }
    busy_op_[t] = OpAt(p, d.op);
    switch (d.kind) {
      case LowerKind::kRead:
      case LowerKind::kHostRead:
      case LowerKind::kHostWrite:
        if (!s_.dram[t]) {
          if (!s_.nvme[t]) {
            return absl::InternalError(absl::StrFormat("op %d %s '%s' but no tier below holds it", d.op,
                                                       d.kind == LowerKind::kRead ? "loads" : "uses on the host",
                                                       graph_.tensors[t].name));
          }
          Emit(d.op, LowerKind::kStage, t);
          plan_.nvme_read_bytes += Bytes(t);
          s_.dram[t] = true;
          s_.dram_bytes += Bytes(t);
        }
        if (d.kind == LowerKind::kHostWrite && s_.nvme[t]) {
          s_.nvme[t] = false;
          s_.nvme_bytes -= Bytes(t);
        }
        Emit(d.op, d.kind, t);
        if (d.kind == LowerKind::kRead && exclusive_[p % len_]) {
          // The GPU changes it before it could drop it clean: the DRAM copy is of no more
          // use once the load has landed (the NVMe copy, if any, goes with the write).
          Emit(d.op, LowerKind::kDrop, t);
          s_.dram[t] = false;
          s_.dram_bytes -= Bytes(t);
        }
        break;
      case LowerKind::kWriteBack:
      case LowerKind::kHostOverwrite:  // (room made above, nothing read into it)
        // DRAM holds the only up-to-date copy.
        if (!s_.dram[t]) {
          s_.dram[t] = true;
          s_.dram_bytes += Bytes(t);
        }
        if (s_.nvme[t]) {
          s_.nvme[t] = false;
          s_.nvme_bytes -= Bytes(t);
        }
        Emit(d.op, d.kind, t);
        break;
      case LowerKind::kInvalidate:
      case LowerKind::kDiscard:
        if (s_.dram[t]) s_.dram_bytes -= Bytes(t);
        if (s_.nvme[t]) s_.nvme_bytes -= Bytes(t);
        s_.dram[t] = s_.nvme[t] = false;
        Emit(d.op, d.kind, t);
        break;
      default:
        break;
    }
    return absl::OkStatus();
  }

  const Graph& graph_;
  const LowerTierOptions& options_;
  const uint64_t dram_budget_;
  const size_t n_;
  const std::vector<LowerEvent> lap_;
  const size_t len_;
  std::vector<bool> exclusive_;  // per demand: a load whose DRAM copy goes once it lands
  std::vector<size_t> gap_;
  std::vector<size_t> cur_next_;  // per tensor: the absolute position of its next demand
  std::vector<int64_t> busy_op_;  // per tensor: the op of its latest demand
  LowerState s_;
  LowerTierPlan plan_;
};

}  // namespace

absl::StatusOr<LowerTierPlan> PlanLowerTiers(const Graph& graph, const ResidencyPlan& gpu, uint64_t dram_budget,
                                             uint64_t nvme_budget, const LowerTierOptions& options) {
  LowerTierPlanner planner(graph, gpu, dram_budget, options);
  // Lap until the state entering a lap repeats (then the events are a cycle the executor can
  // replay every iteration); else the last lap is closed by hand.
  constexpr int kLaps = 12;
  bool settled = false;
  for (int lap = 0; lap < kLaps && !settled; ++lap) {
    auto ended = planner.Lap(lap);
    if (!ended.ok()) return ended.status();
    settled = *ended;
  }
  if (!settled && planner.len() > 0) {
    if (absl::Status closed = planner.CloseLap(); !closed.ok()) return closed;
  }
  LowerTierPlan& plan = planner.plan();
  if (planner.len() == 0) plan.peak_nvme_bytes = planner.nvme_bytes();
  HoistStages(graph, plan, dram_budget);
  if (plan.peak_nvme_bytes > nvme_budget) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("the tiers below the GPU need %s of NVMe at the peak (DRAM budget %s); the NVMe budget is %s",
                        FormatBytes(plan.peak_nvme_bytes), FormatBytes(dram_budget), FormatBytes(nvme_budget)));
  }
  return std::move(plan);
}

namespace {

// DRAM bytes after each event of the lap, from the state it starts in.
std::vector<uint64_t> DramAfterEach(const Graph& graph, const LowerTierPlan& plan, uint64_t& start_bytes) {
  std::vector<bool> dram = plan.dram_at_start;
  uint64_t bytes = 0;
  for (size_t t = 0; t < dram.size(); ++t) {
    if (dram[t]) bytes += graph.tensors[t].bytes;
  }
  start_bytes = bytes;
  std::vector<uint64_t> after(plan.events.size());
  for (size_t k = 0; k < plan.events.size(); ++k) {
    const LowerEvent& e = plan.events[k];
    const uint64_t b = graph.tensors[e.tensor].bytes;
    switch (e.kind) {
      case LowerKind::kWriteBack:
      case LowerKind::kStage:
      case LowerKind::kHostOverwrite:
        if (!dram[e.tensor]) bytes += b;
        dram[e.tensor] = true;
        break;
      case LowerKind::kPushDown:
      case LowerKind::kDrop:
      case LowerKind::kInvalidate:
      case LowerKind::kDiscard:
        if (dram[e.tensor]) bytes -= b;
        dram[e.tensor] = false;
        break;
      case LowerKind::kRead:
      case LowerKind::kDropNvme:
      case LowerKind::kHostRead:
      case LowerKind::kHostWrite:
        break;
    }
    after[k] = bytes;
  }
  return after;
}

// Whether the NVMe copy a stage at `j` reads is used after it within the lap: by a drop of
// the DRAM copy (it would be the only copy left) or anything else that is not a GPU read,
// before a write (write-back, invalidation) makes it stale. Conservative at the lap's end.
bool NvmeCopyUnused(const LowerTierPlan& plan, size_t j) {
  const TensorIndex t = plan.events[j].tensor;
  for (size_t k = j + 1; k < plan.events.size(); ++k) {
    const LowerEvent& e = plan.events[k];
    if (e.tensor != t || e.kind == LowerKind::kRead || e.kind == LowerKind::kHostRead) continue;
    return e.kind == LowerKind::kWriteBack || e.kind == LowerKind::kInvalidate || e.kind == LowerKind::kHostWrite ||
           e.kind == LowerKind::kHostOverwrite || e.kind == LowerKind::kDiscard;
  }
  return false;
}

}  // namespace

int HoistStages(const Graph& graph, LowerTierPlan& plan, uint64_t dram_budget) {
  int moved = 0;
  uint64_t start_bytes = 0;
  std::vector<uint64_t> after = DramAfterEach(graph, plan, start_bytes);
  for (size_t next = 0; next < plan.events.size();) {
    const size_t j = next++;
    if (plan.events[j].kind != LowerKind::kStage) continue;
    const TensorIndex t = plan.events[j].tensor;
    const uint64_t b = graph.tensors[t].bytes;
    // Before event `pos` the stage needs room for its bytes on top of what DRAM holds then,
    // and every event from there to its old place needs room for them too.
    size_t pos = j;
    bool reaches_push_down = false;
    while (pos > 0) {
      const LowerEvent& prev = plan.events[pos - 1];
      if (prev.tensor == t) {
        reaches_push_down = prev.kind == LowerKind::kPushDown && after[pos - 1] + b <= dram_budget;
        break;
      }
      const uint64_t before_prev = pos >= 2 ? after[pos - 2] : start_bytes;
      if (before_prev + b > dram_budget || after[pos - 1] + b > dram_budget) break;
      --pos;
    }
    if (reaches_push_down && NvmeCopyUnused(plan, j)) {
      // DRAM had room to keep it all along: the push-down and the stage cancel out.
      plan.nvme_write_bytes -= b;
      plan.nvme_read_bytes -= b;
      plan.events.erase(plan.events.begin() + static_cast<std::ptrdiff_t>(j));
      plan.events.erase(plan.events.begin() + static_cast<std::ptrdiff_t>(pos - 1));
      ++moved;
      after = DramAfterEach(graph, plan, start_bytes);
      next = j - 1;  // the event after the old stage, two erased before it
      continue;
    }
    if (pos == j) continue;
    LowerEvent stage = plan.events[j];
    stage.op = plan.events[pos].op;
    plan.events.erase(plan.events.begin() + static_cast<std::ptrdiff_t>(j));
    plan.events.insert(plan.events.begin() + static_cast<std::ptrdiff_t>(pos), stage);
    ++moved;
    after = DramAfterEach(graph, plan, start_bytes);
  }
  uint64_t peak = start_bytes;
  for (uint64_t a : after) peak = std::max(peak, a);
  plan.peak_dram_bytes = peak;
  return moved;
}

}  // namespace tierd::prefetcher
