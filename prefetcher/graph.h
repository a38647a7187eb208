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
  // The op runs on the host, next to the tier below the top one (an optimizer step on the
  // CPU of a GPU trainer), on these tensors' DRAM copies: read, read and changed, or
  // written whole. The plan takes them off the GPU before it (written back when the GPU
  // copy is the newer and the value is needed), and a host write makes every other copy
  // stale.
  std::vector<TensorIndex> host_reads;
  std::vector<TensorIndex> host_writes;
  std::vector<TensorIndex> host_overwrites;
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

// INVALID_ARGUMENT for an empty graph, an out-of-range tensor index, a zero-byte tensor,
// a negative duration, an op that uses a tensor both on the GPU and on the host, or host
// uses in a host graph (whose top tier is already the host's).
absl::Status ValidateGraph(const Graph& graph);

// How op uses t: kOverwrite only when the op neither reads nor read-modify-writes it;
// read and overwritten by the same op counts as kWrite.
enum class Use : uint8_t { kNone, kRead, kWrite, kOverwrite };
Use UseOf(const GraphOp& op, TensorIndex t);
// Every tensor the op touches in the top tier, once each, sorted.
std::vector<TensorIndex> Touched(const GraphOp& op);
// Every tensor the op uses on the host, once each, sorted; and how (UseOf's rules).
std::vector<TensorIndex> HostTouched(const GraphOp& op);
Use HostUseOf(const GraphOp& op, TensorIndex t);

// next_use[i][t]: for op i and tensor t, how many ops after op i (1..ops, wrapping
// around the iteration) t is next used in the top tier (with `host_uses`, on the host
// too); ops + 1 if never. O(ops x tensors).
std::vector<std::vector<uint32_t>> NextUseDistances(const Graph& graph, bool host_uses = false);
// dead[i][t]: after op i, t's next use (on the GPU or on the host) overwrites it (its value
// is dead until then).
std::vector<std::vector<bool>> DeadAfter(const Graph& graph);

}  // namespace tierd::prefetcher

#endif  // TIERD_PREFETCHER_GRAPH_H_
