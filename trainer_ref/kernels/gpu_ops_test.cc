// The GPU's kernels against the CPU reference (trainer_ref/cpu_ops) on random inputs, never
// zeros (attention: gpu_attention_test.cc; the optimizers: gpu_optimizer_test.cc). Inputs are rounded to bf16 first and
// the reference runs in fp32 on the rounded values, so what is compared is the kernel's arithmetic and its output
// rounding. Tolerances, per output dtype:
//   bf16 outputs:   |gpu - cpu| <= 2^-7 |cpu| + atol (one bf16 rounding is <= 2^-9 relative;
//                   a value summed in fp32 then rounded once stays well inside 2^-7)
//   fp32 outputs:   1e-5 relative (+ atol), 1e-4 where atomics sum in another order
// Needs a CUDA device: without one every test is skipped (and says so).
#include "trainer_ref/kernels/gpu_ops.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "trainer_ref/cpu_ops.h"
#include "trainer_ref/kernels/fp8_ops.h"
#include "trainer_ref/kernels/gemm.h"
#include "trainer_ref/kernels/gpu_test_util.h"
#include "trainer_ref/kernels/init_normal.h"
#include "trainer_ref/model_config.h"

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

// Programmatic dependent launch: the kernels that may start while the one before them drains
// wait for its writes. A chain of them, each reading what the one before wrote (a norm, its
// FP8 codes plain and transposed, current scaling's amax and scale, the norm's backward and
// its weight-gradient sum, the gradient's sum of squares, RoPE in place, a plain kernel's
// residual add between), eight times over on one stream, gives the bits of the same chain
// launched plainly. A kernel reading before its wait would race and differ.
TEST(GpuOpsTest, KernelsStartedEarlyGiveThePlainLaunchesBits) {
  SKIP_WITHOUT_GPU();
  int device = 0, major = 0;
  ASSERT_EQ(cudaGetDevice(&device), cudaSuccess);
  ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device), cudaSuccess);
  const int b = 2, t = 1024, heads = 8, d = 128, n = b * t, c = heads * d;
  const int64_t nc = int64_t{n} * c;
  std::mt19937_64 rng(31);
  const std::vector<float> x0 = RandomFloats(nc, rng), w0 = RandomFloats(c, rng, 0.5f);
  std::vector<double> inv_freq(d / 2);
  for (int i = 0; i < d / 2; ++i) inv_freq[i] = std::pow(10000.0, -2.0 * i / d);
  const RopeFrequencies freq = RopeFrequenciesOf(inv_freq);
  struct Outputs {
    std::vector<float> x, dx, dweight, slots, norm;
    std::vector<uint8_t> codes, codes_t, codes_current;
  };
  auto run = [&](bool early) {
    EXPECT_EQ(UsePdl(early), early && major >= 9);
    cudaStream_t stream = nullptr;
    EXPECT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    Device<float> x(x0), weight(w0), rstd{std::vector<float>(n)}, dx{std::vector<float>(nc, 0.f)},
        dweight{std::vector<float>(c, 0.f)}, scratch{std::vector<float>(RmsNormScratchFloats(n, c))},
        sums{std::vector<float>(kSumSquaresScratch)}, norm{std::vector<float>(1, 0.f)};
    // {scale_inv, scale, running amax, amax} for the current scaling; a fixed scale at 8 for the transposed codes.
    Device<float> slots{std::vector<float>{1.f, 1.f, 0.f, 0.f, 0.125f, 8.f, 0.f, 0.f}};
    Device<Bf16> h{std::vector<Bf16>(nc)};
    Device<uint8_t> codes{std::vector<uint8_t>(nc)}, codes_t{std::vector<uint8_t>(nc)},
        codes_current{std::vector<uint8_t>(nc)};
    for (int it = 0; it < 8; ++it) {
      RmsNormForward(h.get(), rstd.get(), x.get(), weight.get(), n, c, 1e-5f, stream);
      QuantizeFp8Transposed(codes_t.get(), h.get(), n, c, slots.get() + 5, false, stream, codes.get(),
                            slots.get() + 6);
      AbsMax(slots.get() + 3, h.get(), nc, stream);
      ScaleFromAmax(slots.get() + 1, slots.get(), slots.get() + 3, false, stream, slots.get() + 2);
      QuantizeFp8(codes_current.get(), h.get(), nc, slots.get() + 1, false, stream);
      RmsNormBackward(dx.get(), dweight.get(), h.get(), x.get(), weight.get(), rstd.get(), n, c, scratch.get(),
                      stream);
      SumSquares(dx.get(), nc, norm.get(), sums.get(), stream);
      RopeForward(h.get(), b, t, heads, d, freq, stream);
      AddInto(x.get(), h.get(), nc, stream);
    }
    EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    EXPECT_EQ(cudaStreamDestroy(stream), cudaSuccess);
    return Outputs{x.Host(), dx.Host(), dweight.Host(), slots.Host(), norm.Host(), codes.Host(), codes_t.Host(),
                   codes_current.Host()};
  };
  const Outputs plain = run(false), early = run(true);
  UsePdl(true);  // the default
  auto same = [](const auto& a, const auto& b) {
    return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(a[0])) == 0;
  };
  EXPECT_TRUE(same(plain.x, early.x));
  EXPECT_TRUE(same(plain.dx, early.dx));
  EXPECT_TRUE(same(plain.dweight, early.dweight));
  EXPECT_TRUE(same(plain.slots, early.slots));
  EXPECT_TRUE(same(plain.norm, early.norm));
  EXPECT_TRUE(same(plain.codes, early.codes));
  EXPECT_TRUE(same(plain.codes_t, early.codes_t));
  EXPECT_TRUE(same(plain.codes_current, early.codes_current));
  EXPECT_GT(plain.norm[0], 0.f);  // the chain did work: a gradient and its norm
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
  // 1001: the scalar loops (C not a multiple of 4); 1000 and 6144: rows that end inside a
  // thread's last registers (kPer 4 and 8 float4s a thread).
  for (int c : {64, 1000, 1001, 4096, 6144}) {
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
    // With din's bf16 copy written beside it (aligned, and one value in: the copy apart): the
    // same din, and its copy ToBf16's bits.
    for (int skip : {0, 1}) {
      Device<float> d_din_third(din0), d_dweight_third{std::vector<float>(static_cast<size_t>(c), 0.5f)};
      Device<Bf16> d_din16{std::vector<Bf16>(size_t{n} * c + 1)};
      RmsNormBackward(d_din_third.get(), d_dweight_third.get(), d_dout.get(), d_in.get(), d_weight.get(), d_rstd.get(),
                      n, c, d_scratch.get(), nullptr, d_din16.get() + skip);
      const std::vector<float> din_third = d_din_third.Host();
      EXPECT_EQ(din_third, d_din.Host()) << "C " << c << ", skip " << skip;
      const std::vector<Bf16> din16 = d_din16.Host();
      int64_t off = 0;
      for (size_t i = 0; i < din_third.size(); ++i) off += din16[skip + i] != ToBf16(din_third[i]);
      EXPECT_EQ(off, 0) << "C " << c << ", skip " << skip << ": bf16 copies other than ToBf16's";
    }
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

// A norm's random inputs: the residual stream x (N x C), a bf16 residual and weights near 1.
struct NormInputs {
  std::vector<float> x0;
  Bf16Data residual;
  std::vector<float> weight;
};
NormInputs RandomNormInputs(int n, int c, std::mt19937_64& rng) {
  const size_t nc = size_t{n} * c;
  NormInputs in{RandomFloats(nc, rng, 2.f), Random(nc, rng), std::vector<float>(c)};
  std::normal_distribution<float> w(1.f, 0.1f);
  for (float& v : in.weight) v = w(rng);
  return in;
}

// The fused norm (a residual added into x, x copied for the backward, then the norm) gives
// the bits of AddInto, a device copy and RmsNormForward in turn, and the CPU's values; so does
// each half alone (the copy without an add: a layer's first norm).
TEST(GpuOpsTest, ResidualRmsNormForwardIsAddCopyAndNormInOnePass) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(21);
  for (int c : {64, 1000, 1001, 4096}) {  // 1001: the scalar loops
    for (const bool add : {true, false}) {
      for (const bool copy : {true, false}) {
        const int n = 67;
        const size_t nc = size_t{n} * c;
        const auto [x0, residual, weight] = RandomNormInputs(n, c, rng);
        Device<float> d_x(x0), d_x_again(x0), d_weight(weight), d_saved{std::vector<float>(nc, -7.f)},
            d_saved_again{std::vector<float>(nc, -7.f)}, d_rstd{std::vector<float>(n)}, d_rstd_again{std::vector<float>(n)};
        Device<Bf16> d_residual(residual.bits), d_out{std::vector<Bf16>(nc)}, d_out_again{std::vector<Bf16>(nc)};
        ResidualRmsNormForward(d_out.get(), d_rstd.get(), d_x.get(), add ? d_residual.get() : nullptr,
                               copy ? d_saved.get() : nullptr, d_weight.get(), n, c, 1e-5f, nullptr);
        // The three kernels it stands for.
        if (add) AddInto(d_x_again.get(), d_residual.get(), static_cast<int64_t>(nc), nullptr);
        if (copy) {
          ASSERT_EQ(cudaMemcpy(d_saved_again.get(), d_x_again.get(), nc * sizeof(float), cudaMemcpyDeviceToDevice),
                    cudaSuccess);
        }
        RmsNormForward(d_out_again.get(), d_rstd_again.get(), d_x_again.get(), d_weight.get(), n, c, 1e-5f, nullptr);
        const std::string at = " (C " + std::to_string(c) + (add ? ", add" : "") + (copy ? ", copy" : "") + ")";
        EXPECT_EQ(d_x.Host(), d_x_again.Host()) << "x" << at;
        EXPECT_EQ(d_saved.Host(), d_saved_again.Host()) << "the copy" << at;
        EXPECT_EQ(d_out.Host(), d_out_again.Host()) << "the norm's output" << at;
        EXPECT_EQ(d_rstd.Host(), d_rstd_again.Host()) << "rstd" << at;
        // Against the CPU.
        std::vector<float> x = x0, out(nc), rstd(n);
        if (add) {
          for (size_t i = 0; i < nc; ++i) x[i] += residual.values[i];
        }
        cpu::RmsNormForward(out.data(), rstd.data(), x.data(), weight.data(), n, c, 1e-5f);
        EXPECT_EQ(CompareF32(d_x.Host(), x, 0.f, 0.f, "x" + at), 0);
        if (copy) EXPECT_EQ(CompareF32(d_saved.Host(), x, 0.f, 0.f, "the copy" + at), 0);
        EXPECT_EQ(CompareBf16(Floats(d_out.Host()), out, 1e-6f, "rmsnorm out" + at), 0);
        EXPECT_EQ(CompareF32(d_rstd.Host(), rstd, 1e-5f, 0.f, "rstd" + at), 0);
      }
    }
  }
}

