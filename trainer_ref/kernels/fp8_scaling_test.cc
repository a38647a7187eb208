// Delayed FP8 scaling on the GPU against the CPU reference (trainer_ref/fp8.h): the
// conversions' largest |x| taken on the way, the per-step update of each tensor's history and
// scale bit for bit, and Fp8Linear's two modes, its trouble report and its saved state.
// Part of fp8_ops_test (one binary to carry); needs a CUDA device.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "trainer_ref/fp8.h"
#include "trainer_ref/fp8_codes.h"
#include "trainer_ref/kernels/fp8_linear.h"
#include "trainer_ref/kernels/fp8_ops.h"
#include "trainer_ref/kernels/gemm.h"
#include "trainer_ref/kernels/gpu_test_util.h"

namespace tierd::trainer::gpu {
namespace {

using testing::Bf16Data;
using testing::Device;
using testing::HaveGpu;
using testing::Random;

float AbsMaxOf(const std::vector<float>& v, size_t from = 0, size_t to = SIZE_MAX) {
  float m = 0;
  for (size_t i = from; i < std::min(to, v.size()); ++i) m = std::max(m, std::fabs(v[i]));
  return m;
}

// Every conversion path (eight values a thread, the scalar tail, both transposing kernels)
// folds its input's largest |x| into the amax it is given, the same value AbsMax finds, and
// keeps a larger one already there (a step's running amax); the codes are those made without.
TEST(Fp8ScalingTest, ConversionsTakeTheLargestValueOnTheWay) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(21);
  const int rows = 128, cols = 192;  // 64 x 64 tiles: the vectorised transposing kernel
  Bf16Data in = Random(size_t{rows} * cols, rng);
  in.bits[777] = ToBf16(-9.5f);  // the largest |x|, negative
  in.values[777] = FromBf16(in.bits[777]);
  Device<Bf16> d_in(in.bits);
  Device<float> scale{std::vector<float>{2.0f}};
  const float want = AbsMaxOf(in.values);
  ASSERT_EQ(want, 9.5f);
  for (int path = 0; path < 5; ++path) {
    SCOPED_TRACE(path);
    Device<float> amax{std::vector<float>{0.0f}};
    Device<uint8_t> a{std::vector<uint8_t>(in.bits.size())}, b{std::vector<uint8_t>(in.bits.size())},
        t{std::vector<uint8_t>(in.bits.size())};
    size_t from = 0, n = in.bits.size();
    switch (path) {
      case 0:  // plain, vectorised
        QuantizeFp8(a.get(), d_in.get(), n, scale.get(), false, nullptr, amax.get());
        QuantizeFp8(b.get(), d_in.get(), n, scale.get(), false, nullptr);
        break;
      case 1:  // plain, misaligned and odd: the scalar path
        from = 3, n = in.bits.size() - 8;
        QuantizeFp8(a.get(), d_in.get() + from, n, scale.get(), true, nullptr, amax.get());
        QuantizeFp8(b.get(), d_in.get() + from, n, scale.get(), true, nullptr);
        break;
      case 2:  // transposed 64 x 64 tiles, with plain codes
        QuantizeFp8Transposed(t.get(), d_in.get(), rows, cols, scale.get(), false, nullptr, a.get(), amax.get());
        QuantizeFp8(b.get(), d_in.get(), n, scale.get(), false, nullptr);
        break;
      case 3:  // transposed, 32 x 32 tiles (a shape of no 64-multiple)
        n = size_t{rows - 8} * cols;
        QuantizeFp8Transposed(t.get(), d_in.get(), rows - 8, cols, scale.get(), true, nullptr, a.get(), amax.get());
        QuantizeFp8(b.get(), d_in.get(), n, scale.get(), true, nullptr);
        break;
      case 4: {  // a larger running amax stays
        const float big = 100.0f;
        ASSERT_EQ(cudaMemcpy(amax.get(), &big, sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
        QuantizeFp8(a.get(), d_in.get(), n, scale.get(), false, nullptr, amax.get());
        QuantizeFp8(b.get(), d_in.get(), n, scale.get(), false, nullptr);
        break;
      }
    }
    const float expected = path == 4 ? 100.0f : AbsMaxOf(in.values, from, from + n);
    EXPECT_EQ(amax.Host()[0], expected);
    const std::vector<uint8_t> got = a.Host(), plain = b.Host();
    EXPECT_TRUE(std::equal(got.begin(), got.begin() + n, plain.begin())) << "the codes are those made without amax";
  }
}

// The per-step update against fp8::DelayedScaling on 40 tensors over 60 steps of random
// amaxes (decades apart, zeros, infinities, NaNs, sudden growth and collapse), both formats,
// a window of 5 and a margin of 1: every scale bit for bit, every count, the slots' scales
// and inverses written for delayed scaling and left alone for current, the running amax reset.
// Fixed scaling (0.5 for E4M3, 1024 for E5M2) against fp8::DelayedScaling::Fixed: no scale
// moves, the counts are the reference's.
TEST(Fp8ScalingTest, TheGpusDelayedScalingIsTheCpuReferenceBitForBit) {
  SKIP_WITHOUT_GPU();
  const int tensors = 40, window = 5, margin = 1, steps = 60;
  for (const char* mode : {"delayed", "current", "fixed"}) {
    SCOPED_TRACE(mode);
    const bool fixed = std::string(mode) == "fixed", set_scales = std::string(mode) != "current";
    std::mt19937_64 rng(31);
    std::vector<fp8::DelayedScaling> cpu;
    std::vector<Fp8ScalingState> init(tensors);
    for (int t = 0; t < tensors; ++t) {
      init[t].e5m2 = t % 3 == 0;
      const fp8::Format format = t % 3 == 0 ? fp8::Format::kE5M2 : fp8::Format::kE4M3;
      if (fixed) {
        init[t].scale = t % 3 == 0 ? 1024.0f : 0.5f;
        init[t].has_scale = 1;
        cpu.push_back(fp8::DelayedScaling::Fixed(format, init[t].scale));
      } else {
        cpu.emplace_back(format, window, margin);
      }
    }
    std::vector<float> slots(4 * tensors, 0.0f);
    for (int t = 0; t < tensors; ++t) slots[4 * t] = slots[4 * t + 1] = 7.0f;  // what a conversion left
    Device<float> d_slots(slots), d_history{std::vector<float>(size_t{tensors} * window, 0.0f)};
    Device<Fp8ScalingState> d_states(init);
    std::uniform_real_distribution<float> decades(-12.f, 12.f), unit(0.f, 1.f);
    std::vector<float> level(tensors);
    for (float& l : level) l = std::pow(10.0f, decades(rng));
    int off = 0, saturated = 0, underflows = 0, non_finite = 0;
    for (int step = 0; step < steps; ++step) {
      std::vector<float> host = d_slots.Host();
      for (int t = 0; t < tensors; ++t) {
        const float u = unit(rng);
        if (u < 0.03f) level[t] *= 1e6f;        // sudden growth: saturates
        else if (u < 0.06f) level[t] *= 1e-9f;  // collapse: underflows
        float amax = level[t] * (0.5f + unit(rng));
        if (u > 0.97f) amax = 0.0f;
        else if (u > 0.95f) amax = std::numeric_limits<float>::infinity();
        else if (u > 0.93f) amax = std::numeric_limits<float>::quiet_NaN();
        host[4 * t + 2] = amax;
        cpu[t].Record(amax);
      }
      ASSERT_EQ(cudaMemcpy(d_slots.get(), host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice),
                cudaSuccess);
      UpdateDelayedScaling(d_slots.get(), d_history.get(), d_states.get(), tensors, window, margin, set_scales, nullptr,
                           fixed);
      const std::vector<Fp8ScalingState> got = d_states.Host();
      const std::vector<float> after = d_slots.Host();
      for (int t = 0; t < tensors; ++t) {
        const fp8::DelayedScaling& c = cpu[t];
        const Fp8ScalingState& g = got[t];
        const float cpu_scale = c.scale();
        const bool same = std::memcmp(&g.scale, &cpu_scale, sizeof(float)) == 0 && g.has_scale == c.has_scale() &&
                          g.non_finite == c.non_finite() && g.saturated_in_a_row == c.saturated_in_a_row() &&
                          g.underflow_in_a_row == c.underflow_in_a_row() && after[4 * t + 2] == 0.0f;
        const float want_scale = set_scales && c.has_scale() ? c.scale() : 7.0f;
        const float want_inv = set_scales && c.has_scale() ? 1.0f / c.scale() : 7.0f;
        if ((!same || after[4 * t + 1] != want_scale || after[4 * t] != want_inv) && off++ < 5) {
          ADD_FAILURE() << "step " << step << " tensor " << t << ": gpu scale " << g.scale << " (" << g.non_finite
                        << "/" << g.saturated_in_a_row << "/" << g.underflow_in_a_row << ", slot " << after[4 * t + 1]
                        << "), cpu " << c.Describe() << " (" << c.non_finite() << "/" << c.saturated_in_a_row() << "/"
                        << c.underflow_in_a_row() << ")";
        }
        saturated += g.saturated_in_a_row > 0;
        underflows += g.underflow_in_a_row > 0;
        non_finite += g.non_finite > 0;
      }
    }
    EXPECT_EQ(off, 0);
    // The data exercised every branch.
    EXPECT_GT(saturated, 0);
    EXPECT_GT(underflows, 0);
    EXPECT_GT(non_finite, 0);
  }
}

struct LinearRun {
  std::vector<Bf16> out, din;
  std::vector<float> dw;
};

// One map's forward and backward through `fp8` (layer 0, map 0): out, din, dweight.
LinearRun RunLinear(Fp8Linear& fp8, Device<Bf16>& in, Device<Bf16>& w, Device<Bf16>& dout, int n, int ic, int oc) {
  Device<Bf16> out{std::vector<Bf16>(static_cast<size_t>(n) * oc)}, din{std::vector<Bf16>(static_cast<size_t>(n) * ic)};
  Device<float> dw{std::vector<float>(static_cast<size_t>(oc) * ic, 0.0f)};
  const Fp8Codes codes = fp8.QuantizeInput(0, 0, in.get(), n, ic, nullptr);
  EXPECT_TRUE(fp8.Forward(out.get(), codes, 0, 0, w.get(), n, ic, oc, nullptr).ok());
  const Fp8Codes codes_t = fp8.QuantizeInputTransposed(0, 0, in.get(), n, ic, nullptr);
  EXPECT_TRUE(fp8.Backward(din.get(), dw.get(), dout.get(), codes_t, 0, 0, w.get(), n, ic, oc, nullptr, false).ok());
  return {out.Host(), din.Host(), dw.Host()};
}

// Weights as codes made on the host (fp8_codes.h, what the host's optimizer step writes):
// forward and backward give current scaling's outputs from the bf16 weights, bit for bit. Two
// weights in turn at the same device address, with ForgetWeights between (an optimizer step),
// each gives its own results: the kept transposed codes are made anew.
TEST(Fp8ScalingTest, HostMadeWeightCodesGiveTheBf16WeightsResults) {
  SKIP_WITHOUT_GPU();
  auto gemm = Gemm::Create();
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  const int n = 64, ic = 192, oc = 128;
  std::mt19937_64 rng(43);
  Bf16Data in = Random(static_cast<size_t>(n) * ic, rng), dout = Random(static_cast<size_t>(n) * oc, rng, 1e-3f);
  Device<Bf16> d_in(in.bits), d_dout(dout.bits);
  const Fp8Linear::Shapes shapes = {{oc, ic}};
  Fp8ScalingOptions current_options;
  current_options.delayed = false;
  auto from_bf16 = Fp8Linear::Create(gemm->get(), n, shapes, 1, current_options);
  auto from_codes = Fp8Linear::Create(gemm->get(), n, shapes, 1, current_options);
  ASSERT_TRUE(from_bf16.ok() && from_codes.ok());
  Device<uint8_t> d_codes{std::vector<uint8_t>(static_cast<size_t>(oc) * ic)};
  Device<float> d_scale_inv{std::vector<float>(4, 0.0f)};
  for (float spread : {0.05f, 0.7f}) {
    SCOPED_TRACE(spread);
    Bf16Data w = Random(static_cast<size_t>(oc) * ic, rng, spread);
    Device<Bf16> d_w(w.bits);
    (*from_bf16)->ForgetWeights();
    const LinearRun want = RunLinear(**from_bf16, d_in, d_w, d_dout, n, ic, oc);
    std::vector<uint8_t> codes(w.bits.size());
    const fp8::Fp8Scaled scaled =
        fp8::EncodeE4M3CurrentScaled(w.bits.data(), static_cast<int64_t>(w.bits.size()), codes.data());
    ASSERT_EQ(cudaMemcpy(d_codes.get(), codes.data(), codes.size(), cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(d_scale_inv.get(), &scaled.scale_inv, sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
    (*from_codes)->ForgetWeights();
    const Fp8Codes weight{d_codes.get(), d_scale_inv.get()};
    Device<Bf16> out{std::vector<Bf16>(static_cast<size_t>(n) * oc)},
        din{std::vector<Bf16>(static_cast<size_t>(n) * ic)};
    Device<float> dw{std::vector<float>(static_cast<size_t>(oc) * ic, 0.0f)};
    const Fp8Codes in8 = (*from_codes)->QuantizeInput(0, 0, d_in.get(), n, ic, nullptr);
    ASSERT_TRUE((*from_codes)->ForwardFromCodes(out.get(), in8, 0, 0, weight, n, ic, oc, nullptr).ok());
    const Fp8Codes in8_t = (*from_codes)->QuantizeInputTransposed(0, 0, d_in.get(), n, ic, nullptr);
    ASSERT_TRUE(
        (*from_codes)
            ->BackwardFromCodes(din.get(), dw.get(), d_dout.get(), in8_t, 0, 0, weight, n, ic, oc, nullptr, false)
            .ok());
    EXPECT_EQ(out.Host(), want.out);
    EXPECT_EQ(din.Host(), want.din);
    EXPECT_EQ(dw.Host(), want.dw);
    // The codes' transposes made on the host and handed in (what the optimizer's step may write
    // beside them): the input gradient reads those, the same bits; zeros there give zeros, so
    // they are what it read.
    std::vector<uint8_t> codes_t(codes.size());
    fp8::TransposeCodes(codes.data(), oc, ic, codes_t.data());
    for (const bool zeros : {false, true}) {
      Device<uint8_t> d_codes_t{zeros ? std::vector<uint8_t>(codes.size(), 0) : codes_t};
      Device<Bf16> din_t{std::vector<Bf16>(static_cast<size_t>(n) * ic)};
      ASSERT_TRUE((*from_codes)
                      ->BackwardFromCodes(din_t.get(), nullptr, d_dout.get(), in8_t, 0, 0,
                                          {d_codes.get(), d_scale_inv.get(), d_codes_t.get()}, n, ic, oc, nullptr,
                                          false)
                      .ok());
      const std::vector<Bf16> got = din_t.Host();
      if (zeros) {
        EXPECT_EQ(got, std::vector<Bf16>(got.size(), Bf16{})) << "the transposes handed in were not read";
      } else {
        EXPECT_EQ(got, want.din);
      }
    }
  }
  // A call for a shape the maps were not made for is refused, as with bf16 weights.
  EXPECT_EQ((*from_codes)
                ->ForwardFromCodes(nullptr, {}, 0, 0, {d_codes.get(), d_scale_inv.get()}, n, ic, oc + 16, nullptr)
                .code(),
            absl::StatusCode::kInvalidArgument);
}

// Fp8Linear's modes: delayed scaling converts at the current scale until its first EndStep,
// and after it, with the same tensors, at the same scales (the history holds exactly this
// step's amaxes): bit for bit current scaling's outputs. When the input then grows 4-fold
// step after step, delayed scaling's scale falls behind and Trouble names the tensor after
// the asked-for steps in a row (current scaling: never). A state saved and restored into a
// fresh Fp8Linear converts with the same scales; a state of another window is refused.
TEST(Fp8ScalingTest, DelayedAndCurrentScalingAgreeOnASteadyTensorAndTroubleIsReported) {
  SKIP_WITHOUT_GPU();
  auto gemm = Gemm::Create();
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  const int n = 64, ic = 128, oc = 96;
  std::mt19937_64 rng(41);
  Bf16Data in = Random(static_cast<size_t>(n) * ic, rng), w = Random(static_cast<size_t>(oc) * ic, rng, 0.05f),
           dout = Random(static_cast<size_t>(n) * oc, rng, 1e-3f);
  Device<Bf16> d_in(in.bits), d_w(w.bits), d_dout(dout.bits);
  const Fp8Linear::Shapes shapes = {{oc, ic}};
  Fp8ScalingOptions current_options, delayed_options;
  current_options.delayed = false;
  auto current = Fp8Linear::Create(gemm->get(), n, shapes, 2, current_options);
  auto delayed = Fp8Linear::Create(gemm->get(), n, shapes, 2, delayed_options);
  ASSERT_TRUE(current.ok() && delayed.ok());
  const LinearRun first_current = RunLinear(**current, d_in, d_w, d_dout, n, ic, oc);
  const LinearRun first_delayed = RunLinear(**delayed, d_in, d_w, d_dout, n, ic, oc);
  EXPECT_EQ(first_delayed.out, first_current.out) << "before any step, delayed scaling converts at the current scale";
  (*current)->EndStep(nullptr);
  (*delayed)->EndStep(nullptr);
  const LinearRun second = RunLinear(**delayed, d_in, d_w, d_dout, n, ic, oc);
  EXPECT_EQ(second.out, first_current.out);
  EXPECT_EQ(second.din, first_current.din);
  EXPECT_EQ(second.dw, first_current.dw);
  EXPECT_TRUE((*delayed)->Trouble(1).empty());
  // A state saved now and restored elsewhere gives the same scales.
  (*delayed)->EndStep(nullptr);
  auto saved = (*delayed)->SaveState(nullptr);
  ASSERT_TRUE(saved.ok()) << saved.status();
  auto restored = Fp8Linear::Create(gemm->get(), n, shapes, 2, delayed_options);
  ASSERT_TRUE(restored.ok());
  ASSERT_TRUE((*restored)->RestoreState(*saved, nullptr).ok());
  EXPECT_EQ((*restored)->steps(), 2);
  // The input grows 4-fold a step: each step's amax is 4x the window's largest.
  for (int step = 0; step < 3; ++step) {
    for (Bf16& b : in.bits) b = ToBf16(FromBf16(b) * 4.0f);
    ASSERT_EQ(cudaMemcpy(d_in.get(), in.bits.data(), in.bits.size() * sizeof(Bf16), cudaMemcpyHostToDevice),
              cudaSuccess);
    const LinearRun a = RunLinear(**delayed, d_in, d_w, d_dout, n, ic, oc);
    const LinearRun b = RunLinear(**restored, d_in, d_w, d_dout, n, ic, oc);
    EXPECT_EQ(a.out, b.out) << "step " << step << ": the restored state converts with the same scales";
    EXPECT_EQ(a.dw, b.dw);
    RunLinear(**current, d_in, d_w, d_dout, n, ic, oc);
    for (auto* l : {delayed->get(), restored->get(), current->get()}) l->EndStep(nullptr);
  }
  const std::vector<Fp8Trouble> trouble = (*delayed)->Trouble(3);
  ASSERT_EQ(trouble.size(), 1u);
  EXPECT_EQ(trouble[0].layer, 0);
  EXPECT_EQ(trouble[0].index, 0);
  EXPECT_EQ(trouble[0].role, Fp8Trouble::kInput);
  EXPECT_EQ(trouble[0].saturated_in_a_row, 3);
  EXPECT_TRUE((*delayed)->Trouble(4).empty());
  EXPECT_TRUE((*current)->Trouble(1).empty()) << "current scaling cannot saturate";
  // Refusals: another window; a damaged record.
  Fp8ScalingOptions other = delayed_options;
  other.window = 8;
  auto elsewhere = Fp8Linear::Create(gemm->get(), n, shapes, 2, other);
  ASSERT_TRUE(elsewhere.ok());
  const absl::Status refused = (*elsewhere)->RestoreState(*saved, nullptr);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("window=16"), std::string::npos) << refused;
  EXPECT_EQ((*restored)->RestoreState(saved->substr(0, saved->size() - 4), nullptr).code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ((*restored)->RestoreState("garbage", nullptr).code(), absl::StatusCode::kDataLoss);
  other.window = 0;
  EXPECT_EQ(Fp8Linear::Create(gemm->get(), n, shapes, 2, other).status().code(), absl::StatusCode::kInvalidArgument);
}

// Codes made by the kernel that makes the tensor (the norms, SwiGLU: gpu_ops.h's Fp8Out,
// SwiGluBackwardFp8): there is a target only while the scale is known before the tensor
// (delayed scaling after its first EndStep; never under current scaling, nor for a layer or map
// out of range), and a backward from output-gradient codes without one is refused with the
// step. With a target, codes made at its scale into its place give Forward's and Backward's
// outputs bit for bit; without recording, the target has no amax to fold into.
TEST(Fp8ScalingTest, CodesMadeAtTheTargetsScaleGiveTheConversionsResults) {
  SKIP_WITHOUT_GPU();
  auto gemm = Gemm::Create();
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  const int n = 64, ic = 128, oc = 96;
  std::mt19937_64 rng(47);
  const Bf16Data in = Random(static_cast<size_t>(n) * ic, rng), w = Random(static_cast<size_t>(oc) * ic, rng, 0.05f),
                 dout = Random(static_cast<size_t>(n) * oc, rng, 1e-3f);
  Device<Bf16> d_in(in.bits), d_w(w.bits), d_dout(dout.bits);
  const Fp8Linear::Shapes shapes = {{oc, ic}};
  Fp8ScalingOptions current_options;
  current_options.delayed = false;
  auto current = Fp8Linear::Create(gemm->get(), n, shapes, 2, current_options);
  auto delayed = Fp8Linear::Create(gemm->get(), n, shapes, 2, Fp8ScalingOptions{});
  ASSERT_TRUE(current.ok() && delayed.ok());
  Device<uint8_t> dout8{std::vector<uint8_t>(static_cast<size_t>(n) * oc)};
  Device<Bf16> din{std::vector<Bf16>(static_cast<size_t>(n) * ic)};
  Device<float> dw{std::vector<float>(static_cast<size_t>(oc) * ic, 0.0f)};
  const Fp8Codes in_t = (*delayed)->QuantizeInputTransposed(0, 0, d_in.get(), n, ic, nullptr);
  EXPECT_FALSE((*delayed)->InputTarget(0, 0).has_value()) << "the first step converts at the current scale";
  EXPECT_FALSE((*delayed)->OutputGradientTarget(0, 0).has_value());
  const absl::Status early = (*delayed)->BackwardFromOutputCodes(din.get(), dw.get(), dout8.get(), in_t, 0, 0, d_w.get(),
                                                                 Fp8Codes{}, n, ic, oc, nullptr, false);
  EXPECT_EQ(early.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(early.message().find("delayed scaling, step 0"), std::string::npos) << early;
  RunLinear(**delayed, d_in, d_w, d_dout, n, ic, oc);
  (*delayed)->EndStep(nullptr);
  (*current)->EndStep(nullptr);
  EXPECT_FALSE((*current)->InputTarget(0, 0).has_value()) << "current scaling reads the tensor first";
  EXPECT_FALSE((*current)->OutputGradientTarget(0, 0).has_value());
  EXPECT_FALSE((*delayed)->InputTarget(2, 0).has_value()) << "layer 2 of 2";
  EXPECT_FALSE((*delayed)->OutputGradientTarget(0, 1).has_value()) << "map 1 of 1";
  const auto to_in = (*delayed)->InputTarget(1, 0), to_dout = (*delayed)->OutputGradientTarget(1, 0);
  ASSERT_TRUE(to_in.has_value() && to_dout.has_value());
  ASSERT_NE(to_in->codes, nullptr);
  EXPECT_NE(to_in->amax, nullptr);
  EXPECT_EQ(to_dout->codes, nullptr) << "the output gradient's producer brings its own room";
  // Layer 1 through the conversions, then from codes made at the targets' scales.
  Device<Bf16> out{std::vector<Bf16>(static_cast<size_t>(n) * oc)}, out2{std::vector<Bf16>(static_cast<size_t>(n) * oc)};
  const Fp8Codes converted = (*delayed)->QuantizeInput(1, 0, d_in.get(), n, ic, nullptr);
  ASSERT_TRUE((*delayed)->Forward(out.get(), converted, 1, 0, d_w.get(), n, ic, oc, nullptr).ok());
  QuantizeFp8(to_in->codes, d_in.get(), static_cast<int64_t>(n) * ic, to_in->scale, false, nullptr, to_in->amax);
  ASSERT_TRUE((*delayed)->Forward(out2.get(), (*delayed)->InputCodes(1, 0), 1, 0, d_w.get(), n, ic, oc, nullptr).ok());
  EXPECT_EQ(out2.Host(), out.Host());
  const Fp8Codes in_t1 = (*delayed)->QuantizeInputTransposed(1, 0, d_in.get(), n, ic, nullptr);
  Device<Bf16> din2{std::vector<Bf16>(static_cast<size_t>(n) * ic)};
  Device<float> dw2{std::vector<float>(static_cast<size_t>(oc) * ic, 0.0f)};
  ASSERT_TRUE(
      (*delayed)->Backward(din.get(), dw.get(), d_dout.get(), in_t1, 1, 0, d_w.get(), n, ic, oc, nullptr, false).ok());
  QuantizeFp8(dout8.get(), d_dout.get(), static_cast<int64_t>(n) * oc, to_dout->scale, true, nullptr, to_dout->amax);
  ASSERT_TRUE((*delayed)
                  ->BackwardFromOutputCodes(din2.get(), dw2.get(), dout8.get(), in_t1, 1, 0, d_w.get(), Fp8Codes{}, n,
                                            ic, oc, nullptr, false)
                  .ok());
  EXPECT_EQ(din2.Host(), din.Host());
  EXPECT_EQ(dw2.Host(), dw.Host());
  // The same with the codes' transpose made by their maker (SwiGluBackwardFp8Transposed).
  Device<uint8_t> dout8_t{std::vector<uint8_t>(static_cast<size_t>(n) * oc)};
  TransposeFp8(dout8_t.get(), dout8.get(), n, oc, nullptr);
  Device<Bf16> din3{std::vector<Bf16>(static_cast<size_t>(n) * ic)};
  Device<float> dw3{std::vector<float>(static_cast<size_t>(oc) * ic, 0.0f)};
  ASSERT_TRUE((*delayed)
                  ->BackwardFromOutputCodes(din3.get(), dw3.get(), dout8.get(), in_t1, 1, 0, d_w.get(), Fp8Codes{}, n,
                                            ic, oc, nullptr, false, true, dout8_t.get())
                  .ok());
  EXPECT_EQ(din3.Host(), din.Host());
  EXPECT_EQ(dw3.Host(), dw.Host());
  (*delayed)->set_recording(false);
  EXPECT_EQ((*delayed)->InputTarget(1, 0)->amax, nullptr);
  EXPECT_EQ((*delayed)->OutputGradientTarget(1, 0)->amax, nullptr);
}

// Fixed scaling (--fp8_scaling=fixed): at the scales current scaling would pick for these
// tensors (the weight made to share the input's largest |x|, as one E4M3 scale serves both),
// the same outputs bit for bit; when the input then grows 4-fold a step, the scale stays and
// Trouble names the input's saturation. A fixed state restores only under the same scales,
// and scales that are not positive and finite are refused.
TEST(Fp8ScalingTest, AFixedScaleConvertsLikeTheCurrentOneItEqualsAndNeverMoves) {
  SKIP_WITHOUT_GPU();
  auto gemm = Gemm::Create();
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  const int n = 64, ic = 128, oc = 96;
  std::mt19937_64 rng(43);
  Bf16Data in = Random(static_cast<size_t>(n) * ic, rng), w = Random(static_cast<size_t>(oc) * ic, rng, 0.05f),
           dout = Random(static_cast<size_t>(n) * oc, rng, 1e-3f);
  const float in_amax = AbsMaxOf(in.values);
  w.bits[5] = ToBf16(-in_amax);  // exact: in_amax is a bf16 value
  w.values[5] = -in_amax;
  ASSERT_EQ(AbsMaxOf(w.values), in_amax);
  Device<Bf16> d_in(in.bits), d_w(w.bits), d_dout(dout.bits);
  const Fp8Linear::Shapes shapes = {{oc, ic}};
  Fp8ScalingOptions current_options, fixed_options;
  current_options.delayed = false;
  fixed_options.fixed_scale = fp8::CurrentScale(in_amax, fp8::Format::kE4M3);
  fixed_options.fixed_grad_scale = fp8::CurrentScale(AbsMaxOf(dout.values), fp8::Format::kE5M2);
  auto current = Fp8Linear::Create(gemm->get(), n, shapes, 1, current_options);
  auto fixed = Fp8Linear::Create(gemm->get(), n, shapes, 1, fixed_options);
  ASSERT_TRUE(current.ok() && fixed.ok());
  const LinearRun want = RunLinear(**current, d_in, d_w, d_dout, n, ic, oc);
  for (int step = 0; step < 2; ++step) {
    const LinearRun got = RunLinear(**fixed, d_in, d_w, d_dout, n, ic, oc);
    EXPECT_EQ(got.out, want.out) << "step " << step;
    EXPECT_EQ(got.din, want.din) << "step " << step;
    EXPECT_EQ(got.dw, want.dw) << "step " << step;
    (*fixed)->EndStep(nullptr);
  }
  EXPECT_TRUE((*fixed)->Trouble(1).empty());
  auto saved = (*fixed)->SaveState(nullptr);
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_NE(saved->find("fp8-scaling v1 fixed "), std::string::npos);
  // The input grows 4-fold a step; the codes stay at the fixed scale, so the largest values
  // are cut: the forward's output stops following the input.
  for (int step = 0; step < 3; ++step) {
    for (Bf16& b : in.bits) b = ToBf16(FromBf16(b) * 4.0f);
    ASSERT_EQ(cudaMemcpy(d_in.get(), in.bits.data(), in.bits.size() * sizeof(Bf16), cudaMemcpyHostToDevice),
              cudaSuccess);
    RunLinear(**fixed, d_in, d_w, d_dout, n, ic, oc);
    (*fixed)->EndStep(nullptr);
  }
  const std::vector<Fp8Trouble> trouble = (*fixed)->Trouble(3);
  ASSERT_EQ(trouble.size(), 1u);
  EXPECT_EQ(trouble[0].role, Fp8Trouble::kInput);
  EXPECT_EQ(trouble[0].saturated_in_a_row, 3);
  EXPECT_EQ(trouble[0].scale, fixed_options.fixed_scale) << "the scale never moved";
  // Restores: under the same scales, yes; under others or another mode, refused by name.
  auto same = Fp8Linear::Create(gemm->get(), n, shapes, 1, fixed_options);
  ASSERT_TRUE(same.ok());
  EXPECT_TRUE((*same)->RestoreState(*saved, nullptr).ok());
  Fp8ScalingOptions other = fixed_options;
  other.fixed_grad_scale *= 2;
  auto elsewhere = Fp8Linear::Create(gemm->get(), n, shapes, 1, other);
  ASSERT_TRUE(elsewhere.ok());
  const absl::Status refused = (*elsewhere)->RestoreState(*saved, nullptr);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("--fp8_fixed_grad_scale"), std::string::npos) << refused;
  auto delayed = Fp8Linear::Create(gemm->get(), n, shapes, 1, Fp8ScalingOptions{});
  ASSERT_TRUE(delayed.ok());
  EXPECT_EQ((*delayed)->RestoreState(*saved, nullptr).code(), absl::StatusCode::kInvalidArgument);
  for (float bad : {-1.0f, std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN(), 1e-45f}) {
    Fp8ScalingOptions o;
    o.fixed_scale = 1.0f;
    o.fixed_grad_scale = bad;
    EXPECT_EQ(Fp8Linear::Create(gemm->get(), n, shapes, 1, o).status().code(), absl::StatusCode::kInvalidArgument)
        << bad;
  }
}

}  // namespace
}  // namespace tierd::trainer::gpu
