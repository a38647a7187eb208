// Ops on the host in a GPU graph (an optimizer step on the CPU next to its DRAM-resident
// state): the plan takes their tensors off the GPU before them, writing back only what the
// host needs and the GPU changed, stages nothing for what the host writes whole, and every
// stage (planner, tiers below, simulator, LRU baseline, explain) agrees.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "prefetcher/explain.h"
#include "prefetcher/residency.h"
#include "prefetcher/simulate.h"
#include "prefetcher/tiers.h"

namespace tierd::prefetcher {
namespace {

constexpr uint64_t kMB = 1000 * 1000;

// A training step of `layers` layers with the optimizer on the host: forward (weights,
// saved activations), backward (gradients set), then per layer an op on the host that reads
// the gradients, updates the fp32 state (master + moments) and writes the bf16 weights whole.
struct HostStep {
  Graph graph;
  TensorIndex w(int l) const { return 4 * l; }
  TensorIndex act(int l) const { return 4 * l + 1; }
  TensorIndex grad(int l) const { return 4 * l + 2; }
  TensorIndex state(int l) const { return 4 * l + 3; }
};
HostStep MakeHostStep(int layers) {
  HostStep s;
  Graph& g = s.graph;
  for (int l = 0; l < layers; ++l) {
    const std::string n = std::to_string(l);
    g.tensors.push_back({"w" + n, 100 * kMB, false});
    g.tensors.push_back({"act" + n, 200 * kMB, false});
    g.tensors.push_back({"grad" + n, 200 * kMB, false});
    g.tensors.push_back({"state" + n, 600 * kMB, false});
  }
  for (int l = 0; l < layers; ++l) {
    g.ops.push_back({"fwd" + std::to_string(l), {s.w(l)}, {}, 0.01, {s.act(l)}});
  }
  for (int l = layers; l-- > 0;) {
    g.ops.push_back({"bwd" + std::to_string(l), {s.w(l), s.act(l)}, {}, 0.02, {s.grad(l)}});
  }
  for (int l = 0; l < layers; ++l) {
    GraphOp op{"adamw.cpu" + std::to_string(l), {}, {}, 0.03};
    op.host_reads = {s.grad(l)};
    op.host_writes = {s.state(l)};
    op.host_overwrites = {s.w(l)};
    g.ops.push_back(op);
  }
  return s;
}

size_t OpIndex(const Graph& g, const std::string& name) {
  for (size_t i = 0; i < g.ops.size(); ++i) {
    if (g.ops[i].name == name) return i;
  }
  ADD_FAILURE() << "no op " << name;
  return 0;
}

TEST(HostOpsTest, AGraphSaysOnePlacePerOpAndNoHostUsesInAHostGraph) {
  HostStep s = MakeHostStep(2);
  ASSERT_TRUE(ValidateGraph(s.graph).ok());
  Graph both = s.graph;
  both.ops[0].host_reads.push_back(s.w(0));  // fwd0 reads w0 on the GPU
  const absl::Status refused = ValidateGraph(both);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("uses 'w0' both on the GPU and on the host"), absl::string_view::npos) << refused;
  Graph host = s.graph;
  host.host = true;
  EXPECT_NE(ValidateGraph(host).message().find("whole graph runs on the host"), absl::string_view::npos);
  Graph out_of_range = s.graph;
  out_of_range.ops.back().host_overwrites.push_back(99);
  EXPECT_EQ(ValidateGraph(out_of_range).code(), absl::StatusCode::kInvalidArgument);
}

TEST(HostOpsTest, AHostReadKeepsAValueAliveAndAHostOverwriteEndsIt) {
  HostStep s = MakeHostStep(2);
  const auto dead = DeadAfter(s.graph);
  const size_t bwd0 = OpIndex(s.graph, "bwd0");
  EXPECT_FALSE(dead[bwd0][s.grad(0)]) << "the host reads the gradients after the backward";
  EXPECT_TRUE(dead[bwd0][s.w(0)]) << "the host writes the weights whole after their last read";
  EXPECT_FALSE(dead[bwd0][s.state(0)]);
  // The executor's distances count host uses only when asked.
  const size_t adam0 = OpIndex(s.graph, "adamw.cpu0");
  EXPECT_EQ(NextUseDistances(s.graph, /*host_uses=*/true)[bwd0][s.grad(0)], adam0 - bwd0);
  EXPECT_GT(NextUseDistances(s.graph)[bwd0][s.grad(0)], adam0 - bwd0);
}

TEST(HostOpsTest, TheGpuPlanWritesBackTheGradientsDropsTheWeightsAndNeverHoldsTheState) {
  HostStep s = MakeHostStep(3);
  // The forward's weights and activations fit (900 MB); the backward makes room by dropping
  // what is dead and sending the gradients down.
  const uint64_t budget = 1200 * kMB;
  auto plan = PlanResidency(s.graph, budget);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_TRUE(ReplayPlan(s.graph, budget, *plan).ok()) << ReplayPlan(s.graph, budget, *plan);
  for (int l = 0; l < 3; ++l) {
    for (const auto& resident : plan->resident) {
      EXPECT_FALSE(std::binary_search(resident.begin(), resident.end(), s.state(l))) << "state on the GPU";
    }
  }
  uint64_t grads_written = 0;
  for (const auto& op : plan->evictions) {
    for (const Eviction& e : op) {
      if (e.tensor == s.grad(0) || e.tensor == s.grad(1) || e.tensor == s.grad(2)) {
        EXPECT_TRUE(e.write_back) << "gradients the host reads go down with their values";
        EXPECT_FALSE(e.dead);
        grads_written += s.graph.tensors[e.tensor].bytes;
      }
      if (e.tensor == s.w(0) || e.tensor == s.w(1) || e.tensor == s.w(2)) {
        EXPECT_FALSE(e.write_back) << "the weights are never written on the GPU";
      }
    }
  }
  EXPECT_EQ(grads_written, 3 * 200 * kMB);
  EXPECT_EQ(plan->bytes_written_back, 3 * 200 * kMB) << "only the gradients come down";
  EXPECT_EQ(plan->bytes_loaded, 3 * 100 * kMB) << "the weights the host rewrote go up once a step";

  // Invariant 6: a plan that leaves a host op's tensor on the GPU is refused.
  ResidencyPlan broken = *plan;
  bool removed = false;
  for (auto& ev : broken.evictions) {
    auto it = std::find_if(ev.begin(), ev.end(), [&](const Eviction& e) { return e.tensor == s.grad(1); });
    if (it == ev.end()) continue;
    ev.erase(it);
    removed = true;
  }
  ASSERT_TRUE(removed);
  const absl::Status refused = ReplayPlan(s.graph, budget, broken, /*cyclic=*/false);
  EXPECT_NE(refused.message().find("runs on the host while the GPU holds 'grad1' (invariant 6)"),
            absl::string_view::npos)
      << refused;
}

TEST(HostOpsTest, BelowTheGpuTheHostFindsItsTensorsInDramAndNothingIsStagedForAnOverwrite) {
  HostStep s = MakeHostStep(3);
  // The GPU writes activations back (700 MB is below a forward's 900 MB), and DRAM cannot
  // hold the three states (1800 MB) with everything else: something goes to NVMe.
  const uint64_t gpu_budget = 700 * kMB, dram_budget = 2000 * kMB;
  auto gpu = PlanResidency(s.graph, gpu_budget);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  auto lower = PlanLowerTiers(s.graph, *gpu, dram_budget, 10000 * kMB);
  ASSERT_TRUE(lower.ok()) << lower.status();
  ASSERT_TRUE(ReplayLowerTiers(s.graph, *gpu, *lower, dram_budget, 10000 * kMB).ok())
      << ReplayLowerTiers(s.graph, *gpu, *lower, dram_budget, 10000 * kMB);
  int host_reads = 0, host_writes = 0, host_overwrites = 0;
  for (size_t k = 0; k < lower->events.size(); ++k) {
    const LowerEvent& e = lower->events[k];
    host_reads += e.kind == LowerKind::kHostRead;
    host_writes += e.kind == LowerKind::kHostWrite;
    host_overwrites += e.kind == LowerKind::kHostOverwrite;
    if (e.kind != LowerKind::kHostOverwrite) continue;
    for (size_t j = k; j-- > 0;) {  // the weights' event before their overwrite is no stage
      if (lower->events[j].tensor != e.tensor) continue;
      EXPECT_NE(lower->events[j].kind, LowerKind::kStage) << "staged for a host op that writes it whole";
      break;
    }
  }
  EXPECT_EQ(host_reads, 3);
  EXPECT_EQ(host_writes, 3);
  EXPECT_EQ(host_overwrites, 3);
  EXPECT_GT(lower->nvme_write_bytes, 0u) << "DRAM is too small for everything: something spills";
  EXPECT_LE(lower->peak_dram_bytes, dram_budget);

  // A replay catches a host op that finds no DRAM copy: a state staged back for its host op.
  LowerTierPlan broken = *lower;
  auto stage = std::find_if(broken.events.begin(), broken.events.end(), [&](const LowerEvent& e) {
    return e.kind == LowerKind::kStage && e.tensor % 4 == 3;
  });
  ASSERT_NE(stage, broken.events.end()) << "no state went through NVMe";
  broken.events.erase(stage);
  const absl::Status refused = ReplayLowerTiers(s.graph, *gpu, broken, dram_budget, 10000 * kMB);
  EXPECT_NE(refused.message().find("a host op finds no DRAM copy of 'state"), absl::string_view::npos) << refused;
}

TEST(HostOpsTest, TheSimulatorRunsHostOpsAfterTheirWriteBacksAndMovesThePlannedBytes) {
  HostStep s = MakeHostStep(3);
  const Budgets budgets{700 * kMB, 2400 * kMB, 10000 * kMB};
  auto plan = MakePlan(s.graph, budgets);
  ASSERT_TRUE(plan.ok()) << plan.status();
  LinkModel link;
  link.move_latency_s = 0;
  SimOptions options;
  options.record_timeline = true;
  auto sim = SimulatePlan(s.graph, *plan, budgets, link, options);
  if (!sim.ok()) {
    for (size_t t = 0; t < s.graph.tensors.size(); ++t) printf("start %s dram %d nvme %d\n", s.graph.tensors[t].name.c_str(), (int)plan->lower.dram_at_start[t], (int)plan->lower.nvme_at_start[t]);
    size_t k = 0;
    for (size_t i = 0; i < s.graph.ops.size(); ++i) {
      printf("op %zu %s\n", i, s.graph.ops[i].name.c_str());
      for (auto& e : plan->gpu.evictions[i]) printf("  gpu evict %s wb %d dead %d\n", s.graph.tensors[e.tensor].name.c_str(), e.write_back, e.dead);
      for (auto t : plan->gpu.loads[i]) printf("  gpu load %s\n", s.graph.tensors[t].name.c_str());
      for (; k < plan->lower.events.size() && plan->lower.events[k].op == i; ++k) printf("  lower %s %s\n", LowerKindName(plan->lower.events[k].kind), s.graph.tensors[plan->lower.events[k].tensor].name.c_str());
    }
  }
  ASSERT_TRUE(sim.ok()) << sim.status();
  EXPECT_EQ(sim->h2d_bytes, plan->gpu.bytes_loaded);
  EXPECT_EQ(sim->d2h_bytes, plan->gpu.bytes_written_back);
  EXPECT_LE(sim->peak_gpu_bytes, budgets.gpu);
  // Each host op starts only after its gradients' write-back ended.
  for (int l = 0; l < 3; ++l) {
    const std::string op = "adamw.cpu" + std::to_string(l), grad = "grad" + std::to_string(l);
    double op_start = -1, write_back_end = -1;
    for (const TimelineEvent& e : sim->timeline) {
      if (e.iteration != 1) continue;
      if (e.track == Track::kCompute && e.name == op) op_start = e.start;
      if (e.track == Track::kD2H && e.name.find(grad) != std::string::npos) write_back_end = e.end;
    }
    ASSERT_GE(op_start, 0) << op;
    ASSERT_GE(write_back_end, 0) << grad;
    EXPECT_GE(op_start, write_back_end) << op;
  }
  // The on-demand pager runs the same graph and moves at least as much.
  auto lru = SimulateOnDemandLru(s.graph, budgets, link, options);
  ASSERT_TRUE(lru.ok()) << lru.status();
  EXPECT_GE(lru->d2h_bytes, sim->d2h_bytes);
  EXPECT_GE(lru->step_seconds, sim->step_seconds);
}

TEST(HostOpsTest, ExplainSaysATensorLeavesTheGpuForAHostOp) {
  HostStep s = MakeHostStep(2);
  auto plan = MakePlan(s.graph, {700 * kMB, 4000 * kMB, 10000 * kMB});
  ASSERT_TRUE(plan.ok()) << plan.status();
  auto text = ExplainTensor(s.graph, *plan, "grad1");
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_NE(text->find("read on the host, in DRAM"), std::string::npos) << *text;
  auto w = ExplainTensor(s.graph, *plan, "w1");
  ASSERT_TRUE(w.ok());
  EXPECT_NE(w->find("written whole on the host"), std::string::npos) << *w;
}

}  // namespace
}  // namespace tierd::prefetcher