// The norm of a sum left elsewhere (the residual stream carried into the next layer's first
// norm): ResidualRmsNormForward's bits for the output, rstd, the sum and its copy, with FP8
// codes too, and x itself unwritten.
TEST(GpuOpsTest, SumRmsNormForwardLeavesXAndGivesTheFusedNormsBits) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(22);
  Device<float> scale{std::vector<float>{5.f}};
  for (int c : {64, 1000, 1001, 4096}) {  // 1001: the scalar loops
    for (const bool to_sum : {true, false}) {
      for (const bool to_saved : {true, false}) {
        if (!to_sum && !to_saved) continue;
        const int n = 67;
        const size_t nc = size_t{n} * c;
        const auto [x0, residual, weight] = RandomNormInputs(n, c, rng);
        const std::vector<float> unset(nc, -7.f);
        Device<float> d_x(x0), d_sum(unset), d_saved(unset), d_rstd{std::vector<float>(n)}, d_amax{std::vector<float>{0.f}};
        Device<float> d_x_fused(x0), d_saved_fused(unset), d_rstd_fused{std::vector<float>(n)},
            d_amax_fused{std::vector<float>{0.f}}, d_weight(weight);
        Device<Bf16> d_residual(residual.bits), d_out{std::vector<Bf16>(nc)}, d_out_fused{std::vector<Bf16>(nc)};
        Device<uint8_t> d_codes{std::vector<uint8_t>(nc)}, d_codes_fused{std::vector<uint8_t>(nc)};
        SumRmsNormForward(d_out.get(), d_rstd.get(), d_x.get(), d_residual.get(), to_sum ? d_sum.get() : nullptr,
                          to_saved ? d_saved.get() : nullptr, d_weight.get(), n, c, 1e-5f, nullptr,
                          Fp8Out{d_codes.get(), scale.get(), d_amax.get()});
        ResidualRmsNormForward(d_out_fused.get(), d_rstd_fused.get(), d_x_fused.get(), d_residual.get(),
                               d_saved_fused.get(), d_weight.get(), n, c, 1e-5f, nullptr,
                               Fp8Out{d_codes_fused.get(), scale.get(), d_amax_fused.get()});
        const std::string at = " (C " + std::to_string(c) + (to_sum ? ", sum" : "") + (to_saved ? ", saved" : "") + ")";
        EXPECT_EQ(d_x.Host(), x0) << "x was written" << at;
        EXPECT_EQ(d_sum.Host(), to_sum ? d_x_fused.Host() : unset) << "the sum" << at;
        EXPECT_EQ(d_saved.Host(), to_saved ? d_saved_fused.Host() : unset) << "the copy" << at;
        EXPECT_EQ(d_out.Host(), d_out_fused.Host()) << "the norm's output" << at;
        EXPECT_EQ(d_rstd.Host(), d_rstd_fused.Host()) << "rstd" << at;
        EXPECT_EQ(d_codes.Host(), d_codes_fused.Host()) << "codes" << at;
        EXPECT_EQ(d_amax.Host(), d_amax_fused.Host()) << "amax" << at;
        // The sum against the CPU's.
        std::vector<float> x = x0;
        for (size_t i = 0; i < nc; ++i) x[i] += residual.values[i];
        EXPECT_EQ(CompareF32(to_sum ? d_sum.Host() : d_saved.Host(), x, 0.f, 0.f, "the sum" + at), 0);
      }
    }
  }
}

