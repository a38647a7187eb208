// The iteration graph in the wire form RegisterGraph takes, from the planner's own type
// (for clients that build their graph with prefetcher/, e.g. from a synthetic trace).
#ifndef TIERD_CLIENTS_GRAPH_SPEC_H_
#define TIERD_CLIENTS_GRAPH_SPEC_H_

#include "prefetcher/graph.h"
#include "proto/tierd.pb.h"

namespace tierd {

v1::GraphSpec ToGraphSpec(const prefetcher::Graph& graph);

}  // namespace tierd

#endif  // TIERD_CLIENTS_GRAPH_SPEC_H_
