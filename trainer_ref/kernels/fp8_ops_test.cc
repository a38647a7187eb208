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

// A fused kernel's codes, plain and transposed, and its amax (amax[0]) are the unfused chain's
// (the _ref buffers, amax[1]); the plain codes returned, for the CPU comparison.
std::vector<uint8_t> ExpectTheUnfusedCodes(Device<uint8_t>& plain, Device<uint8_t>& plain_ref,
                                           Device<uint8_t>& transposed, Device<uint8_t>& transposed_ref,
                                           Device<float>& amax) {
  const std::vector<uint8_t> got = plain.Host();
  EXPECT_EQ(got, plain_ref.Host());
  EXPECT_EQ(transposed.Host(), transposed_ref.Host());
  const std::vector<float> amaxes = amax.Host();
  EXPECT_GT(amaxes[0], 0.f);
  EXPECT_EQ(amaxes[0], amaxes[1]);
  return got;
}

// Codes a fused kernel made against the CPU reference's values `cpu` (rounded to bf16, then
// fp8::Encode at `scale`): none more than one code away, and at least 99% equal (the GPU's
// __expf and sincosf are not the CPU's std::exp and std::sin).
void ExpectWithinOneCodeOfTheCpu(const std::vector<uint8_t>& got, const std::vector<float>& cpu, float scale,
                                 fp8::Format format) {
  ASSERT_EQ(got.size(), cpu.size());
  int64_t equal = 0, far = 0;
  for (size_t i = 0; i < cpu.size(); ++i) {
    const uint8_t want = fp8::Encode(FromBf16(ToBf16(cpu[i])) * scale, format);
    equal += got[i] == want;
    far += std::abs(int{got[i]} - int{want}) > 1;
  }
  EXPECT_EQ(far, 0) << "codes more than one step from the CPU's";
  EXPECT_GT(equal, static_cast<int64_t>(cpu.size()) * 99 / 100) << "codes equal to the CPU's of " << cpu.size();
}

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

// SwiGLU's backward straight to E5M2 codes: the bits of SwiGluBackward then QuantizeFp8 (codes
// and amaxes) on the GPU, and within one code of the CPU reference's (cpu_ops' SwiGluBackward,
// rounded to bf16, fp8::Encode: the GPU's sigmoid is __expf's); on the vector path (a multiple
// of 8) and the one-by-one path (a count that is not, a pointer one value in).
TEST(Fp8OpsTest, SwiGluBackwardToCodesIsSwiGluBackwardThenTheConversion) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(29);
  const int64_t count = 64 * 1000 + 9;
  const Bf16Data gate = Random(count + 1, rng, 2.f), up = Random(count + 1, rng), dout = Random(count + 1, rng, 1e-3f);
  Device<Bf16> d_gate(gate.bits), d_up(up.bits), d_dout(dout.bits);
  Device<float> scales{std::vector<float>{2048.f, 4096.f}};
  for (int64_t skip : {0, 1}) {
    const int64_t n = count - skip;
    SCOPED_TRACE(skip ? "one value in" : "aligned");
    Device<uint8_t> dg8{std::vector<uint8_t>(n)}, du8{std::vector<uint8_t>(n)}, dg8_ref{std::vector<uint8_t>(n)},
        du8_ref{std::vector<uint8_t>(n)};
    Device<float> amax{std::vector<float>{0.f, 0.f, 0.f, 0.f}};
    Device<Bf16> dg{std::vector<Bf16>(n)}, du{std::vector<Bf16>(n)};
    SwiGluBackwardFp8(dg8.get(), du8.get(), d_dout.get() + skip, d_gate.get() + skip, d_up.get() + skip, n,
                      scales.get(), scales.get() + 1, amax.get(), amax.get() + 1, nullptr);
    SwiGluBackward(dg.get(), du.get(), d_dout.get() + skip, d_gate.get() + skip, d_up.get() + skip, 1,
                   static_cast<int>(n), nullptr);
    QuantizeFp8(dg8_ref.get(), dg.get(), n, scales.get(), true, nullptr, amax.get() + 2);
    QuantizeFp8(du8_ref.get(), du.get(), n, scales.get() + 1, true, nullptr, amax.get() + 3);
    const std::vector<uint8_t> got_g = dg8.Host(), got_u = du8.Host();
    EXPECT_EQ(got_g, dg8_ref.Host());
    EXPECT_EQ(got_u, du8_ref.Host());
    const std::vector<float> amaxes = amax.Host();
    EXPECT_EQ(amaxes[0], amaxes[2]);
    EXPECT_EQ(amaxes[1], amaxes[3]);
    EXPECT_GT(amaxes[0], 0.f);
    // The CPU reference, in float with std::exp.
    std::vector<float> cg(n, 0.f), cu(n, 0.f);
    cpu::SwiGluBackward(cg.data(), cu.data(), dout.values.data() + skip, gate.values.data() + skip,
                        up.values.data() + skip, 1, static_cast<int>(n));
    int64_t equal = 0, far = 0;
    float cpu_amax = 0.f;
    for (int64_t i = 0; i < n; ++i) {
      const float g = FromBf16(ToBf16(cg[i])), u = FromBf16(ToBf16(cu[i]));
      cpu_amax = std::max(cpu_amax, std::fabs(g));
      const uint8_t want_g = fp8::Encode(g * 2048.f, fp8::Format::kE5M2);
      const uint8_t want_u = fp8::Encode(u * 4096.f, fp8::Format::kE5M2);
      equal += (got_g[i] == want_g) + (got_u[i] == want_u);
      far += (std::abs(int{got_g[i]} - int{want_g}) > 1) + (std::abs(int{got_u[i]} - int{want_u}) > 1);
    }
    EXPECT_EQ(far, 0) << "codes more than one step from the CPU's";
    EXPECT_GT(equal, 2 * n * 99 / 100) << "codes equal to the CPU's of " << 2 * n;
    EXPECT_NEAR(amaxes[0], cpu_amax, 1e-2f * cpu_amax);
  }
}

