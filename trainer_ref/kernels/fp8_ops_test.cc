// The FP8 kernels and GEMMs against the CPU reference (trainer_ref/fp8.h) on random data:
// codes bit for bit, GEMMs within the output's rounding (see each test for its bound).
// Needs a CUDA device: without one every test is skipped (and says so).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "trainer_ref/fp8.h"
#include "trainer_ref/cpu_ops.h"
#include "trainer_ref/fp8_codes.h"
#include "trainer_ref/kernels/fp8_ops.h"
#include "trainer_ref/kernels/gemm.h"
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

// FP8: the largest |x| and the codes at a per-tensor scale give the CPU reference's bits
// (trainer_ref/fp8.h) in both formats, saturation included; the FP8 GEMM equals the CPU's
// product of the decoded codes times both scales (bf16 output tolerance), with and without
// fast accumulation, and the E4M3 x E5M2 form a gradient takes.
TEST(Fp8OpsTest, Fp8CodesAndGemmMatchTheCpuReference) {
  SKIP_WITHOUT_GPU();
  auto gemm = Gemm::Create();
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  std::mt19937_64 rng(11);
  const int n = 96, ic = 128, oc = 160;
  Bf16Data in = Random(size_t{n} * ic, rng), w = Random(size_t{oc} * ic, rng, 0.05f);
  in.bits[5] = ToBf16(40.0f);  // an outlier: the scale is set by it
  in.values[5] = FromBf16(in.bits[5]);
  Device<Bf16> d_in(in.bits), d_w(w.bits);
  // The scales in 16-byte slots: amax in, amax w, scale in, scale w, scale_inv in, scale_inv w.
  Device<float> slots{std::vector<float>(6 * 4, 0.f)};
  float* slot = slots.get();
  AbsMax(slot + 0, d_in.get(), in.bits.size(), nullptr);
  AbsMax(slot + 4, d_w.get(), w.bits.size(), nullptr);
  std::vector<float> host_slots = slots.Host();
  float amax_in = 0, amax_w = 0;
  for (float x : in.values) amax_in = std::max(amax_in, std::fabs(x));
  for (float x : w.values) amax_w = std::max(amax_w, std::fabs(x));
  EXPECT_EQ(host_slots[0], amax_in);
  EXPECT_EQ(host_slots[4], amax_w);
  AbsMax(slot + 8, d_w.get() + 3, w.bits.size() - 5, nullptr);  // misaligned, an odd count: the scalar path
  float amax_odd = 0;
  for (size_t i = 3; i + 2 < w.values.size(); ++i) amax_odd = std::max(amax_odd, std::fabs(w.values[i]));
  EXPECT_EQ(slots.Host()[8], amax_odd);
  for (bool e5m2 : {false, true}) {
    SCOPED_TRACE(e5m2 ? "e5m2" : "e4m3");
    const fp8::Format format = e5m2 ? fp8::Format::kE5M2 : fp8::Format::kE4M3;
    fp8::DelayedScaling in_scale(format, 1), w_scale(fp8::Format::kE4M3, 1);
    in_scale.Record(amax_in);
    w_scale.Record(amax_w);
    // One scale a tenth too large for `in`: its largest values saturate (on both sides).
    const float scales[6] = {0, 0, in_scale.scale() * 1.1f, w_scale.scale(), 0, 0};
    for (int i = 2; i < 4; ++i) host_slots[4 * i] = scales[i];
    host_slots[4 * 4] = 1.0f / scales[2];
    host_slots[4 * 5] = w_scale.scale_inv();
    ASSERT_EQ(cudaMemcpy(slot, host_slots.data(), host_slots.size() * sizeof(float), cudaMemcpyHostToDevice),
              cudaSuccess);
    Device<uint8_t> q_in{std::vector<uint8_t>(in.bits.size())}, q_w{std::vector<uint8_t>(w.bits.size())};
    QuantizeFp8(q_in.get(), d_in.get(), in.bits.size(), slot + 8, e5m2, nullptr);
    QuantizeFp8(q_w.get(), d_w.get(), w.bits.size(), slot + 12, false, nullptr);
    const std::vector<uint8_t> codes_in = q_in.Host(), codes_w = q_w.Host();
    int off = 0, saturated = 0;
    for (size_t i = 0; i < codes_in.size(); ++i) {
      const uint8_t want = fp8::Encode(in.values[i] * scales[2], format);
      saturated += std::fabs(fp8::Decode(want, format)) == fp8::MaxFinite(format);
      if (codes_in[i] != want && off++ < 5) {
        ADD_FAILURE() << "in[" << i << "] " << in.values[i] << ": gpu code " << int{codes_in[i]} << " cpu "
                      << int{want};
      }
    }
    for (size_t i = 0; i < codes_w.size(); ++i) {
      const uint8_t want = fp8::Encode(w.values[i] * scales[3], fp8::Format::kE4M3);
      if (codes_w[i] != want && off++ < 5) ADD_FAILURE() << "w[" << i << "]: gpu " << int{codes_w[i]};
    }
    EXPECT_EQ(off, 0);
    EXPECT_GE(saturated, 1) << "the outlier saturates at a scale a tenth too large";
    // Eight values a thread where aligned: from one element on (misaligned) and of a count
    // that is no multiple of 8, every code is still the CPU's.
    for (int from : {0, 1}) {
      Device<uint8_t> q_odd{std::vector<uint8_t>(in.bits.size())};
      QuantizeFp8(q_odd.get(), d_in.get() + from, in.bits.size() - 5, slot + 8, e5m2, nullptr);
      const std::vector<uint8_t> odd = q_odd.Host();
      for (size_t i = 0; i + 5 < in.bits.size(); ++i) {
        if (odd[i] != fp8::Encode(in.values[i + from] * scales[2], format) && off++ < 5) {
          ADD_FAILURE() << "from " << from << ", code " << i;
        }
      }
    }
    EXPECT_EQ(off, 0);
    for (bool fast : {false, true}) {
      SCOPED_TRACE(fast ? "fast accumulation" : "exact accumulation");
      Device<Bf16> d_out{std::vector<Bf16>(size_t{n} * oc)};
      absl::Status s =
          (*gemm)->ForwardFp8(d_out.get(), q_in.get(), q_w.get(), slot + 16, slot + 20, n, ic, oc, nullptr, fast, e5m2);
      ASSERT_TRUE(s.ok()) << s;
      std::vector<float> want(size_t{n} * oc);
      for (int r = 0; r < n; ++r) {
        for (int o = 0; o < oc; ++o) {
          double sum = 0;
          for (int k = 0; k < ic; ++k) {
            sum += double{fp8::Decode(codes_in[static_cast<size_t>(r) * ic + k], format)} *
                   fp8::Decode(codes_w[static_cast<size_t>(o) * ic + k], fp8::Format::kE4M3);
          }
          want[static_cast<size_t>(r) * oc + o] = static_cast<float>(sum * host_slots[16] * host_slots[20]);
        }
      }
      EXPECT_EQ(CompareBf16(Floats(d_out.Host()), want, 2e-2f, "fp8 matmul out"), 0);
    }
  }
  Device<Bf16> odd{std::vector<Bf16>(size_t{n} * 24)};
  EXPECT_EQ((*gemm)->ForwardFp8(odd.get(), nullptr, nullptr, slot, slot, n, 24, 24, nullptr).code(),
            absl::StatusCode::kInvalidArgument);
}

