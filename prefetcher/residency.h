// Residency planning: which tensors are in the GPU tier at each op of the (repeating)
// iteration, under a byte budget, evicting by furthest next use (Belady's MIN, with the
// future known because training repeats the same iteration). This is the first stage of
// the planner: it decides *what* moves; when to issue each move (from link
// bandwidths and op times) is the next stage.
//
// Invariants of a plan (checked by ReplayPlan):
//   1. At every op, the resident bytes are <= the budget.
//   2. Every tensor an op reads or writes is resident while it runs.
//   3. Pinned tensors are resident at every op.
//   4. A tensor written on the GPU is written back before it is evicted (never dropped dirty),
//      unless its next use overwrites it (a dead value: an activation after its last read).
// Dead values are dropped as soon as they are dead, so their room is free for prefetches.
//   5. The plan is a cycle: the lap ends in the state it starts from, so the executor
//      replays it every iteration (the steady state, found by lapping until it repeats).
//   6. A tensor an op uses on the host is not on the GPU while it runs (its GPU copy was
//      written back first if it was the newer one), so the host sees the latest value.
#ifndef TIERD_PREFETCHER_RESIDENCY_H_
#define TIERD_PREFETCHER_RESIDENCY_H_

#include <atomic>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "prefetcher/graph.h"

namespace tierd::prefetcher {

struct Eviction {
  TensorIndex tensor = 0;
  bool write_back = false;  // the GPU copy was the only up-to-date one
  bool dead = false;        // its next use overwrites it: dropped, never written back
};

struct ResidencyPlan {
  std::vector<std::vector<TensorIndex>> resident;  // per op, sorted
  std::vector<std::vector<TensorIndex>> loads;     // per op: brought in before it runs
  std::vector<std::vector<TensorIndex>> allocs;    // per op: room made, nothing loaded (overwrites)
  std::vector<std::vector<Eviction>> evictions;    // per op: dropped before it runs
  std::vector<TensorIndex> resident_at_start;      // the steady state entering op 0
  std::vector<bool> dirty_at_start;                // per tensor, entering op 0
  uint64_t bytes_loaded = 0;                       // per iteration, steady state
  uint64_t bytes_written_back = 0;
  uint64_t peak_resident_bytes = 0;
};

// RESOURCE_EXHAUSTED naming the op and the numbers when an op's tensors plus the pinned
// ones do not fit the budget. `cancel`, once set by another thread, stops it at the next op
// with CANCELLED.
absl::StatusOr<ResidencyPlan> PlanResidency(const Graph& graph, uint64_t gpu_budget_bytes,
                                            const std::atomic<bool>* cancel = nullptr);

// One lap of the iteration from a given state (what is resident and dirty at its start),
// not the steady state: MIN over a finite sequence, which the tests compare with brute
// force. (The executor's replans plan the steady state again.) Same errors.
absl::StatusOr<ResidencyPlan> PlanResidencyFrom(const Graph& graph, uint64_t gpu_budget_bytes,
                                                const std::vector<TensorIndex>& resident,
                                                const std::vector<bool>& dirty);

// Moves each load for a write (its op changes the tensor) to the earliest op of the lap from
// which the top tier has room for it at every op until its old place (MIN loads only at the
// op of use, leaving room free as activations die), never across a host use of the tensor;
// when the room reaches back to the op that evicted it, the eviction and the load both go.
// Bytes loaded do not grow. Returns how many loads moved or went. For plans that are cycles
// (PlanResidency's): nothing moves across op 0, where the lap's start state is fixed.
int HoistLoads(const Graph& graph, ResidencyPlan& plan, uint64_t budget_bytes);

// Replays a plan against the graph and checks invariants 1-4 and 6, and with `cyclic` (plans from
// PlanResidency) invariant 5: the lap ends in the state it started from. For tests.
absl::Status ReplayPlan(const Graph& graph, uint64_t gpu_budget_bytes, const ResidencyPlan& plan,
                        bool cyclic = true);

}  // namespace tierd::prefetcher

#endif  // TIERD_PREFETCHER_RESIDENCY_H_
