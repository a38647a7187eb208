// Every GPU kernel against the CPU reference (trainer_ref/cpu_ops, optimizer) on random
// inputs, never zeros. Inputs are rounded to bf16 first and the reference runs in fp32 on
// the rounded values, so what is compared is the kernel's arithmetic and its output
// rounding. Tolerances, per output dtype:
//   bf16 outputs:   |gpu - cpu| <= 2^-7 |cpu| + atol (one bf16 rounding is <= 2^-9 relative;
//                   a value summed in fp32 then rounded once stays well inside 2^-7)
//   fp32 outputs:   1e-5 relative (+ atol), 1e-4 where atomics sum in another order
// Needs a CUDA device: without one every test is skipped (and says so).
#include "trainer_ref/kernels/gpu_ops.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "trainer_ref/adamw8bit.h"
#include "trainer_ref/cpu_ops.h"
#include "trainer_ref/host_adamw.h"
#include "trainer_ref/kernels/attention_tc.h"
#include "trainer_ref/kernels/gemm.h"
#include "trainer_ref/kernels/gpu_test_util.h"
#include "trainer_ref/kernels/init_normal.h"
#include "trainer_ref/optimizer.h"

namespace tierd::trainer::gpu {
namespace {

using testing::Bf16Data;
using testing::CompareBf16;
using testing::CompareF32;
using testing::Device;
using testing::Floats;
using testing::HaveGpu;
using testing::Random;

TEST(GpuOpsTest, Bf16RoundingMatchesTheDevice) {
  // Host conversions: exact for representable values, nearest-even otherwise.
  EXPECT_EQ(FromBf16(ToBf16(1.0f)), 1.0f);
  EXPECT_EQ(FromBf16(ToBf16(-2.5f)), -2.5f);
  EXPECT_EQ(FromBf16(ToBf16(1.0f + 1.0f / 256)), 1.0f);           // a tie: to even (1.0)
  EXPECT_EQ(FromBf16(ToBf16(1.0f + 3.0f / 256)), 1.0f + 4.0f / 256);  // a tie: to even (1 + 2/128)
  EXPECT_TRUE(std::isnan(FromBf16(ToBf16(std::nanf("")))));
}

std::vector<float> RandomFloats(size_t n, std::mt19937_64& rng, float scale = 1.f) {
  std::normal_distribution<float> normal(0.f, scale);
  std::vector<float> out(n);
  for (float& x : out) {
    x = normal(rng);
    if (x == 0.f) x = scale * 1e-3f;
  }
  return out;
}

TEST(GpuOpsTest, EmbeddingForwardAndBackward) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(1);
  const int n = 777, c = 300, v = 50;  // each token on ~15 rows; 300 columns: two column blocks
  const Bf16Data wte = Random(size_t{v} * c, rng);
  std::vector<int32_t> tokens(n);
  for (int& t : tokens) t = static_cast<int>(rng() % v);
  Device<Bf16> d_wte(wte.bits);
  Device<float> d_out{std::vector<float>(size_t{n} * c)};
  Device<int32_t> d_tokens(tokens);
  EmbeddingForward(d_out.get(), d_tokens.get(), d_wte.get(), n, c, v, nullptr);
  std::vector<float> cpu(size_t{n} * c);
  cpu::EmbeddingForward(cpu.data(), tokens.data(), wte.values.data(), n, c);
  EXPECT_EQ(CompareF32(d_out.Host(), cpu, 0.f, 0.f, "embedding out (exact)"), 0);