// cuBLASLt reads an FP8 matmul's scales only from 16-byte aligned addresses: a scale off that
// is refused before any work, saying which operand's and where, in the forward and in both
// backward products; the same call with aligned scales runs.
TEST(Fp8OpsTest, AnFp8MatmulRefusesAScaleNotSixteenByteAligned) {
  SKIP_WITHOUT_GPU();
  auto gemm = Gemm::Create();
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  const int n = 32, ic = 32, oc = 32;
  Device<uint8_t> codes{std::vector<uint8_t>(size_t{n} * ic, 0)};
  Device<float> scales{std::vector<float>(8, 1.f)}, dweight{std::vector<float>(size_t{oc} * ic, 0.f)};
  Device<Bf16> out{std::vector<Bf16>(size_t{n} * oc)};
  float* aligned = scales.get();
  float* off = scales.get() + 1;
  ASSERT_TRUE((*gemm)->ForwardFp8(out.get(), codes.get(), codes.get(), aligned, aligned + 4, n, ic, oc, nullptr).ok());
  const absl::Status forward =
      (*gemm)->ForwardFp8(out.get(), codes.get(), codes.get(), off, aligned + 4, n, ic, oc, nullptr);
  EXPECT_EQ(forward.code(), absl::StatusCode::kInvalidArgument) << forward;
  EXPECT_NE(forward.message().find("B scale"), std::string::npos) << forward;  // the input's, B of out^T
  EXPECT_NE(forward.message().find("not 16-byte aligned"), std::string::npos) << forward;
  ASSERT_TRUE((*gemm)
                  ->BackwardFp8(out.get(), dweight.get(), codes.get(), codes.get(), codes.get(), codes.get(), aligned,
                                aligned, aligned + 4, n, ic, oc, nullptr)
                  .ok());
  const absl::Status din = (*gemm)->BackwardFp8(out.get(), nullptr, codes.get(), codes.get(), codes.get(),
                                                codes.get(), aligned, aligned, off, n, ic, oc, nullptr);
  EXPECT_EQ(din.code(), absl::StatusCode::kInvalidArgument) << din;
  EXPECT_NE(din.message().find("A scale"), std::string::npos) << din;  // the weight's
  const absl::Status dw = (*gemm)->BackwardFp8(nullptr, dweight.get(), codes.get(), codes.get(), codes.get(),
                                               codes.get(), aligned, off, aligned, n, ic, oc, nullptr);
  EXPECT_EQ(dw.code(), absl::StatusCode::kInvalidArgument) << dw;
  EXPECT_NE(dw.message().find("A scale"), std::string::npos) << dw;  // the input's
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

// The FP8 backward: transposed codes equal the CPU's codes transposed (a shape that is not a
// multiple of the kernel's 32 x 32 tile, both formats), and din (bf16) and dweight (fp32)
// accumulate the CPU's products of the decoded codes times both scales.
TEST(Fp8OpsTest, Fp8BackwardMatchesTheCpuReference) {
  SKIP_WITHOUT_GPU();
  auto gemm = Gemm::Create();
  ASSERT_TRUE(gemm.ok()) << gemm.status();
  std::mt19937_64 rng(13);
  const int n = 80, ic = 112, oc = 48;
  const Bf16Data in = Random(size_t{n} * ic, rng), w = Random(size_t{oc} * ic, rng, 0.05f),
                 dout = Random(size_t{n} * oc, rng, 1e-3f), din0 = Random(size_t{n} * ic, rng, 0.01f),
                 dw0 = Random(size_t{oc} * ic, rng, 0.01f);
  auto amax = [](const std::vector<float>& v) {
    float m = 0;
    for (float x : v) m = std::max(m, std::fabs(x));
    return m;
  };
  fp8::DelayedScaling s_in(fp8::Format::kE4M3, 1), s_w(fp8::Format::kE4M3, 1), s_dout(fp8::Format::kE5M2, 1);
  s_in.Record(amax(in.values));
  s_w.Record(amax(w.values));
  s_dout.Record(amax(dout.values));
  // 16-byte slots: scales of dout, in, w; then their inverses.
  std::vector<float> slots(6 * 4, 0.f);
  slots[0] = s_dout.scale(), slots[4] = s_in.scale(), slots[8] = s_w.scale();
  slots[12] = s_dout.scale_inv(), slots[16] = s_in.scale_inv(), slots[20] = s_w.scale_inv();
  Device<float> d_slots(slots);
  Device<Bf16> d_in(in.bits), d_w(w.bits), d_dout(dout.bits), d_din(din0.bits);
  Device<float> d_dw(dw0.values);
  Device<uint8_t> q_dout{std::vector<uint8_t>(size_t{n} * oc)}, q_dout_t{std::vector<uint8_t>(size_t{n} * oc)},
      q_in_t{std::vector<uint8_t>(size_t{n} * ic)}, q_w_t{std::vector<uint8_t>(size_t{oc} * ic)};
  float* slot = d_slots.get();
  QuantizeFp8(q_dout.get(), d_dout.get(), size_t{n} * oc, slot + 0, /*e5m2=*/true, nullptr);
  Device<uint8_t> q_dout_both{std::vector<uint8_t>(size_t{n} * oc)};  // plain codes from the transposing kernel
  QuantizeFp8Transposed(q_dout_t.get(), d_dout.get(), n, oc, slot + 0, true, nullptr, q_dout_both.get());
  QuantizeFp8Transposed(q_in_t.get(), d_in.get(), n, ic, slot + 4, false, nullptr);
  QuantizeFp8Transposed(q_w_t.get(), d_w.get(), oc, ic, slot + 8, false, nullptr);
  // The codes, transposed, against the CPU's.
  auto expect_transposed = [](const std::vector<uint8_t>& gpu, const std::vector<float>& values, int rows, int cols,
                              float scale, fp8::Format format, const char* what) {
    int off = 0;
    for (int r = 0; r < rows; ++r) {
      for (int c = 0; c < cols; ++c) {
        const uint8_t want = fp8::Encode(values[static_cast<size_t>(r) * cols + c] * scale, format);
        if (gpu[static_cast<size_t>(c) * rows + r] != want && off++ < 5) {
          ADD_FAILURE() << what << " (" << r << ", " << c << "): gpu " << int{gpu[static_cast<size_t>(c) * rows + r]}
                        << " cpu " << int{want};
        }
      }
    }
    return off;
  };
  const std::vector<uint8_t> dout_codes = q_dout.Host(), dout_t = q_dout_t.Host(), in_t = q_in_t.Host(),
                             w_t = q_w_t.Host();
  EXPECT_EQ(expect_transposed(dout_t, dout.values, n, oc, slots[0], fp8::Format::kE5M2, "dout^T"), 0);
  EXPECT_EQ(q_dout_both.Host(), dout_codes) << "the transposing kernel's plain codes are QuantizeFp8's";
  EXPECT_EQ(expect_transposed(in_t, in.values, n, ic, slots[4], fp8::Format::kE4M3, "in^T"), 0);
  EXPECT_EQ(expect_transposed(w_t, w.values, oc, ic, slots[8], fp8::Format::kE4M3, "w^T"), 0);
  absl::Status s = (*gemm)->BackwardFp8(d_din.get(), d_dw.get(), q_dout.get(), q_dout_t.get(), q_in_t.get(),
                                        q_w_t.get(), slot + 12, slot + 16, slot + 20, n, ic, oc, nullptr);
  ASSERT_TRUE(s.ok()) << s;
  // The reference on the decoded codes: din += dout x w, dw += dout^T x in.
  auto d_of = [](uint8_t code, fp8::Format f) { return double{fp8::Decode(code, f)}; };
  std::vector<float> din = din0.values, dw = dw0.values;
  for (int r = 0; r < n; ++r) {
    for (int i = 0; i < ic; ++i) {
      double sum = 0;
      for (int o = 0; o < oc; ++o) {
        sum += d_of(dout_codes[static_cast<size_t>(r) * oc + o], fp8::Format::kE5M2) *
               d_of(w_t[static_cast<size_t>(i) * oc + o], fp8::Format::kE4M3);
      }
      din[static_cast<size_t>(r) * ic + i] += static_cast<float>(sum * slots[12] * slots[20]);
    }
  }
  // Hopper's FP8 tensor cores accumulate with about 14 bits of mantissa before cuBLASLt adds
  // into fp32 (DeepSeek-V3's report, section 3.3): dweight, an fp32 output, is held to 2^-10
  // of the sum of its terms' magnitudes (measured: ~4e-4 of it), not to fp32 rounding.
  std::vector<float> dw_bound(dw.size());
  for (int o = 0; o < oc; ++o) {
    for (int i = 0; i < ic; ++i) {
      double sum = 0, magnitude = 0;
      for (int r = 0; r < n; ++r) {
        const double term = d_of(dout_t[static_cast<size_t>(o) * n + r], fp8::Format::kE5M2) *
                            d_of(in_t[static_cast<size_t>(i) * n + r], fp8::Format::kE4M3);
        sum += term;
        magnitude += std::fabs(term);
      }
      dw[static_cast<size_t>(o) * ic + i] += static_cast<float>(sum * slots[12] * slots[16]);
      dw_bound[static_cast<size_t>(o) * ic + i] =
          static_cast<float>(std::ldexp(magnitude * slots[12] * slots[16], -10));
    }
  }
  EXPECT_EQ(CompareBf16(Floats(d_din.Host()), din, 1e-4f, "fp8 din"), 0);
  const std::vector<float> gpu_dw = d_dw.Host();
  int dw_off = 0;
  for (size_t k = 0; k < dw.size(); ++k) {
    if (!(std::fabs(gpu_dw[k] - dw[k]) <= dw_bound[k] + 1e-6f * std::fabs(dw[k])) && dw_off++ < 5) {
      ADD_FAILURE() << "fp8 dweight[" << k << "]: gpu " << gpu_dw[k] << " cpu " << dw[k] << " bound " << dw_bound[k];
    }
  }
  EXPECT_EQ(dw_off, 0);
  EXPECT_EQ(
      (*gemm)
          ->BackwardFp8(nullptr, d_dw.get(), nullptr, nullptr, nullptr, nullptr, slot, slot, slot, 8, ic, oc, nullptr)
          .code(),
      absl::StatusCode::kInvalidArgument);
}

// Matrices of 64 x 64 tiles (every model shape) take the transposing kernel's vectorised
// path: its transposed and plain codes equal the CPU's, in both formats.
TEST(Fp8OpsTest, TransposedCodesOfTileMultiplesMatchTheCpuReference) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(17);
  const int rows = 192, cols = 320;
  const Bf16Data in = Random(size_t{rows} * cols, rng);
  Device<Bf16> d_in(in.bits);
  Device<float> d_scale{std::vector<float>{3.5f}};
  for (bool e5m2 : {false, true}) {
    const fp8::Format format = e5m2 ? fp8::Format::kE5M2 : fp8::Format::kE4M3;
    Device<uint8_t> t{std::vector<uint8_t>(in.bits.size())}, plain{std::vector<uint8_t>(in.bits.size())};
    QuantizeFp8Transposed(t.get(), d_in.get(), rows, cols, d_scale.get(), e5m2, nullptr, plain.get());
    const std::vector<uint8_t> got_t = t.Host(), got = plain.Host();
    int off = 0;
    for (int r = 0; r < rows; ++r) {
      for (int c = 0; c < cols; ++c) {
        const uint8_t want = fp8::Encode(in.values[static_cast<size_t>(r) * cols + c] * 3.5f, format);
        if ((got_t[static_cast<size_t>(c) * rows + r] != want || got[static_cast<size_t>(r) * cols + c] != want) &&
            off++ < 5) {
          ADD_FAILURE() << fp8::FormatName(format) << " (" << r << ", " << c << "): transposed "
                        << int{got_t[static_cast<size_t>(c) * rows + r]} << ", plain "
                        << int{got[static_cast<size_t>(r) * cols + c]} << ", cpu " << int{want};
        }
      }
    }
    EXPECT_EQ(off, 0);
  }
}

