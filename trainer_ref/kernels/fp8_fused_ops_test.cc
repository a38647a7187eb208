// The fused kernels that write FP8 codes in place of a bf16 tensor (SwiGLU both ways, RoPE's
// backward, the norms' forward; plain and transposed): bit for bit the unfused chain they
// replace on the GPU, and within one code of the CPU reference on random data. Part of
// fp8_ops_test (one binary to carry); needs a CUDA device, else every test is skipped.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "trainer_ref/cpu_ops.h"
#include "trainer_ref/fp8.h"
#include "trainer_ref/kernels/fp8_ops.h"
#include "trainer_ref/kernels/gpu_ops.h"
#include "trainer_ref/kernels/gpu_test_util.h"

namespace tierd::trainer::gpu {
namespace {

using testing::Bf16Data;
using testing::Device;
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

}  // namespace
}  // namespace tierd::trainer::gpu
