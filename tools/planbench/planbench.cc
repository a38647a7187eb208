// planbench: the planner against an on-demand LRU pager and against the lower bound, on
// synthetic Llama-style training traces, by simulation (no GPU needed: the link model is
// the lent H200's measured one). Prints what it compares, the model, and the ratios.
//
//   bazel run -c opt //tools/planbench -- --models=1.3b,7b,13b --accum=1,64
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "base/units.h"
#include "prefetcher/simulate.h"
#include "prefetcher/synthetic.h"

ABSL_FLAG(std::string, models, "1.3b,7b,13b", "model shapes: tiny, 1.3b, 7b, 13b");
ABSL_FLAG(std::string, accum, "1,64", "micro-batches per optimizer step (each 8 x 2048 tokens)");
ABSL_FLAG(std::string, gpu, "24GiB", "GPU budget");
ABSL_FLAG(std::string, dram, "64GiB", "DRAM budget");
ABSL_FLAG(std::string, nvme, "512GiB", "NVMe budget");
ABSL_FLAG(double, h2d_gbps, 55, "DRAM->GPU GB/s (lent H200, pinned)");
ABSL_FLAG(double, d2h_gbps, 55, "GPU->DRAM GB/s");
ABSL_FLAG(double, nvme_gbps, 2, "NVMe GB/s, reads and writes sharing the device");
ABSL_FLAG(double, tflops, 400, "sustained bf16 TFLOP/s for op times");
ABSL_FLAG(bool, time_aware, false,
          "also try plans with loads for writes hoisted into free room and victims below the GPU chosen by time "
          "(simulated only: the daemon does not plan so; see docs/BENCHMARKS.md)");
ABSL_FLAG(bool, optimizer_on_host, false, "AdamW on the host's CPU next to its DRAM state instead of on the GPU");
ABSL_FLAG(bool, phases, false,
          "after each row, the plan's steady step by phase (forward, backward, optimizer): compute, stall and "
          "the NVMe and DRAM->GPU bytes moved while the phase ran");
ABSL_FLAG(double, host_adamw_gparams, 2.3, "with --optimizer_on_host: host AdamW rate, G params/s (H200 host: 2.3)");

namespace tp = tierd::prefetcher;

