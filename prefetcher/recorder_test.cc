// IterationRecorder: the graph it makes from a hand-written trace, op by op; how it
// numbers later iterations' ops; and what it refuses.
#include "prefetcher/recorder.h"

#include <gtest/gtest.h>

#include <map>

namespace tierd::prefetcher {
namespace {

constexpr int64_t kMs = 1'000'000;

std::optional<IterationRecorder::TensorInfo> Describe(uint64_t id) {
  static const std::map<uint64_t, IterationRecorder::TensorInfo> known = {
      {10, {"w0", 1000}}, {11, {"w1", 2000}}, {20, {"act0", 500}}, {30, {"grad0", 1000}}};
  auto it = known.find(id);
  if (it == known.end()) return std::nullopt;
  return it->second;
}

// forward: (w0 read, act0 overwrite) then (w1 read); backward: (w0 read, act0 read, grad0
// write); each op released whole before the next.
void OneIteration(IterationRecorder& r, int64_t t0, std::vector<std::optional<uint32_t>>* begun = nullptr) {
  auto acquire = [&](uint64_t id, Access touch, int64_t at) {
    auto op = r.Acquired(id, touch, /*host=*/false, at);
    if (begun != nullptr) begun->push_back(op);
  };
  acquire(10, Access::kRead, t0);
  acquire(20, Access::kOverwrite, t0 + 1 * kMs);
  r.Released(10);
  r.Released(20);
  acquire(11, Access::kRead, t0 + 5 * kMs);
  r.Released(11);
  acquire(10, Access::kRead, t0 + 7 * kMs);
  acquire(20, Access::kRead, t0 + 7 * kMs);
  acquire(30, Access::kWrite, t0 + 8 * kMs);
  r.Released(30);
  r.Released(20);
  r.Released(10);
}

TEST(IterationRecorderTest, OpsAreRunsOfAcquiresBetweenReleases) {
  IterationRecorder r;
  EXPECT_EQ(r.phase(), IterationRecorder::Phase::kWaiting);
  EXPECT_EQ(r.Acquired(10, Access::kRead, false, 0), std::nullopt) << "nothing is recorded before the first mark";
  r.Released(10);
  r.Mark(100 * kMs);
  EXPECT_EQ(r.phase(), IterationRecorder::Phase::kRecording);
  OneIteration(r, 100 * kMs);
  EXPECT_FALSE(r.MakeGraph(Describe).ok()) << "not before the closing mark";
  r.Mark(110 * kMs);
  ASSERT_EQ(r.phase(), IterationRecorder::Phase::kFollowing);
  auto graph = r.MakeGraph(Describe);
  ASSERT_TRUE(graph.ok()) << graph.status();
  EXPECT_FALSE(graph->host);
  ASSERT_EQ(graph->tensors.size(), 4u);
  EXPECT_EQ(graph->tensors[0].name, "w0");
  EXPECT_EQ(graph->tensors[1].name, "act0");
  EXPECT_EQ(graph->tensors[1].bytes, 500u);
  ASSERT_EQ(graph->ops.size(), 3u);
  // Op 0: w0 read, act0 overwritten; 5 ms until op 1 began.
  EXPECT_EQ(graph->ops[0].reads, std::vector<TensorIndex>{0});
  EXPECT_EQ(graph->ops[0].overwrites, std::vector<TensorIndex>{1});
  EXPECT_DOUBLE_EQ(graph->ops[0].seconds, 0.005);
  // Op 1: w1 read, 2 ms.
  EXPECT_EQ(graph->ops[1].reads, std::vector<TensorIndex>{2});
  EXPECT_DOUBLE_EQ(graph->ops[1].seconds, 0.002);
  // Op 2: w0 and act0 read, grad0 written; until the closing mark, 3 ms.
  EXPECT_EQ(graph->ops[2].reads, (std::vector<TensorIndex>{0, 1}));
  EXPECT_EQ(graph->ops[2].writes, std::vector<TensorIndex>{3});
  EXPECT_DOUBLE_EQ(graph->ops[2].seconds, 0.003);
}

TEST(IterationRecorderTest, LaterIterationsAreNumberedByTheSameRule) {
  IterationRecorder r;
  r.Mark(0);
  OneIteration(r, 0);
  r.Mark(10 * kMs);
  std::vector<std::optional<uint32_t>> begun;
  OneIteration(r, 10 * kMs, &begun);
  // Six acquires; ops begin at the 1st, 3rd and 4th.
  const std::vector<std::optional<uint32_t>> want = {0u, std::nullopt, 1u, 2u, std::nullopt, std::nullopt};
  EXPECT_EQ(begun, want);
  // A client that strays (an extra op) wraps around; the next mark puts it back at op 0.
  EXPECT_EQ(r.Acquired(11, Access::kRead, false, 0), 0u);
  r.Released(11);
  r.Mark(20 * kMs);
  EXPECT_EQ(r.Acquired(10, Access::kRead, false, 0), 0u);
  EXPECT_EQ(r.ops(), 3u) << "following does not record";
}

TEST(IterationRecorderTest, RepeatedAcquiresInOneOpMerge) {
  IterationRecorder r;
  r.Mark(0);
  r.Acquired(10, Access::kRead, true, 0);
  r.Acquired(10, Access::kWrite, true, 0);  // read, then changed: a read-modify-write
  r.Acquired(20, Access::kOverwrite, true, 0);
  r.Acquired(20, Access::kRead, true, 0);  // produced here first: still an overwrite
  r.Mark(kMs);
  auto graph = r.MakeGraph(Describe);
  ASSERT_TRUE(graph.ok()) << graph.status();
  EXPECT_TRUE(graph->host) << "every acquire was on the host";
  ASSERT_EQ(graph->ops.size(), 1u);
  EXPECT_EQ(graph->ops[0].writes, std::vector<TensorIndex>{0});
  EXPECT_EQ(graph->ops[0].overwrites, std::vector<TensorIndex>{1});
  EXPECT_TRUE(graph->ops[0].reads.empty());
}

// A GPU session that also acquires on the host (its optimizer on the CPU): the host
// acquires become host uses of the op, by how they touched the tensor.
TEST(IterationRecorderTest, HostAcquiresInAGpuSessionAreHostUses) {
  IterationRecorder r;
  r.Mark(0);
  r.Acquired(10, Access::kRead, /*host=*/false, 1 * kMs);  // forward on the GPU
  r.Released(10);
  r.Acquired(30, Access::kRead, /*host=*/true, 2 * kMs);  // the optimizer on the host
  r.Acquired(11, Access::kWrite, /*host=*/true, 2 * kMs);
  r.Acquired(10, Access::kOverwrite, /*host=*/true, 2 * kMs);
  r.Released(30);
  r.Released(11);
  r.Released(10);
  r.Mark(4 * kMs);
  auto graph = r.MakeGraph(Describe);
  ASSERT_TRUE(graph.ok()) << graph.status();
  EXPECT_FALSE(graph->host) << "the session acquires on the GPU too";
  ASSERT_EQ(graph->ops.size(), 2u);
  const GraphOp& opt = graph->ops[1];
  EXPECT_TRUE(opt.reads.empty() && opt.writes.empty() && opt.overwrites.empty());
  ASSERT_EQ(opt.host_reads.size(), 1u);
  EXPECT_EQ(graph->tensors[opt.host_reads[0]].name, "grad0");
  ASSERT_EQ(opt.host_writes.size(), 1u);
  EXPECT_EQ(graph->tensors[opt.host_writes[0]].name, "w1");
  ASSERT_EQ(opt.host_overwrites.size(), 1u);
  EXPECT_EQ(graph->tensors[opt.host_overwrites[0]].name, "w0");
  EXPECT_EQ(HostUseOf(opt, opt.host_overwrites[0]), Use::kOverwrite);
  EXPECT_TRUE(ValidateGraph(*graph).ok());
}

TEST(IterationRecorderTest, RefusesAnEmptyOrUnknownRecording) {
  IterationRecorder empty;
  empty.Mark(0);
  empty.Mark(kMs);
  auto none = empty.MakeGraph(Describe);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("acquired nothing"), std::string::npos) << none.status();
  IterationRecorder gone;
  gone.Mark(0);
  gone.Acquired(99, Access::kRead, false, 0);  // unleased before the graph is made
  gone.Mark(kMs);
  auto unknown = gone.MakeGraph(Describe);
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("leased"), std::string::npos) << unknown.status();
}

}  // namespace
}  // namespace tierd::prefetcher
