#include "prefetcher/tiers.h"

#include <gtest/gtest.h>

#include <random>

#include "prefetcher/random_graph.h"

namespace tierd::prefetcher {
namespace {

// A little training loop: forward reads weights and writes activations, backward reads both
// and writes gradients, the optimizer reads gradients and updates weights and state.
Graph TinyTraining(int layers, uint64_t w) {
  Graph g;
  auto add = [&](const std::string& name, uint64_t bytes) {
    g.tensors.push_back({name, bytes, false});
    return static_cast<TensorIndex>(g.tensors.size() - 1);
  };
  std::vector<TensorIndex> weight, act, grad, state;
  for (int l = 0; l < layers; ++l) {
    weight.push_back(add("w" + std::to_string(l), w));
    act.push_back(add("act" + std::to_string(l), w / 2));
    grad.push_back(add("grad" + std::to_string(l), w));
    state.push_back(add("adam" + std::to_string(l), 2 * w));
  }
  for (int l = 0; l < layers; ++l) g.ops.push_back({"fwd" + std::to_string(l), {weight[l]}, {}, 1, {act[l]}});
  for (int l = layers; l-- > 0;) g.ops.push_back({"bwd" + std::to_string(l), {weight[l], act[l]}, {}, 1, {grad[l]}});
  for (int l = 0; l < layers; ++l) g.ops.push_back({"opt" + std::to_string(l), {grad[l]}, {weight[l], state[l]}, 1});
  return g;
}

TEST(TiersTest, RoomyDramMeansNoNvmeTrafficInTheSteadyState) {
  Graph g = TinyTraining(4, 100);
  auto gpu = PlanResidency(g, 500);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  auto lower = PlanLowerTiers(g, *gpu, 1 << 20, 1 << 20);
  ASSERT_TRUE(lower.ok()) << lower.status();
  EXPECT_TRUE(ReplayLowerTiers(g, *gpu, *lower, 1 << 20, 1 << 20).ok());
  EXPECT_EQ(lower->nvme_read_bytes, 0u);
  EXPECT_EQ(lower->nvme_write_bytes, 0u);
  EXPECT_GT(gpu->bytes_loaded, 0u);
}

// An offloaded model's weights (read on the GPU, written by no op of the graph) that DRAM
// holds need no NVMe at all: not even a copy kept from the start.
TEST(TiersTest, ReadOnlyWeightsThatFitDramNeedNoNvme) {
  Graph g;
  for (int l = 0; l < 6; ++l) g.tensors.push_back({"w" + std::to_string(l), 100, false});
  for (int l = 0; l < 6; ++l) g.ops.push_back({"fwd" + std::to_string(l), {static_cast<TensorIndex>(l)}, {}, 1});
  for (int l = 6; l-- > 0;) g.ops.push_back({"bwd" + std::to_string(l), {static_cast<TensorIndex>(l)}, {}, 1});
  auto gpu = PlanResidency(g, 250);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  auto lower = PlanLowerTiers(g, *gpu, 600, 0);
  ASSERT_TRUE(lower.ok()) << lower.status();
  EXPECT_TRUE(ReplayLowerTiers(g, *gpu, *lower, 600, 0).ok());
  EXPECT_EQ(lower->peak_nvme_bytes, 0u);
  EXPECT_EQ(lower->nvme_read_bytes + lower->nvme_write_bytes, 0u);
  // DRAM for half of them: the rest start on NVMe and are read from there.
  auto half = PlanLowerTiers(g, *gpu, 300, 1 << 20);
  ASSERT_TRUE(half.ok()) << half.status();
  EXPECT_TRUE(ReplayLowerTiers(g, *gpu, *half, 300, 1 << 20).ok());
  EXPECT_GT(half->peak_nvme_bytes, 0u);
  EXPECT_LE(half->peak_dram_bytes, 300u);
}

TEST(TiersTest, TightDramSpillsToNvmeAndLosesNothing) {
  Graph g = TinyTraining(4, 100);
  auto gpu = PlanResidency(g, 500);
  ASSERT_TRUE(gpu.ok());
  auto lower = PlanLowerTiers(g, *gpu, 800, 1 << 20);
  ASSERT_TRUE(lower.ok()) << lower.status();
  ASSERT_TRUE(ReplayLowerTiers(g, *gpu, *lower, 800, 1 << 20).ok()) << ReplayLowerTiers(g, *gpu, *lower, 800, 1 << 20);
  EXPECT_GT(lower->nvme_read_bytes, 0u);
  EXPECT_GT(lower->nvme_write_bytes, 0u);
  EXPECT_LE(lower->peak_dram_bytes, 800u);
  // A plan that forgets one push-down would drop the only copy: replay says so.
  LowerTierPlan broken = *lower;
  for (LowerEvent& e : broken.events) {
    if (e.kind == LowerKind::kPushDown) {
      e.kind = LowerKind::kDrop;
      break;
    }
  }
  EXPECT_FALSE(ReplayLowerTiers(g, *gpu, broken, 800, 1 << 20).ok());
}

TEST(TiersTest, TooLittleNvmeIsRefusedWithTheNumbers) {
  Graph g = TinyTraining(4, 100);
  auto gpu = PlanResidency(g, 500);
  ASSERT_TRUE(gpu.ok());
  auto lower = PlanLowerTiers(g, *gpu, 800, 100);
  ASSERT_EQ(lower.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(lower.status().message().find("NVMe budget is 100 B"), absl::string_view::npos) << lower.status();
  EXPECT_EQ(PlanLowerTiers(g, *gpu, 150, 1 << 20).status().code(), absl::StatusCode::kResourceExhausted);
}

// Random graphs and budgets, MIN's GPU plans and the same with loads hoisted (which keep every
// invariant of ReplayPlan and never load more); below them, with MIN's victims, exclusive
// loads and victims chosen by time: nothing is lost and every budget holds.
TEST(TiersTest, RandomGraphsAndBudgetsReplayCleanly) {
  const LowerTierOptions kOptions[] = {{}, {0, true}, {0.25, true}, {0.5, false}};  // slack, exclusive
  std::mt19937_64 rng(17);
  int planned = 0, hoisted_plans = 0;
  for (int trial = 0; trial < 300; ++trial) {
    uint64_t largest = 0;
    const Graph g = RandomGraph(rng, {}, &largest);
    const uint64_t gpu_budget = largest * (1 + rng() % 4), dram = largest * (1 + rng() % 4);
    auto gpu = PlanResidency(g, gpu_budget);
    if (!gpu.ok()) continue;
    ResidencyPlan hoisted = *gpu;
    hoisted_plans += HoistLoads(g, hoisted, gpu_budget) > 0;
    ASSERT_TRUE(ReplayPlan(g, gpu_budget, hoisted).ok()) << ReplayPlan(g, gpu_budget, hoisted) << " trial " << trial;
    EXPECT_LE(hoisted.bytes_loaded, gpu->bytes_loaded);
    EXPECT_LE(hoisted.bytes_written_back, gpu->bytes_written_back);
    for (const ResidencyPlan* plan : {&*gpu, &hoisted}) {
      for (const LowerTierOptions options : kOptions) {
        auto lower = PlanLowerTiers(g, *plan, dram, 1 << 20, options);
        if (!lower.ok()) {
          ASSERT_EQ(lower.status().code(), absl::StatusCode::kResourceExhausted) << lower.status();
          continue;
        }
        ++planned;
        ASSERT_TRUE(ReplayLowerTiers(g, *plan, *lower, dram, 1 << 20).ok())
            << ReplayLowerTiers(g, *plan, *lower, dram, 1 << 20) << " trial " << trial << " slack "
            << options.victim_slack << " exclusive " << options.exclusive_loads;
      }
    }
  }
  EXPECT_GT(planned, 8 * 120);
  EXPECT_GT(hoisted_plans, 20);
}

// Three tensors of 100 B. A stage moves back over events while DRAM has room for it at
// each one, and stops where it would not.
TEST(TiersTest, StagesMoveEarlierOnlyIntoFreeRoom) {
  Graph g;
  for (const char* name : {"a", "b", "c"}) g.tensors.push_back({name, 100, false});
  g.ops.resize(4);
  auto plan_with = [&] {
    LowerTierPlan p;
    p.dram_at_start = {true, false, false};
    p.nvme_at_start = {false, true, false};
    p.events = {{0, LowerKind::kWriteBack, 2}, {1, LowerKind::kInvalidate, 2}, {1, LowerKind::kRead, 0},
                {2, LowerKind::kStage, 1},     {2, LowerKind::kRead, 1},      {3, LowerKind::kInvalidate, 1}};
    p.nvme_read_bytes = 100;
    return p;
  };
  LowerTierPlan roomy = plan_with();
  EXPECT_EQ(HoistStages(g, roomy, 300), 1);
  EXPECT_EQ(roomy.events[0].kind, LowerKind::kStage);  // a + b + c fit at op 0
  EXPECT_EQ(roomy.events[0].op, 0u);
  EXPECT_EQ(roomy.peak_dram_bytes, 300u);
  LowerTierPlan tight = plan_with();
  EXPECT_EQ(HoistStages(g, tight, 250), 1);
  EXPECT_EQ(tight.events[2].kind, LowerKind::kStage);  // not while c is in DRAM
  EXPECT_EQ(tight.events[2].op, 1u);
  EXPECT_EQ(tight.peak_dram_bytes, 200u);
  EXPECT_EQ(tight.nvme_read_bytes, 100u);  // moved, not removed
}

// A push-down whose stage can move back to it was not needed: both go.
TEST(TiersTest, APushDownAndAStageThatMeetCancel) {
  Graph g;
  for (const char* name : {"a", "c"}) g.tensors.push_back({name, 100, false});
  g.ops.resize(4);
  LowerTierPlan p;
  p.dram_at_start = {true, false};
  p.nvme_at_start = {false, false};
  p.events = {{0, LowerKind::kPushDown, 0}, {0, LowerKind::kWriteBack, 1}, {1, LowerKind::kInvalidate, 1},
              {2, LowerKind::kStage, 0},    {2, LowerKind::kRead, 0},      {3, LowerKind::kInvalidate, 0}};
  p.nvme_read_bytes = p.nvme_write_bytes = 100;
  LowerTierPlan kept = p;
  EXPECT_EQ(HoistStages(g, p, 200), 1);
  ASSERT_EQ(p.events.size(), 4u);
  for (const LowerEvent& e : p.events) EXPECT_NE(e.kind, LowerKind::kPushDown);
  EXPECT_EQ(p.nvme_read_bytes, 0u);
  EXPECT_EQ(p.nvme_write_bytes, 0u);
  // Without room for both, the push-down is what made room: nothing moves.
  EXPECT_EQ(HoistStages(g, kept, 100), 0);
  EXPECT_EQ(kept.events.size(), 6u);
  // If the NVMe copy is what a later drop relies on, the pair stays.
  LowerTierPlan relied = kept;
  relied.events[5] = {3, LowerKind::kDrop, 0};
  EXPECT_EQ(HoistStages(g, relied, 200), 1);  // the stage moves up to the push-down, no further
  EXPECT_EQ(relied.events.size(), 6u);
  EXPECT_EQ(relied.events[1].kind, LowerKind::kStage);
}

}  // namespace
}  // namespace tierd::prefetcher