// SwiGluBackwardFp8Transposed: the plain codes and amaxes of SwiGluBackwardFp8 bit for bit, and
// the transposed codes are the plain ones transposed; a shape not of 64 x 64 tiles is refused
// with nothing written.
TEST(Fp8OpsTest, SwiGluBackwardToTransposedCodesIsTheSameCodesTransposed) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(31);
  const int rows = 192, cols = 320;
  const size_t count = static_cast<size_t>(rows) * cols;
  const Bf16Data gate = Random(count, rng, 2.f), up = Random(count, rng), dout = Random(count, rng, 1e-3f);
  Device<Bf16> d_gate(gate.bits), d_up(up.bits), d_dout(dout.bits);
  Device<float> scales{std::vector<float>{2048.f, 4096.f}}, amax{std::vector<float>{0.f, 0.f, 0.f, 0.f}};
  Device<uint8_t> dg8{std::vector<uint8_t>(count)}, du8{std::vector<uint8_t>(count)},
      dg8_t{std::vector<uint8_t>(count, 7)}, du8_t{std::vector<uint8_t>(count, 7)},
      dg8_ref{std::vector<uint8_t>(count)}, du8_ref{std::vector<uint8_t>(count)};
  EXPECT_FALSE(SwiGluBackwardFp8Transposed(dg8.get(), du8.get(), dg8_t.get(), du8_t.get(), d_dout.get(), d_gate.get(),
                                           d_up.get(), rows - 16, cols, scales.get(), scales.get() + 1, amax.get(),
                                           amax.get() + 1, nullptr));
  EXPECT_EQ(dg8_t.Host(), std::vector<uint8_t>(count, 7)) << "a refused shape wrote codes";
  ASSERT_TRUE(SwiGluBackwardFp8Transposed(dg8.get(), du8.get(), dg8_t.get(), du8_t.get(), d_dout.get(), d_gate.get(),
                                          d_up.get(), rows, cols, scales.get(), scales.get() + 1, amax.get(),
                                          amax.get() + 1, nullptr));
  SwiGluBackwardFp8(dg8_ref.get(), du8_ref.get(), d_dout.get(), d_gate.get(), d_up.get(), static_cast<int64_t>(count),
                    scales.get(), scales.get() + 1, amax.get() + 2, amax.get() + 3, nullptr);
  const std::vector<uint8_t> g = dg8.Host(), u = du8.Host(), gt = dg8_t.Host(), ut = du8_t.Host();
  EXPECT_EQ(g, dg8_ref.Host());
  EXPECT_EQ(u, du8_ref.Host());
  const std::vector<float> amaxes = amax.Host();
  EXPECT_GT(amaxes[0], 0.f);
  EXPECT_EQ(amaxes[0], amaxes[2]);
  EXPECT_EQ(amaxes[1], amaxes[3]);
  int off = 0;
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < cols; ++c) {
      const size_t plain = static_cast<size_t>(r) * cols + c, transposed = static_cast<size_t>(c) * rows + r;
      if ((gt[transposed] != g[plain] || ut[transposed] != u[plain]) && off++ < 5) {
        ADD_FAILURE() << "(" << r << ", " << c << "): transposed " << int{gt[transposed]} << "/" << int{ut[transposed]}
                      << ", plain " << int{g[plain]} << "/" << int{u[plain]};
      }
    }
  }
  EXPECT_EQ(off, 0);
}