// Codes transposed as bytes: the CPU's transpose, on the 64 x 64 tile path and on the general
// one (a shape of 16s, a misaligned pointer).
TEST(Fp8OpsTest, TransposedCodesMatchTheCpuTranspose) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(23);
  struct Case {
    int rows, cols, offset;
  };
  for (const Case& k : {Case{192, 320, 0}, Case{48, 80, 0}, Case{128, 64, 3}}) {
    SCOPED_TRACE(::testing::Message() << k.rows << "x" << k.cols << " at +" << k.offset);
    std::vector<uint8_t> in(static_cast<size_t>(k.rows) * k.cols + k.offset);
    for (auto& b : in) b = static_cast<uint8_t>(rng());
    Device<uint8_t> d_in(in), d_out{std::vector<uint8_t>(static_cast<size_t>(k.rows) * k.cols, 0)};
    TransposeFp8(d_out.get(), d_in.get() + k.offset, k.rows, k.cols, nullptr);
    const std::vector<uint8_t> got = d_out.Host();
    int off = 0;
    for (int r = 0; r < k.rows; ++r) {
      for (int c = 0; c < k.cols; ++c) {
        const uint8_t want = in[k.offset + static_cast<size_t>(r) * k.cols + c],
                      have = got[static_cast<size_t>(c) * k.rows + r];
        if (have != want && off++ < 5)
          ADD_FAILURE() << "(" << r << ", " << c << "): " << int{have} << " not " << int{want};
      }
    }
    EXPECT_EQ(off, 0);
  }
}