  const std::vector<float> dout = RandomFloats(size_t{n} * c, rng);
  std::vector<float> dwte(size_t{v} * c, 0.25f);
  const TokenSegments segments = SegmentTokens(tokens.data(), n, v);
  EXPECT_EQ(segments.rows, n);
  EXPECT_EQ(segments.segments, v);
  Device<int32_t> d_index(segments.index);
  std::vector<float> first;
  for (int run = 0; run < 2; ++run) {  // deterministic: the same bits twice
    Device<float> d_dout(dout), d_dwte(dwte);
    EmbeddingBackward(d_dwte.get(), d_dout.get(), d_index.get(), segments.rows, segments.segments, c, nullptr);
    if (run == 0) {
      first = d_dwte.Host();
    } else {
      EXPECT_EQ(std::memcmp(first.data(), d_dwte.Host().data(), first.size() * 4), 0) << "not deterministic";
    }
  }
  cpu::EmbeddingBackward(dwte.data(), dout.data(), tokens.data(), n, c);
  EXPECT_EQ(CompareF32(first, dwte, 1e-4f, 1e-5f, "dwte"), 0);
}

// The rows grouped by token for the embedding's backward (host code): stable within a token,
// tokens outside [0, V) left out, absent tokens no segment.
TEST(GpuOpsTest, TokenSegmentsGroupRowsByTokenInOrder) {
  const std::vector<int32_t> tokens = {3, 1, 3, -1, 7, 1, 3, 9};  // V = 8: 9 and -1 are outside
  const TokenSegments s = SegmentTokens(tokens.data(), static_cast<int>(tokens.size()), 8);
  EXPECT_EQ(s.rows, 6);
  EXPECT_EQ(s.segments, 3);
  const std::vector<int32_t> want = {1, 5, 0, 2, 6, 4,  // rows: token 1's, token 3's, token 7's
                                     0, 2, 5, 6,        // segment starts, then the end
                                     1, 3, 7};          // segment tokens
  EXPECT_EQ(s.index, want);
  const TokenSegments none = SegmentTokens(tokens.data(), 0, 8);
  EXPECT_EQ(none.segments, 0);
  EXPECT_EQ(none.index, std::vector<int32_t>{0});
}

// The residual stream is fp32: the norm reads it, its gradient adds into it.
TEST(GpuOpsTest, RmsNormForwardAndBackward) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(2);
  for (int c : {64, 1000, 1001, 4096}) {  // 1001: the scalar loops (C not a multiple of 4)
    const int n = 133;  // three chunks of rows for the weight gradient, the last one short
    const std::vector<float> in = RandomFloats(size_t{n} * c, rng, 2.f), din0 = RandomFloats(size_t{n} * c, rng);
    const Bf16Data dout = Random(size_t{n} * c, rng);
    std::vector<float> weight(c);
    std::normal_distribution<float> w(1.f, 0.1f);
    for (float& x : weight) x = w(rng);
    Device<float> d_in(in), d_din(din0), d_weight(weight), d_rstd{std::vector<float>(n)},
        d_dweight{std::vector<float>(static_cast<size_t>(c), 0.5f)},
        d_again{std::vector<float>(static_cast<size_t>(c), 0.5f)},
        d_scratch{std::vector<float>(static_cast<size_t>(RmsNormScratchFloats(n, c)))}, d_din_again(din0);
    Device<Bf16> d_out{std::vector<Bf16>(size_t{n} * c)}, d_dout(dout.bits);
    RmsNormForward(d_out.get(), d_rstd.get(), d_in.get(), d_weight.get(), n, c, 1e-5f, nullptr);
    RmsNormBackward(d_din.get(), d_dweight.get(), d_dout.get(), d_in.get(), d_weight.get(), d_rstd.get(), n, c,
                    d_scratch.get(), nullptr);
    RmsNormBackward(d_din_again.get(), d_again.get(), d_dout.get(), d_in.get(), d_weight.get(), d_rstd.get(), n, c,
                    d_scratch.get(), nullptr);
    EXPECT_EQ(std::memcmp(d_dweight.Host().data(), d_again.Host().data(), static_cast<size_t>(c) * 4), 0) << "not deterministic";
    std::vector<float> out(size_t{n} * c), rstd(n), din = din0, dweight(c, 0.5f);
    cpu::RmsNormForward(out.data(), rstd.data(), in.data(), weight.data(), n, c, 1e-5f);
    cpu::RmsNormBackward(din.data(), dweight.data(), dout.values.data(), in.data(), weight.data(), rstd.data(), n, c);
    const std::string at = " (C " + std::to_string(c) + ")";
    EXPECT_EQ(CompareBf16(Floats(d_out.Host()), out, 1e-6f, "rmsnorm out" + at), 0);
    EXPECT_EQ(CompareF32(d_rstd.Host(), rstd, 1e-5f, 0.f, "rstd" + at), 0);
    EXPECT_EQ(CompareF32(d_din.Host(), din, 1e-4f, 1e-5f, "rmsnorm din (fp32)" + at), 0);
    EXPECT_EQ(CompareF32(d_dweight.Host(), dweight, 1e-4f, 1e-4f, "rmsnorm dweight" + at), 0);
  }
}

