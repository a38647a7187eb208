#include "prefetcher/explain.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "base/units.h"

namespace tierd::prefetcher {

absl::StatusOr<std::string> ExplainTensor(const Graph& graph, const Plan& plan, const std::string& name) {
  TensorIndex t = 0;
  for (; t < graph.tensors.size() && graph.tensors[t].name != name; ++t) {
  }
  if (t == graph.tensors.size()) {
    std::string near;
    for (const GraphTensor& x : graph.tensors) {
      if (absl::StrContains(x.name, name) || absl::StrContains(name, x.name)) near += " " + x.name;
      if (near.size() > 200) break;
    }
    return absl::NotFoundError(absl::StrFormat("the graph has no tensor '%s'%s", name,
                                               near.empty() ? "" : "; did you mean:" + near));
  }
  const size_t ops = graph.ops.size();
  const auto next = NextUseDistances(graph);
  const GraphTensor& tensor = graph.tensors[t];
  std::string out = absl::StrFormat("%s (%s)%s\n", tensor.name, FormatBytes(tensor.bytes),
                                    tensor.pinned_gpu ? ": pinned to the GPU, never moves" : "");
  auto op_name = [&](size_t i) { return absl::StrFormat("op %d '%s'", i, graph.ops[i].name); };
  // Where it is below the GPU, replayed from the lower plan's start state.
  bool dram = plan.lower.dram_at_start.empty() ? false : static_cast<bool>(plan.lower.dram_at_start[t]);
  bool nvme = plan.lower.nvme_at_start.empty() ? false : static_cast<bool>(plan.lower.nvme_at_start[t]);
  bool gpu = std::binary_search(plan.gpu.resident_at_start.begin(), plan.gpu.resident_at_start.end(), t);
  auto where = [&] {
    std::string w;
    if (gpu) w += "GPU";
    if (dram) w += w.empty() ? "DRAM" : "+DRAM";
    if (nvme) w += w.empty() ? "NVMe" : "+NVMe";
    return w.empty() ? std::string("nowhere (its value is dead)") : w;
  };
  out += absl::StrFormat("entering the iteration: %s\n", where());
  size_t lower = 0;
  size_t gpu_ops = 0;
  for (size_t i = 0; i < ops; ++i) {
    std::vector<std::string> lines;
    for (; lower < plan.lower.events.size() && plan.lower.events[lower].op == i; ++lower) {
      const LowerEvent& e = plan.lower.events[lower];
      if (e.tensor != t) continue;
      switch (e.kind) {
        case LowerKind::kStage: dram = true; lines.push_back(graph.ops[i].host_reads.empty() && graph.ops[i].host_writes.empty() ? "staged NVMe->DRAM: DRAM did not hold it and the GPU load reads from DRAM" : "staged NVMe->DRAM: DRAM did not hold it and a GPU load or this host op reads it there"); break;
        case LowerKind::kPushDown: dram = false; nvme = true; lines.push_back("pushed down DRAM->NVMe to make room in DRAM: DRAM held the only copy below the GPU, and of DRAM's tensors its next use is furthest"); break;
        case LowerKind::kDrop: dram = false; lines.push_back(nvme ? "DRAM copy dropped to make room: NVMe holds the same bytes" : "DRAM copy dropped to make room: its value is dead"); break;
        case LowerKind::kWriteBack: dram = true; nvme = false; break;
        case LowerKind::kInvalidate: dram = nvme = false; break;
        case LowerKind::kRead: break;
        case LowerKind::kDropNvme: nvme = false; lines.push_back("NVMe copy freed while closing the lap (DRAM holds the bytes)"); break;
        case LowerKind::kHostRead: lines.push_back("read on the host, in DRAM"); break;
        case LowerKind::kHostWrite: nvme = false; lines.push_back("read and written on the host, in DRAM (the NVMe copy is stale)"); break;
        case LowerKind::kDiscard: dram = nvme = false; lines.push_back("its copies below dropped after this host op: its value is dead (the next use overwrites it)"); break;
        case LowerKind::kHostOverwrite: dram = true; nvme = false; lines.push_back("written whole on the host, in DRAM (room made, nothing read)"); break;
      }
    }
    for (const Eviction& e : plan.gpu.evictions[i]) {
      if (e.tensor != t) continue;
      gpu = false;
      if (e.dead) {
        lines.push_back("dropped from the GPU: its value is dead (the next use overwrites it)");
      } else if (HostUseOf(graph.ops[i], t) != Use::kNone) {
        lines.push_back(e.write_back ? "written back to DRAM and off the GPU: this op uses it on the host"
                                     : "off the GPU (DRAM has the bytes): this op uses it on the host");
      } else {
        lines.push_back(absl::StrFormat("evicted from the GPU%s: its next use is %d ops away, the furthest of the "
                                        "GPU's tensors when room was needed",
                                        e.write_back ? " after a write-back to DRAM (the GPU copy was the only one)" : " (a clean copy: nothing to write)",
                                        next[(i + ops - 1) % ops][t] - 1));
      }
    }
    if (std::count(plan.gpu.loads[i].begin(), plan.gpu.loads[i].end(), t)) {
      gpu = true;
      lines.push_back("loaded DRAM->GPU: this op uses it");
    }
    if (std::count(plan.gpu.allocs[i].begin(), plan.gpu.allocs[i].end(), t)) {
      gpu = true;
      lines.push_back("room made on the GPU, nothing loaded: this op overwrites it");
    }
    const Use use = UseOf(graph.ops[i], t);
    if (use != Use::kNone) {
      if (use != Use::kRead) dram = nvme = false;  // copies below are stale now
      lines.push_back(use == Use::kRead ? "read" : use == Use::kWrite ? "read and written" : "overwritten");
    }
    gpu_ops += gpu;
    if (lines.empty()) continue;
    out += absl::StrFormat("%s:\n", op_name(i));
    for (const std::string& l : lines) out += "    " + l + "\n";
    out += absl::StrFormat("    now on: %s\n", where());
  }
  out += absl::StrFormat("on the GPU during %d of %d ops\n", gpu_ops, ops);
  return out;
}

}  // namespace tierd::prefetcher
