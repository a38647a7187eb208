// planbench: the planner against an on-demand LRU pager and against the lower bound, on
// synthetic Llama-style training traces, by simulation (no GPU needed: the link model is
// the lent H200's measured one). Prints what it compares, the model, and the ratios.
//
//   bazel run -c opt //tools/planbench -- --models=1.3b,7b,13b --accum=1,64
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
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
#include "prefetcher/chrome_trace.h"
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
          "(the daemon plans so only with tierd --planner_time_aware; see "
          "docs/runs/BENCHMARKS-history-2026-11-29-to-12-01.md)");
ABSL_FLAG(int, optimizer_chunks, 1,
          "each layer's optimizer state (master, m, v) as this many tensors (sub-groups), so the tiers below can "
          "hold part of a layer's state; a what-if: the GPU trainer leases each layer's state whole");
ABSL_FLAG(bool, optimizer_on_host, false, "AdamW on the host's CPU next to its DRAM state instead of on the GPU");
ABSL_FLAG(bool, phases, false,
          "after each row, the plan's steady step by phase (forward, backward, optimizer): compute, stall and "
          "the NVMe (by kind of tensor) and DRAM->GPU bytes moved while the phase ran; the disk's longest idle "
          "spans and the ops they fall in; then the lower bound's binding run next to what the plan moved in it");
ABSL_FLAG(std::string, trace_out, "",
          "write each row's simulated plan as a Chrome/Perfetto trace, PREFIX-MODEL-ACCUM.json (ui.perfetto.dev)");
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

// The kind of tensor a move's name ("stage opt.m.layers.3") is for, in the synthetic trace.
int KindOf(const std::string& move) {
  if (absl::StrContains(move, " opt.")) return 0;
  if (absl::EndsWith(move, ".w")) return 1;
  if (absl::EndsWith(move, ".grad")) return 2;
  return 3;
}
constexpr const char* kKinds[] = {"optimizer state", "weights", "gradients", "activations"};

// What moved in [t0, t1) of a timeline: a move's bytes count in proportion to its overlap.
struct Moved {
  double nvme_read = 0, nvme_write = 0, disk_busy = 0, h2d = 0;
  double read_by_kind[4] = {}, write_by_kind[4] = {};
};
Moved MovedIn(const tp::SimResult& sim, double t0, double t1) {
  Moved m;
  for (const tp::TimelineEvent& e : sim.timeline) {
    if (e.track == tp::Track::kCompute || e.end <= e.start) continue;
    const double overlap = std::min(e.end, t1) - std::max(e.start, t0);
    if (overlap <= 0) continue;
    const double bytes = e.bytes * overlap / (e.end - e.start);
    if (e.track == tp::Track::kH2D) m.h2d += bytes;
    if (e.track != tp::Track::kNvme) continue;
    const bool read = absl::StartsWith(e.name, "stage ");
    (read ? m.nvme_read : m.nvme_write) += bytes;
    (read ? m.read_by_kind : m.write_by_kind)[KindOf(e.name)] += bytes;
    m.disk_busy += overlap;
  }
  return m;
}

// NVMe bytes by tensor kind, the kinds that moved at least 0.1 GB.
void PrintByKind(const Moved& m, const char* indent) {
  for (int k = 0; k < 4; ++k) {
    if (m.read_by_kind[k] + m.write_by_kind[k] < 1e8) continue;
    std::printf("%s%-15s NVMe read %6.1f write %6.1f GB\n", indent, kKinds[k], m.read_by_kind[k] / 1e9,
                m.write_by_kind[k] / 1e9);
  }
}

// The disk's idle time within [t0, t1) and its longest idle spans, with the ops running at
// their start and end.
template <typename OpAt>
void PrintDiskGaps(const tp::SimResult& sim, double t0, double t1, OpAt op_at) {
  std::vector<std::pair<double, double>> busy;
  for (const tp::TimelineEvent& e : sim.timeline) {
    if (e.track == tp::Track::kNvme && e.end > t0 && e.start < t1) busy.emplace_back(e.start, e.end);
  }
  std::sort(busy.begin(), busy.end());
  struct Gap {
    double start, end;
  };
  std::vector<Gap> gaps;
  double at = t0;
  for (const auto& [s, e] : busy) {
    if (s > at) gaps.push_back({at, s});
    at = std::max(at, e);
  }
  if (t1 > at) gaps.push_back({at, t1});
  double idle = 0;
  for (const Gap& g : gaps) idle += g.end - g.start;
  std::sort(gaps.begin(), gaps.end(), [](const Gap& a, const Gap& b) { return a.end - a.start > b.end - b.start; });
  std::printf("    disk idle %.2fs of the %.2fs step in %zu spans; the longest:\n", idle, t1 - t0, gaps.size());
  for (size_t k = 0; k < gaps.size() && k < 5; ++k) {
    std::printf("      %.3fs from %+.3fs (op %s) to %+.3fs (op %s)\n", gaps[k].end - gaps[k].start,
                gaps[k].start - t0, op_at(gaps[k].start).c_str(), gaps[k].end - t0, op_at(gaps[k].end).c_str());
  }
}

