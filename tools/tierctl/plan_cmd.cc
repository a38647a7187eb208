#include "tools/tierctl/plan_cmd.h"

#include <cstdio>
#include <fstream>

#include "absl/flags/flag.h"
#include "absl/strings/str_format.h"
#include "base/units.h"
#include "prefetcher/chrome_trace.h"
#include "prefetcher/explain.h"
#include "prefetcher/graph_file.h"
#include "prefetcher/simulate.h"
#include "prefetcher/synthetic.h"

ABSL_FLAG(std::string, graph, "", "plan/trace: the iteration graph (YAML; see --dump_graph for the format)");
ABSL_FLAG(std::string, model, "", "plan/trace: a synthetic Llama-style step instead: tiny, 1.3b, 7b, 13b");
ABSL_FLAG(int, accum, 1, "plan/trace with --model: micro-batches (8 x 2048 tokens) per optimizer step");
ABSL_FLAG(bool, optimizer_on_host, false,
          "plan/trace with --model: AdamW on the host's CPU next to its DRAM state (host ops) instead of on the GPU");
ABSL_FLAG(double, host_adamw_gparams, 2.3, "plan/trace with --optimizer_on_host: host AdamW rate, G params/s");
ABSL_FLAG(std::string, gpu, "24GiB", "plan/trace: GPU budget");
ABSL_FLAG(std::string, dram, "64GiB", "plan/trace: DRAM budget");
ABSL_FLAG(std::string, nvme, "512GiB", "plan/trace: NVMe budget");
ABSL_FLAG(double, h2d_gbps, 55, "plan/trace: DRAM->GPU GB/s");
ABSL_FLAG(double, d2h_gbps, 55, "plan/trace: GPU->DRAM GB/s");
ABSL_FLAG(double, nvme_gbps, 2, "plan/trace: NVMe GB/s (reads and writes share it)");
ABSL_FLAG(double, nvme_write_gbps, 0, "plan/trace: NVMe write GB/s when it differs from --nvme_gbps (0: the same)");
ABSL_FLAG(bool, time_aware, false,
          "plan/trace: also try loads hoisted into free room and victims chosen by time (as planbench "
          "--time_aware and tierd --planner_time_aware)");
ABSL_FLAG(bool, simulate, false, "plan: also simulate the on-demand LRU baseline and the lower bound");
ABSL_FLAG(std::string, explain, "", "plan: say where this tensor is at each op and why");
ABSL_FLAG(std::string, out, "tierd-trace.json", "trace: where to write the Chrome/Perfetto JSON");
ABSL_FLAG(bool, dump_graph, false, "plan: print the graph as YAML (a starting point for --graph)");

