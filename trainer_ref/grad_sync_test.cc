#include "trainer_ref/grad_sync.h"

#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace tierd::trainer {
namespace {

std::vector<float> Random(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d;
  std::vector<float> x(n);
  for (float& v : x) v = d(rng);
  return x;
}

TEST(TopKTest, SendsTheLargestAndKeepsTheRestSoNothingIsLost) {
  const int64_t n = 1000, k = 50;
  std::vector<float> acc = Random(n, 7);
  const std::vector<float> before = acc;
  std::vector<uint8_t> packed(k * kSparseEntryBytes);
  TopKPack(acc.data(), n, k, packed.data());
  std::vector<float> sent(n, 0.f);
  UnpackAdd(packed.data(), k, sent.data());
  // sent + what stays is what there was (bf16's rounding stays behind too).
  int nonzero = 0;
  float smallest_sent = INFINITY, largest_kept = 0;
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_FLOAT_EQ(sent[i] + acc[i], before[i]) << i;
    if (sent[i] != 0) {
      ++nonzero;
      smallest_sent = std::min(smallest_sent, std::fabs(before[i]));
      EXPECT_LE(std::fabs(acc[i]), std::fabs(before[i]) / 128) << "bf16 keeps 8 bits: the remainder is small";
    } else {
      largest_kept = std::max(largest_kept, std::fabs(before[i]));
    }
  }
  EXPECT_EQ(nonzero, k);
  EXPECT_GE(smallest_sent, largest_kept);
}

TEST(TopKTest, TiesGoToTheLowerIndexAndEntriesComeInIndexOrder) {
  std::vector<float> acc = {1, -3, 3, 0.5f, 3};
  std::vector<uint8_t> packed(2 * kSparseEntryBytes);
  TopKPack(acc.data(), 5, 2, packed.data());
  EXPECT_EQ(acc, (std::vector<float>{1, 0, 0, 0.5f, 3}));
  uint32_t first, second;
  std::memcpy(&first, packed.data(), 4);
  std::memcpy(&second, packed.data() + kSparseEntryBytes, 4);
  EXPECT_EQ(first, 1u);
  EXPECT_EQ(second, 2u);
}

std::vector<TensorLayout> Layout() {
  TensorLayout a, b, c;
  a.name = "tok_emb";
  a.count = 5000;
  b.name = "layers.0.attn.wq";
  b.count = 4096;
  b.offset = 5000;
  c.name = "layers.0.norm";
  c.count = 64;
  c.offset = 9096;
  return {a, b, c};
}

TEST(GradSyncTest, OneProcessIsTheMeanOverMicroBatches) {
  auto sync = GradSync::Create({}, Layout());
  ASSERT_TRUE(sync.ok()) << sync.status();
  std::vector<float> g = {3, 6, -9};
  g.resize(5000);
  ASSERT_TRUE(sync->Sync(0, g.data(), nullptr, 3, false).ok());
  EXPECT_EQ(g[0], 1);
  EXPECT_EQ(g[2], -3);
  EXPECT_EQ(sync->Owned(1), std::make_pair(int64_t{0}, int64_t{4096}));
  EXPECT_FALSE(sync->sparse());
  EXPECT_EQ(sync->DenseBytesPerStep(), 0);
}

TEST(GradSyncTest, RatiosByPatternAndTheirErrors) {
  DataParallelOptions o;
  o.sparse_ratio = 0.05;
  o.sparse_ratio_by = {{".*norm.*", 1}, {"tok_emb", 0.01}};
  auto sync = GradSync::Create(o, Layout());
  ASSERT_TRUE(sync.ok()) << sync.status();
  EXPECT_EQ(sync->SparseK(0), 50);   // 1% of 5000
  EXPECT_EQ(sync->SparseK(1), 205);  // 5% of 4096
  EXPECT_EQ(sync->SparseK(2), 0);    // dense
  EXPECT_TRUE(sync->sparse());
  // One process, sparse: what is not sent stays in the residual, and goes out later.
  std::vector<float> g = Random(5000, 3), residual(5000, 0.f);
  const std::vector<float> original = g;
  ASSERT_TRUE(sync->Sync(0, g.data(), residual.data(), 1, false).ok());
  for (int i = 0; i < 5000; ++i) EXPECT_FLOAT_EQ(g[i] + residual[i], original[i]);

  // Update mode, one process: the change applied is what was sent; the rest stays behind.
  std::vector<float> before = Random(5000, 4), params = before, update_residual(5000, 0.f);
  const std::vector<float> change = Random(5000, 5);
  for (int i = 0; i < 5000; ++i) params[i] += 0.01f * change[i];
  ASSERT_TRUE(sync->SparseUpdate(0, params.data(), before.data(), update_residual.data()).ok());
  int moved = 0;
  for (int i = 0; i < 5000; ++i) {
    EXPECT_NEAR(params[i] - before[i] + update_residual[i], 0.01f * change[i], 1e-6f) << i;
    moved += params[i] != before[i];
  }
  EXPECT_EQ(moved, 50) << "1% of tok_emb's elements";

  o.sparse_ratio_by = {{"(", 1}};
  EXPECT_EQ(GradSync::Create(o, Layout()).status().code(), absl::StatusCode::kInvalidArgument);
  o.sparse_ratio_by = {};
  o.sparse_ratio = 1.5;
  EXPECT_EQ(GradSync::Create(o, Layout()).status().message(),
            "--sparse_grad_ratio=1.5: a fraction in [0, 1] (0 or 1: dense)");
  o.sparse_ratio = 0.05;
  o.zero2 = true;
  EXPECT_EQ(GradSync::Create(o, Layout()).status().code(), absl::StatusCode::kInvalidArgument);
  o.zero2 = false;
  o.zero3 = true;
  EXPECT_EQ(GradSync::Create(o, Layout()).status().message(),
            "--zero=3 with --sparse_grad_ratio: ZeRO-3 reduce-scatters dense slices; use one or the other");
  o.zero3 = false;
  o.sync_every = 4;
  EXPECT_EQ(GradSync::Create(o, Layout()).status().code(), absl::StatusCode::kInvalidArgument);
}

// ZeRO-3 in one process: the one slice is the whole tensor, and gathering it copies it.
TEST(GradSyncTest, ZeroThreeInOneProcessGathersTheWholeTensorFromItsSlice) {
  DataParallelOptions o;
  o.zero3 = true;
  auto sync = GradSync::Create(o, Layout());
  ASSERT_TRUE(sync.ok()) << sync.status();
  EXPECT_EQ(sync->Owned(1), std::make_pair(int64_t{0}, int64_t{4096}));
  const std::vector<float> slice = Random(4096, 6);
  std::vector<float> full(4096, 0.f);
  ASSERT_TRUE(sync->GatherFull(1, slice.data(), full.data()).ok());
  EXPECT_EQ(full, slice);
}

}  // namespace
}  // namespace tierd::trainer