// A measured iteration of a run with a timeline, by phase (each op's span, its stall and
// its compute, is its phase's), and the plan over the lower bound's run that adds the most.
void PrintPhases(const tp::Graph& graph, const tp::SimResult& sim, const tp::LowerBound& lb, int iteration) {
  static constexpr const char* kNames[] = {"forward", "backward", "optimizer"};
  const size_t ops = graph.ops.size();
  // begin[k], end[k]: op k of the unrolled run (iteration k / ops); begin is the end of the
  // op before, so it counts the stall.
  std::vector<double> start(ops * (iteration + 1), -1), end(ops * (iteration + 1), -1);
  for (const tp::TimelineEvent& e : sim.timeline) {
    if (e.track != tp::Track::kCompute || e.iteration > iteration) continue;
    start[e.iteration * ops + e.op] = e.start;
    end[e.iteration * ops + e.op] = e.end;
  }
  auto begin = [&](size_t k) { return k == 0 ? start[0] : end[k - 1]; };
  const size_t first = iteration * ops;
  struct Phase {
    double compute = 0, stall = 0;
    Moved moved;
  } phase[3];
  for (size_t i = 0; i < ops; ++i) {
    Phase& p = phase[PhaseOf(graph.ops[i].name)];
    p.compute += end[first + i] - start[first + i];
    p.stall += start[first + i] - begin(first + i);
    const Moved m = MovedIn(sim, begin(first + i), end[first + i]);
    p.moved.nvme_read += m.nvme_read;
    p.moved.nvme_write += m.nvme_write;
    p.moved.disk_busy += m.disk_busy;
    p.moved.h2d += m.h2d;
    for (int k = 0; k < 4; ++k) {
      p.moved.read_by_kind[k] += m.read_by_kind[k];
      p.moved.write_by_kind[k] += m.write_by_kind[k];
    }
  }
  for (int k = 0; k < 3; ++k) {
    const Phase& p = phase[k];
    std::printf("    %-9s compute %7.2fs stall %7.2fs | NVMe read %6.1f write %6.1f GB, disk busy %6.2fs | DRAM->GPU %6.1f GB\n",
                kNames[k], p.compute, p.stall, p.moved.nvme_read / 1e9, p.moved.nvme_write / 1e9, p.moved.disk_busy,
                p.moved.h2d / 1e9);
    PrintByKind(p.moved, "      ");
  }
  PrintDiskGaps(sim, begin(first), end[first + ops - 1], [&](double t) {
    for (size_t i = 0; i < ops; ++i) {
      if (t < end[first + i]) return graph.ops[i].name;
    }
    return graph.ops[ops - 1].name;
  });
  if (lb.run_seconds <= 0 || iteration < 2) return;
  // The bound's run, from the iteration before so that a run across the lap's end fits.
  const size_t a = (iteration - 1) * ops + lb.run_first_op;
  const size_t b = (iteration - 1 + (lb.run_last_op < lb.run_first_op ? 1 : 0)) * ops + lb.run_last_op;
  double compute = 0;
  for (size_t k = a; k <= b; ++k) compute += end[k] - start[k];
  const Moved m = MovedIn(sim, begin(a), end[b]);
  std::printf("    bound's run (ops %u-%u): at least %.2fs, NVMe read %.1f + write %.1f GB; the plan: %.2fs (compute "
              "%.2fs), NVMe read %.1f + write %.1f GB, disk busy %.2fs\n",
              lb.run_first_op, lb.run_last_op, lb.run_seconds, lb.run_nvme_read_bytes / 1e9,
              lb.run_nvme_write_bytes / 1e9, end[b] - begin(a), compute, m.nvme_read / 1e9, m.nvme_write / 1e9,
              m.disk_busy);
  PrintByKind(m, "      ");
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Compares tierd's planner with an on-demand LRU pager and with the lower bound (compute or the busiest "
      "link, whichever is longer), simulating synthetic training steps.\n  planbench --models=7b --accum=1,64");
  absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_optimizer_chunks) < 1) {
    std::fprintf(stderr, "planbench: --optimizer_chunks wants a positive integer, got %d\n",
                 absl::GetFlag(FLAGS_optimizer_chunks));
    return 2;
  }
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
              (std::string(absl::GetFlag(FLAGS_optimizer_on_host)
                               ? absl::StrFormat("; AdamW on the host at %.1f G params/s",
                                                 absl::GetFlag(FLAGS_host_adamw_gparams))
                               : "") +
               (absl::GetFlag(FLAGS_optimizer_chunks) > 1
                    ? absl::StrFormat("; optimizer state in %d sub-groups a layer", absl::GetFlag(FLAGS_optimizer_chunks))
                    : ""))
                  .c_str());
  std::printf("%-5s %5s %8s | %9s %9s | %9s %9s | %9s %9s %-22s | %7s %8s | %9s %8s | %-26s | %-26s | %s | %s\n",
              "model", "accum", "compute", "plan step", "stall", "LRU step", "stall", "LB step", "stall", "bound",
              "plan/LB", "LRU/plan", "stall/LB", "LRU/LB", "plan GB h2d/d2h/nvr/nvw", "LRU GB h2d/d2h/nvr/nvw",
              "plan s", "layout");
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
      trace.optimizer_state_chunks = absl::GetFlag(FLAGS_optimizer_chunks);
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
      const std::string trace_out = absl::GetFlag(FLAGS_trace_out);
      options.record_timeline = absl::GetFlag(FLAGS_phases) || !trace_out.empty();
      auto sim = tp::SimulatePlan(graph, *plan, budgets, link, options);
      auto lru = tp::SimulateOnDemandLru(graph, budgets, link, options);
      if (!sim.ok() || !lru.ok()) {
        std::fprintf(stderr, "planbench: %s %s\n", std::string(sim.status().message()).c_str(),
                     std::string(lru.status().message()).c_str());
        return 1;
      }
      const tp::LowerBound lb = tp::ComputeLowerBound(graph, link, budgets);
      // The targets, as ratios: the plan's stall over the bound's (<= 1.05 wanted), and
      // LRU's stall over the bound's — the most LRU/plan any plan can reach (>= 5x wanted).
      const auto ratio = [](double a, double b) { return b > 0 ? absl::StrFormat("%.4f", a / b) : std::string("-"); };
      const std::string lru_over_bound =
          lb.stall_seconds > 0 ? absl::StrFormat("%.1fx", lru->stall_seconds / lb.stall_seconds) : std::string("-");
      std::printf(
          "%-5s %5d %7.2fs | %8.2fs %8.2fs | %8.2fs %8.2fs | %8.2fs %8.2fs %-22s | %7.3f %7.1fx | %9s %8s | %-26s | "
          "%-26s | %.1f | %s\n",
                  model.c_str(), trace.grad_accum, sim->compute_seconds, sim->step_seconds, sim->stall_seconds,
                  lru->step_seconds, lru->stall_seconds, lb.step_seconds, lb.stall_seconds, lb.bound_by.c_str(),
                  sim->step_seconds / lb.step_seconds,
                  sim->stall_seconds > 0 ? lru->stall_seconds / sim->stall_seconds : 0.0,
                  ratio(sim->stall_seconds, lb.stall_seconds).c_str(), lru_over_bound.c_str(),
                  (Gb(sim->h2d_bytes) + "/" + Gb(sim->d2h_bytes) + "/" + Gb(sim->nvme_read_bytes) + "/" +
                   Gb(sim->nvme_write_bytes)).c_str(),
                  (Gb(lru->h2d_bytes) + "/" + Gb(lru->d2h_bytes) + "/" + Gb(lru->nvme_read_bytes) + "/" +
                   Gb(lru->nvme_write_bytes)).c_str(),
                  plan_s,
                  absl::StrFormat("%s (%.1f GB for %.1f GB live)", plan->layout_fits ? "fits" : "online",
                                  plan->layout.size_bytes / 1e9, plan->layout.peak_live_bytes / 1e9)
                      .c_str());
      if (absl::GetFlag(FLAGS_phases)) PrintPhases(graph, *sim, lb, options.iterations - 1);
      if (!trace_out.empty()) {
        const std::string path = absl::StrFormat("%s-%s-%d.json", trace_out, model, trace.grad_accum);
        std::ofstream out(path);
        out << tp::ChromeTraceJson(sim->timeline, absl::StrFormat("planbench %s x%d", model, trace.grad_accum));
        if (!out) {
          std::fprintf(stderr, "planbench: cannot write %s\n", path.c_str());
          return 1;
        }
        std::printf("    wrote %s (%zu spans)\n", path.c_str(), sim->timeline.size());
      }
      std::fflush(stdout);
    }
  }
  std::printf("plan/LB: planner step over the lower bound (1.000 = at the bound). LRU/plan: LRU stall over planner stall. "
              "stall/LB: planner stall over the bound's (the issue's target: <= 1.05). LRU/LB: LRU stall over the "
              "bound's, the most LRU/plan any plan can reach (the target: >= 5x). "
              "layout: the plan's static GPU layout fits the budget, or copies are placed online; the region it needs for the most bytes live at once.\n");
  return 0;
}
