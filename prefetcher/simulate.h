// The planner's simulator: plays a plan (GPU residency + tiers below) forward in time
// over a link model, with the compute stream running the ops in order, and says what the
// run will cost: step time, stall time, bytes per link, peak bytes per tier. The same
// engine records a timeline (ops on one track, moves per link on others) for traces.
//
// When each move is issued (the schedule the executor follows):
//   - a GPU eviction becomes possible when its tensor's last use before it has finished;
//     a clean or dead copy is freed then, a dirty one is written back (GPU->DRAM link) and
//     its memory is freed when the copy lands;
//   - loads (and room for overwrites) are granted GPU memory strictly in op order, each as
//     soon as the budget has room for it, and go out on the DRAM->GPU link in that order:
//     the link never idles while a later load could run, each load lands as far ahead of
//     its op as the budget permits, and the budget holds at every instant (a grant waits
//     for frees; it cannot deadlock because every free it may wait for belongs to an
//     earlier or the same op);
//   - NVMe stages and push-downs share one device; DRAM room is granted in plan order.
// Deadlines: op i starts when op i-1 is done and all of op i's loads have landed. Time it
// waits for them is stall.
#ifndef TIERD_PREFETCHER_SIMULATE_H_
#define TIERD_PREFETCHER_SIMULATE_H_

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "prefetcher/graph.h"
#include "prefetcher/layout.h"
#include "prefetcher/residency.h"
#include "prefetcher/tiers.h"

