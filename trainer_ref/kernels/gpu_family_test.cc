// The Llama family's kernels (gpu_family_ops.cu) against the CPU reference on random data:
// q/k/v biases, and grouped-query attention through repeated key/value heads against the
// CPU's own grouped attention. Part of gpu_ops_test; tolerances as gpu_ops_test.cc states.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "trainer_ref/cpu_ops.h"
#include "trainer_ref/kernels/gpu_ops.h"
#include "trainer_ref/kernels/gpu_test_util.h"

namespace tierd::trainer::gpu {
namespace {

using testing::Bf16Data;
using testing::CompareBf16;
using testing::CompareF32;
using testing::Device;
using testing::Floats;
using testing::HaveGpu;
using testing::Random;

TEST(GpuFamilyTest, BiasForwardAndBackward) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(41);
  const int n = 150, oc = 72;  // three chunks of rows, the last partial
  const Bf16Data out = Random(static_cast<size_t>(n) * oc, rng), dout = Random(static_cast<size_t>(n) * oc, rng);
  const Bf16Data bias_bits = Random(oc, rng);
  const std::vector<float> bias = bias_bits.values;
  std::vector<float> dbias0(oc);
  for (int j = 0; j < oc; ++j) dbias0[j] = 0.25f * (j % 5) - 0.5f;  // added into
  Device<Bf16> d_out(out.bits), d_dout(dout.bits);
  Device<float> d_bias(bias), d_dbias(dbias0), scratch{std::vector<float>(BiasScratchFloats(n, oc))};
  BiasForward(d_out.get(), d_bias.get(), n, oc, nullptr);
  BiasBackward(d_dbias.get(), d_dout.get(), n, oc, scratch.get(), nullptr);
  std::vector<float> cpu_out = out.values, cpu_dbias = dbias0;
  cpu::BiasForward(cpu_out.data(), bias.data(), n, oc);
  cpu::BiasBackward(cpu_dbias.data(), dout.values.data(), n, oc);
  EXPECT_EQ(CompareBf16(Floats(d_out.Host()), cpu_out, 1e-6f, "bias forward"), 0);
  EXPECT_EQ(CompareF32(d_dbias.Host(), cpu_dbias, 1e-5f, 1e-4f, "bias backward"), 0);
  // Deterministic: the same sums again give the same bits.
  Device<float> again(dbias0);
  BiasBackward(again.get(), d_dout.get(), n, oc, scratch.get(), nullptr);
  EXPECT_EQ(again.Host(), d_dbias.Host());
}

// The GPU computes grouped-query attention as multi-head attention over repeated key/value
// heads, summing each group's key/value gradients back; the CPU computes it directly.
TEST(GpuFamilyTest, GroupedQueryAttentionThroughRepeatedHeads) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(42);
  struct Shape {
    int h, kv, d, t;
  };
  for (const Shape& s : {Shape{4, 1, 64, 130}, Shape{6, 2, 128, 200}, Shape{4, 2, 32, 70}}) {
    const int b = 2, t = s.t, h = s.h, kv = s.kv, d = s.d, n = b * t;
    const size_t nq = static_cast<size_t>(n) * h * d, nk = static_cast<size_t>(n) * kv * d;
    const std::string at = " (H " + std::to_string(h) + ", KV " + std::to_string(kv) + ", D " + std::to_string(d) + ")";
    const Bf16Data q = Random(nq, rng), k = Random(nk, rng), v = Random(nk, rng), dout = Random(nq, rng);
    Device<Bf16> d_q(q.bits), d_k(k.bits), d_v(v.bits), d_dout(dout.bits);
    Device<Bf16> k_full{std::vector<Bf16>(nq)}, v_full{std::vector<Bf16>(nq)}, out{std::vector<Bf16>(nq)};
    Device<Bf16> dq{std::vector<Bf16>(nq)}, dk_full{std::vector<Bf16>(nq)}, dv_full{std::vector<Bf16>(nq)};
    Device<Bf16> dk{std::vector<Bf16>(nk, ToBf16(7.f))}, dv{std::vector<Bf16>(nk, ToBf16(7.f))};  // written
    Device<float> lse{std::vector<float>(static_cast<size_t>(b) * h * t)};
    const int64_t scratch_bytes = AttentionBackwardScratchBytes(b, t, h, d);
    Device<unsigned char> scratch{std::vector<unsigned char>(static_cast<size_t>(scratch_bytes))};
    RepeatKvHeads(k_full.get(), d_k.get(), n, h, kv, d, nullptr);
    RepeatKvHeads(v_full.get(), d_v.get(), n, h, kv, d, nullptr);
    ASSERT_EQ(AttentionForward(out.get(), lse.get(), d_q.get(), k_full.get(), v_full.get(), b, t, h, d, nullptr),
              cudaSuccess);
    ASSERT_EQ(AttentionBackward(dq.get(), dk_full.get(), dv_full.get(), d_dout.get(), out.get(), lse.get(),
                                scratch.get(), scratch_bytes, d_q.get(), k_full.get(), v_full.get(), b, t, h, d,
                                nullptr),
              cudaSuccess);
    SumKvHeadGroups(dk.get(), dk_full.get(), n, h, kv, d, nullptr);
    SumKvHeadGroups(dv.get(), dv_full.get(), n, h, kv, d, nullptr);
    std::vector<float> ref(nq), att(static_cast<size_t>(b) * h * t * t), rdq(nq, 0.f), rdk(nk, 0.f), rdv(nk, 0.f);
    cpu::AttentionForward(ref.data(), att.data(), q.values.data(), k.values.data(), v.values.data(), b, t, h, kv, d);
    cpu::AttentionBackward(rdq.data(), rdk.data(), rdv.data(), dout.values.data(), att.data(), q.values.data(),
                           k.values.data(), v.values.data(), b, t, h, kv, d);
    EXPECT_EQ(CompareBf16(Floats(out.Host()), ref, 1e-2f, "gqa out" + at), 0);
    EXPECT_EQ(CompareBf16(Floats(dq.Host()), rdq, 2e-2f, "gqa dq" + at), 0);
    // A key/value head's gradient sums its group's: up to H/KV times the error of one.
    const float group_atol = 2e-2f * static_cast<float>(h / kv);
    EXPECT_EQ(CompareBf16(Floats(dk.Host()), rdk, group_atol, "gqa dk" + at), 0);
    EXPECT_EQ(CompareBf16(Floats(dv.Host()), rdv, group_atol, "gqa dv" + at), 0);
  }
}