TEST(GpuOpsTest, RopeForwardAndBackward) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(3);
  struct Shape {
    int b, t, h, d;
  };
  for (const Shape& s : {Shape{2, 37, 4, 32}, Shape{2, 37, 3, 6}}) {  // 16-byte groups of pairs; single pairs
    const int b = s.b, t = s.t, h = s.h, d = s.d;
    const std::string at = " (D " + std::to_string(d) + ")";
    const Bf16Data x = Random(static_cast<size_t>(b) * t * h * d, rng);
    Device<Bf16> d_x(x.bits);
    RopeForward(d_x.get(), b, t, h, d, 10000.f, nullptr);
    std::vector<float> cpu = x.values;
    cpu::RopeForward(cpu.data(), b, t, h, d, 10000.f);
    EXPECT_EQ(CompareBf16(Floats(d_x.Host()), cpu, 1e-3f, "rope forward" + at), 0);
    Device<Bf16> d_dx(x.bits);
    RopeBackward(d_dx.get(), b, t, h, d, 10000.f, nullptr);
    std::vector<float> back = x.values;
    cpu::RopeBackward(back.data(), b, t, h, d, 10000.f);
    EXPECT_EQ(CompareBf16(Floats(d_dx.Host()), back, 1e-3f, "rope backward" + at), 0);
  }
}

TEST(GpuOpsTest, SwiGluAndAdd) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(4);
  const int n = 45, f = 300;
  const size_t count = size_t{n} * f;
  const Bf16Data gate = Random(count, rng, 2.f), up = Random(count, rng), dout = Random(count, rng),
                 dgate0 = Random(count, rng), dup0 = Random(count, rng);
  // The backward writes its outputs: what was there before (random here) must not show.
  Device<Bf16> d_gate(gate.bits), d_up(up.bits), d_out{std::vector<Bf16>(count)}, d_dout(dout.bits),
      d_dgate(dgate0.bits), d_dup(dup0.bits);
  SwiGluForward(d_out.get(), d_gate.get(), d_up.get(), n, f, nullptr);
  SwiGluBackward(d_dgate.get(), d_dup.get(), d_dout.get(), d_gate.get(), d_up.get(), n, f, nullptr);
  std::vector<float> out(count), dgate(count, 0.f), dup(count, 0.f);
  cpu::SwiGluForward(out.data(), gate.values.data(), up.values.data(), n, f);
  cpu::SwiGluBackward(dgate.data(), dup.data(), dout.values.data(), gate.values.data(), up.values.data(), n, f);
  EXPECT_EQ(CompareBf16(Floats(d_out.Host()), out, 1e-4f, "swiglu out"), 0);
  EXPECT_EQ(CompareBf16(Floats(d_dgate.Host()), dgate, 1e-3f, "swiglu dgate"), 0);
  EXPECT_EQ(CompareBf16(Floats(d_dup.Host()), dup, 1e-3f, "swiglu dup"), 0);
  // The residual stream: x (fp32) += y (bf16); and its bf16 copy for the GEMMs.
  const std::vector<float> x0 = RandomFloats(count, rng);
  Device<float> d_x(x0);
  AddInto(d_x.get(), d_up.get(), static_cast<int64_t>(count), nullptr);
  std::vector<float> sum(count);
  for (size_t i = 0; i < count; ++i) sum[i] = x0[i] + up.values[i];
  EXPECT_EQ(CompareF32(d_x.Host(), sum, 1e-7f, 0.f, "add into"), 0);
  Device<Bf16> d_x16{std::vector<Bf16>(count)};
  ToBf16(d_x16.get(), d_x.get(), static_cast<int64_t>(count), nullptr);
  const std::vector<Bf16> x16 = d_x16.Host();
  for (size_t i = 0; i < count; ++i) ASSERT_EQ(x16[i], ToBf16(sum[i])) << "element " << i;
}