// SwiGLU's forward straight to E4M3 codes, plain and transposed, with no bf16 output: the bits
// of SwiGluForward with Fp8Out then TransposeFp8 (codes and amax), and within one code of the
// CPU reference (cpu::SwiGluForward, rounded to bf16, fp8::Encode: __expf is not std::exp). A
// shape not of 64 x 64 tiles is refused with nothing written.
TEST(Fp8OpsTest, SwiGluForwardToTransposedCodesIsTheForwardsCodesTransposed) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(41);
  const int rows = 192, cols = 320;
  const size_t count = static_cast<size_t>(rows) * cols;
  const Bf16Data gate = Random(count, rng, 2.f), up = Random(count, rng);
  Device<Bf16> d_gate(gate.bits), d_up(up.bits), d_out{std::vector<Bf16>(count)};
  Device<float> scale{std::vector<float>{64.f}}, amax{std::vector<float>{0.f, 0.f}};
  Device<uint8_t> plain{std::vector<uint8_t>(count, 7)}, transposed{std::vector<uint8_t>(count, 7)},
      plain_ref{std::vector<uint8_t>(count)}, transposed_ref{std::vector<uint8_t>(count)};
  EXPECT_FALSE(SwiGluForwardFp8Transposed(plain.get(), transposed.get(), d_gate.get(), d_up.get(), rows - 16, cols,
                                          scale.get(), amax.get(), nullptr));
  EXPECT_EQ(plain.Host(), std::vector<uint8_t>(count, 7)) << "a refused shape wrote codes";
  EXPECT_EQ(transposed.Host(), std::vector<uint8_t>(count, 7)) << "a refused shape wrote codes";
  ASSERT_TRUE(SwiGluForwardFp8Transposed(plain.get(), transposed.get(), d_gate.get(), d_up.get(), rows, cols,
                                         scale.get(), amax.get(), nullptr));
  SwiGluForward(d_out.get(), d_gate.get(), d_up.get(), rows, cols, nullptr,
                Fp8Out{plain_ref.get(), scale.get(), amax.get() + 1});
  TransposeFp8(transposed_ref.get(), plain_ref.get(), rows, cols, nullptr);
  const std::vector<uint8_t> got = ExpectTheUnfusedCodes(plain, plain_ref, transposed, transposed_ref, amax);
  std::vector<float> cpu(count);
  cpu::SwiGluForward(cpu.data(), gate.values.data(), up.values.data(), rows, cols);
  ExpectWithinOneCodeOfTheCpu(got, cpu, 64.f, fp8::Format::kE4M3);
}

