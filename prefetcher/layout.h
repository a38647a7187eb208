// Fixed GPU offsets for the planned tensors: each residency interval of the plan (the ops
// a tensor's GPU copy lives through, stretched back by how early its load may start) is a
// live range on the iteration's cycle; allocator/static_assigner packs them. The planned
// part of the GPU tier then cannot fragment; what does not fit goes to the online allocator.
#ifndef TIERD_PREFETCHER_LAYOUT_H_
#define TIERD_PREFETCHER_LAYOUT_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "prefetcher/graph.h"
#include "prefetcher/residency.h"
#include "prefetcher/simulate.h"

namespace tierd::prefetcher {

struct PlacedInterval {
  TensorIndex tensor = 0;
  uint32_t first_op = 0, ops = 0;  // live from first_op for `ops` ops (wrapping)
  uint64_t offset = 0;
};

struct GpuLayout {
  std::vector<PlacedInterval> intervals;
  uint64_t size_bytes = 0;       // the region the layout needs
  uint64_t peak_live_bytes = 0;  // its lower bound
};

// lead_ops[i]: how many ops before op i its loads may already be under way (LoadLeads); an
// empty vector means loads happen at their op.
absl::StatusOr<GpuLayout> LayOutGpu(const Graph& graph, const ResidencyPlan& plan,
                                    const std::vector<uint32_t>& lead_ops);

// From a simulated timeline (record_timeline): for each op, the most ops between the op
// running when one of its loads started and the op itself.
std::vector<uint32_t> LoadLeads(const Graph& graph, const SimResult& sim);

}  // namespace tierd::prefetcher

#endif  // TIERD_PREFETCHER_LAYOUT_H_
