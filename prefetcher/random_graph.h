// Random iteration graphs for the planner's property tests: a few tensors of mixed sizes
// (some pinned), ops that read, read-modify-write and overwrite a few of them, and now and
// then an op on the host that uses unpinned tensors it does not use on the GPU.
#ifndef TIERD_PREFETCHER_RANDOM_GRAPH_H_
#define TIERD_PREFETCHER_RANDOM_GRAPH_H_

#include <algorithm>
#include <cstdint>
#include <random>
#include <string>

#include "prefetcher/graph.h"

namespace tierd::prefetcher {

struct RandomGraphShape {
  int max_tensors = 10;    // 2 + rng % this
  int max_ops = 25;        // 1 + rng % this
  uint64_t max_units = 50;  // a tensor is 1..max_units units
  uint64_t unit_bytes = 1;
  int pinned_one_in = 12;
  double max_seconds = 0;  // 0: every op lasts 1 s; else 0..max_seconds
  bool host_ops = true;    // one op in four also uses a tensor or two on the host
};

// `largest` gets the largest tensor's bytes.
inline Graph RandomGraph(std::mt19937_64& rng, const RandomGraphShape& shape, uint64_t* largest) {
  Graph g;
  const int tensors = 2 + static_cast<int>(rng() % shape.max_tensors);
  *largest = 0;
  for (int t = 0; t < tensors; ++t) {
    g.tensors.push_back({"t" + std::to_string(t), (1 + rng() % shape.max_units) * shape.unit_bytes,
                         rng() % shape.pinned_one_in == 0});
    *largest = std::max(*largest, g.tensors.back().bytes);
  }
  for (int i = 0, ops = 1 + static_cast<int>(rng() % shape.max_ops); i < ops; ++i) {
    const double seconds = shape.max_seconds > 0 ? (rng() % 100) * shape.max_seconds / 100 : 1.0;
    GraphOp op{"op" + std::to_string(i), {}, {}, seconds};
    for (int k = static_cast<int>(rng() % 3); k >= 0; --k) op.reads.push_back(rng() % tensors);
    if (rng() % 2) op.writes.push_back(rng() % tensors);
    if (rng() % 3 == 0) op.overwrites.push_back(rng() % tensors);
    if (shape.host_ops && rng() % 4 == 0) {
      const std::vector<TensorIndex> on_gpu = Touched(op);
      for (int k = static_cast<int>(rng() % 2); k >= 0; --k) {
        const TensorIndex t = rng() % tensors;
        if (g.tensors[t].pinned_gpu || std::binary_search(on_gpu.begin(), on_gpu.end(), t)) continue;
        (rng() % 3 == 0 ? op.host_reads : rng() % 2 ? op.host_writes : op.host_overwrites).push_back(t);
      }
    }
    g.ops.push_back(op);
  }
  return g;
}

}  // namespace tierd::prefetcher

#endif  // TIERD_PREFETCHER_RANDOM_GRAPH_H_
