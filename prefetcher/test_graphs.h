// Hand-made graphs the prefetcher's tests share.
#ifndef TIERD_PREFETCHER_TEST_GRAPHS_H_
#define TIERD_PREFETCHER_TEST_GRAPHS_H_

#include "prefetcher/graph.h"

namespace tierd::prefetcher {

// fwd makes an activation, bwd reads it (then it is dead) and makes a gradient, opt updates
// weight and state. In 240 B of GPU the state (100 B) is evicted for the forward and MIN
// brings it back only at opt; from `mid` on the dead activation's room holds it, so
// HoistLoads moves its load there.
inline Graph HoistableStep() {
  Graph g;
  g.tensors = {{"act", 100}, {"w", 50}, {"state", 100}, {"grad", 50}};
  g.ops.push_back({"fwd", {1}, {}, 1, {0}});
  g.ops.push_back({"bwd", {0, 1}, {}, 1, {3}});
  g.ops.push_back({"mid", {1}, {}, 1});
  g.ops.push_back({"opt", {3}, {1, 2}, 1});
  return g;
}

}  // namespace tierd::prefetcher

#endif  // TIERD_PREFETCHER_TEST_GRAPHS_H_
