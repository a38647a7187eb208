#include "prefetcher/graph.h"

#include <algorithm>

#include "absl/strings/str_format.h"

namespace tierd::prefetcher {

const char* TopTierName(const Graph& graph) { return graph.host ? "DRAM" : "GPU"; }
const char* InTopTier(const Graph& graph) { return graph.host ? "in DRAM" : "on the GPU"; }

absl::Status ValidateGraph(const Graph& graph) {
  if (graph.ops.empty() || graph.tensors.empty()) return absl::InvalidArgumentError("the graph is empty");
  for (size_t t = 0; t < graph.tensors.size(); ++t) {
    if (graph.tensors[t].bytes == 0) {
      return absl::InvalidArgumentError(absl::StrFormat("tensor %d ('%s') has 0 bytes", t, graph.tensors[t].name));
    }
  }
  for (size_t i = 0; i < graph.ops.size(); ++i) {
    const GraphOp& op = graph.ops[i];
    if (op.seconds < 0) return absl::InvalidArgumentError(absl::StrFormat("op %d has a negative duration", i));
    for (const auto* list : {&op.reads, &op.writes, &op.overwrites, &op.host_reads, &op.host_writes,
                              &op.host_overwrites}) {
      for (TensorIndex t : *list) {
        if (t >= graph.tensors.size()) {
          return absl::InvalidArgumentError(
              absl::StrFormat("op %d ('%s') uses tensor %d; the graph has %d", i, op.name, t, graph.tensors.size()));
        }
      }
    }
    const std::vector<TensorIndex> host = HostTouched(op);
    if (!host.empty() && graph.host) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "op %d ('%s') uses tensors on the host, but the whole graph runs on the host (its top tier is DRAM): "
          "list them as reads and writes",
          i, op.name));
    }
    for (TensorIndex t : Touched(op)) {
      if (std::binary_search(host.begin(), host.end(), t)) {
        return absl::InvalidArgumentError(
            absl::StrFormat("op %d ('%s') uses '%s' both on the GPU and on the host: one place per op", i, op.name,
                            graph.tensors[t].name));
      }
    }
  }
  return absl::OkStatus();
}

namespace {

Use UseIn(const std::vector<TensorIndex>& read, const std::vector<TensorIndex>& written,
          const std::vector<TensorIndex>& overwritten, TensorIndex t) {
  auto has = [t](const std::vector<TensorIndex>& list) {
    return std::find(list.begin(), list.end(), t) != list.end();
  };
  const bool reads = has(read), overwrites = has(overwritten);
  if (has(written) || (reads && overwrites)) return Use::kWrite;  // read and changed
  if (reads) return Use::kRead;
  if (overwrites) return Use::kOverwrite;
  return Use::kNone;
}

}  // namespace

Use UseOf(const GraphOp& op, TensorIndex t) { return UseIn(op.reads, op.writes, op.overwrites, t); }

Use HostUseOf(const GraphOp& op, TensorIndex t) {
  return UseIn(op.host_reads, op.host_writes, op.host_overwrites, t);
}

namespace {

std::vector<TensorIndex> SortedUnion(const std::vector<TensorIndex>& a, const std::vector<TensorIndex>& b,
                                     const std::vector<TensorIndex>& c) {
  std::vector<TensorIndex> all(a);
  all.insert(all.end(), b.begin(), b.end());
  all.insert(all.end(), c.begin(), c.end());
  std::sort(all.begin(), all.end());
  all.erase(std::unique(all.begin(), all.end()), all.end());
  return all;
}

}  // namespace

std::vector<TensorIndex> Touched(const GraphOp& op) { return SortedUnion(op.reads, op.writes, op.overwrites); }

std::vector<TensorIndex> HostTouched(const GraphOp& op) {
  return SortedUnion(op.host_reads, op.host_writes, op.host_overwrites);
}

std::vector<std::vector<bool>> DeadAfter(const Graph& graph) {
  const size_t ops = graph.ops.size(), tensors = graph.tensors.size();
  std::vector<std::vector<bool>> dead(ops, std::vector<bool>(tensors, false));
  std::vector<int8_t> next_is_overwrite(tensors, -1);  // -1: not seen yet
  for (size_t step = 2 * ops; step-- > 0;) {
    const size_t i = step % ops;
    if (step < ops) {
      for (size_t t = 0; t < tensors; ++t) dead[i][t] = next_is_overwrite[t] == 1;
    }
    for (TensorIndex t : Touched(graph.ops[i])) {
      next_is_overwrite[t] = UseOf(graph.ops[i], t) == Use::kOverwrite ? 1 : 0;
    }
    for (TensorIndex t : HostTouched(graph.ops[i])) {
      next_is_overwrite[t] = HostUseOf(graph.ops[i], t) == Use::kOverwrite ? 1 : 0;
    }
  }
  return dead;
}

std::vector<std::vector<uint32_t>> NextUseDistances(const Graph& graph, bool host_uses) {
  const size_t ops = graph.ops.size(), tensors = graph.tensors.size();
  const uint32_t never = static_cast<uint32_t>(ops + 1);
  std::vector<std::vector<uint32_t>> next(ops, std::vector<uint32_t>(tensors, never));
  // Walk the iteration twice backwards: the second lap supplies the wrap-around.
  std::vector<uint32_t> last_seen(tensors, UINT32_MAX);  // absolute position of the next use
  for (size_t step = 2 * ops; step-- > 0;) {
    const size_t i = step % ops;
    if (step < ops) {
      for (size_t t = 0; t < tensors; ++t) {
        if (last_seen[t] != UINT32_MAX) next[i][t] = static_cast<uint32_t>(last_seen[t] - step);
      }
    }
    for (TensorIndex t : Touched(graph.ops[i])) last_seen[t] = static_cast<uint32_t>(step);
    if (!host_uses) continue;
    for (TensorIndex t : HostTouched(graph.ops[i])) last_seen[t] = static_cast<uint32_t>(step);
  }
  return next;
}

}  // namespace tierd::prefetcher