namespace tierd::prefetcher {

struct LinkModel {
  double h2d_bytes_per_s = 55e9;  // DRAM -> GPU (pinned)
  double d2h_bytes_per_s = 55e9;  // GPU -> DRAM
  double nvme_read_bytes_per_s = 2e9;   // NVMe is one device: reads and writes share it
  double nvme_write_bytes_per_s = 2e9;
  double move_latency_s = 10e-6;  // per move, on top of bytes / bandwidth
};

struct Budgets {
  uint64_t gpu = 0, dram = 0, nvme = 0;
};

// The whole plan for a graph: what is where at each op, and the moves below the GPU.
// MIN decides residency at op boundaries and likes to evict what the previous op just
// used; a load for op i would then wait for op i-1 to end. So residency is planned under
// the GPU budget minus a prefetch reserve: the reserve is room for the next op's loads
// to land while the current op still holds its tensors.
// How a plan departs from plain MIN at both levels (PlanBest simulates a few and keeps the
// fastest): DRAM copies of loads for writes dropped once landed, loads for writes hoisted
// into free room (HoistLoads), and victims below the GPU chosen by time too
// (LowerTierOptions).
struct PlanStyle {
  bool exclusive_loads = false;  // LowerTierOptions::exclusive_loads
  bool hoist_loads = false;
  double victim_slack = 0;
};
struct Plan {
  ResidencyPlan gpu;
  LowerTierPlan lower;
  uint64_t reserve_bytes = 0;
  PlanStyle style;
  // Fixed offsets in the top tier's arena for the planned tensors (PlanBest), used when
  // they fit the arena (`layout_fits`); otherwise every placement is online.
  GpuLayout layout;
  bool layout_fits = false;
};
absl::StatusOr<Plan> MakePlan(const Graph& graph, const Budgets& budgets, uint64_t reserve_bytes = 0,
                              const PlanStyle& style = {}, const std::atomic<bool>* cancel = nullptr);

enum class Track : uint8_t { kCompute, kH2D, kD2H, kNvme };
const char* TrackName(Track track);

struct TimelineEvent {
  Track track = Track::kCompute;
  std::string name;  // op name, or "load w3", "write-back grad.3", ...
  double start = 0, end = 0;
  uint64_t bytes = 0;
  int iteration = 0;
  uint32_t op = 0;  // the op it runs or serves
};

struct SimOptions {
  int iterations = 4;       // the first is warm-up and not measured
  uint64_t seed = 1;
  double jitter = 0;        // op times and link speeds scaled by uniform(1-j, 1+j)
  bool record_timeline = false;
  // Set (by another thread): the simulation stops at its next op with CANCELLED.
  const std::atomic<bool>* cancel = nullptr;
};

// A copy's time in the top tier: from the start of its load (or alloc) to the end of its
// free or write-back; end < 0: still there when the run ended.
struct GpuWindow {
  TensorIndex tensor = 0;
  double start = 0, end = -1;
  int iteration = 0;
  uint32_t op = 0;  // the op the load was for
};

struct SimResult {
  // Per measured iteration (means).
  double step_seconds = 0;
  double compute_seconds = 0;
  double stall_seconds = 0;
  double max_step_seconds = 0;
  uint64_t h2d_bytes = 0, d2h_bytes = 0, nvme_read_bytes = 0, nvme_write_bytes = 0;
  // Over the measured iterations.
  uint64_t peak_gpu_bytes = 0, peak_dram_bytes = 0, peak_nvme_bytes = 0;
  std::vector<double> op_stall_seconds;  // per op, mean per iteration
  std::vector<TimelineEvent> timeline;
  std::vector<GpuWindow> gpu_windows;  // with record_timeline
};

// INVALID_ARGUMENT for link speeds <= 0, fewer than 2 iterations or jitter outside [0, 1).
absl::Status ValidateSimInputs(const LinkModel& link, const SimOptions& options);

// INTERNAL if the schedule deadlocks or a budget is broken (a planner bug, never input);
// INVALID_ARGUMENT for a bad link model or options.
absl::StatusOr<SimResult> SimulatePlan(const Graph& graph, const Plan& plan, const Budgets& budgets,
                                       const LinkModel& link, const SimOptions& options);

// The baseline: no plan, tensors fetched when an op needs them (least recently used evicted,
// dirty copies written back first, NVMe when DRAM is full), every transfer on the critical
// path — what an on-demand pager does. Overwrites are not fetched (the client says so), but
// dead values are written back (a pager cannot know they are dead).
absl::StatusOr<SimResult> SimulateOnDemandLru(const Graph& graph, const Budgets& budgets,
                                              const LinkModel& link, const SimOptions& options);

// Plans with a few reserves (0 to 4x the largest single op's incoming bytes, then either
// side of the fastest at half that grid's step), in each of
// `styles`, simulates each, and returns the one with the shortest predicted step (the
// earlier on a tie) whose static layout fits the arena (the simulator assumes no
// fragmentation, which the layout makes true), or the fastest if none fits: more reserve
// means more traffic (a smaller budget for MIN) but more overlap. `tried`, if given, lists
// them; INVALID_ARGUMENT for no styles. By default (the daemon) plain MIN and exclusive
// loads: on the H200 (8-layer planned worker, docs/BENCHMARKS.md) exclusive loads ran at
// 0.47-0.57 s an iteration against 0.54 s plain; hoisted ones, though predicted faster, ran
// 0.85-0.99 s while the executor skipped them as late, and 0.54-0.57 s (their prediction)
// since, against 0.49-0.50 s for the default; TimeAwareStyles() adds those for the
// simulator (planbench --time_aware) and for tierd --planner_time_aware.
// Plain MIN and MIN with exclusive loads: what the daemon plans with by default.
const std::vector<PlanStyle>& DaemonStyles();
struct PlanCandidate {
  uint64_t reserve_bytes = 0;
  double step_seconds = 0, stall_seconds = 0;
  uint64_t h2d_bytes = 0;
  PlanStyle style;
};
// `layout_limit_bytes`: the arena the static layout may fill (0: the GPU budget); a caller
// that plans under its quota minus a headroom passes the whole quota.
// `cancel`, once set (by another thread), stops it between plans and within simulations with
// CANCELLED (a daemon's deadline).
absl::StatusOr<Plan> PlanBest(const Graph& graph, const Budgets& budgets, const LinkModel& link,
                              std::vector<PlanCandidate>* tried = nullptr, uint64_t layout_limit_bytes = 0,
                              const std::vector<PlanStyle>& styles = DaemonStyles(),
                              const std::atomic<bool>* cancel = nullptr);
// Plain, exclusive loads, exclusive loads hoisted, and those with victims chosen by time too
// (slack 0.25).
const std::vector<PlanStyle>& TimeAwareStyles();
// "MIN", or what the style adds to it ("exclusive loads, hoisted loads, victim slack 0.25").
std::string DescribeStyle(const PlanStyle& style);

// No stalls beyond what the links force, for any plan under these budgets (it takes none:
// a bound from a plan's own bytes would move with the plan). Two bounds, the larger holds:
//   whole step: at the start of each op, the live values (needed later with their value)
//     beyond the GPU budget are below it and are loaded before their next use, and those
//     the GPU wrote last were written back since; beyond GPU and DRAM they are on NVMe
//     only, read from it and (if written in the lap) written to it. Each link carries at
//     least that every step, and compute runs;
//   phases: a run of ops W takes at least its compute and the time to bring in what it uses
//     with its value that cannot already be on the GPU (beyond the GPU budget) and, beyond
//     GPU and DRAM, off NVMe, and to write to NVMe what it makes that cannot stay above it;
//     runs that do not overlap add up, so the step takes at least the sum over the best cut
//     of the lap into runs (the optimizer step that touches all state with little compute
//     is such a run; so is each pass that streams the weights).
struct LowerBound {
  double step_seconds = 0, stall_seconds = 0, compute_seconds = 0;
  std::string bound_by = "compute";
  // The phase bound's run that adds the most beyond its compute (first_op > last_op: it
  // crosses the lap's end), and the NVMe bytes it must read and write; run_seconds is its
  // bound. run_seconds is 0 when no run adds anything.
  uint32_t run_first_op = 0, run_last_op = 0;
  uint64_t run_nvme_read_bytes = 0, run_nvme_write_bytes = 0;
  double run_seconds = 0;
};
LowerBound ComputeLowerBound(const Graph& graph, const LinkModel& link, const Budgets& budgets);

// The residency windows of the last whole simulated iteration (the one before the last: a
// steady state when the run is long enough), as times within it, for LayOutGpu; `lap` gets
// the iteration's length. Needs a run of 3 or more iterations with record_timeline;
// otherwise empty.
std::vector<ResidencyWindow> LapWindows(const Graph& graph, const Plan& plan, const SimResult& sim, double* lap);

}  // namespace tierd::prefetcher

#endif  // TIERD_PREFETCHER_SIMULATE_H_
