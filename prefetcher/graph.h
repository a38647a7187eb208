// The iteration graph the planner works from: tensors with sizes, and the ops of one
// training iteration in execution order, each with the tensors it reads and writes and
// its (estimated or measured) duration. The iteration repeats: after the last op comes
// the first op again, so "next use" wraps around.
#ifndef TIERD_PREFETCHER_GRAPH_H_
#define TIERD_PREFETCHER_GRAPH_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace tierd::prefetcher {

using TensorIndex = uint32_t;

struct GraphTensor {
  std::string name;
  uint64_t bytes = 0;
  bool pinned_gpu = false;  // never leaves the GPU
};

struct GraphOp {
  std::string name;
  std::vector<TensorIndex> reads;
  std::vector<TensorIndex> writes;  // read-modify-write: the old value is needed
  double seconds = 0;
  // Written without being read (an activation produced, a gradient set): the old value is
  // dead, so nothing is loaded for it and nothing was worth writing back before it.
  std::vector<TensorIndex> overwrites;
};

struct Graph {
  std::vector<GraphTensor> tensors;
  std::vector<GraphOp> ops;
  // The client acquires on the host (a CPU trainer): the planned top tier is DRAM, not the
  // GPU, and the tier below it NVMe. The planning is the same; messages name the tier.
  bool host = false;
};
// The planned top tier's name ("GPU" or "DRAM"), and where a tensor in it is ("on the GPU",
// "in DRAM"), for messages.
const char* TopTierName(const Graph& graph);
const char* InTopTier(const Graph& graph);

// INVALID_ARGUMENT for an empty graph, an out-of-range tensor index, a zero-byte tensor or
// a negative duration.
absl::Status ValidateGraph(const Graph& graph);

// How op uses t: kOverwrite only when the op neither reads nor read-modify-writes it;
// read and overwritten by the same op counts as kWrite.
enum class Use : uint8_t { kNone, kRead, kWrite, kOverwrite };
Use UseOf(const GraphOp& op, TensorIndex t);
// Every tensor the op touches, once each, sorted.
std::vector<TensorIndex> Touched(const GraphOp& op);

// next_use[i][t]: for op i and tensor t, how many ops after op i (1..ops, wrapping
// around the iteration) t is next used; ops + 1 if never. O(ops x tensors).
std::vector<std::vector<uint32_t>> NextUseDistances(const Graph& graph);
// dead[i][t]: after op i, t's next use overwrites it (its value is dead until then).
std::vector<std::vector<bool>> DeadAfter(const Graph& graph);

}  // namespace tierd::prefetcher

#endif  // TIERD_PREFETCHER_GRAPH_H_
