// The iteration graph as a YAML file, for `tierctl plan --graph FILE` and for clients that
// would rather write a file than call RegisterGraph:
//
//   tensors:
//     - {name: layers.0.w, bytes: 64MiB}
//     - {name: embed.w, bytes: 256MiB, pinned: true}   # never leaves the GPU
//   ops:                                              # one iteration, in order
//     - {name: layers.0.fwd, seconds: 0.004, reads: [layers.0.w, act.0], overwrites: [act.1]}
//     - {name: layers.0.adamw, seconds: 0.001, reads: [layers.0.grad], writes: [layers.0.w]}
//
//     - {name: layers.0.adamw.cpu, seconds: 0.02, host_reads: [layers.0.grad], host_writes: [layers.0.m]}
//
// `writes` are read-modify-write; `overwrites` are written without being read;
// `host_reads`/`host_writes`/`host_overwrites`: the op runs on the host, on the DRAM
// copies. An optional
// `host: true` says the client acquires in DRAM (a CPU trainer): DRAM over NVMe is planned.
#ifndef TIERD_PREFETCHER_GRAPH_FILE_H_
#define TIERD_PREFETCHER_GRAPH_FILE_H_

#include <string>

#include "absl/status/statusor.h"
#include "prefetcher/graph.h"

namespace tierd::prefetcher {

// INVALID_ARGUMENT with the line number for a malformed file, an unknown key, a duplicate
// tensor name, an op naming a tensor not listed, or a bad size; the graph is validated.
absl::StatusOr<Graph> ParseGraphYaml(const std::string& text);
absl::StatusOr<Graph> LoadGraphFile(const std::string& path);
std::string GraphToYaml(const Graph& graph);

}  // namespace tierd::prefetcher

#endif  // TIERD_PREFETCHER_GRAPH_FILE_H_