// The host's codes of a weight (fp8_codes.h, what its optimizer step writes) are the GPU's own:
// AbsMax, ScaleFromAmax and QuantizeFp8 at current scaling give the same codes and scale_inv.
TEST(Fp8OpsTest, HostMadeWeightCodesAreTheGpusCurrentScaledCodes) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(29);
  const int rows = 256, cols = 384;
  Bf16Data w = Random(size_t{rows} * cols, rng, 0.02f);
  w.bits[777] = ToBf16(-0.3f);  // the largest, so the scale is not the mean's
  Device<Bf16> d_w(w.bits);
  Device<float> slot{std::vector<float>(4, 0.f)};
  Device<uint8_t> codes{std::vector<uint8_t>(w.bits.size())};
  AbsMax(slot.get() + 3, d_w.get(), static_cast<int64_t>(w.bits.size()), nullptr);
  ScaleFromAmax(slot.get() + 1, slot.get(), slot.get() + 3, /*e5m2=*/false, nullptr);
  QuantizeFp8(codes.get(), d_w.get(), static_cast<int64_t>(w.bits.size()), slot.get() + 1, false, nullptr);
  std::vector<uint8_t> host(w.bits.size());
  const fp8::Fp8Scaled s =
      fp8::EncodeE4M3CurrentScaled(w.bits.data(), static_cast<int64_t>(w.bits.size()), host.data());
  const std::vector<float> got = slot.Host();
  EXPECT_EQ(got[0], s.scale_inv);
  EXPECT_EQ(got[1], s.scale);
  EXPECT_EQ(got[3], s.amax);
  EXPECT_EQ(codes.Host(), host);
}

