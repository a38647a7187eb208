#include <gtest/gtest.h>

#include "prefetcher/chrome_trace.h"
#include "prefetcher/explain.h"
#include "prefetcher/graph_file.h"
#include "prefetcher/residency.h"
#include "prefetcher/synthetic.h"

namespace tierd::prefetcher {
namespace {

Graph Tiny() {
  TraceOptions trace;
  trace.micro_batch_seqs = 1;
  trace.seq_len = 64;
  return SyntheticTransformer(*ShapePreset("tiny"), trace);
}

TEST(GraphFileTest, RoundTripsThroughYaml) {
  TraceOptions on_host;
  on_host.micro_batch_seqs = 1;
  on_host.seq_len = 64;
  on_host.optimizer_on_host = true;  // ops with host_reads, host_writes, host_overwrites
  for (const Graph& g : {Tiny(), SyntheticTransformer(*ShapePreset("tiny"), on_host)}) {
    auto back = ParseGraphYaml(GraphToYaml(g));
    ASSERT_TRUE(back.ok()) << back.status();
    ASSERT_EQ(back->ops.size(), g.ops.size());
    for (size_t i = 0; i < g.ops.size(); ++i) {
      EXPECT_EQ(back->ops[i].host_reads, g.ops[i].host_reads);
      EXPECT_EQ(back->ops[i].host_writes, g.ops[i].host_writes);
      EXPECT_EQ(back->ops[i].host_overwrites, g.ops[i].host_overwrites);
    }
  }
  const Graph g = Tiny();
  auto back = ParseGraphYaml(GraphToYaml(g));
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_EQ(back->tensors.size(), g.tensors.size());
  ASSERT_EQ(back->ops.size(), g.ops.size());
  for (size_t i = 0; i < g.ops.size(); ++i) {
    EXPECT_EQ(back->ops[i].name, g.ops[i].name);
    EXPECT_EQ(back->ops[i].reads, g.ops[i].reads);
    EXPECT_EQ(back->ops[i].writes, g.ops[i].writes);
    EXPECT_EQ(back->ops[i].overwrites, g.ops[i].overwrites);
    EXPECT_DOUBLE_EQ(back->ops[i].seconds, g.ops[i].seconds);
  }
  for (size_t t = 0; t < g.tensors.size(); ++t) EXPECT_EQ(back->tensors[t].bytes, g.tensors[t].bytes);
  EXPECT_FALSE(back->host);
  Graph host = g;
  host.host = true;
  auto host_back = ParseGraphYaml(GraphToYaml(host));
  ASSERT_TRUE(host_back.ok()) << host_back.status();
  EXPECT_TRUE(host_back->host);
}

// Optimizer state in sub-groups (planbench --optimizer_chunks): each group's master, m and v
// as k tensors of a k-th of the bytes each, all written by the group's one AdamW op.
TEST(SyntheticTest, OptimizerStateInSubGroupsKeepsItsBytesAndItsOp) {
  TraceOptions whole;
  whole.micro_batch_seqs = 1;
  whole.seq_len = 64;
  TraceOptions split = whole;
  split.optimizer_state_chunks = 4;
  const Graph a = SyntheticTransformer(*ShapePreset("tiny"), whole);
  const Graph b = SyntheticTransformer(*ShapePreset("tiny"), split);
  auto state_bytes = [](const Graph& g, size_t* count) {
    uint64_t bytes = 0;
    *count = 0;
    for (const auto& t : g.tensors) {
      if (t.name.rfind("opt.", 0) != 0) continue;
      bytes += t.bytes;
      ++*count;
    }
    return bytes;
  };
  size_t count_a = 0, count_b = 0;
  const uint64_t bytes_a = state_bytes(a, &count_a), bytes_b = state_bytes(b, &count_b);
  EXPECT_EQ(count_b, 4 * count_a);
  EXPECT_NEAR(static_cast<double>(bytes_b), static_cast<double>(bytes_a), 4.0 * count_a);  // (rounding)
  ASSERT_EQ(b.ops.size(), a.ops.size());
  for (size_t i = 0; i < a.ops.size(); ++i) {
    if (a.ops[i].name.find(".adamw") == std::string::npos) continue;
    EXPECT_EQ(b.ops[i].writes.size(), 4 * a.ops[i].writes.size()) << a.ops[i].name;
  }
  uint64_t total = 0;
  for (const auto& t : b.tensors) total += t.bytes;
  auto plan = PlanResidency(b, total / 3);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(ReplayPlan(b, total / 3, *plan).ok()) << ReplayPlan(b, total / 3, *plan);
}

// The planner's refusals name the tier it plans: the GPU, or DRAM for a host graph.
TEST(GraphFileTest, RefusalsNameThePlannedTier) {
  Graph g = Tiny();
  auto gpu = PlanResidency(g, 1024);
  ASSERT_EQ(gpu.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(gpu.status().message().find("on the GPU at once"), absl::string_view::npos) << gpu.status();
  EXPECT_NE(gpu.status().message().find("the GPU budget is 1.00 KiB"), absl::string_view::npos) << gpu.status();
  g.host = true;
  auto dram = PlanResidency(g, 1024);
  ASSERT_EQ(dram.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(dram.status().message().find("in DRAM at once"), absl::string_view::npos) << dram.status();
  EXPECT_NE(dram.status().message().find("the DRAM budget is 1.00 KiB"), absl::string_view::npos) << dram.status();
  EXPECT_EQ(dram.status().message().find("GPU"), absl::string_view::npos) << dram.status();
}

TEST(GraphFileTest, MistakesAreReportedWithTheLine) {
  auto unknown = ParseGraphYaml("tensors:\n  - {name: a, bytes: 1KiB}\nops:\n  - {name: f, reads: [b]}\n");
  ASSERT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(unknown.status().message().find("line 4"), absl::string_view::npos) << unknown.status();
  EXPECT_NE(unknown.status().message().find("'b'"), absl::string_view::npos);
  auto key = ParseGraphYaml("tensors:\n  - {name: a, bytes: 1KiB, color: red}\nops: []\n");
  EXPECT_NE(key.status().message().find("unknown key 'color'"), absl::string_view::npos) << key.status();
  auto twice = ParseGraphYaml("tensors:\n  - {name: a, bytes: 1}\n  - {name: a, bytes: 1}\nops:\n  - {name: f, reads: [a]}\n");
  EXPECT_NE(twice.status().message().find("listed twice"), absl::string_view::npos);
  auto size = ParseGraphYaml("tensors:\n  - {name: a, bytes: lots}\nops:\n  - {name: f, reads: [a]}\n");
  EXPECT_EQ(size.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseGraphYaml("tensors: [\n").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LoadGraphFile("/nonexistent/graph.yaml").status().code(), absl::StatusCode::kNotFound);
}

TEST(ExplainTest, SaysWhereATensorIsAndWhy) {
  const Graph g = Tiny();
  uint64_t total = 0;
  for (const auto& t : g.tensors) total += t.bytes;
  const Budgets budgets{total / 3, total / 2, total * 2};
  auto plan = MakePlan(g, budgets);
  ASSERT_TRUE(plan.ok()) << plan.status();
  auto text = ExplainTensor(g, *plan, "opt.m.layers.1");
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_NE(text->find("loaded DRAM->GPU"), std::string::npos) << *text;
  EXPECT_NE(text->find("evicted from the GPU after a write-back"), std::string::npos) << *text;
  EXPECT_NE(text->find("read and written"), std::string::npos) << *text;
  auto act = ExplainTensor(g, *plan, "act.2");
  ASSERT_TRUE(act.ok());
  EXPECT_NE(act->find("nothing loaded: this op overwrites it"), std::string::npos) << *act;
  auto missing = ExplainTensor(g, *plan, "layers.1");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("did you mean"), absl::string_view::npos);
}

TEST(ChromeTraceTest, EveryEventIsACompleteSpanOnItsTrack) {
  std::vector<TimelineEvent> timeline = {{Track::kCompute, "layers.0.fwd", 0.001, 0.002, 0, 1, 3},
                                         {Track::kH2D, "load \"w\"", 0.0, 0.0015, 4096, 1, 3}};
  const std::string json = ChromeTraceJson(timeline, "tierd plan");
  EXPECT_NE(json.find("\"ph\": \"X\", \"pid\": 1, \"tid\": 0, \"ts\": 1000.000, \"dur\": 1000.000"), std::string::npos) << json;
  EXPECT_NE(json.find("load \\\"w\\\""), std::string::npos);
  EXPECT_NE(json.find("\"name\": \"DRAM->GPU\""), std::string::npos);
  EXPECT_EQ(json.back(), '\n');
}

}  // namespace
}  // namespace tierd::prefetcher
