#include "prefetcher/layout.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_format.h"
#include "allocator/static_assigner.h"

namespace tierd::prefetcher {

absl::StatusOr<GpuLayout> LayOutGpu(const Graph& graph, const std::vector<ResidencyWindow>& windows, double lap,
                                    uint64_t alignment) {
  GpuLayout layout;
  if (windows.empty()) return layout;
  const uint32_t ops = static_cast<uint32_t>(graph.ops.size());
  // Cut the iteration at every start and end: the steps of the cycle.
  auto phase = [lap](double t) { return lap > 0 ? std::fmod(t, lap) : 0.0; };
  std::vector<double> cuts;
  for (const ResidencyWindow& w : windows) {
    if (w.tensor >= graph.tensors.size() || (!w.whole && !(w.end > w.start))) {
      return absl::InvalidArgumentError(absl::StrFormat("residency window of tensor %d from %g to %g", w.tensor,
                                                        w.start, w.end));
    }
    if (w.whole) continue;
    cuts.push_back(phase(w.start));
    cuts.push_back(phase(w.end));
  }
  std::sort(cuts.begin(), cuts.end());
  cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
  if (cuts.empty()) cuts.push_back(0);
  const uint32_t steps = static_cast<uint32_t>(cuts.size());
  auto step_of = [&](double t) {
    return static_cast<uint32_t>(std::lower_bound(cuts.begin(), cuts.end(), phase(t)) - cuts.begin());
  };
  std::vector<LiveRange> ranges;
  for (const ResidencyWindow& w : windows) {
    PlacedInterval p;
    p.tensor = w.tensor;
    if (w.whole || w.end - w.start >= lap) {
      p.first_op = 0;
      p.ops = ops;
      p.first_step = 0;
      p.steps = steps;
    } else {
      p.first_op = w.first_op;
      p.ops = (w.last_op + ops - w.first_op) % ops + 1;
      p.first_step = step_of(w.start);
      p.steps = (step_of(w.end) + steps - p.first_step) % steps;
      if (p.steps == 0) p.steps = steps;  // ends where it starts, a lap later
    }
    ranges.push_back({p.first_step, p.steps, graph.tensors[w.tensor].bytes});
    layout.intervals.push_back(p);
  }
  auto assigned = AssignStaticOffsets(steps, ranges, alignment);
  if (!assigned.ok()) return assigned.status();
  for (size_t k = 0; k < layout.intervals.size(); ++k) layout.intervals[k].offset = assigned->offsets[k];
  layout.steps = steps;
  layout.size_bytes = assigned->size_bytes;
  layout.peak_live_bytes = assigned->peak_live_bytes;
  return layout;
}

LayoutIndex::LayoutIndex(const GpuLayout& layout, size_t tensors, uint32_t ops) : ops_(ops), by_tensor_(tensors) {
  for (const PlacedInterval& p : layout.intervals) {
    if (p.tensor < tensors) by_tensor_[p.tensor].push_back(p);
  }
}

std::optional<uint64_t> LayoutIndex::Offset(TensorIndex t, uint32_t op) const {
  if (t >= by_tensor_.size() || by_tensor_[t].empty() || ops_ == 0) return std::nullopt;
  const PlacedInterval* next = nullptr;
  uint32_t next_distance = ops_ + 1;
  for (const PlacedInterval& p : by_tensor_[t]) {
    if ((op + ops_ - p.first_op) % ops_ < p.ops) return p.offset;  // it holds `op`
    const uint32_t distance = (p.first_op + ops_ - op) % ops_;
    if (distance < next_distance) {
      next_distance = distance;
      next = &p;
    }
  }
  return next->offset;
}

std::optional<uint64_t> LayoutIndex::OffsetNow(TensorIndex t, uint32_t op) const {
  if (t >= by_tensor_.size() || ops_ == 0) return std::nullopt;
  for (const PlacedInterval& p : by_tensor_[t]) {
    if ((op + ops_ - p.first_op) % ops_ < p.ops) return p.offset;
  }
  return std::nullopt;
}

}  // namespace tierd::prefetcher
