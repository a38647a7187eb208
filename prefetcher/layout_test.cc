#include "prefetcher/layout.h"

#include <gtest/gtest.h>

#include "allocator/static_assigner.h"
#include "prefetcher/simulate.h"
#include "prefetcher/synthetic.h"

namespace tierd::prefetcher {
namespace {

// The tiny model's step, one sequence a micro-batch, two micro-batches; `total` gets its bytes.
Graph TinyStep(int seq_len, uint64_t* total) {
  TraceOptions trace;
  trace.micro_batch_seqs = 1;
  trace.seq_len = seq_len;
  trace.grad_accum = 2;
  Graph g = SyntheticTransformer(*ShapePreset("tiny"), trace);
  *total = 0;
  for (const auto& t : g.tensors) *total += t.bytes;
  return g;
}

// On a real-shaped trace: no two copies live at once share GPU addresses, every use is
// covered, and the layout is as small as the budget allows (within the packing's slack).
TEST(LayoutTest, SyntheticTrainingStepPacksWithoutClashes) {
  uint64_t total = 0;
  const Graph g = TinyStep(64, &total);
  const Budgets budgets{total / 3, total, total * 2};
  auto plan = PlanBest(g, budgets, LinkModel{});
  ASSERT_TRUE(plan.ok()) << plan.status();
  SimOptions options;
  options.iterations = 5;  // as PlanBest simulates for its layout
  options.record_timeline = true;
  auto sim = SimulatePlan(g, *plan, budgets, LinkModel{}, options);
  ASSERT_TRUE(sim.ok()) << sim.status();
  double lap = 0;
  const std::vector<ResidencyWindow> windows = LapWindows(g, *plan, *sim, &lap);
  ASSERT_FALSE(windows.empty());
  ASSERT_GT(lap, 0);
  auto layout = LayOutGpu(g, windows, lap);
  ASSERT_TRUE(layout.ok()) << layout.status();
  const uint32_t ops = g.ops.size();
  // Copies live at the same time never share bytes.
  for (size_t a = 0; a < layout->intervals.size(); ++a) {
    const PlacedInterval& x = layout->intervals[a];
    for (size_t b = a + 1; b < layout->intervals.size(); ++b) {
      const PlacedInterval& y = layout->intervals[b];
      if (!Overlaps(layout->steps, {x.first_step, x.steps, 1}, {y.first_step, y.steps, 1})) continue;
      const uint64_t xb = g.tensors[x.tensor].bytes, yb = g.tensors[y.tensor].bytes;
      ASSERT_TRUE(x.offset + xb <= y.offset || y.offset + yb <= x.offset)
          << g.tensors[x.tensor].name << " / " << g.tensors[y.tensor].name;
    }
  }
  // Every op that uses a tensor is inside one of its intervals.
  for (uint32_t i = 0; i < ops; ++i) {
    for (TensorIndex t : Touched(g.ops[i])) {
      bool covered = false;
      for (const PlacedInterval& x : layout->intervals) {
        covered |= x.tensor == t && Overlaps(ops, {x.first_op, x.ops, 1}, {i, 1, 1});
      }
      ASSERT_TRUE(covered) << g.tensors[t].name << " at op " << i;
    }
  }
  // The simulator kept the budget at every instant, so the live bytes never pass it; the
  // packing needs at least that and, greedy by size, not much more here.
  EXPECT_LE(layout->peak_live_bytes, budgets.gpu);
  EXPECT_GE(layout->size_bytes, layout->peak_live_bytes);
  EXPECT_LE(layout->size_bytes, layout->peak_live_bytes * 5 / 4);
  std::printf("layout %lu B for a peak of %lu B live (plan peak %lu B, budget %lu B)\n", layout->size_bytes,
              layout->peak_live_bytes, plan->gpu.peak_resident_bytes, budgets.gpu);
  // PlanBest made the same layout and kept it when it fits the budget.
  EXPECT_EQ(plan->layout.size_bytes, layout->size_bytes);
  EXPECT_EQ(plan->layout_fits, layout->size_bytes <= budgets.gpu);
}

// The simulator counts no fragmentation; the static layout makes that true only when it
// fits. Here the fastest style's layout does not fit, a slower one's does: that one is chosen.
TEST(LayoutTest, PlanBestPrefersAPlanWhoseLayoutFits) {
  uint64_t total = 0;
  const Graph g = TinyStep(128, &total);
  const Budgets budgets{total * 3 / 4, total * 3 / 4, total * 2};
  std::vector<PlanCandidate> tried;
  auto plan = PlanBest(g, budgets, LinkModel{}, &tried, 0, TimeAwareStyles());
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(plan->layout_fits);
  double fastest = tried.front().step_seconds, chosen = -1;
  for (const PlanCandidate& c : tried) {
    fastest = std::min(fastest, c.step_seconds);
    if (c.reserve_bytes == plan->reserve_bytes && c.style.hoist_loads == plan->style.hoist_loads &&
        c.style.exclusive_loads == plan->style.exclusive_loads && c.style.victim_slack == plan->style.victim_slack) {
      chosen = c.step_seconds;
    }
  }
  ASSERT_GT(chosen, 0);
  EXPECT_LT(fastest, chosen * (1 - 1e-6)) << "a faster plan was tried: its layout did not fit";
  EXPECT_EQ(PlanBest(g, budgets, LinkModel{}, nullptr, 0, {}).status().code(), absl::StatusCode::kInvalidArgument);
  // The fastest plan, laid out alone, does not fit.
  for (const PlanCandidate& c : tried) {
    if (c.step_seconds != fastest) continue;
    auto alone = PlanBest(g, budgets, LinkModel{}, nullptr, 0, {c.style});
    ASSERT_TRUE(alone.ok());
    EXPECT_FALSE(alone->layout_fits);
    break;
  }
}

}  // namespace
}  // namespace tierd::prefetcher
