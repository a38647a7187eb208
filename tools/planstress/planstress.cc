// planstress: plans many random iteration graphs (mixed sizes, pins, host ops) under random
// budgets, reserves and disk speeds, simulates each plan, and checks what no plan may do:
// deadlock, break a budget, or run faster than the lower bound. Prints the first few
// offenders whole (tensors and ops), so each can become a test.
//
//   bazel run -c opt //tools/planstress -- --graphs=3000 --seed=1 --max_ops=40 --slow_nvme_gbps=0.2
#include <algorithm>
#include <cstdio>
#include <random>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "prefetcher/random_graph.h"
#include "prefetcher/simulate.h"

ABSL_FLAG(int, graphs, 3000, "random graphs to plan");
ABSL_FLAG(uint64_t, seed, 1, "random seed");
ABSL_FLAG(int, max_ops, 40, "ops per graph, at most");
ABSL_FLAG(int, max_tensors, 20, "tensors per graph, at most (plus 2)");
ABSL_FLAG(double, slow_nvme_gbps, 0.2, "half the graphs get NVMe this slow (GB/s; the others 2 GB/s)");

namespace tp = tierd::prefetcher;

namespace {

void PrintGraph(const tp::Graph& g, const tp::Budgets& budgets, const tp::Plan* plan) {
  std::printf("  budgets: GPU %lu, DRAM %lu bytes", budgets.gpu, budgets.dram);
  if (plan != nullptr) std::printf("; plan %s, reserve %lu", tp::DescribeStyle(plan->style).c_str(), plan->reserve_bytes);
  std::printf("\n");
  for (const tp::GraphTensor& t : g.tensors) std::printf("  tensor %s %lu%s\n", t.name.c_str(), t.bytes, t.pinned_gpu ? " pinned" : "");
  auto list = [](const char* what, const std::vector<tp::TensorIndex>& ts) {
    if (ts.empty()) return;
    std::printf(" %s", what);
    for (tp::TensorIndex t : ts) std::printf(" %u", t);
  };
  for (const tp::GraphOp& op : g.ops) {
    std::printf("  op %s %.6f s:", op.name.c_str(), op.seconds);
    list("reads", op.reads);
    list("writes", op.writes);
    list("overwrites", op.overwrites);
    list("host_reads", op.host_reads);
    list("host_writes", op.host_writes);
    list("host_overwrites", op.host_overwrites);
    std::printf("\n");
  }
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Plans random iteration graphs and checks that no simulated plan deadlocks, breaks a budget or beats the "
      "lower bound.\n  planstress --graphs=3000 --seed=1 --max_ops=40");
  absl::ParseCommandLine(argc, argv);
  std::mt19937_64 rng(absl::GetFlag(FLAGS_seed));
  tp::LinkModel link;
  link.move_latency_s = 0;
  int planned = 0, link_bound = 0, offenders = 0;
  double tightest = 1e300;
  const int graphs = absl::GetFlag(FLAGS_graphs);
  for (int trial = 0; trial < graphs; ++trial) {
    uint64_t largest = 0;
    tp::RandomGraphShape shape{.unit_bytes = 1000000, .max_seconds = trial % 3 == 0 ? 0.0005 : 0.01};
    shape.max_ops = absl::GetFlag(FLAGS_max_ops);
    shape.max_tensors = absl::GetFlag(FLAGS_max_tensors);
    const tp::Graph g = tp::RandomGraph(rng, shape, &largest);
    const tp::Budgets budgets{largest * (1 + rng() % 4), largest * (1 + rng() % 4), 1ull << 40};
    link.nvme_read_bytes_per_s = link.nvme_write_bytes_per_s = rng() % 2 ? 2e9 : absl::GetFlag(FLAGS_slow_nvme_gbps) * 1e9;
    // Half the graphs with the simulator's choice among every style, half with a fixed reserve.
    auto plan = trial % 2 ? tp::PlanBest(g, budgets, link, nullptr, 0, tp::TimeAwareStyles())
                          : tp::MakePlan(g, budgets, (rng() % 3) * largest / 2);
    if (!plan.ok()) continue;  // budgets below what one op needs at once
    ++planned;
    tp::SimOptions options;
    options.iterations = 5;
    auto sim = tp::SimulatePlan(g, *plan, budgets, link, options);
    std::string wrong;
    const tp::LowerBound lb = tp::ComputeLowerBound(g, link, budgets);
    if (!sim.ok()) {
      wrong = std::string(sim.status().message());
    } else {
      link_bound += lb.bound_by != "compute";
      tightest = std::min(tightest, sim->step_seconds / lb.step_seconds);
      if (sim->peak_gpu_bytes > budgets.gpu || sim->peak_dram_bytes > budgets.dram) wrong = "a budget broken";
      if (sim->step_seconds < lb.step_seconds * 0.999) {
        wrong = "faster than the lower bound: " + std::to_string(sim->step_seconds) + " s < " +
                std::to_string(lb.step_seconds) + " s (" + lb.bound_by + ")";
      }
    }
    if (wrong.empty()) continue;
    if (++offenders <= 5) {
      std::printf("graph %d: %s\n", trial, wrong.c_str());
      PrintGraph(g, budgets, &*plan);
    }
  }
  std::printf("planstress: %d graphs, %d planned (the rest had budgets below one op's needs), %d bound by a link; "
              "%d offenders; the closest plan ran %.4fx its bound\n",
              graphs, planned, link_bound, offenders, tightest);
  return offenders == 0 ? 0 : 1;
}