namespace tierd {
namespace {

namespace tp = prefetcher;

int Usage(const std::string& what) {
  std::fprintf(stderr, "tierctl: %s\n", what.c_str());
  return 2;
}

std::string Gb(uint64_t b) { return absl::StrFormat("%.2f GB", b / 1e9); }

}  // namespace

int RunPlanCommand(const std::vector<std::string>& args) {
  const bool trace = args[0] == "trace";
  tp::Graph graph;
  std::string source;
  if (!absl::GetFlag(FLAGS_graph).empty() == !absl::GetFlag(FLAGS_model).empty()) {
    return Usage("give the iteration as --graph FILE or as --model tiny|1.3b|7b|13b (one of them)");
  }
  if (!absl::GetFlag(FLAGS_graph).empty()) {
    auto g = tp::LoadGraphFile(absl::GetFlag(FLAGS_graph));
    if (!g.ok()) return Usage(std::string(g.status().message()));
    graph = *std::move(g);
    source = absl::GetFlag(FLAGS_graph);
  } else {
    auto shape = tp::ShapePreset(absl::GetFlag(FLAGS_model));
    if (!shape.ok()) return Usage(std::string(shape.status().message()));
    tp::TraceOptions options;
    options.grad_accum = absl::GetFlag(FLAGS_accum);
    if (options.grad_accum < 1) return Usage("--accum must be >= 1");
    options.optimizer_on_host = absl::GetFlag(FLAGS_optimizer_on_host);
    options.host_adamw_params_per_s = absl::GetFlag(FLAGS_host_adamw_gparams) * 1e9;
    if (!(options.host_adamw_params_per_s > 0)) return Usage("--host_adamw_gparams must be > 0");
    graph = tp::SyntheticTransformer(*shape, options);
    source = absl::StrFormat("synthetic %s step, %d x 16384 tokens%s", shape->name, options.grad_accum,
                             options.optimizer_on_host ? ", AdamW on the host" : "");
  }
  if (absl::GetFlag(FLAGS_dump_graph)) {
    std::printf("%s", tp::GraphToYaml(graph).c_str());
    return 0;
  }
  tp::Budgets budgets;
  for (auto [flag, out] : {std::pair{absl::GetFlag(FLAGS_gpu), &budgets.gpu}, std::pair{absl::GetFlag(FLAGS_dram), &budgets.dram},
                           std::pair{absl::GetFlag(FLAGS_nvme), &budgets.nvme}}) {
    auto b = ParseBytes(flag);
    if (!b.ok()) return Usage(std::string(b.status().message()));
    *out = *b;
  }
  tp::LinkModel link;
  link.h2d_bytes_per_s = absl::GetFlag(FLAGS_h2d_gbps) * 1e9;
  link.d2h_bytes_per_s = absl::GetFlag(FLAGS_d2h_gbps) * 1e9;
  link.nvme_read_bytes_per_s = link.nvme_write_bytes_per_s = absl::GetFlag(FLAGS_nvme_gbps) * 1e9;
  if (absl::GetFlag(FLAGS_nvme_write_gbps) < 0) return Usage("--nvme_write_gbps must be > 0 (or 0: --nvme_gbps's)");
  if (absl::GetFlag(FLAGS_nvme_write_gbps) > 0) link.nvme_write_bytes_per_s = absl::GetFlag(FLAGS_nvme_write_gbps) * 1e9;
  auto plan = absl::GetFlag(FLAGS_time_aware) ? tp::PlanBest(graph, budgets, link, nullptr, 0, tp::TimeAwareStyles())
                                              : tp::PlanBest(graph, budgets, link);
  if (!plan.ok()) {
    std::fprintf(stderr, "tierctl: cannot plan %s: %s\n", source.c_str(), std::string(plan.status().message()).c_str());
    return 1;
  }
  tp::SimOptions options;
  options.iterations = 3;
  options.record_timeline = trace;
  auto sim = tp::SimulatePlan(graph, *plan, budgets, link, options);
  if (!sim.ok()) {
    std::fprintf(stderr, "tierctl: %s\n", std::string(sim.status().message()).c_str());
    return 1;
  }
  if (trace) {
    const std::string path = absl::GetFlag(FLAGS_out);
    std::ofstream out(path);
    out << tp::ChromeTraceJson(sim->timeline, "tierd plan: " + source);
    if (!out.flush()) return Usage("cannot write " + path);
    std::printf("wrote %s: %zu spans over %d iterations (open it in ui.perfetto.dev or chrome://tracing)\n",
                path.c_str(), sim->timeline.size(), options.iterations);
    return 0;
  }
  if (!absl::GetFlag(FLAGS_explain).empty()) {
    auto text = tp::ExplainTensor(graph, *plan, absl::GetFlag(FLAGS_explain));
    if (!text.ok()) return Usage(std::string(text.status().message()));
    std::printf("%s", text->c_str());
    return 0;
  }
  uint64_t total = 0;
  for (const auto& t : graph.tensors) total += t.bytes;
  std::printf("plan for %s: %zu tensors (%s), %zu ops\n", source.c_str(), graph.tensors.size(),
              FormatBytes(total).c_str(), graph.ops.size());
  std::printf("budgets: GPU %s (of which %s kept free for prefetches), DRAM %s, NVMe %s\n",
              FormatBytes(budgets.gpu).c_str(), FormatBytes(plan->reserve_bytes).c_str(),
              FormatBytes(budgets.dram).c_str(), FormatBytes(budgets.nvme).c_str());
  std::printf("planned as: %s\n", tp::DescribeStyle(plan->style).c_str());
  std::printf("predicted per step: %.3f s (compute %.3f s, stall %.3f s)\n", sim->step_seconds, sim->compute_seconds,
              sim->stall_seconds);
  std::printf("moved per step: DRAM->GPU %s, GPU->DRAM %s, NVMe read %s, NVMe write %s\n", Gb(sim->h2d_bytes).c_str(),
              Gb(sim->d2h_bytes).c_str(), Gb(sim->nvme_read_bytes).c_str(), Gb(sim->nvme_write_bytes).c_str());
  std::printf("peak: GPU %s, DRAM %s, NVMe %s\n", FormatBytes(sim->peak_gpu_bytes).c_str(),
              FormatBytes(sim->peak_dram_bytes).c_str(), FormatBytes(sim->peak_nvme_bytes).c_str());
  std::printf("static layout: %s for at most %s live at once (%.2fx); %s\n", FormatBytes(plan->layout.size_bytes).c_str(),
              FormatBytes(plan->layout.peak_live_bytes).c_str(),
              plan->layout.peak_live_bytes > 0
                  ? static_cast<double>(plan->layout.size_bytes) / plan->layout.peak_live_bytes
                  : 1.0,
              plan->layout_fits ? "fits the GPU budget: planned copies get fixed offsets"
                                : "more than the GPU budget: placement would be online");
  std::vector<std::pair<double, size_t>> worst;
  for (size_t i = 0; i < graph.ops.size(); ++i) {
    if (sim->op_stall_seconds[i] > 0) worst.push_back({sim->op_stall_seconds[i], i});
  }
  std::sort(worst.rbegin(), worst.rend());
  for (size_t k = 0; k < worst.size() && k < 5; ++k) {
    std::printf("  waits %.3f s before op %zu '%s'\n", worst[k].first, worst[k].second,
                graph.ops[worst[k].second].name.c_str());
  }
  if (absl::GetFlag(FLAGS_simulate)) {
    auto lru = tp::SimulateOnDemandLru(graph, budgets, link, options);
    const tp::LowerBound lb = tp::ComputeLowerBound(graph, link, budgets);
    if (lru.ok() && sim->stall_seconds == 0) {
      std::printf("on-demand LRU would take %.3f s per step (stall %.3f s); the plan has no stall\n",
                  lru->step_seconds, lru->stall_seconds);
    } else if (lru.ok()) {
      std::printf("on-demand LRU would take %.3f s per step (stall %.3f s); the planner's stall is %.1fx smaller\n",
                  lru->step_seconds, lru->stall_seconds,
                  sim->stall_seconds > 0 ? lru->stall_seconds / sim->stall_seconds : 0.0);
    } else {
      std::printf("on-demand LRU: %s\n", std::string(lru.status().message()).c_str());
    }
    std::printf("lower bound: %.3f s per step (bound by %s); the plan is at %.3fx of it\n", lb.step_seconds,
                lb.bound_by.c_str(), sim->step_seconds / lb.step_seconds);
  }
  return 0;
}

}  // namespace tierd