// The repeat and the sum by themselves, bit for bit against a host loop.
TEST(GpuFamilyTest, RepeatAndSumOfKeyValueHeadsExactly) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(43);
  const int n = 33, h = 8, kv = 2, d = 6, group = h / kv;
  const Bf16Data kvd = Random(static_cast<size_t>(n) * kv * d, rng), full = Random(static_cast<size_t>(n) * h * d, rng);
  Device<Bf16> d_kv(kvd.bits), d_full{std::vector<Bf16>(full.bits.size())}, d_in(full.bits),
      d_sum{std::vector<Bf16>(kvd.bits.size())};
  RepeatKvHeads(d_full.get(), d_kv.get(), n, h, kv, d, nullptr);
  SumKvHeadGroups(d_sum.get(), d_in.get(), n, h, kv, d, nullptr);
  std::vector<Bf16> want_full(full.bits.size()), want_sum(kvd.bits.size());
  for (int r = 0; r < n; ++r) {
    for (int hh = 0; hh < h; ++hh) {
      for (int e = 0; e < d; ++e) want_full[(r * h + hh) * d + e] = kvd.bits[(r * kv + hh / group) * d + e];
    }
    for (int j = 0; j < kv; ++j) {
      for (int e = 0; e < d; ++e) {
        float sum = 0.f;
        for (int g = 0; g < group; ++g) sum += full.values[(r * h + j * group + g) * d + e];
        want_sum[(r * kv + j) * d + e] = ToBf16(sum);
      }
    }
  }
  EXPECT_EQ(d_full.Host(), want_full);
  EXPECT_EQ(d_sum.Host(), want_sum);
}

}  // namespace
}  // namespace tierd::trainer::gpu
