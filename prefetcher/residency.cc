#include "prefetcher/residency.h"

#include <algorithm>

#include "absl/strings/str_format.h"
#include "base/units.h"

namespace tierd::prefetcher {
namespace {

struct State {
  std::vector<bool> resident;
  std::vector<bool> dirty;
  uint64_t bytes = 0;
};

struct Oracle {
  std::vector<std::vector<uint32_t>> next;
  std::vector<std::vector<bool>> dead;
};

void Drop(const Graph& graph, State& state, TensorIndex t) {
  state.resident[t] = false;
  state.dirty[t] = false;
  state.bytes -= graph.tensors[t].bytes;
}

// One lap over the ops from `state`; fills `plan` when it is not null.
absl::Status Lap(const Graph& graph, uint64_t budget, const Oracle& oracle, State& state, ResidencyPlan* plan,
                 const std::atomic<bool>* cancel) {
  const size_t ops = graph.ops.size();
  for (size_t i = 0; i < ops; ++i) {
    if (cancel != nullptr && cancel->load(std::memory_order_relaxed)) {
      return absl::CancelledError("planning was cancelled");
    }
    const GraphOp& op = graph.ops[i];
    const size_t prev = (i + ops - 1) % ops;
    const std::vector<TensorIndex> needed = Touched(op);
    auto is_needed = [&](size_t t) { return std::binary_search(needed.begin(), needed.end(), t); };
    std::vector<Eviction> evicted;
    // Values that died with the previous op go at once: their room is free for prefetches.
    for (size_t t = 0; t < graph.tensors.size(); ++t) {
      if (!state.resident[t] || graph.tensors[t].pinned_gpu || is_needed(t) || !oracle.dead[prev][t]) continue;
      evicted.push_back({static_cast<TensorIndex>(t), false, true});
      Drop(graph, state, t);
    }
    // A host op needs its tensors below the GPU: their GPU copies go first (written back
    // when they are the newer ones), and a host write leaves nothing valid on the GPU.
    for (TensorIndex t : HostTouched(op)) {
      if (graph.tensors[t].pinned_gpu) {
        return absl::FailedPreconditionError(absl::StrFormat(
            "op %d ('%s') uses '%s' on the host, but it is pinned to the GPU: unpin it or run the op on the GPU", i,
            op.name, graph.tensors[t].name));
      }
      if (!state.resident[t]) continue;
      const bool dead = HostUseOf(op, t) == Use::kOverwrite;
      evicted.push_back({t, !dead && state.dirty[t], dead});
      Drop(graph, state, t);
    }
    uint64_t incoming = 0;
    for (TensorIndex t : needed) {
      if (!state.resident[t]) incoming += graph.tensors[t].bytes;
    }
    while (state.bytes + incoming > budget) {
      // The resident tensor used furthest in the future (larger first on ties).
      int victim = -1;
      for (size_t t = 0; t < graph.tensors.size(); ++t) {
        if (!state.resident[t] || graph.tensors[t].pinned_gpu || is_needed(t)) continue;
        const auto& next = oracle.next[i];
        if (victim < 0 || next[t] > next[victim] ||
            (next[t] == next[victim] && graph.tensors[t].bytes > graph.tensors[victim].bytes)) {
          victim = static_cast<int>(t);
        }
      }
      if (victim < 0) {
        return absl::ResourceExhaustedError(absl::StrFormat(
            "op %d ('%s') needs %s %s at once with the pinned tensors and this op's own; "
            "the %s budget is %s",
            i, op.name, FormatBytes(state.bytes + incoming), InTopTier(graph), TopTierName(graph),
            FormatBytes(budget)));
      }
      evicted.push_back({static_cast<TensorIndex>(victim), static_cast<bool>(state.dirty[victim]), false});
      Drop(graph, state, victim);
    }
    std::vector<TensorIndex> loaded, allocated;
    for (TensorIndex t : needed) {
      if (state.resident[t]) continue;
      state.resident[t] = true;
      state.bytes += graph.tensors[t].bytes;
      (UseOf(op, t) == Use::kOverwrite ? allocated : loaded).push_back(t);
    }
    for (TensorIndex t : needed) {
      if (UseOf(op, t) != Use::kRead) state.dirty[t] = true;
    }
    if (plan == nullptr) continue;
    for (TensorIndex t : loaded) plan->bytes_loaded += graph.tensors[t].bytes;
    for (const Eviction& e : evicted) {
      if (e.write_back) plan->bytes_written_back += graph.tensors[e.tensor].bytes;
    }
    plan->peak_resident_bytes = std::max(plan->peak_resident_bytes, state.bytes);
    std::vector<TensorIndex> resident;
    for (size_t t = 0; t < graph.tensors.size(); ++t) {
      if (state.resident[t]) resident.push_back(static_cast<TensorIndex>(t));
    }
    plan->resident.push_back(std::move(resident));
    plan->loads.push_back(std::move(loaded));
    plan->allocs.push_back(std::move(allocated));
    plan->evictions.push_back(std::move(evicted));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ResidencyPlan> PlanResidency(const Graph& graph, uint64_t gpu_budget_bytes,
                                            const std::atomic<bool>* cancel) {
  if (absl::Status valid = ValidateGraph(graph); !valid.ok()) return valid;
  State state;
  state.resident.assign(graph.tensors.size(), false);
  state.dirty.assign(graph.tensors.size(), false);
  for (size_t t = 0; t < graph.tensors.size(); ++t) {
    if (!graph.tensors[t].pinned_gpu) continue;
    state.resident[t] = true;
    state.bytes += graph.tensors[t].bytes;
  }
  if (state.bytes > gpu_budget_bytes) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "the pinned tensors alone need %s; the %s budget is %s", FormatBytes(state.bytes), TopTierName(graph),
        FormatBytes(gpu_budget_bytes)));
  }
  const Oracle oracle{NextUseDistances(graph), DeadAfter(graph)};
  // Lap until the state entering op 0 repeats: then the plan is a cycle the executor can
  // replay every iteration. Belady from an arbitrary state settles in a lap or two; if it
  // has not after kLaps, the last lap is closed by hand (below).
  constexpr int kLaps = 8;
  ResidencyPlan plan;
  for (int lap = 0; lap < kLaps; ++lap) {
    const State before = state;
    plan = ResidencyPlan{};
    if (absl::Status s = Lap(graph, gpu_budget_bytes, oracle, state, &plan, cancel); !s.ok()) return s;
    for (size_t t = 0; t < graph.tensors.size(); ++t) {
      if (before.resident[t]) plan.resident_at_start.push_back(static_cast<TensorIndex>(t));
    }
    plan.dirty_at_start = before.dirty;
    if (state.resident == before.resident && state.dirty == before.dirty) return plan;
  }
  // Not settled: the lap ends in E but was planned from S. Enter op 0 from E instead: first
  // leave E for S (evict E minus S, load S minus E), then the lap as planned. Tensors loaded
  // here come in clean, so a later write-back of one may be redundant — never unsafe.
  std::vector<Eviction> closing;
  std::vector<TensorIndex> reloads;
  std::vector<bool> in_start(graph.tensors.size(), false);
  for (TensorIndex t : plan.resident_at_start) in_start[t] = true;
  const auto& dead_before_op0 = oracle.dead[graph.ops.size() - 1];
  for (size_t t = 0; t < graph.tensors.size(); ++t) {
    const auto ti = static_cast<TensorIndex>(t);
    if (state.resident[t] && !in_start[t]) {
      const bool dead = dead_before_op0[t];
      closing.push_back({ti, static_cast<bool>(state.dirty[t]) && !dead, dead});
    }
    if (!state.resident[t] && in_start[t]) {
      // Op 0 drops it anyway (a host op's, or dead): neither bring it back nor drop it.
      auto& planned = plan.evictions[0];
      auto dropped = std::find_if(planned.begin(), planned.end(), [&](const Eviction& e) { return e.tensor == ti; });
      if (dropped != planned.end()) {
        if (dropped->write_back) plan.bytes_written_back -= graph.tensors[t].bytes;
        planned.erase(dropped);
        continue;
      }
      reloads.push_back(ti);
    }
  }
  plan.evictions[0].insert(plan.evictions[0].begin(), closing.begin(), closing.end());
  plan.loads[0].insert(plan.loads[0].begin(), reloads.begin(), reloads.end());
  for (TensorIndex t : reloads) plan.bytes_loaded += graph.tensors[t].bytes;
  for (const Eviction& e : closing) {
    if (e.write_back) plan.bytes_written_back += graph.tensors[e.tensor].bytes;
  }
  plan.resident_at_start.clear();
  for (size_t t = 0; t < graph.tensors.size(); ++t) {
    if (state.resident[t]) plan.resident_at_start.push_back(static_cast<TensorIndex>(t));
  }
  plan.dirty_at_start = state.dirty;
  return plan;
}

absl::StatusOr<ResidencyPlan> PlanResidencyFrom(const Graph& graph, uint64_t gpu_budget_bytes,
                                                const std::vector<TensorIndex>& resident,
                                                const std::vector<bool>& dirty) {
  if (absl::Status valid = ValidateGraph(graph); !valid.ok()) return valid;
  const size_t n = graph.tensors.size();
  if (dirty.size() != n) return absl::InvalidArgumentError("one dirty flag per tensor is needed");
  State state;
  state.resident.assign(n, false);
  state.dirty = dirty;
  for (TensorIndex t : resident) {
    if (t >= n) return absl::InvalidArgumentError(absl::StrFormat("resident tensor %d; the graph has %d", t, n));
    if (state.resident[t]) continue;
    state.resident[t] = true;
    state.bytes += graph.tensors[t].bytes;
  }
  for (size_t t = 0; t < n; ++t) {
    if (graph.tensors[t].pinned_gpu && !state.resident[t]) {
      state.resident[t] = true;  // a pin brings its tensor in before anything runs
      state.bytes += graph.tensors[t].bytes;
    }
    if (!state.resident[t]) state.dirty[t] = false;
  }
  if (state.bytes > gpu_budget_bytes) {
    return absl::ResourceExhaustedError(absl::StrFormat("the starting state holds %s; the %s budget is %s",
                                                        FormatBytes(state.bytes), TopTierName(graph),
                                                        FormatBytes(gpu_budget_bytes)));
  }
  ResidencyPlan plan;
  for (size_t t = 0; t < n; ++t) {
    if (state.resident[t]) plan.resident_at_start.push_back(static_cast<TensorIndex>(t));
  }
  plan.dirty_at_start = state.dirty;
  const Oracle oracle{NextUseDistances(graph), DeadAfter(graph)};
  if (absl::Status lap = Lap(graph, gpu_budget_bytes, oracle, state, &plan, nullptr); !lap.ok()) return lap;
  return plan;
}

absl::Status ReplayPlan(const Graph& graph, uint64_t budget, const ResidencyPlan& plan, bool cyclic) {
  const size_t n = graph.tensors.size(), ops = graph.ops.size();
  if (plan.loads.size() != ops || plan.allocs.size() != ops || plan.evictions.size() != ops) {
    return absl::InternalError("the plan does not have one entry per op");
  }
  const auto dead = DeadAfter(graph);
  std::vector<bool> resident(n, false), dirty = plan.dirty_at_start;
  uint64_t bytes = 0;
  for (TensorIndex t : plan.resident_at_start) {
    resident[t] = true;
    bytes += graph.tensors[t].bytes;
  }
  auto fail = [](size_t op, const std::string& what) {
    return absl::InternalError(absl::StrFormat("op %d: %s", op, what));
  };
  for (size_t i = 0; i < ops; ++i) {
    const GraphOp& op = graph.ops[i];
    for (const Eviction& e : plan.evictions[i]) {
      if (!resident[e.tensor]) return fail(i, "evicts a tensor that is not resident");
      if (graph.tensors[e.tensor].pinned_gpu) return fail(i, "evicts a pinned tensor (invariant 3)");
      if (e.dead && !dead[(i + ops - 1) % ops][e.tensor]) return fail(i, "drops a live value as dead (invariant 4)");
      if (dirty[e.tensor] && !e.write_back && !e.dead) return fail(i, "drops a dirty tensor (invariant 4)");
      resident[e.tensor] = false;
      dirty[e.tensor] = false;
      bytes -= graph.tensors[e.tensor].bytes;
    }
    for (const auto* list : {&plan.loads[i], &plan.allocs[i]}) {
      for (TensorIndex t : *list) {
        if (resident[t]) return fail(i, "brings in a tensor already resident");
        if (list == &plan.allocs[i] && UseOf(op, t) != Use::kOverwrite) {
          return fail(i, "allocates without loading a tensor the op reads (invariant 2)");
        }
        resident[t] = true;
        bytes += graph.tensors[t].bytes;
      }
    }
    if (bytes > budget) return fail(i, "over the budget (invariant 1)");
    for (TensorIndex t : HostTouched(op)) {
      if (resident[t]) return fail(i, "runs on the host while the GPU holds '" + graph.tensors[t].name + "' (invariant 6)");
    }
    for (TensorIndex t : Touched(op)) {
      if (!resident[t]) return fail(i, "runs without a tensor it uses (invariant 2)");
      if (UseOf(op, t) != Use::kRead) dirty[t] = true;
    }
    for (size_t t = 0; t < n; ++t) {
      if (graph.tensors[t].pinned_gpu && !resident[t]) return fail(i, "a pinned tensor is absent (invariant 3)");
    }
  }
  if (cyclic) {
    std::vector<bool> start(n, false);
    for (TensorIndex t : plan.resident_at_start) start[t] = true;
    if (start != resident) return absl::InternalError("the lap does not end where it started (invariant 5)");
  }
  return absl::OkStatus();
}

}  // namespace tierd::prefetcher