// The element-wise kernels take 16-byte accesses only when every pointer is aligned: one
// element in, they take the one-value loop, with the same results.
TEST(GpuOpsTest, ElementwiseKernelsOnUnalignedPointers) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(14);
  const int n = 1, f = 999;
  const size_t count = size_t{n} * f;
  const Bf16Data gate = Random(count + 1, rng, 2.f), up = Random(count + 1, rng), dout = Random(count + 1, rng);
  Device<Bf16> d_gate(gate.bits), d_up(up.bits), d_dout(dout.bits), d_out{std::vector<Bf16>(count + 1)},
      d_dgate{std::vector<Bf16>(count + 1)}, d_dup{std::vector<Bf16>(count + 1)};
  SwiGluForward(d_out.get() + 1, d_gate.get() + 1, d_up.get() + 1, n, f, nullptr);
  SwiGluBackward(d_dgate.get() + 1, d_dup.get() + 1, d_dout.get() + 1, d_gate.get() + 1, d_up.get() + 1, n, f, nullptr);
  std::vector<float> out(count), dgate(count, 0.f), dup(count, 0.f);
  cpu::SwiGluForward(out.data(), gate.values.data() + 1, up.values.data() + 1, n, f);
  cpu::SwiGluBackward(dgate.data(), dup.data(), dout.values.data() + 1, gate.values.data() + 1, up.values.data() + 1, n,
                      f);
  auto tail = [](const std::vector<Bf16>& v) { return Floats(std::vector<Bf16>(v.begin() + 1, v.end())); };
  EXPECT_EQ(CompareBf16(tail(d_out.Host()), out, 1e-4f, "swiglu out (unaligned)"), 0);
  EXPECT_EQ(CompareBf16(tail(d_dgate.Host()), dgate, 1e-3f, "swiglu dgate (unaligned)"), 0);
  EXPECT_EQ(CompareBf16(tail(d_dup.Host()), dup, 1e-3f, "swiglu dup (unaligned)"), 0);
  const std::vector<float> x0 = RandomFloats(count + 1, rng);
  Device<float> d_x(x0);
  AddInto(d_x.get() + 1, d_up.get() + 1, static_cast<int64_t>(count), nullptr);
  Device<Bf16> d_x16{std::vector<Bf16>(count + 1)};
  ToBf16(d_x16.get() + 1, d_x.get() + 1, static_cast<int64_t>(count), nullptr);
  const std::vector<float> x = d_x.Host();
  const std::vector<Bf16> x16 = d_x16.Host();
  for (size_t i = 1; i <= count; ++i) {
    ASSERT_EQ(x[i], x0[i] + up.values[i]) << "add into, element " << i;
    ASSERT_EQ(x16[i], ToBf16(x[i])) << "to bf16, element " << i;
  }
  EXPECT_EQ(x[0], x0[0]) << "the element before the range was written";
}

TEST(GpuOpsTest, CrossEntropyLossAndGradient) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(5);
  for (int v : {50, 32000}) {
    const int n = 19;
    const Bf16Data logits = Random(size_t{n} * v, rng, 3.f);
    std::vector<int32_t> targets(n);
    for (int& t : targets) t = static_cast<int>(rng() % v);
    targets[3] = -1;  // ignored
    int counted = 0;
    for (int t : targets) counted += t >= 0;
    Device<Bf16> d_logits(logits.bits), d_dlogits{std::vector<Bf16>(size_t{n} * v)};
    Device<int32_t> d_targets(targets);
    Device<float> d_losses{std::vector<float>(n)};
    CrossEntropy(d_losses.get(), d_dlogits.get(), d_logits.get(), d_targets.get(), n, v, counted, nullptr);
    const std::vector<float> losses = d_losses.Host();
    double mean = 0;
    for (float l : losses) mean += l / counted;
    EXPECT_EQ(losses[3], 0.f) << "an ignored row has no loss";
    const float cpu_loss = cpu::CrossEntropyForward(logits.values.data(), targets.data(), n, v);
    EXPECT_NEAR(mean, cpu_loss, 1e-4 * std::fabs(cpu_loss)) << "V " << v;
    std::vector<float> dlogits(size_t{n} * v);
    cpu::CrossEntropyBackward(dlogits.data(), logits.values.data(), targets.data(), n, v);
    EXPECT_EQ(CompareBf16(Floats(d_dlogits.Host()), dlogits, 1e-8f, "dlogits (V " + std::to_string(v) + ")"), 0);
  }
}

