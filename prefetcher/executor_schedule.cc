// The executor's schedule: a plan (GPU residency and the moves below it) laid out as the
// four lanes' actions, each with what it waits for in the other lanes and its DRAM ticket.
#include "prefetcher/executor.h"

#include <algorithm>
#include <array>
#include <map>

namespace tierd::prefetcher {

Executor::Schedule Executor::Build(const Graph& graph, const Plan& plan) {
  enum { kGpuIn = 0, kGpuOut = 1, kDramIn = 2, kDramOut = 3 };
  const int64_t ops = static_cast<int64_t>(graph.ops.size());
  const size_t n = graph.tensors.size();
  const auto next = NextUseDistances(graph, /*host_uses=*/true);  // a host use is too late for an eviction
  // Per tensor and lane: the index of its latest action so far (kNone: none yet).
  std::vector<std::array<int64_t, kLanes>> latest(n);
  for (auto& l : latest) l.fill(kNone);
  std::vector<Action> lanes[kLanes];
  int64_t tickets = 0;
  // Two passes: the first learns each tensor's last action per lane (the wrap-around into
  // the next lap), the second builds the lap. Plan order per op: GPU evictions, the moves
  // below the GPU as planned, then loads and room for overwrites.
  for (int pass = 0; pass < 2; ++pass) {
    for (auto& lane : lanes) lane.clear();
    // Last use before the current op (relative), on the GPU and on the host.
    std::vector<int64_t> use(n, kNone), host_use(n, kNone);
    for (int64_t i = 0; i < ops; ++i) {
      for (TensorIndex t : Touched(graph.ops[i])) use[t] = i - ops;
      for (TensorIndex t : HostTouched(graph.ops[i])) host_use[t] = i - ops;
    }
    size_t lower = 0;
    tickets = 0;
    auto add = [&](int lane, Kind kind, TensorIndex t, uint32_t op, int64_t ready_after) {
      Action a{kind, t, op, ready_after, 0, {kNone, kNone, kNone, kNone}, -1};
      const int64_t before = (op + ops - 1) % ops;
      a.next_use = static_cast<int64_t>(op) - 1 + next[before][t];
      for (int l = 0; l < kLanes; ++l) {
        if (l != lane) a.after[l] = latest[t][l];
      }
      lanes[lane].push_back(a);
      latest[t][lane] = static_cast<int64_t>(lanes[lane].size()) - 1;
    };
    for (uint32_t i = 0; i < ops; ++i) {
      std::map<TensorIndex, size_t> written_back;  // this op's write-backs: their gpu-out actions
      for (const Eviction& e : plan.gpu.evictions[i]) {
        add(kGpuOut, e.dead ? Kind::kEvictDead : Kind::kEvict, e.tensor, i, use[e.tensor]);
        if (e.write_back) written_back[e.tensor] = lanes[kGpuOut].size() - 1;
      }
      // The moves below the GPU in plan order, so each keeps its place against the others
      // on the same tensor (a stage, then the NVMe copy freed, say). A drop after the op's
      // read of the same tensor (an exclusive load) waits for the load: it goes after them.
      std::vector<TensorIndex> read_here, dropped_after_read;
      for (; lower < plan.lower.events.size() && plan.lower.events[lower].op == i; ++lower) {
        const LowerEvent& ev = plan.lower.events[lower];
        // A DRAM copy a host op uses stays until that op is over.
        const int64_t after_host = host_use[ev.tensor];
        if (ev.kind == LowerKind::kRead) read_here.push_back(ev.tensor);
        if (ev.kind == LowerKind::kDrop &&
            std::find(read_here.begin(), read_here.end(), ev.tensor) != read_here.end()) {
          dropped_after_read.push_back(ev.tensor);
          continue;
        }
        if (ev.kind == LowerKind::kPushDown) add(kDramOut, Kind::kPushDown, ev.tensor, i, after_host);
        if (ev.kind == LowerKind::kDrop) add(kDramOut, Kind::kDrop, ev.tensor, i, after_host);
        if (ev.kind == LowerKind::kDropNvme) add(kDramOut, Kind::kDropNvme, ev.tensor, i, kNone);
        // (Too late once the client reaches the use after the host op: it rewrites it.)
        if (ev.kind == LowerKind::kDiscard) add(kDramOut, Kind::kDiscard, ev.tensor, i, after_host);
        if (ev.kind == LowerKind::kStage) {
          add(kDramIn, Kind::kStage, ev.tensor, i, kNone);
          lanes[kDramIn].back().dram_ticket = tickets++;
        }
        if (ev.kind == LowerKind::kWriteBack) {
          auto it = written_back.find(ev.tensor);
          if (it != written_back.end()) lanes[kGpuOut][it->second].dram_ticket = tickets++;
        }
      }
      for (TensorIndex t : plan.gpu.loads[i]) add(kGpuIn, Kind::kLoad, t, i, kNone);
      // Room for this op's overwrites, reserved in plan order so later loads cannot take it.
      for (TensorIndex t : plan.gpu.allocs[i]) add(kGpuIn, Kind::kAlloc, t, i, kNone);
      for (TensorIndex t : dropped_after_read) add(kDramOut, Kind::kDrop, t, i, host_use[t]);
      // Every other tensor the op uses should be there already; if the tiers' own fallback
      // evicted it (after a miss), bring it back: the plan heals instead of drifting.
      for (TensorIndex t : Touched(graph.ops[i])) {
        const auto& loads = plan.gpu.loads[i];
        const auto& allocs = plan.gpu.allocs[i];
        if (std::find(loads.begin(), loads.end(), t) != loads.end() ||
            std::find(allocs.begin(), allocs.end(), t) != allocs.end()) {
          continue;
        }
        add(kGpuIn, UseOf(graph.ops[i], t) == Use::kOverwrite ? Kind::kAlloc : Kind::kEnsure, t, i, kNone);
      }
      for (TensorIndex t : Touched(graph.ops[i])) use[t] = i;
      for (TensorIndex t : HostTouched(graph.ops[i])) host_use[t] = i;
    }
    if (pass == 0) {
      // Carry each tensor's last action per lane into the next lap as a negative index.
      for (auto& l : latest) {
        for (int lane = 0; lane < kLanes; ++lane) {
          if (l[lane] != kNone) l[lane] -= static_cast<int64_t>(lanes[lane].size());
        }
      }
    }
  }
  Schedule s;
  for (int l = 0; l < kLanes; ++l) s.lanes[l].actions = std::move(lanes[l]);
  s.dram_tickets = tickets;
  s.ticket_holders.resize(tickets);
  for (int l = 0; l < kLanes; ++l) {
    for (size_t i = 0; i < s.lanes[l].actions.size(); ++i) {
      const int64_t ticket = s.lanes[l].actions[i].dram_ticket;
      if (ticket >= 0) s.ticket_holders[ticket] = {l, static_cast<int64_t>(i)};
    }
  }
  s.lanes[kGpuOut].in_order = s.lanes[kDramOut].in_order = false;
  return s;
}

}  // namespace tierd::prefetcher