// RoPE's backward straight to E5M2 codes, plain and transposed: the bits of RopeBackward then
// QuantizeFp8Transposed (codes and amax), within one code of the CPU reference's turn
// (cpu::RopeBackward, rounded to bf16, fp8::Encode: the GPU's sincosf is not std::sin's); for
// head sizes 64 and 128 (pairs across a tile's edge between heads) and positions wrapping at
// T. A shape not of 64 x 64 tiles is refused with nothing written.
TEST(Fp8OpsTest, RopeBackwardToCodesIsRopeBackwardThenTheConversion) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(37);
  struct Shape {
    int b, t, h, d;
  };
  for (const Shape& sh : {Shape{2, 64, 4, 64}, Shape{1, 192, 3, 128}, Shape{4, 32, 2, 64}}) {
    const int b = sh.b, t = sh.t, h = sh.h, d = sh.d, rows = b * t, cols = h * d;
    SCOPED_TRACE("D " + std::to_string(d) + ", T " + std::to_string(t));
    std::vector<double> freq(d / 2);
    for (int i = 0; i < d / 2; ++i) freq[i] = 1.0 / std::pow(10000.0, 2.0 * i / d);
    const RopeFrequencies table = RopeFrequenciesOf(freq);
    const size_t count = static_cast<size_t>(rows) * cols;
    const Bf16Data x = Random(count, rng, 1e-2f);
    Device<Bf16> d_x(x.bits), d_turned(x.bits);
    Device<float> scale{std::vector<float>{4096.f}}, amax{std::vector<float>{0.f, 0.f}};
    Device<uint8_t> plain{std::vector<uint8_t>(count, 7)}, transposed{std::vector<uint8_t>(count, 7)},
        plain_ref{std::vector<uint8_t>(count)}, transposed_ref{std::vector<uint8_t>(count)};
    if (t == 32) {  // 128 rows, but the same call at T 40 (80 rows) is refused
      EXPECT_FALSE(RopeBackwardFp8Transposed(plain.get(), transposed.get(), d_x.get(), 2, 40, h, d, table, scale.get(),
                                             true, amax.get(), nullptr));
      EXPECT_EQ(plain.Host(), std::vector<uint8_t>(count, 7)) << "a refused shape wrote codes";
    }
    ASSERT_TRUE(RopeBackwardFp8Transposed(plain.get(), transposed.get(), d_x.get(), b, t, h, d, table, scale.get(),
                                          true, amax.get(), nullptr));
    RopeBackward(d_turned.get(), b, t, h, d, table, nullptr);
    QuantizeFp8Transposed(transposed_ref.get(), d_turned.get(), rows, cols, scale.get(), true, nullptr,
                          plain_ref.get(), amax.get() + 1);
    const std::vector<uint8_t> got = ExpectTheUnfusedCodes(plain, plain_ref, transposed, transposed_ref, amax);
    EXPECT_EQ(d_x.Host(), x.bits) << "the input was written";
    std::vector<float> cpu = x.values;
    cpu::RopeBackward(cpu.data(), b, t, h, d, freq.data());
    ExpectWithinOneCodeOfTheCpu(got, cpu, 4096.f, fp8::Format::kE5M2);
  }
}