TEST(GpuOpsTest, AdamWMatchesTheCpuOptimizer) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(6);
  const int64_t n = 10007;
  std::normal_distribution<float> normal(0.f, 0.02f);
  std::vector<float> grads(n);
  for (float& g : grads) g = normal(rng) * 0.5f;
  std::vector<float> master(n), m(n), v(n);
  for (int64_t i = 0; i < n; ++i) {
    master[i] = normal(rng);
    m[i] = normal(rng) * 0.1f;
    v[i] = std::fabs(normal(rng)) * 1e-3f + 1e-6f;
  }
  AdamWParams p;
  p.lr = 3e-4f;
  p.step = 7;
  p.grad_scale = 0.5f;
  Device<float> d_master(master), d_m(m), d_v(v);
  Device<Bf16> d_w{std::vector<Bf16>(n)};
  Device<float> d_g(grads);
  AdamW(d_master.get(), d_m.get(), d_v.get(), d_w.get(), d_g.get(), n, p, nullptr);
  std::vector<float> g(n);
  for (int64_t i = 0; i < n; ++i) g[i] = grads[i] * p.grad_scale;
  AdamWOptions o;
  o.beta1 = p.beta1;
  o.beta2 = p.beta2;
  o.eps = p.eps;
  o.weight_decay = p.weight_decay;
  AdamWStep(master.data(), g.data(), m.data(), v.data(), n, p.lr, p.step, o, /*decay=*/true);
  EXPECT_EQ(CompareF32(d_master.Host(), master, 1e-5f, 1e-7f, "master"), 0);
  EXPECT_EQ(CompareF32(d_m.Host(), m, 1e-5f, 1e-9f, "m"), 0);
  EXPECT_EQ(CompareF32(d_v.Host(), v, 1e-5f, 1e-12f, "v"), 0);
  EXPECT_EQ(CompareBf16(Floats(d_w.Host()), master, 0.f, "bf16 weights"), 0);
}

// The host optimizer (trainer_ref/host_adamw, for state that lives in DRAM) and the kernel
// give the same bits: a run may step either place and stay the same run.
TEST(GpuOpsTest, AdamWOnTheHostGivesTheKernelsBits) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(16);
  const int64_t n = 100003;
  std::normal_distribution<float> normal(0.f, 0.02f);
  std::vector<float> grads(n), master(n), m(n), v(n);
  for (int64_t i = 0; i < n; ++i) {
    grads[i] = normal(rng) * 3.f;
    master[i] = normal(rng);
    m[i] = normal(rng) * 0.1f;
    v[i] = std::fabs(normal(rng)) * 1e-3f + 1e-7f;
  }
  for (bool decay : {true, false}) {
    AdamWParams p;
    p.lr = 1e-3f;
    p.step = 3;
    p.grad_scale = 0.37f;
    p.decay = decay;
    Device<float> d_master(master), d_m(m), d_v(v), d_g(grads);
    Device<Bf16> d_w{std::vector<Bf16>(n)};
    AdamW(d_master.get(), d_m.get(), d_v.get(), d_w.get(), d_g.get(), n, p, nullptr);
    std::vector<float> h_master = master, h_m = m, h_v = v;
    std::vector<uint16_t> h_w(n);
    HostAdamW(h_master.data(), h_m.data(), h_v.data(), h_w.data(), grads.data(), n, p);
    const std::vector<float> g_master = d_master.Host(), g_m = d_m.Host(), g_v = d_v.Host();
    const std::vector<Bf16> g_w = d_w.Host();
    int64_t differ = 0;
    for (int64_t i = 0; i < n; ++i) {
      differ += std::memcmp(&g_master[i], &h_master[i], 4) != 0 || std::memcmp(&g_m[i], &h_m[i], 4) != 0 ||
                std::memcmp(&g_v[i], &h_v[i], 4) != 0 || g_w[i] != h_w[i];
    }
    EXPECT_EQ(differ, 0) << "of " << n << " elements differ in some bit (decay " << decay << ")";
  }
}