// Current scaling on the device: the scale and its inverse from an amax, bit for bit the CPU
// reference's (fp8::CurrentScale), over random amaxes of many decades and the degenerate ones.
TEST(Fp8OpsTest, ScaleFromAmaxMatchesTheCpuReference) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(5);
  std::vector<float> amaxes = {0.0f,
                               std::numeric_limits<float>::infinity(),
                               std::numeric_limits<float>::quiet_NaN(),
                               std::numeric_limits<float>::denorm_min(),
                               1e-30f,
                               448.0f,
                               3.0f};
  std::uniform_real_distribution<float> exponent(-30.f, 30.f);
  for (int i = 0; i < 200; ++i) amaxes.push_back(std::pow(2.0f, exponent(rng)) * 1.2345f);
  Device<float> slot{std::vector<float>(4, 0.f)};
  int off = 0;
  for (bool e5m2 : {false, true}) {
    const fp8::Format format = e5m2 ? fp8::Format::kE5M2 : fp8::Format::kE4M3;
    for (float amax : amaxes) {
      ASSERT_EQ(cudaMemcpy(slot.get() + 2, &amax, sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
      ScaleFromAmax(slot.get() + 1, slot.get(), slot.get() + 2, e5m2, nullptr);
      const std::vector<float> got = slot.Host();
      const float want = fp8::CurrentScale(amax, format);
      if ((got[1] != want || got[0] != 1.0f / want) && off++ < 5) {
        ADD_FAILURE() << fp8::FormatName(format) << " amax " << amax << ": gpu scale " << got[1] << " inverse "
                      << got[0] << ", cpu " << want << " and " << 1.0f / want;
      }
    }
    // ScalesFromAmaxes: every amax at once, each into a slot of 4 floats {scale_inv, scale, amax}.
    const int count = static_cast<int>(amaxes.size());
    Device<float> d_amaxes(amaxes), slots{std::vector<float>(4 * count, -1.f)};
    ScalesFromAmaxes(slots.get(), 4, d_amaxes.get(), count, e5m2, nullptr);
    const std::vector<float> got = slots.Host();
    for (int t = 0; t < count; ++t) {
      const float want = fp8::CurrentScale(amaxes[t], format);
      const bool same_amax = std::memcmp(&got[4 * t + 2], &amaxes[t], sizeof(float)) == 0;
      if ((got[4 * t + 1] != want || got[4 * t] != 1.0f / want || !same_amax || got[4 * t + 3] != -1.f) &&
          off++ < 5) {
        ADD_FAILURE() << fp8::FormatName(format) << " slot " << t << " amax " << amaxes[t] << ": gpu {" << got[4 * t]
                      << ", " << got[4 * t + 1] << ", " << got[4 * t + 2] << ", " << got[4 * t + 3] << "}, cpu scale "
                      << want;
      }
    }
  }
  EXPECT_EQ(off, 0);
}

}  // namespace
}  // namespace tierd::trainer::gpu