TEST(GpuOpsTest, RopeForwardAndBackward) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(3);
  struct Shape {
    int b, t, h, d;
  };
  // 16-byte groups of pairs; single pairs; Llama 3.1's scaled frequencies (llama3, factor 8).
  for (const Shape& s : {Shape{2, 37, 4, 32}, Shape{2, 37, 3, 6}, Shape{1, 300, 2, 128}}) {
    const int b = s.b, t = s.t, h = s.h, d = s.d;
    const std::string at = " (D " + std::to_string(d) + ")";
    ModelConfig config{"rope", 1, h * d, h, 16, 16, t};
    if (d == 128) {
      config.rope_theta = 500000;
      config.rope_scaling = {RopeScaling::Type::kLlama3, 8.0, 1.0, 4.0, 64};
    }
    const std::vector<double> freq = RopeInverseFrequencies(config);
    const RopeFrequencies table = RopeFrequenciesOf(freq);
    const Bf16Data x = Random(static_cast<size_t>(b) * t * h * d, rng);
    Device<Bf16> d_x(x.bits);
    RopeForward(d_x.get(), b, t, h, d, table, nullptr);
    std::vector<float> cpu = x.values;
    cpu::RopeForward(cpu.data(), b, t, h, d, freq.data());
    EXPECT_EQ(CompareBf16(Floats(d_x.Host()), cpu, 1e-3f, "rope forward" + at), 0);
    Device<Bf16> d_dx(x.bits);
    RopeBackward(d_dx.get(), b, t, h, d, table, nullptr);
    std::vector<float> back = x.values;
    cpu::RopeBackward(back.data(), b, t, h, d, freq.data());
    EXPECT_EQ(CompareBf16(Floats(d_dx.Host()), back, 1e-3f, "rope backward" + at), 0);
    // Queries and keys in one launch (keys with fewer heads, as grouped-query attention's;
    // the keys 8 bytes off alignment once: one pair a thread for both): the two launches' bits.
    for (const int offset : {0, 4}) {
      const int hk = std::max(1, h / 2);
      const Bf16Data keys = Random(static_cast<size_t>(b) * t * hk * d + offset, rng);
      Device<Bf16> d_q(x.bits), d_k(keys.bits), d_q1(x.bits), d_k1(keys.bits);
      RopeForwardPair(d_q.get(), h, d_k.get() + offset, hk, b, t, d, table, nullptr);
      RopeForward(d_q1.get(), b, t, h, d, table, nullptr);
      RopeForward(d_k1.get() + offset, b, t, hk, d, table, nullptr);
      EXPECT_EQ(d_q.Host(), d_q1.Host()) << "queries" << at << ", offset " << offset;
      EXPECT_EQ(d_k.Host(), d_k1.Host()) << "keys" << at << ", offset " << offset;
    }
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

// Both kernels: eight logits a load (V a multiple of 8, aligned rows: 56 has fewer loads than
// threads, 32,000 is the models') and one a load (V 50, or the arrays one value off alignment).
// Logits up to +-12 move each thread's running maximum many times along a row.
TEST(GpuOpsTest, CrossEntropyLossAndGradient) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(5);
  for (const auto& [v, offset] : std::vector<std::pair<int, int>>{{50, 0}, {56, 0}, {32000, 0}, {32000, 1}}) {
    const int n = 19;
    const std::string what = "V " + std::to_string(v) + (offset != 0 ? ", unaligned" : "");
    const Bf16Data logits = Random(size_t{n} * v, rng, v == 56 ? 12.f : 3.f);
    std::vector<int32_t> targets(n);
    for (int& t : targets) t = static_cast<int>(rng() % v);
    targets[3] = -1;  // ignored
    targets[5] = v - 1;  // the last logit of a row: the last load's last lane
    int counted = 0;
    for (int t : targets) counted += t >= 0;
    std::vector<Bf16> shifted(offset, Bf16{0});
    shifted.insert(shifted.end(), logits.bits.begin(), logits.bits.end());
    Device<Bf16> d_logits(shifted), d_dlogits{std::vector<Bf16>(size_t{n} * v + offset)};
    Device<int32_t> d_targets(targets);
    Device<float> d_losses{std::vector<float>(n)}, d_losses_only{std::vector<float>(n, -1.f)};
    CrossEntropy(d_losses.get(), d_dlogits.get() + offset, d_logits.get() + offset, d_targets.get(), n, v, counted,
                 nullptr);
    CrossEntropy(d_losses_only.get(), nullptr, d_logits.get() + offset, d_targets.get(), n, v, counted, nullptr);
    const std::vector<float> losses = d_losses.Host();
    EXPECT_EQ(d_losses_only.Host(), losses) << what << ": the loss without the gradient";
    double mean = 0;
    for (float l : losses) mean += l / counted;
    EXPECT_EQ(losses[3], 0.f) << "an ignored row has no loss";
    const float cpu_loss = cpu::CrossEntropyForward(logits.values.data(), targets.data(), n, v);
    EXPECT_NEAR(mean, cpu_loss, 1e-4 * std::fabs(cpu_loss)) << what;
    std::vector<float> dlogits(size_t{n} * v);
    cpu::CrossEntropyBackward(dlogits.data(), logits.values.data(), targets.data(), n, v);
    std::vector<Bf16> got = d_dlogits.Host();
    got.erase(got.begin(), got.begin() + offset);
    EXPECT_EQ(CompareBf16(Floats(got), dlogits, 1e-8f, "dlogits (" + what + ")"), 0);
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
  // From x[1] (a gradient that does not start 16-byte aligned) and over a count of 13 values
  // (fewer than a block's threads: most threads sum nothing).
  for (int64_t skip : {1, 999990}) {
    Device<float> d_from{std::vector<float>{0.f}};
    SumSquares(d_x.get() + skip, static_cast<int64_t>(x.size()) - skip, d_from.get(), d_scratch.get(), nullptr);
    double expected = 0;
    for (size_t i = skip; i < x.size(); ++i) expected += double{x[i]} * x[i];
    EXPECT_NEAR(d_from.Host()[0], expected, 1e-5 * expected) << "from x[" << skip << "]";
  }
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

// With a timed search (GemmOptions::candidates), the first call of each shape tries the
// heuristic's candidates into a scratch output: the results are the CPU reference's still,
// an accumulating call's output holds its old values plus the product (the candidates did
// not write into it), and each shape is planned once however often it is called.
TEST(GpuOpsTest, SearchedGemmPlansEachShapeOnceAndLeavesTheOutputAlone) {
  EXPECT_EQ(Gemm::Create(GemmOptions{.candidates = 0}).status().code(), absl::StatusCode::kInvalidArgument);
  SKIP_WITHOUT_GPU();
  auto gemm = Gemm::Create(GemmOptions{.candidates = 8});
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  std::mt19937_64 rng(11);
  const int n = 256, ic = 192, oc = 320;
  const Bf16Data in = Random(size_t{n} * ic, rng), w = Random(size_t{oc} * ic, rng, 0.1f),
                 dout = Random(size_t{n} * oc, rng), din0 = Random(size_t{n} * ic, rng),
                 dw0 = Random(size_t{oc} * ic, rng);
  Device<Bf16> d_in(in.bits), d_w(w.bits), d_out{std::vector<Bf16>(size_t{n} * oc)}, d_dout(dout.bits),
      d_din(din0.bits);
  Device<float> d_dw(dw0.values);
  for (int twice = 0; twice < 2; ++twice) {
    ASSERT_TRUE((*gemm)->Forward(d_out.get(), d_in.get(), d_w.get(), n, ic, oc, nullptr).ok());
  }
  ASSERT_TRUE((*gemm)->Backward(d_din.get(), d_dw.get(), d_dout.get(), d_in.get(), d_w.get(), n, ic, oc, nullptr).ok());
  std::vector<float> out(size_t{n} * oc), din = din0.values, dw = dw0.values;
  cpu::MatmulForward(out.data(), in.values.data(), w.values.data(), n, ic, oc);
  cpu::MatmulBackward(din.data(), dw.data(), dout.values.data(), in.values.data(), w.values.data(), n, ic, oc);
  EXPECT_EQ(CompareBf16(Floats(d_out.Host()), out, 1e-2f, "searched matmul out"), 0);
  EXPECT_EQ(CompareBf16(Floats(d_din.Host()), din, 1e-2f, "searched matmul din (accumulated)"), 0);
  EXPECT_EQ(CompareF32(d_dw.Host(), dw, 1e-4f, 1e-4f, "searched matmul dweight (accumulated, fp32)"), 0);
  EXPECT_EQ((*gemm)->plans(), 3u) << "forward, din, dweight";
  ASSERT_TRUE((*gemm)->Forward(d_out.get(), d_in.get(), d_w.get(), n, ic, oc, nullptr).ok());
  EXPECT_EQ((*gemm)->plans(), 3u);
  for (const std::string& line : (*gemm)->DescribePlans()) std::printf("%s\n", line.c_str());
}

// The searched choices go to a cache file; a second Gemm (the next process: a resumed run)
// takes them from it without timing and gives the same bits. A line that does not parse is
// skipped and counted, the others still used.
TEST(GpuOpsTest, SearchedChoicesAreCachedOnDiskAndGiveTheSameBits) {
  SKIP_WITHOUT_GPU();
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = std::string(tmp != nullptr ? tmp : "/tmp") + "/gemm-cache-" + std::to_string(getpid());
  GemmOptions options{.candidates = 4, .cache_dir = dir};
  std::mt19937_64 rng(12);
  const int n = 128, ic = 256, oc = 192;
  const Bf16Data in = Random(size_t{n} * ic, rng), w = Random(size_t{oc} * ic, rng, 0.1f),
                 dout = Random(size_t{n} * oc, rng);
  Device<Bf16> d_in(in.bits), d_w(w.bits), d_dout(dout.bits);
  auto run = [&](Gemm& gemm) {
    Device<Bf16> out{std::vector<Bf16>(size_t{n} * oc)}, din{std::vector<Bf16>(size_t{n} * ic)};
    Device<float> dw{std::vector<float>(size_t{oc} * ic)};
    EXPECT_TRUE(gemm.Forward(out.get(), d_in.get(), d_w.get(), n, ic, oc, nullptr).ok());
    EXPECT_TRUE(gemm.Backward(din.get(), dw.get(), d_dout.get(), d_in.get(), d_w.get(), n, ic, oc, nullptr).ok());
    std::vector<float> bits = Floats(out.Host());
    for (float x : Floats(din.Host())) bits.push_back(x);
    for (float x : dw.Host()) bits.push_back(x);
    return bits;
  };
  auto first = Gemm::Create(options);
  ASSERT_TRUE(first.ok()) << first.status();
  const std::vector<float> searched = run(**first);
  EXPECT_EQ((*first)->cache_hits(), 0);
  const std::string file = (*first)->cache_file();
  ASSERT_NE(file.find("best-of-4"), std::string::npos) << file;
  {
    std::ofstream append(file, std::ios::app);
    append << "not a line of the cache\n";
  }
  auto second = Gemm::Create(options);
  ASSERT_TRUE(second.ok());
  const std::vector<float> again = run(**second);
  EXPECT_EQ((*second)->cache_hits(), 3) << "forward, din, dweight from the file";
  EXPECT_EQ((*second)->cache_lines_skipped(), 1);
  ASSERT_EQ(searched.size(), again.size());
  EXPECT_EQ(std::memcmp(searched.data(), again.data(), searched.size() * sizeof(float)), 0);
  for (const std::string& line : (*second)->DescribePlans()) {
    EXPECT_NE(line.find("from the cache file"), std::string::npos) << line;
  }
}

}  // namespace
}  // namespace tierd::trainer::gpu