// The initial weights: every element equals the host's InitNormalValue (double-precision
// log/sin/cos on either side: at most an ulp of fp32 apart), bf16 weights the master's
// rounding, a range that starts mid-slice and crosses slices; constants exactly.
TEST(GpuOpsTest, InitialWeightsMatchTheHostsValues) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(5);
  const int64_t begin = 70001, count = 3 * 65536 + 77;  // odd start and count, four slices
  const uint64_t seed = rng() % 1000, entry = rng() % 100;
  Device<float> master(std::vector<float>(count, -9.f));
  Device<Bf16> weights(std::vector<Bf16>(count, 0xFFFF));
  InitNormal(master.get(), weights.get(), begin, count, seed, entry, 0.02, nullptr);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
  const std::vector<float> m = master.Host();
  const std::vector<Bf16> w = weights.Host();
  double sum = 0, squares = 0;
  for (int64_t i = 0; i < count; ++i) {
    const float want = InitNormalValue(seed, entry, static_cast<uint64_t>(begin + i), 0.02);
    ASSERT_NEAR(m[i], want, 1e-6f * std::abs(want) + 1e-12f) << "element " << begin + i;
    ASSERT_EQ(w[i], ToBf16(m[i])) << "element " << begin + i;
    sum += m[i];
    squares += double(m[i]) * m[i];
  }
  EXPECT_NEAR(sum / count, 0.0, 0.02 * 5 / std::sqrt(double(count)));  // N(0, 0.02)
  EXPECT_NEAR(std::sqrt(squares / count), 0.02, 0.0005);
  InitConstant(master.get(), weights.get(), 1000, 1.f, nullptr);
  const std::vector<float> ones = master.Host();
  const std::vector<Bf16> one_bits = weights.Host();
  for (int i = 0; i < 1000; ++i) ASSERT_TRUE(ones[i] == 1.f && one_bits[i] == ToBf16(1.f)) << i;
  EXPECT_EQ(ones[1000], m[1000]) << "nothing written past the count";
}

// Three 8-bit steps on the GPU and on the host from the same random state: the same bits.
void AdamW8bitAgainstTheHost() {
  std::mt19937 rng(17);
  std::normal_distribution<float> normal(0, 1);
  const int64_t n = 45 * q8::kQuantBlock + 99;
  std::vector<float> master(n), grads(n), m0(n), v0(n);
  for (int64_t i = 0; i < n; ++i) {
    master[i] = 0.02f * normal(rng);
    grads[i] = 1e-2f * normal(rng) * (1 + i % 13);
    m0[i] = 1e-3f * normal(rng);
    v0[i] = 1e-6f * std::fabs(normal(rng));
  }
  const uint64_t bytes = Moment8bitBytes(n);
  std::vector<uint8_t> m(bytes), v(bytes);
  Quantize8bit(m0.data(), n, true, m.data());
  Quantize8bit(v0.data(), n, false, v.data());
  Device<float> d_master(master), d_grads(grads);
  Device<uint8_t> d_m(m), d_v(v);
  Device<Bf16> d_weights(std::vector<Bf16>(n, 0));
  std::vector<uint16_t> weights(n);
  AdamWParams p;
  p.lr = 3e-3f;
  p.grad_scale = 0.5f;
  for (int step = 1; step <= 3; ++step) {
    p.step = step;
    p.decay = step != 2;
    ASSERT_EQ(AdamW8bit(d_master.get(), d_m.get(), d_v.get(), d_weights.get(), d_grads.get(), n, p, nullptr),
              cudaSuccess);
    HostAdamW8bit(master.data(), m.data(), v.data(), weights.data(), grads.data(), n, p);
  }
  EXPECT_EQ(d_master.Host(), master);
  EXPECT_EQ(d_m.Host(), m);
  EXPECT_EQ(d_v.Host(), v);
  const std::vector<Bf16> w = d_weights.Host();
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(w[i], weights[i]) << i;
}