// The norm's and SwiGLU's forward with Fp8Out: the same outputs as without, and beside them the
// codes and amax QuantizeFp8 makes of those outputs (the GPU's, and fp8::Encode of the output
// on the CPU), on the vector paths and the one-by-one ones (C 1001; SwiGLU one value in). With
// a null bf16 output, the same codes and amax alone.
TEST(Fp8OpsTest, NormAndSwiGluWriteTheCodesOfTheirOutput) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(31);
  auto floats = [&](size_t n, float sd) {
    std::normal_distribution<float> normal(0.f, sd);
    std::vector<float> out(n);
    for (float& x : out) x = normal(rng);
    return out;
  };
  Device<float> scale{std::vector<float>{5.f}};
  auto expect_codes = [&](const std::vector<Bf16>& out, Device<uint8_t>& codes, Device<float>& amax,
                          const std::string& what) {
    Device<Bf16> d_out(out);
    Device<uint8_t> ref{std::vector<uint8_t>(out.size())};
    Device<float> ref_amax{std::vector<float>{0.f}};
    QuantizeFp8(ref.get(), d_out.get(), static_cast<int64_t>(out.size()), scale.get(), false, nullptr, ref_amax.get());
    const std::vector<uint8_t> got = codes.Host();
    EXPECT_EQ(got, ref.Host()) << what;
    EXPECT_EQ(amax.Host()[0], ref_amax.Host()[0]) << what;
    float most = 0.f;
    int64_t off = 0;
    for (size_t i = 0; i < out.size(); ++i) {
      most = std::max(most, std::fabs(FromBf16(out[i])));
      off += got[i] != fp8::Encode(FromBf16(out[i]) * 5.f, fp8::Format::kE4M3);
    }
    EXPECT_EQ(off, 0) << what << ": codes other than the CPU's of the output";
    EXPECT_EQ(amax.Host()[0], most) << what;
  };
  for (int c : {1000, 1001}) {
    const int n = 67;
    const size_t nc = size_t{n} * c;
    const std::vector<float> x0 = floats(nc, 2.f), weight = floats(c, 1.f);
    const Bf16Data residual = Random(nc, rng);
    Device<float> d_x(x0), d_x_plain(x0), d_weight(weight), d_saved{std::vector<float>(nc)},
        d_rstd{std::vector<float>(n)}, d_saved_plain{std::vector<float>(nc)}, d_rstd_plain{std::vector<float>(n)},
        amax{std::vector<float>{0.f}};
    Device<Bf16> d_residual(residual.bits), d_out{std::vector<Bf16>(nc)}, d_out_plain{std::vector<Bf16>(nc)};
    Device<uint8_t> codes{std::vector<uint8_t>(nc)};
    ResidualRmsNormForward(d_out.get(), d_rstd.get(), d_x.get(), d_residual.get(), d_saved.get(), d_weight.get(), n, c,
                           1e-5f, nullptr, Fp8Out{codes.get(), scale.get(), amax.get()});
    ResidualRmsNormForward(d_out_plain.get(), d_rstd_plain.get(), d_x_plain.get(), d_residual.get(),
                           d_saved_plain.get(), d_weight.get(), n, c, 1e-5f, nullptr);
    const std::string at = "norm, C " + std::to_string(c);
    EXPECT_EQ(d_out.Host(), d_out_plain.Host()) << at;
    EXPECT_EQ(d_x.Host(), d_x_plain.Host()) << at;
    EXPECT_EQ(d_rstd.Host(), d_rstd_plain.Host()) << at;
    expect_codes(d_out.Host(), codes, amax, at);
    Device<float> d_x_alone(x0), d_rstd_alone{std::vector<float>(n)}, amax_alone{std::vector<float>{0.f}};
    Device<uint8_t> codes_alone{std::vector<uint8_t>(nc)};
    ResidualRmsNormForward(nullptr, d_rstd_alone.get(), d_x_alone.get(), d_residual.get(), nullptr, d_weight.get(), n,
                           c, 1e-5f, nullptr, Fp8Out{codes_alone.get(), scale.get(), amax_alone.get()});
    EXPECT_EQ(codes_alone.Host(), codes.Host()) << at << ", codes alone";
    EXPECT_EQ(amax_alone.Host(), amax.Host()) << at << ", codes alone";
    EXPECT_EQ(d_rstd_alone.Host(), d_rstd.Host()) << at << ", codes alone";
    EXPECT_EQ(d_x_alone.Host(), d_x.Host()) << at << ", codes alone";
  }
  const int n = 33, f = 1000;
  const size_t count = size_t{n} * f;
  const Bf16Data gate = Random(count + 1, rng, 2.f), up = Random(count + 1, rng);
  Device<Bf16> d_gate(gate.bits), d_up(up.bits);
  for (int skip : {0, 1}) {
    Device<Bf16> d_out{std::vector<Bf16>(count + 1)}, d_out_plain{std::vector<Bf16>(count + 1)};
    Device<uint8_t> codes{std::vector<uint8_t>(count - skip)};
    Device<float> amax{std::vector<float>{0.f}};
    const int rows = skip ? 1 : n, cols = skip ? static_cast<int>(count) - 1 : f;
    SwiGluForward(d_out.get() + skip, d_gate.get() + skip, d_up.get() + skip, rows, cols, nullptr,
                  Fp8Out{codes.get(), scale.get(), amax.get()});
    SwiGluForward(d_out_plain.get() + skip, d_gate.get() + skip, d_up.get() + skip, rows, cols, nullptr);
    const std::vector<Bf16> out = d_out.Host();
    EXPECT_EQ(out, d_out_plain.Host());
    expect_codes(std::vector<Bf16>(out.begin() + skip, out.begin() + skip + (count - skip)), codes, amax,
                 skip ? "swiglu, one value in" : "swiglu");
    Device<uint8_t> codes_alone{std::vector<uint8_t>(count - skip)};
    Device<float> amax_alone{std::vector<float>{0.f}};
    SwiGluForward(nullptr, d_gate.get() + skip, d_up.get() + skip, rows, cols, nullptr,
                  Fp8Out{codes_alone.get(), scale.get(), amax_alone.get()});
    EXPECT_EQ(codes_alone.Host(), codes.Host()) << "swiglu, codes alone, skip " << skip;
    EXPECT_EQ(amax_alone.Host(), amax.Host()) << "swiglu, codes alone, skip " << skip;
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
