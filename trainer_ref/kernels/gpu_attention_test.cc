// Causal attention's kernels (attention.cu, attention_tc*.cu) against the CPU reference on
// random data, their bits run to run, and the backward's scratch. Part of gpu_ops_test.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "trainer_ref/cpu_ops.h"
#include "trainer_ref/kernels/attention_tc.h"
#include "trainer_ref/kernels/gpu_ops.h"
#include "trainer_ref/kernels/gpu_test_util.h"

namespace tierd::trainer::gpu {
namespace {

using testing::Bf16Data;
using testing::CompareBf16;
using testing::Device;
using testing::Floats;
using testing::HaveGpu;
using testing::Random;

// The attention scratch (host arithmetic, no GPU needed): delta's B H T floats (256-byte
// aligned), then dS (bf16, 64 x 64 tiles of the causal half: 528 a head at T = 2048) for the
// sequences of one pass, the fewest equal passes within 512 MiB.
TEST(GpuOpsTest, AttentionScratchHoldsOnePassOfEqualPasses) {
  const int64_t mib = int64_t{1} << 20, tile_bytes = 64 * 64 * 2;
  // 1.3B's micro-batch: 2 sequences x 16 heads, 66 MiB each: one pass of both.
  const int64_t per_1_3b = 16 * 528 * tile_bytes;
  EXPECT_EQ(AttentionBackwardScratchBytes(2, 2048, 16, 128), 2 * 16 * 2048 * 4 + 2 * per_1_3b);
  EXPECT_EQ(2 * per_1_3b, 132 * mib);
  // 7B's: 4 x 32 heads, 132 MiB each; 3 would fit in 512 MiB, so two passes of 2, not 3 + 1.
  const int64_t per_7b = 32 * 528 * tile_bytes;
  EXPECT_EQ(AttentionBackwardScratchBytes(4, 2048, 32, 128), 4 * 32 * 2048 * 4 + 2 * per_7b);
  // Asked for at most one sequence at a time; and T not a multiple of 64 (5 tiles: 15 a head).
  EXPECT_EQ(AttentionBackwardScratchBytes(4, 2048, 32, 128, 1), 4 * 32 * 2048 * 4 + per_7b);
  EXPECT_EQ(AttentionBackwardScratchBytes(2, 300, 3, 64), 7424 /* 7200 rounded up to 256 */ + 2 * 3 * 15 * tile_bytes);
  // Head sizes off the tensor cores keep delta only.
  EXPECT_EQ(AttentionBackwardScratchBytes(2, 70, 3, 32), 1792 /* 1680 rounded up */);
}

// Online softmax against the CPU's materialized probabilities. Gradients are sums over up to
// T rows of products of bf16 values: atol 2e-2 on values of order 1.
TEST(GpuOpsTest, CausalAttentionForwardAndBackward) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(8);
  // 16 and 32: the warp-per-row kernels; 64 and 128: tensor cores, with T = 300 spanning
  // five 64-row tiles (the last one partial) so the causal masks at tile edges and the
  // double-buffered tile loads are covered.
  for (int d : {16, 32, 64, 128}) {
    const int b = 2, t = d >= 64 ? 300 : 70, h = 3;
    const size_t count = size_t{b} * t * h * d;
    const Bf16Data q = Random(count, rng), k = Random(count, rng), v = Random(count, rng), dout = Random(count, rng),
                   dq0 = Random(count, rng), dk0 = Random(count, rng), dv0 = Random(count, rng);
    Device<Bf16> d_q(q.bits), d_k(k.bits), d_v(v.bits), d_out{std::vector<Bf16>(count)}, d_dout(dout.bits),
        d_dq(dq0.bits), d_dk(dk0.bits), d_dv(dv0.bits);
    Device<float> d_lse{std::vector<float>(size_t{b} * h * t)};
    const int64_t scratch_bytes = AttentionBackwardScratchBytes(b, t, h, d);
    Device<unsigned char> scratch{std::vector<unsigned char>(static_cast<size_t>(scratch_bytes))};
    ASSERT_EQ(AttentionForward(d_out.get(), d_lse.get(), d_q.get(), d_k.get(), d_v.get(), b, t, h, d, nullptr),
              cudaSuccess);
    ASSERT_EQ(AttentionBackward(d_dq.get(), d_dk.get(), d_dv.get(), d_dout.get(), d_out.get(), d_lse.get(),
                                scratch.get(), scratch_bytes, d_q.get(), d_k.get(), d_v.get(), b, t, h, d, nullptr),
              cudaSuccess);
    // The backward writes dq, dk, dv: the random values they held must not show.
    std::vector<float> out(count), att(size_t{b} * h * t * t), dq(count, 0.f), dk(count, 0.f), dv(count, 0.f);
    cpu::AttentionForward(out.data(), att.data(), q.values.data(), k.values.data(), v.values.data(), b, t, h, h, d);
    cpu::AttentionBackward(dq.data(), dk.data(), dv.data(), dout.values.data(), att.data(), q.values.data(),
                           k.values.data(), v.values.data(), b, t, h, h, d);
    const std::string at = " (D " + std::to_string(d) + ")";
    EXPECT_EQ(CompareBf16(Floats(d_out.Host()), out, 1e-2f, "attention out" + at), 0);
    EXPECT_EQ(CompareBf16(Floats(d_dq.Host()), dq, 2e-2f, "attention dq" + at), 0);
    EXPECT_EQ(CompareBf16(Floats(d_dk.Host()), dk, 2e-2f, "attention dk" + at), 0);
    EXPECT_EQ(CompareBf16(Floats(d_dv.Host()), dv, 2e-2f, "attention dv" + at), 0);
    // Deterministic: the same backward again gives the same bits (no atomics, a fixed
    // summation order), and so does one with room for one sequence's dS at a time (two
    // passes over the batch through the same scratch).
    const int64_t one_at_a_time = AttentionBackwardScratchBytes(b, t, h, d, /*sequences_at_once=*/1);
    for (const int64_t bytes : {scratch_bytes, one_at_a_time}) {
      Device<Bf16> again_dq(dq0.bits), again_dk(dk0.bits), again_dv(dv0.bits);
      ASSERT_EQ(
          AttentionBackward(again_dq.get(), again_dk.get(), again_dv.get(), d_dout.get(), d_out.get(), d_lse.get(),
                            scratch.get(), bytes, d_q.get(), d_k.get(), d_v.get(), b, t, h, d, nullptr),
          cudaSuccess);
      EXPECT_TRUE(again_dq.Host() == d_dq.Host() && again_dk.Host() == d_dk.Host() && again_dv.Host() == d_dv.Host())
          << "attention backward not reproducible bit for bit with " << bytes << " bytes of scratch" << at;
    }
    if (d >= 64) {
      // The previous design, kept for attention_bench and TIERD_ATTENTION_DQ=recompute: dQ
      // from S and dP computed again, against the same reference; dK and dV are the same bits.
      Device<Bf16> re_dq(dq0.bits), re_dk(dk0.bits), re_dv(dv0.bits);
      for (auto part : {AttentionBackwardPart::kDelta, AttentionBackwardPart::kKeys, AttentionBackwardPart::kQueries}) {
        ASSERT_EQ(AttentionBackwardPartTc(part, /*recompute_dq=*/true, re_dq.get(), re_dk.get(), re_dv.get(),
                                          d_dout.get(), d_out.get(), d_lse.get(), scratch.get(), scratch_bytes,
                                          d_q.get(), d_k.get(), d_v.get(), b, t, h, d, nullptr),
                  cudaSuccess);
      }
      EXPECT_EQ(CompareBf16(Floats(re_dq.Host()), dq, 2e-2f, "attention dq, recomputing S and dP" + at), 0);
      EXPECT_TRUE(re_dk.Host() == d_dk.Host() && re_dv.Host() == d_dv.Host()) << at;
    }
    if (d >= 64) {  // tensor cores: the scratch holds dS, and less than one sequence's is refused
      EXPECT_LT(one_at_a_time, scratch_bytes) << at;
      EXPECT_EQ(
          AttentionBackward(d_dq.get(), d_dk.get(), d_dv.get(), d_dout.get(), d_out.get(), d_lse.get(), scratch.get(),
                            one_at_a_time - 1, d_q.get(), d_k.get(), d_v.get(), b, t, h, d, nullptr),
          cudaErrorInvalidValue)
          << at;
    }
  }
}

}  // namespace
}  // namespace tierd::trainer::gpu