// AdamW with 8-bit blockwise moments: the kernel gives the host's HostAdamW8bit bits (master,
// bf16 weights, codes and scales) over three steps from random moments, on a size that ends
// mid-block in a CUDA block whose last warps have no quantization block; both ways of finding
// the codes (GpuCodePath: the search, the tables).
TEST(GpuOpsTest, AdamW8bitGivesTheHostsBits) {
  SKIP_WITHOUT_GPU();
  const std::string was = GpuCodePath();
  for (const char* path : {"search", "table"}) {
    SCOPED_TRACE(path);
    ASSERT_EQ(std::string(UseGpuCodePath(path)), path);
    AdamW8bitAgainstTheHost();
  }
  UseGpuCodePath(was);
}

// bf16 gradients (the compact state keeps them so after accumulating in fp32): both steps,
// fp32 and 8-bit moments, give the host's bits for the fp32 values the bf16 ones round to.
TEST(GpuOpsTest, AdamWFromBf16GradientsGivesTheHostsBitsOfTheRoundedValues) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(23);
  std::normal_distribution<float> normal(0, 1);
  const int64_t n = 3 * 2048 + 517;
  std::vector<float> master(n), rounded(n), m(n), v(n);
  std::vector<Bf16> grads(n);
  for (int64_t i = 0; i < n; ++i) {
    master[i] = 0.02f * normal(rng);
    grads[i] = ToBf16(3e-3f * normal(rng) * (1 + i % 7));
    rounded[i] = FromBf16(grads[i]);
    m[i] = 1e-3f * normal(rng);
    v[i] = 1e-6f * std::fabs(normal(rng)) + 1e-9f;
  }
  AdamWParams p;
  p.lr = 2e-3f;
  p.step = 4;
  p.grad_scale = 0.7f;
  {
    Device<float> d_master(master), d_m(m), d_v(v);
    Device<Bf16> d_g(grads), d_w{std::vector<Bf16>(n)};
    AdamW(d_master.get(), d_m.get(), d_v.get(), d_w.get(), d_g.get(), n, p, nullptr);
    std::vector<float> h_master = master, h_m = m, h_v = v;
    std::vector<uint16_t> h_w(n);
    HostAdamW(h_master.data(), h_m.data(), h_v.data(), h_w.data(), rounded.data(), n, p);
    EXPECT_EQ(d_master.Host(), h_master);
    EXPECT_EQ(d_m.Host(), h_m);
    EXPECT_EQ(d_v.Host(), h_v);
    EXPECT_EQ(d_w.Host(), h_w);
  }
  const uint64_t bytes = Moment8bitBytes(n);
  std::vector<uint8_t> m8(bytes), v8(bytes);
  Quantize8bit(m.data(), n, true, m8.data());
  Quantize8bit(v.data(), n, false, v8.data());
  Device<float> d_master(master);
  Device<uint8_t> d_m(m8), d_v(v8);
  Device<Bf16> d_g(grads), d_w{std::vector<Bf16>(n)};
  ASSERT_EQ(AdamW8bit(d_master.get(), d_m.get(), d_v.get(), d_w.get(), d_g.get(), n, p, nullptr), cudaSuccess);
  std::vector<uint16_t> h_w(n);
  HostAdamW8bit(master.data(), m8.data(), v8.data(), h_w.data(), rounded.data(), n, p);
  EXPECT_EQ(d_master.Host(), master);
  EXPECT_EQ(d_m.Host(), m8);
  EXPECT_EQ(d_v.Host(), v8);
  EXPECT_EQ(d_w.Host(), h_w);
}

