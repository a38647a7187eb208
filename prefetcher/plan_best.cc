// Planning with the simulator: a plan under a prefetch reserve, the reserve whose simulated
// step is fastest, and the static GPU layout from the chosen plan's simulated residency.
#include <algorithm>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/limits.h"
#include "base/units.h"
#include "prefetcher/simulate.h"

namespace tierd::prefetcher {

std::string DescribeStyle(const PlanStyle& style) {
  std::vector<std::string> parts;
  if (style.exclusive_loads) parts.push_back("exclusive loads");
  if (style.hoist_loads) parts.push_back("hoisted loads");
  if (style.victim_slack > 0) parts.push_back(absl::StrFormat("victim slack %.2f", style.victim_slack));
  return parts.empty() ? "MIN" : "MIN with " + absl::StrJoin(parts, ", ");
}

const std::vector<PlanStyle>& DaemonStyles() {
  static const std::vector<PlanStyle> styles = {PlanStyle{}, PlanStyle{true}};
  return styles;
}

const std::vector<PlanStyle>& TimeAwareStyles() {
  // (On the synthetic 7B and 13B steps a victim slack of 0.2 to 0.4 gave the same plans; 0.6
  // lets victims be used too soon and costs NVMe traffic. With the optimizer state in
  // sub-groups, 0.5 lets the push-downs that make room for the optimizer's stages take state
  // the optimizer updated a few layers back, whose write-back is done, instead of the one it
  // just wrote: the disk no longer idles 0.5 s waiting behind it, and 7B at one micro-batch
  // plans at 6.64 s a step, not 7.14, against the bound's 6.44; planbench --optimizer_chunks=16.)
  static const std::vector<PlanStyle> styles = {PlanStyle{}, PlanStyle{true}, PlanStyle{true, true},
                                                PlanStyle{true, true, 0.25}, PlanStyle{true, true, 0.5}};
  return styles;
}

namespace {

// The run the layout is taken from: its lap is the one before the last, which a hoisted load
// for an early op reaches a steady state by (the second of three laps did not, in tests).
constexpr int kLayoutIterations = 5;

// Fixed offsets for the plan's copies, from their times in the top tier in a simulated
// steady-state iteration; used when they fit the arena (`limit` bytes).
absl::StatusOr<Plan> WithLayout(const Graph& graph, Plan plan, const Budgets& budgets, const LinkModel& link,
                                uint64_t limit, const std::atomic<bool>* cancel) {
  SimOptions timed;
  timed.cancel = cancel;
  timed.iterations = kLayoutIterations;
  timed.record_timeline = true;
  auto sim = SimulatePlan(graph, plan, budgets, link, timed);
  if (!sim.ok()) return sim.status();
  const uint64_t alignment = graph.host ? limits::kDirectIoAlignmentBytes : limits::kGpuAlignmentBytes;
  double lap = 0;
  const std::vector<ResidencyWindow> windows = LapWindows(graph, plan, *sim, &lap);  // sets lap first
  auto layout = LayOutGpu(graph, windows, lap, alignment);
  if (!layout.ok()) return layout.status();
  plan.layout = *std::move(layout);
  plan.layout_fits = plan.layout.size_bytes <= limit;
  return plan;
}

}  // namespace

absl::StatusOr<Plan> MakePlan(const Graph& graph, const Budgets& budgets, uint64_t reserve_bytes,
                              const PlanStyle& style, const std::atomic<bool>* cancel) {
  if (reserve_bytes >= budgets.gpu) {
    return absl::InvalidArgumentError(absl::StrFormat("a prefetch reserve of %s leaves nothing of the GPU budget (%s)",
                                                      FormatBytes(reserve_bytes), FormatBytes(budgets.gpu)));
  }
  auto gpu = PlanResidency(graph, budgets.gpu - reserve_bytes, cancel);
  if (!gpu.ok()) return gpu.status();
  if (style.hoist_loads) HoistLoads(graph, *gpu, budgets.gpu - reserve_bytes);
  LowerTierOptions lower_options;
  lower_options.victim_slack = style.victim_slack;
  lower_options.exclusive_loads = style.exclusive_loads;
  lower_options.cancel = cancel;
  auto lower = PlanLowerTiers(graph, *gpu, budgets.dram, budgets.nvme, lower_options);
  if (!lower.ok()) return lower.status();
  Plan plan{*std::move(gpu), *std::move(lower), reserve_bytes};
  plan.style = style;
  return plan;
}

std::vector<ResidencyWindow> LapWindows(const Graph& graph, const Plan& plan, const SimResult& sim, double* lap) {
  *lap = 0;
  std::vector<std::pair<double, uint32_t>> op_starts;  // all iterations, by time
  // The last whole lap: the iteration before the last (the last one's tail is cut off).
  int iterations = 0;
  for (const TimelineEvent& e : sim.timeline) iterations = std::max(iterations, e.iteration + 1);
  if (iterations < 3) return {};
  const int steady = iterations - 2;
  double lap_start[2] = {-1, -1};
  for (const TimelineEvent& e : sim.timeline) {
    if (e.track != Track::kCompute) continue;
    op_starts.push_back({e.start, e.op});
    if (e.op == 0 && (e.iteration == steady || e.iteration == steady + 1)) lap_start[e.iteration - steady] = e.start;
  }
  if (lap_start[0] < 0 || lap_start[1] <= lap_start[0]) return {};
  std::sort(op_starts.begin(), op_starts.end());
  auto op_at = [&](double t) -> uint32_t {
    auto it = std::upper_bound(op_starts.begin(), op_starts.end(), std::make_pair(t, UINT32_MAX));
    return it == op_starts.begin() ? 0 : std::prev(it)->second;
  };
  const double from = lap_start[0], length = lap_start[1] - lap_start[0];
  *lap = length;
  std::vector<ResidencyWindow> out;
  std::vector<bool> whole(graph.tensors.size(), false), seen(graph.tensors.size(), false);
  for (const GpuWindow& w : sim.gpu_windows) {
    seen[w.tensor] = true;
    const bool open = w.end < 0;
    if (w.start < from) {
      // Began before the lap: all of it if it lasts past the lap's end. One that ends
      // inside the lap is, in the steady state, the window that starts late in this lap
      // and runs into the next: that one is counted.
      if (open || w.end >= from + length) whole[w.tensor] = true;
      continue;
    }
    if (w.start >= from + length) continue;
    if (open || w.end - w.start >= length) {
      whole[w.tensor] = true;
      continue;
    }
    out.push_back({w.tensor, w.start - from, w.end - from, false, op_at(w.start), op_at(w.end)});
  }
  // Resident from the start and never moved: there all the time.
  for (TensorIndex t : plan.gpu.resident_at_start) whole[t] = whole[t] || !seen[t];
  for (size_t t = 0; t < whole.size(); ++t) {
    if (whole[t]) out.push_back({static_cast<TensorIndex>(t), 0, length, true, 0, 0});
  }
  return out;
}

absl::StatusOr<Plan> PlanBest(const Graph& graph, const Budgets& budgets, const LinkModel& link,
                              std::vector<PlanCandidate>* tried, uint64_t layout_limit_bytes,
                              const std::vector<PlanStyle>& styles, const std::atomic<bool>* cancel) {
  auto cancelled = [cancel] { return cancel != nullptr && cancel->load(std::memory_order_relaxed); };
  auto base = MakePlan(graph, budgets, 0, {}, cancel);
  if (!base.ok()) return base.status();
  uint64_t largest_op_load = 0;
  for (size_t i = 0; i < graph.ops.size(); ++i) {
    uint64_t b = 0;
    for (TensorIndex t : base->gpu.loads[i]) b += graph.tensors[t].bytes;
    for (TensorIndex t : base->gpu.allocs[i]) b += graph.tensors[t].bytes;
    largest_op_load = std::max(largest_op_load, b);
  }
  SimOptions quick;
  quick.iterations = 3;
  quick.cancel = cancel;
  // The fastest plan of each style.
  std::vector<std::pair<double, Plan>> fastest;
  for (const PlanStyle& style : styles) {
    std::optional<Plan> best;
    double best_step = 0, best_factor = 0;
    // Tries one reserve; false when it does not fit (nor will a larger one).
    auto try_reserve = [&](double factor) -> absl::StatusOr<bool> {
      const uint64_t reserve = static_cast<uint64_t>(factor * largest_op_load);
      if (factor > 0 && reserve == 0) return true;
      if (cancelled()) return absl::CancelledError("planning was cancelled");
      const bool plain = !style.exclusive_loads && !style.hoist_loads && style.victim_slack == 0;
      auto plan = factor == 0 && plain ? base : MakePlan(graph, budgets, reserve, style, cancel);
      if (absl::IsCancelled(plan.status())) return plan.status();
      if (!plan.ok()) return false;
      auto sim = SimulatePlan(graph, *plan, budgets, link, quick);
      if (!sim.ok()) return sim.status();
      if (tried != nullptr) {
        tried->push_back({reserve, sim->step_seconds, sim->stall_seconds, plan->gpu.bytes_loaded, style});
      }
      if (!best || sim->step_seconds < best_step * (1 - 1e-9)) {
        best = *std::move(plan);
        best_step = sim->step_seconds;
        best_factor = factor;
      }
      return true;
    };
    for (double factor : {0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0}) {
      auto fits = try_reserve(factor);
      if (!fits.ok()) return fits.status();
      if (!*fits) break;  // a larger reserve will not fit either
    }
    // The step is not smooth in the reserve (MIN's choices change with it): look either
    // side of the best at half the grid's step. At 7B in 24 GiB + 64 GiB with 16
    // micro-batches (planbench) a 0.71 GB reserve plans a step 0.34 s shorter than 1.42 GB.
    if (best && best_factor < 2.0) {
      for (double factor : {best_factor - 0.25, best_factor + 0.25}) {
        if (factor <= 0) continue;
        if (auto fits = try_reserve(factor); !fits.ok()) return fits.status();
      }
    }
    if (best) fastest.emplace_back(best_step, *std::move(best));
  }
  if (fastest.empty()) return absl::InvalidArgumentError("PlanBest needs at least one plan style to try");
  // Fastest first (the earlier style on a tie). The simulator assumes the top tier does not
  // fragment, which the static layout makes true only when it fits the arena: the first plan
  // whose layout fits wins; if none fits, the fastest.
  std::stable_sort(fastest.begin(), fastest.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first * (1 - 1e-9); });
  const uint64_t limit = layout_limit_bytes > 0 ? layout_limit_bytes : budgets.gpu;
  std::optional<Plan> chosen;
  for (auto& [step, plan] : fastest) {
    auto laid_out = WithLayout(graph, std::move(plan), budgets, link, limit, cancel);
    if (!laid_out.ok()) return laid_out.status();
    if (laid_out->layout_fits) return *std::move(laid_out);
    if (!chosen) chosen = *std::move(laid_out);
  }
  return *std::move(chosen);
}

}  // namespace tierd::prefetcher