namespace {

uint64_t Bytes(const std::string& flag) {
  auto b = tierd::ParseBytes(flag);
  if (!b.ok()) {
    std::fprintf(stderr, "planbench: %s\n", std::string(b.status().message()).c_str());
    std::exit(2);
  }
  return *b;
}

std::string Gb(uint64_t b) { return absl::StrFormat("%.1f", b / 1e9); }

// Which phase of a training step an op of the synthetic trace belongs to.
int PhaseOf(const std::string& op) {
  if (absl::StrContains(op, ".adamw")) return 2;
  if (absl::StrContains(op, "bwd")) return 1;
  return 0;
}

// The last measured iteration of a run with a timeline, by phase: each op's span (its
// stall and its compute) is the phase's; a move's bytes count toward the phases its span
// overlaps, in proportion.
void PrintPhases(const tp::Graph& graph, const tp::SimResult& sim, int iteration, double nvme_bytes_per_s) {
  static constexpr const char* kNames[] = {"forward", "backward", "optimizer"};
  struct Phase {
    double compute = 0, stall = 0, nvme = 0, h2d = 0;
  } phase[3];
  std::vector<std::pair<double, double>> span(graph.ops.size(), {0, -1});
  double prev_end = -1;
  for (const tp::TimelineEvent& e : sim.timeline) {
    if (e.track != tp::Track::kCompute) continue;
    if (e.iteration == iteration - 1 && e.op + 1 == graph.ops.size()) prev_end = e.end;
    if (e.iteration == iteration) span[e.op] = {e.start, e.end};
  }
  if (prev_end < 0) return;
  std::vector<double> begin(graph.ops.size());
  for (size_t i = 0; i < graph.ops.size(); ++i) {
    begin[i] = i == 0 ? prev_end : span[i - 1].second;
    const int p = PhaseOf(graph.ops[i].name);
    phase[p].compute += span[i].second - span[i].first;
    phase[p].stall += span[i].first - begin[i];
  }
  for (const tp::TimelineEvent& e : sim.timeline) {
    if (e.track != tp::Track::kNvme && e.track != tp::Track::kH2D) continue;
    if (e.end <= begin[0] || e.start >= span.back().second || e.end <= e.start) continue;
    for (size_t i = 0; i < graph.ops.size(); ++i) {
      const double overlap = std::min(e.end, span[i].second) - std::max(e.start, begin[i]);
      if (overlap <= 0) continue;
      Phase& p = phase[PhaseOf(graph.ops[i].name)];
      (e.track == tp::Track::kNvme ? p.nvme : p.h2d) += e.bytes * overlap / (e.end - e.start);
    }
  }
  for (int p = 0; p < 3; ++p) {
    std::printf("    %-9s compute %8.2fs  stall %8.2fs  NVMe %7.1f GB (%5.1f s of the disk)  DRAM->GPU %7.1f GB\n",
                kNames[p], phase[p].compute, phase[p].stall, phase[p].nvme / 1e9,
                phase[p].nvme / nvme_bytes_per_s, phase[p].h2d / 1e9);
  }
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Compares tierd's planner with an on-demand LRU pager and with the lower bound (compute or the busiest "
      "link, whichever is longer), simulating synthetic training steps.\n  planbench --models=7b --accum=1,64");
  absl::ParseCommandLine(argc, argv);
  const tp::Budgets budgets{Bytes(absl::GetFlag(FLAGS_gpu)), Bytes(absl::GetFlag(FLAGS_dram)),
                            Bytes(absl::GetFlag(FLAGS_nvme))};
  tp::LinkModel link;
  link.h2d_bytes_per_s = absl::GetFlag(FLAGS_h2d_gbps) * 1e9;
  link.d2h_bytes_per_s = absl::GetFlag(FLAGS_d2h_gbps) * 1e9;
  link.nvme_read_bytes_per_s = link.nvme_write_bytes_per_s = absl::GetFlag(FLAGS_nvme_gbps) * 1e9;
  std::printf("planbench: planner vs on-demand LRU vs lower bound, simulated (not measured on a GPU)\n");
  std::printf("budgets: GPU %s, DRAM %s, NVMe %s; links: %.0f GB/s DRAM->GPU, %.0f GB/s GPU->DRAM, %.1f GB/s NVMe; "
              "ops at %.0f TFLOP/s; micro-batch 8 x 2048 tokens; Adam mixed precision (16 B/param)%s\n",
              tierd::FormatBytes(budgets.gpu).c_str(), tierd::FormatBytes(budgets.dram).c_str(),
              tierd::FormatBytes(budgets.nvme).c_str(), link.h2d_bytes_per_s / 1e9, link.d2h_bytes_per_s / 1e9,
              link.nvme_read_bytes_per_s / 1e9, absl::GetFlag(FLAGS_tflops),
              absl::GetFlag(FLAGS_optimizer_on_host)
                  ? absl::StrFormat("; AdamW on the host at %.1f G params/s", absl::GetFlag(FLAGS_host_adamw_gparams))
                        .c_str()
                  : "");
  std::printf("%-5s %5s %8s | %9s %9s | %9s %9s | %9s %9s %-22s | %7s %8s | %-26s | %-26s | %s | %s\n", "model", "accum",
              "compute", "plan step", "stall", "LRU step", "stall", "LB step", "stall", "bound", "plan/LB",
              "LRU/plan", "plan GB h2d/d2h/nvr/nvw", "LRU GB h2d/d2h/nvr/nvw", "plan s", "layout");
  for (const std::string& model : std::vector<std::string>(absl::StrSplit(absl::GetFlag(FLAGS_models), ','))) {
    auto shape = tp::ShapePreset(model);
    if (!shape.ok()) {
      std::fprintf(stderr, "planbench: %s\n", std::string(shape.status().message()).c_str());
      return 2;
    }
    for (const std::string& accum_text : std::vector<std::string>(absl::StrSplit(absl::GetFlag(FLAGS_accum), ','))) {
      tp::TraceOptions trace;
      if (!absl::SimpleAtoi(accum_text, &trace.grad_accum) || trace.grad_accum < 1) {
        std::fprintf(stderr, "planbench: --accum wants positive integers, got '%s'\n", accum_text.c_str());
        return 2;
      }
      trace.flops_per_s = absl::GetFlag(FLAGS_tflops) * 1e12;
      trace.optimizer_on_host = absl::GetFlag(FLAGS_optimizer_on_host);
      trace.host_adamw_params_per_s = absl::GetFlag(FLAGS_host_adamw_gparams) * 1e9;
      const tp::Graph graph = tp::SyntheticTransformer(*shape, trace);
      const auto t0 = std::chrono::steady_clock::now();
      auto plan = absl::GetFlag(FLAGS_time_aware)
                      ? tp::PlanBest(graph, budgets, link, nullptr, 0, tp::TimeAwareStyles())
                      : tp::PlanBest(graph, budgets, link);
      const double plan_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      if (!plan.ok()) {
        std::printf("%-5s %5d  cannot plan: %s\n", model.c_str(), trace.grad_accum,
                    std::string(plan.status().message()).c_str());
        continue;
      }
      tp::SimOptions options;
      options.iterations = 3;
      options.record_timeline = absl::GetFlag(FLAGS_phases);
      auto sim = tp::SimulatePlan(graph, *plan, budgets, link, options);
      auto lru = tp::SimulateOnDemandLru(graph, budgets, link, options);
      if (!sim.ok() || !lru.ok()) {
        std::fprintf(stderr, "planbench: %s %s\n", std::string(sim.status().message()).c_str(),
                     std::string(lru.status().message()).c_str());
        return 1;
      }
      const tp::LowerBound lb = tp::ComputeLowerBound(graph, link, budgets);
      std::printf("%-5s %5d %7.2fs | %8.2fs %8.2fs | %8.2fs %8.2fs | %8.2fs %8.2fs %-22s | %7.3f %7.1fx | %-26s | %-26s | %.1f | %s\n",
                  model.c_str(), trace.grad_accum, sim->compute_seconds, sim->step_seconds, sim->stall_seconds,
                  lru->step_seconds, lru->stall_seconds, lb.step_seconds, lb.stall_seconds, lb.bound_by.c_str(),
                  sim->step_seconds / lb.step_seconds,
                  sim->stall_seconds > 0 ? lru->stall_seconds / sim->stall_seconds : 0.0,
                  (Gb(sim->h2d_bytes) + "/" + Gb(sim->d2h_bytes) + "/" + Gb(sim->nvme_read_bytes) + "/" +
                   Gb(sim->nvme_write_bytes)).c_str(),
                  (Gb(lru->h2d_bytes) + "/" + Gb(lru->d2h_bytes) + "/" + Gb(lru->nvme_read_bytes) + "/" +
                   Gb(lru->nvme_write_bytes)).c_str(),
                  plan_s, plan->layout_fits ? "fits" : "online");
      if (absl::GetFlag(FLAGS_phases)) PrintPhases(graph, *sim, options.iterations - 1, link.nvme_read_bytes_per_s);
      std::fflush(stdout);
    }
  }
  std::printf("plan/LB: planner step over the lower bound (1.000 = at the bound). LRU/plan: LRU stall over planner stall. "
              "layout: the plan's static GPU layout fits the budget, or copies are placed online.\n");
  return 0;
}