TEST(GpuOpsTest, SumOfSquaresForTheGradientNorm) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(9);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> x(1000003);
  for (float& f : x) f = normal(rng);
  Device<float> d_x(x), d_out{std::vector<float>{2.f}}, d_again{std::vector<float>{2.f}},
      d_scratch{std::vector<float>(kSumSquaresScratch)};
  SumSquares(d_x.get(), static_cast<int64_t>(x.size()), d_out.get(), d_scratch.get(), nullptr);
  SumSquares(d_x.get(), static_cast<int64_t>(x.size()), d_again.get(), d_scratch.get(), nullptr);
  double cpu = 2;
  for (float f : x) cpu += double{f} * f;
  EXPECT_NEAR(d_out.Host()[0], cpu, 1e-5 * cpu);
  EXPECT_EQ(std::memcmp(d_out.Host().data(), d_again.Host().data(), 4), 0) << "not deterministic";
}

// Sums of many bf16 products: the reference sums the same rounded inputs in fp32, the GPU
// in fp32 in another order, and rounds once; atol covers cancellation near zero.
TEST(GpuOpsTest, MatmulForwardAndBackwardThroughCublasLt) {
  SKIP_WITHOUT_GPU();
  auto gemm = Gemm::Create();
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  std::mt19937_64 rng(7);
  const int n = 100, ic = 96, oc = 130;
  const Bf16Data in = Random(size_t{n} * ic, rng), w = Random(size_t{oc} * ic, rng, 0.1f),
                 dout = Random(size_t{n} * oc, rng), din0 = Random(size_t{n} * ic, rng),
                 dw0 = Random(size_t{oc} * ic, rng);
  Device<Bf16> d_in(in.bits), d_w(w.bits), d_out{std::vector<Bf16>(size_t{n} * oc)}, d_dout(dout.bits),
      d_din(din0.bits);
  Device<float> d_dw(dw0.values);
  ASSERT_TRUE((*gemm)->Forward(d_out.get(), d_in.get(), d_w.get(), n, ic, oc, nullptr).ok());
  ASSERT_TRUE((*gemm)->Backward(d_din.get(), d_dw.get(), d_dout.get(), d_in.get(), d_w.get(), n, ic, oc, nullptr).ok());
  std::vector<float> out(size_t{n} * oc), din = din0.values, dw = dw0.values;
  cpu::MatmulForward(out.data(), in.values.data(), w.values.data(), n, ic, oc);
  cpu::MatmulBackward(din.data(), dw.data(), dout.values.data(), in.values.data(), w.values.data(), n, ic, oc);
  EXPECT_EQ(CompareBf16(Floats(d_out.Host()), out, 1e-2f, "matmul out"), 0);
  EXPECT_EQ(CompareBf16(Floats(d_din.Host()), din, 1e-2f, "matmul din"), 0);
  EXPECT_EQ(CompareF32(d_dw.Host(), dw, 1e-4f, 1e-4f, "matmul dweight (fp32)"), 0);
  // Accumulating forward: out += in x w^T.
  ASSERT_TRUE((*gemm)->Forward(d_out.get(), d_in.get(), d_w.get(), n, ic, oc, nullptr, /*accumulate=*/true).ok());
  for (float& x : out) x *= 2;
  EXPECT_EQ(CompareBf16(Floats(d_out.Host()), out, 2e-2f, "matmul out, accumulated"), 0);
  // A first contribution: din = dout x w, whatever din held (din0 + the first backward here).
  ASSERT_TRUE((*gemm)
                  ->Backward(d_din.get(), nullptr, d_dout.get(), d_in.get(), d_w.get(), n, ic, oc, nullptr,
                             /*accumulate_din=*/false)
                  .ok());
  std::vector<float> din_only(size_t{n} * ic, 0.f), unused(size_t{oc} * ic, 0.f);
  cpu::MatmulBackward(din_only.data(), unused.data(), dout.values.data(), in.values.data(), w.values.data(), n, ic, oc);
  EXPECT_EQ(CompareBf16(Floats(d_din.Host()), din_only, 1e-2f, "matmul din, written"), 0);
}

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
    cpu::AttentionForward(out.data(), att.data(), q.values.data(), k.values.data(), v.values.data(), b, t, h, d);
    cpu::AttentionBackward(dq.data(), dk.data(), dv.data(), dout.values.data(), att.data(), q.values.data(),
                           k.values.data(), v.values.data(), b, t, h, d);
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
