#include "prefetcher/residency.h"

#include <algorithm>
#include <set>

#include "absl/strings/str_format.h"
#include "base/units.h"

namespace tierd::prefetcher {
namespace {

struct State {
  std::vector<bool> resident;
  std::vector<bool> dirty;
  uint64_t bytes = 0;
};

// One lap over the ops from `state`; fills `plan` when it is not null.
absl::Status Lap(const Graph& graph, uint64_t budget, const std::vector<std::vector<uint32_t>>& next,
                 State& state, ResidencyPlan* plan) {
  const size_t ops = graph.ops.size();
  for (size_t i = 0; i < ops; ++i) {
    const GraphOp& op = graph.ops[i];
    std::set<TensorIndex> needed(op.reads.begin(), op.reads.end());
    needed.insert(op.writes.begin(), op.writes.end());
    uint64_t incoming = 0;
    for (TensorIndex t : needed) {
      if (!state.resident[t]) incoming += graph.tensors[t].bytes;
    }
    std::vector<Eviction> evicted;
    while (state.bytes + incoming > budget) {
      // The resident tensor used furthest in the future (larger first on ties).
      int victim = -1;
      for (size_t t = 0; t < graph.tensors.size(); ++t) {
        if (!state.resident[t] || graph.tensors[t].pinned_gpu || needed.count(t)) continue;
        if (victim < 0 || next[i][t] > next[i][victim] ||
            (next[i][t] == next[i][victim] && graph.tensors[t].bytes > graph.tensors[victim].bytes)) {
          victim = static_cast<int>(t);
        }
      }
      if (victim < 0) {
        return absl::ResourceExhaustedError(absl::StrFormat(
            "op %d ('%s') needs %s on the GPU at once with the pinned tensors and this op's own; "
            "the GPU budget is %s",
            i, op.name, FormatBytes(state.bytes + incoming), FormatBytes(budget)));
      }
      evicted.push_back({static_cast<TensorIndex>(victim), state.dirty[victim]});
      state.resident[victim] = false;
      state.dirty[victim] = false;
      state.bytes -= graph.tensors[victim].bytes;
    }
    std::vector<TensorIndex> loaded;
    for (TensorIndex t : needed) {
      if (state.resident[t]) continue;
      state.resident[t] = true;
      state.bytes += graph.tensors[t].bytes;
      loaded.push_back(t);
    }
    for (TensorIndex t : op.writes) state.dirty[t] = true;
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
    plan->evictions.push_back(std::move(evicted));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ResidencyPlan> PlanResidency(const Graph& graph, uint64_t gpu_budget_bytes) {
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
        "the pinned tensors alone need %s; the GPU budget is %s", FormatBytes(state.bytes),
        FormatBytes(gpu_budget_bytes)));
  }
  const auto next = NextUseDistances(graph);
  if (absl::Status warm = Lap(graph, gpu_budget_bytes, next, state, nullptr); !warm.ok()) return warm;
  ResidencyPlan plan;
  for (size_t t = 0; t < graph.tensors.size(); ++t) {
    if (state.resident[t]) plan.resident_at_start.push_back(static_cast<TensorIndex>(t));
  }
  plan.dirty_at_start = state.dirty;
  if (absl::Status lap = Lap(graph, gpu_budget_bytes, next, state, &plan); !lap.ok()) return lap;
  return plan;
}

absl::Status ReplayPlan(const Graph& graph, uint64_t budget, const ResidencyPlan& plan) {
  const size_t n = graph.tensors.size();
  std::vector<bool> resident(n, false), dirty = plan.dirty_at_start;
  uint64_t bytes = 0;
  for (TensorIndex t : plan.resident_at_start) {
    resident[t] = true;
    bytes += graph.tensors[t].bytes;
  }
  auto fail = [](size_t op, const std::string& what) {
    return absl::InternalError(absl::StrFormat("op %d: %s", op, what));
  };
  for (size_t i = 0; i < graph.ops.size(); ++i) {
    for (const Eviction& e : plan.evictions[i]) {
      if (!resident[e.tensor]) return fail(i, "evicts a tensor that is not resident");
      if (graph.tensors[e.tensor].pinned_gpu) return fail(i, "evicts a pinned tensor (invariant 3)");
      if (dirty[e.tensor] && !e.write_back) return fail(i, "drops a dirty tensor (invariant 4)");
      resident[e.tensor] = false;
      dirty[e.tensor] = false;
      bytes -= graph.tensors[e.tensor].bytes;
    }
    for (TensorIndex t : plan.loads[i]) {
      if (resident[t]) return fail(i, "loads a tensor already resident");
      resident[t] = true;
      bytes += graph.tensors[t].bytes;
    }
    if (bytes > budget) return fail(i, "over the budget (invariant 1)");
    for (const auto* list : {&graph.ops[i].reads, &graph.ops[i].writes}) {
      for (TensorIndex t : *list) {
        if (!resident[t]) return fail(i, "runs without a tensor it uses (invariant 2)");
      }
    }
    for (size_t t = 0; t < n; ++t) {
      if (graph.tensors[t].pinned_gpu && !resident[t]) return fail(i, "a pinned tensor is absent (invariant 3)");
    }
    for (TensorIndex t : graph.ops[i].writes) dirty[t] = true;
  }
  return absl::OkStatus();
}

}  // namespace tierd::prefetcher
