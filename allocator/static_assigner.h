// Static offset assignment for planned tensors, like a compiler's memory planner: each
// request lives for an arc of steps on a cycle (the ops of an iteration, wrapping) and
// needs `bytes`; requests whose arcs overlap get disjoint address ranges. Offsets are fixed
// for the whole run, so the planned part of the GPU tier cannot fragment.
//
// Greedy by size (largest first), each placed at the lowest offset that clears every placed
// request it overlaps in time — the "greedy by size" heuristic of TFLite's and XLA's
// planners. Not optimal in general (the problem is NP-hard); the result is checked against
// the lower bound (the most bytes live at one step) in tests and reported.
#ifndef TIERD_ALLOCATOR_STATIC_ASSIGNER_H_
#define TIERD_ALLOCATOR_STATIC_ASSIGNER_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"

namespace tierd {

struct LiveRange {
  uint32_t first = 0;   // first step it is live
  uint32_t length = 0;  // steps live, 1..steps; first + length may wrap past `steps`
  uint64_t bytes = 0;
};

struct StaticAssignment {
  std::vector<uint64_t> offsets;  // per request
  uint64_t size_bytes = 0;        // highest offset + bytes: the region this needs
  uint64_t peak_live_bytes = 0;   // the lower bound: most bytes live at one step
};

// INVALID_ARGUMENT for zero steps, a zero length or a length above `steps`, a range starting
// beyond the cycle, or a zero-byte request. `alignment` (a power of two) rounds offsets up.
absl::StatusOr<StaticAssignment> AssignStaticOffsets(uint32_t steps, const std::vector<LiveRange>& ranges,
                                                     uint64_t alignment = 256);

// True when ranges a and b are live at a common step of the cycle.
bool Overlaps(uint32_t steps, const LiveRange& a, const LiveRange& b);

}  // namespace tierd

#endif  // TIERD_ALLOCATOR_STATIC_ASSIGNER_H_
