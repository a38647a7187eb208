// HoistLoads: MIN loads a tensor at the op that uses it; the room activations leave as they
// die in the backward stays empty until then. A load for a write moved into that room frees
// its DRAM copy early (an exclusive load, tiers.h), and the tiers below use the room to
// stage from NVMe during the backward instead of in the optimizer step.
#include <algorithm>
#include <vector>

#include "base/check.h"
#include "prefetcher/residency.h"

namespace tierd::prefetcher {
namespace {

bool Contains(const std::vector<TensorIndex>& sorted, TensorIndex t) {
  return std::binary_search(sorted.begin(), sorted.end(), t);
}

void Insert(std::vector<TensorIndex>& sorted, TensorIndex t) {
  sorted.insert(std::lower_bound(sorted.begin(), sorted.end(), t), t);
}

bool UsedOnTheHost(const GraphOp& op, TensorIndex t) {
  for (const auto* list : {&op.host_reads, &op.host_writes, &op.host_overwrites}) {
    if (std::find(list->begin(), list->end(), t) != list->end()) return true;
  }
  return false;
}

}  // namespace

int HoistLoads(const Graph& graph, ResidencyPlan& plan, uint64_t budget_bytes) {
  const uint32_t ops = static_cast<uint32_t>(graph.ops.size());
  if (ops < 2) return 0;
  std::vector<uint64_t> bytes_at(ops, 0);
  for (uint32_t i = 0; i < ops; ++i) {
    for (TensorIndex t : plan.resident[i]) bytes_at[i] += graph.tensors[t].bytes;
  }
  int moved = 0;
  for (uint32_t j = 0; j < ops; ++j) {
    for (size_t pos = 0; pos < plan.loads[j].size();) {
      const TensorIndex t = plan.loads[j][pos];
      const uint64_t b = graph.tensors[t].bytes;
      if (UseOf(graph.ops[j], t) != Use::kWrite) {  // (a read-only load frees nothing below)
        ++pos;
        continue;
      }
      // Walk back (within the lap: the plan's first op is where its state is fixed) while
      // the room stays free and nothing else needs the tensor off the GPU.
      uint32_t to = j;
      bool evicted_at_to = false;
      while (to > 0) {
        const uint32_t k = to - 1;
        if (Contains(plan.resident[k], t)) {
          evicted_at_to = true;
          break;
        }
        if (UsedOnTheHost(graph.ops[k], t) || bytes_at[k] + b > budget_bytes) break;
        to = k;
      }
      if (to == j) {
        ++pos;
        continue;
      }
      plan.loads[j].erase(plan.loads[j].begin() + static_cast<std::ptrdiff_t>(pos));
      if (evicted_at_to) {
        // It never needed to leave: keep it, and neither move happens.
        auto& ev = plan.evictions[to];
        auto e = std::find_if(ev.begin(), ev.end(), [t](const Eviction& x) { return x.tensor == t; });
        TIERD_CHECK(e != ev.end());  // resident before `to`, not at it: `to` evicted it
        if (e->write_back) plan.bytes_written_back -= b;
        ev.erase(e);
        plan.bytes_loaded -= b;
      } else {
        plan.loads[to].push_back(t);
      }
      for (uint32_t k = to; k < j; ++k) {
        Insert(plan.resident[k], t);
        bytes_at[k] += b;
        plan.peak_resident_bytes = std::max(plan.peak_resident_bytes, bytes_at[k]);
      }
      ++moved;
    }
  }
  return moved;
}

}  // namespace tierd::prefetcher
