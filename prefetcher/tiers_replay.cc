// ReplayLowerTiers (tiers.h): both plans replayed together, every event checked against the
// state of the tiers below; for tests.
#include <algorithm>

#include "absl/strings/str_format.h"
#include "base/units.h"
#include "prefetcher/tiers.h"

namespace tierd::prefetcher {
namespace {

// Which tensors DRAM and NVMe hold, and their bytes.
struct LowerState {
  std::vector<bool> dram, nvme;
  uint64_t dram_bytes = 0, nvme_bytes = 0;
};

}  // namespace

absl::Status ReplayLowerTiers(const Graph& graph, const ResidencyPlan& gpu, const LowerTierPlan& plan,
                              uint64_t dram_budget, uint64_t nvme_budget) {
  const size_t n = graph.tensors.size(), ops = graph.ops.size();
  LowerState s;
  s.dram = plan.dram_at_start;
  s.nvme = plan.nvme_at_start;
  if (s.dram.size() != n || s.nvme.size() != n) return absl::InternalError("start state has the wrong size");
  for (size_t t = 0; t < n; ++t) {
    if (s.dram[t]) s.dram_bytes += graph.tensors[t].bytes;
    if (s.nvme[t]) s.nvme_bytes += graph.tensors[t].bytes;
  }
  auto fail = [&](uint32_t op, const std::string& what) {
    return absl::InternalError(absl::StrFormat("op %d: %s", op, what));
  };
  // The next demand (read, write-back or invalidate) of each tensor after position p, cyclic.
  auto next_demand = [&](size_t p, TensorIndex t) -> LowerKind {
    for (size_t k = 1; k <= plan.events.size(); ++k) {
      const LowerEvent& e = plan.events[(p + k) % plan.events.size()];
      if (e.tensor != t) continue;
      if (e.kind == LowerKind::kHostRead || e.kind == LowerKind::kHostWrite) return LowerKind::kRead;  // needs it
      if (e.kind == LowerKind::kHostOverwrite) return LowerKind::kInvalidate;                          // does not
      if (e.kind == LowerKind::kRead || e.kind == LowerKind::kWriteBack || e.kind == LowerKind::kInvalidate) {
        return e.kind;
      }
    }
    return LowerKind::kInvalidate;  // never needed again
  };
  const auto dead_after = DeadAfter(graph);
  size_t p = 0;
  for (uint32_t i = 0; i < ops; ++i) {
    std::vector<TensorIndex> reads, write_backs, host_uses;
    for (; p < plan.events.size() && plan.events[p].op == i; ++p) {
      const LowerEvent& e = plan.events[p];
      const TensorIndex t = e.tensor;
      const uint64_t b = graph.tensors[t].bytes;
      switch (e.kind) {
        case LowerKind::kWriteBack:
          if (!s.dram[t]) s.dram_bytes += b;
          if (s.nvme[t]) s.nvme_bytes -= b;
          s.dram[t] = true;
          s.nvme[t] = false;
          write_backs.push_back(t);
          break;
        case LowerKind::kRead:
          if (!s.dram[t]) return fail(i, "a GPU load finds no DRAM copy of '" + graph.tensors[t].name + "'");
          reads.push_back(t);
          break;
        case LowerKind::kStage:
          if (!s.nvme[t]) return fail(i, "stages '" + graph.tensors[t].name + "' from NVMe, which does not hold it");
          if (!s.dram[t]) s.dram_bytes += b;
          s.dram[t] = true;
          break;
        case LowerKind::kPushDown:
          if (!s.dram[t]) return fail(i, "pushes down a tensor DRAM does not hold");
          if (!s.nvme[t]) s.nvme_bytes += b;
          s.nvme[t] = true;
          s.dram[t] = false;
          s.dram_bytes -= b;
          break;
        case LowerKind::kDrop:
          if (!s.dram[t]) return fail(i, "drops a tensor DRAM does not hold");
          if (!s.nvme[t] && next_demand(p, t) == LowerKind::kRead) {
            return fail(i, "drops the only copy below the GPU of '" + graph.tensors[t].name + "', read later");
          }
          s.dram[t] = false;
          s.dram_bytes -= b;
          break;
        case LowerKind::kDiscard:
          if (!dead_after[(i + ops - 1) % ops][t]) {
            return fail(i, "discards '" + graph.tensors[t].name + "', whose value is needed later");
          }
          [[fallthrough]];
        case LowerKind::kInvalidate:  // both copies below the GPU go
          if (s.dram[t]) s.dram_bytes -= b;
          if (s.nvme[t]) s.nvme_bytes -= b;
          s.dram[t] = s.nvme[t] = false;
          break;
        case LowerKind::kHostRead:
        case LowerKind::kHostWrite:
          if (!s.dram[t]) return fail(i, "a host op finds no DRAM copy of '" + graph.tensors[t].name + "'");
          if ((e.kind == LowerKind::kHostWrite) != (HostUseOf(graph.ops[i], t) == Use::kWrite)) {
            return fail(i, "the host use of '" + graph.tensors[t].name + "' is not the graph's");
          }
          if (e.kind == LowerKind::kHostWrite && s.nvme[t]) {
            s.nvme[t] = false;
            s.nvme_bytes -= b;
          }
          host_uses.push_back(t);
          break;
        case LowerKind::kHostOverwrite:
          if (HostUseOf(graph.ops[i], t) != Use::kOverwrite) {
            return fail(i, "the host overwrite of '" + graph.tensors[t].name + "' is not the graph's");
          }
          if (!s.dram[t]) s.dram_bytes += b;
          if (s.nvme[t]) s.nvme_bytes -= b;
          s.dram[t] = true;
          s.nvme[t] = false;
          host_uses.push_back(t);
          break;
        case LowerKind::kDropNvme:
          if (!s.nvme[t]) return fail(i, "frees an NVMe copy that does not exist");
          if (!s.dram[t] && next_demand(p, t) == LowerKind::kRead) {
            return fail(i, "frees the only copy below the GPU of '" + graph.tensors[t].name + "', read later");
          }
          s.nvme[t] = false;
          s.nvme_bytes -= b;
          break;
      }
      if (s.dram_bytes > dram_budget) return fail(i, "over the DRAM budget");
      if (s.nvme_bytes > nvme_budget) return fail(i, "over the NVMe budget");
    }
    std::vector<TensorIndex> want_reads = gpu.loads[i], want_write_backs;
    for (const Eviction& e : gpu.evictions[i]) {
      if (e.write_back) want_write_backs.push_back(e.tensor);
      if (!e.write_back && !e.dead && !s.dram[e.tensor] && !s.nvme[e.tensor]) {
        return fail(i, "drops a clean GPU copy of '" + graph.tensors[e.tensor].name + "' with no copy below");
      }
    }
    for (auto* v : {&reads, &want_reads, &write_backs, &want_write_backs, &host_uses}) std::sort(v->begin(), v->end());
    if (host_uses != HostTouched(graph.ops[i])) return fail(i, "the host op's uses and the DRAM host uses differ");
    if (reads != want_reads) return fail(i, "the GPU loads and the DRAM reads differ");
    if (write_backs != want_write_backs) return fail(i, "the GPU write-backs and the DRAM write-backs differ");
  }
  if (p != plan.events.size()) return absl::InternalError("events out of op order");
  if (s.dram != plan.dram_at_start || s.nvme != plan.nvme_at_start) {
    return absl::InternalError("the lap does not end where it started below the GPU");
  }
  return absl::OkStatus();
}

}  // namespace tierd::prefetcher
