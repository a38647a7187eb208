#include "clients/graph_spec.h"

namespace tierd {

v1::GraphSpec ToGraphSpec(const prefetcher::Graph& graph) {
  v1::GraphSpec spec;
  spec.set_host(graph.host);
  for (const prefetcher::GraphTensor& t : graph.tensors) {
    v1::GraphTensorSpec* out = spec.add_tensors();
    out->set_name(t.name);
    out->set_bytes(t.bytes);
    out->set_pinned(t.pinned_gpu);
  }
  for (const prefetcher::GraphOp& op : graph.ops) {
    v1::GraphOpSpec* out = spec.add_ops();
    out->set_name(op.name);
    out->set_seconds(op.seconds);
    for (auto t : op.reads) out->add_reads(graph.tensors[t].name);
    for (auto t : op.writes) out->add_writes(graph.tensors[t].name);
    for (auto t : op.overwrites) out->add_overwrites(graph.tensors[t].name);
    for (auto t : op.host_reads) out->add_host_reads(graph.tensors[t].name);
    for (auto t : op.host_writes) out->add_host_writes(graph.tensors[t].name);
    for (auto t : op.host_overwrites) out->add_host_overwrites(graph.tensors[t].name);
  }
  return spec;
}

}  // namespace tierd
