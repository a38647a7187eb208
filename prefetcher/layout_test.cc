#include "prefetcher/layout.h"

#include <gtest/gtest.h>

#include "allocator/static_assigner.h"
#include "prefetcher/synthetic.h"

namespace tierd::prefetcher {
namespace {

// On a real-shaped trace: no two intervals live at once share GPU addresses, and every op's
// resident tensors (and loads in flight) are covered by an interval.
TEST(LayoutTest, SyntheticTrainingStepPacksWithoutClashes) {
  TraceOptions trace;
  trace.micro_batch_seqs = 1;
  trace.seq_len = 64;
  trace.grad_accum = 2;
  const Graph g = SyntheticTransformer(*ShapePreset("tiny"), trace);
  uint64_t total = 0;
  for (const auto& t : g.tensors) total += t.bytes;
  const Budgets budgets{total / 3, total, total * 2};
  auto plan = PlanBest(g, budgets, LinkModel{});
  ASSERT_TRUE(plan.ok()) << plan.status();
  SimOptions options;
  options.record_timeline = true;
  auto sim = SimulatePlan(g, *plan, budgets, LinkModel{}, options);
  ASSERT_TRUE(sim.ok()) << sim.status();
  const std::vector<uint32_t> leads = LoadLeads(g, *sim);
  auto layout = LayOutGpu(g, plan->gpu, leads);
  ASSERT_TRUE(layout.ok()) << layout.status();
  const uint32_t ops = g.ops.size();
  for (size_t a = 0; a < layout->intervals.size(); ++a) {
    const PlacedInterval& x = layout->intervals[a];
    for (size_t b = a + 1; b < layout->intervals.size(); ++b) {
      const PlacedInterval& y = layout->intervals[b];
      if (!Overlaps(ops, {x.first_op, x.ops, 1}, {y.first_op, y.ops, 1})) continue;
      const uint64_t xb = g.tensors[x.tensor].bytes, yb = g.tensors[y.tensor].bytes;
      ASSERT_TRUE(x.offset + xb <= y.offset || y.offset + yb <= x.offset) << g.tensors[x.tensor].name << " / " << g.tensors[y.tensor].name;
    }
  }
  for (uint32_t i = 0; i < ops; ++i) {
    for (TensorIndex t : plan->gpu.resident[i]) {
      bool covered = false;
      for (const PlacedInterval& x : layout->intervals) {
        covered |= x.tensor == t && Overlaps(ops, {x.first_op, x.ops, 1}, {i, 1, 1});
      }
      ASSERT_TRUE(covered) << g.tensors[t].name << " at op " << i;
    }
  }
  EXPECT_GE(layout->size_bytes, layout->peak_live_bytes);
  std::printf("layout %lu B for a peak of %lu B live (plan peak %lu B, budget %lu B)\n", layout->size_bytes,
              layout->peak_live_bytes, plan->gpu.peak_resident_bytes, budgets.gpu);
}

}  // namespace
}  // namespace tierd::prefetcher
