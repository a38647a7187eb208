// Fixed offsets in the top tier (the GPU, or DRAM for a host graph) for the planned
// tensors: each time a tensor's copy lives there in one steady-state iteration of the
// simulated run (from the start of its load to the end of its free or write-back) is a live
// range on the iteration's cycle; allocator/static_assigner packs them. The simulator keeps
// the budget at every instant, so the ranges never need more than the budget at once; the
// packing is within a few tenths of that. Copies then go to their fixed offsets when the
// range is free, and what does not fit goes to the online allocator.
#ifndef TIERD_PREFETCHER_LAYOUT_H_
#define TIERD_PREFETCHER_LAYOUT_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "prefetcher/graph.h"
#include "prefetcher/residency.h"

namespace tierd::prefetcher {

// One residency of a tensor in one iteration, as times within the iteration [0, lap):
// from `start` to `end` (end > start, past `lap` when it wraps into the next iteration), or
// all the iteration (`whole`). first_op/last_op: the ops running at start and at end.
struct ResidencyWindow {
  TensorIndex tensor = 0;
  double start = 0, end = 0;
  bool whole = false;
  uint32_t first_op = 0, last_op = 0;
};

struct PlacedInterval {
  TensorIndex tensor = 0;
  uint32_t first_op = 0, ops = 0;      // the ops it spans (wrapping): what lookups go by
  uint32_t first_step = 0, steps = 0;  // its live range on the layout's time steps
  uint64_t offset = 0;
};

struct GpuLayout {
  std::vector<PlacedInterval> intervals;
  uint32_t steps = 0;            // the iteration cut at every window's start and end
  uint64_t size_bytes = 0;       // the region the layout needs
  uint64_t peak_live_bytes = 0;  // its lower bound: the most bytes live at one time
};

// Offsets are multiples of `alignment` (the top tier arena's: 256 B on the GPU, 4 KiB in
// DRAM). INVALID_ARGUMENT for a window of an unknown tensor or with end <= start.
absl::StatusOr<GpuLayout> LayOutGpu(const Graph& graph, const std::vector<ResidencyWindow>& windows, double lap,
                                    uint64_t alignment = 256);

// A layout looked up by tensor and op.
class LayoutIndex {
 public:
  LayoutIndex() = default;
  LayoutIndex(const GpuLayout& layout, size_t tensors, uint32_t ops);
  // Where t goes at `op`: the offset of its interval that holds `op`, else of its next
  // interval after `op` (cyclic); nullopt when t has none.
  std::optional<uint64_t> Offset(TensorIndex t, uint32_t op) const;
  // The offset of t's interval that holds `op`; nullopt when none does.
  std::optional<uint64_t> OffsetNow(TensorIndex t, uint32_t op) const;

 private:
  uint32_t ops_ = 0;
  std::vector<std::vector<PlacedInterval>> by_tensor_;
};

}  // namespace tierd::prefetcher

#endif  // TIERD_PREFETCHER_LAYOUT_H_
