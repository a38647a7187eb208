#include "prefetcher/layout.h"

#include <algorithm>

#include "allocator/static_assigner.h"

namespace tierd::prefetcher {

absl::StatusOr<GpuLayout> LayOutGpu(const Graph& graph, const ResidencyPlan& plan,
                                    const std::vector<uint32_t>& lead_ops) {
  const uint32_t ops = static_cast<uint32_t>(graph.ops.size());
  const size_t n = graph.tensors.size();
  // live[t][i]: t's GPU copy exists while op i runs, or its load for a later op is in flight.
  std::vector<std::vector<bool>> live(n, std::vector<bool>(ops, false));
  for (uint32_t i = 0; i < ops; ++i) {
    for (TensorIndex t : plan.resident[i]) live[t][i] = true;
  }
  for (uint32_t i = 0; i < ops; ++i) {
    const uint32_t lead = lead_ops.empty() ? 0 : std::min(lead_ops[i], ops - 1);
    for (const auto* list : {&plan.loads[i], &plan.allocs[i]}) {
      for (TensorIndex t : *list) {
        for (uint32_t k = 1; k <= lead; ++k) live[t][(i + ops - k) % ops] = true;
      }
    }
  }
  std::vector<LiveRange> ranges;
  std::vector<PlacedInterval> intervals;
  for (size_t t = 0; t < n; ++t) {
    const auto& l = live[t];
    if (std::all_of(l.begin(), l.end(), [](bool b) { return b; })) {
      ranges.push_back({0, ops, graph.tensors[t].bytes});
      intervals.push_back({static_cast<TensorIndex>(t), 0, ops, 0});
      continue;
    }
    // Maximal runs on the cycle: each starts where live follows not-live.
    for (uint32_t i = 0; i < ops; ++i) {
      if (!l[i] || l[(i + ops - 1) % ops]) continue;
      uint32_t length = 0;
      while (length < ops && l[(i + length) % ops]) ++length;
      ranges.push_back({i, length, graph.tensors[t].bytes});
      intervals.push_back({static_cast<TensorIndex>(t), i, length, 0});
    }
  }
  GpuLayout layout;
  if (ranges.empty()) return layout;
  auto assigned = AssignStaticOffsets(ops, ranges);
  if (!assigned.ok()) return assigned.status();
  for (size_t k = 0; k < intervals.size(); ++k) intervals[k].offset = assigned->offsets[k];
  layout.intervals = std::move(intervals);
  layout.size_bytes = assigned->size_bytes;
  layout.peak_live_bytes = assigned->peak_live_bytes;
  return layout;
}

std::vector<uint32_t> LoadLeads(const Graph& graph, const SimResult& sim) {
  const size_t ops = graph.ops.size();
  std::vector<uint32_t> lead(ops, 0);
  // Compute spans in timeline order, as global op numbers (iteration * ops + op).
  std::vector<std::pair<double, int64_t>> op_starts;
  for (const TimelineEvent& e : sim.timeline) {
    if (e.track == Track::kCompute) op_starts.push_back({e.start, static_cast<int64_t>(e.iteration) * ops + e.op});
  }
  std::sort(op_starts.begin(), op_starts.end());
  for (const TimelineEvent& e : sim.timeline) {
    if (e.track != Track::kH2D) continue;
    // The op running (or next to run) when the load started.
    auto it = std::upper_bound(op_starts.begin(), op_starts.end(), std::make_pair(e.start, INT64_MAX));
    const int64_t running = it == op_starts.begin() ? 0 : std::prev(it)->second;
    const int64_t served = static_cast<int64_t>(e.iteration) * ops + e.op;
    if (served > running) lead[e.op] = std::max<uint32_t>(lead[e.op], static_cast<uint32_t>(served - running));
  }
  return lead;
}

}  // namespace tierd::prefetcher
