// Lion and Adafactor on the GPU against the host's loops and optimizer.h's references, on random
// data (AdamW's kernels are checked in gpu_ops_test.cc). Part of gpu_ops_test (one binary to
// carry); needs a CUDA device.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "trainer_ref/host_adafactor.h"
#include "trainer_ref/host_lion.h"
#include "trainer_ref/kernels/gpu_ops.h"
#include "trainer_ref/kernels/gpu_test_util.h"
#include "trainer_ref/optimizer.h"

namespace tierd::trainer::gpu {
namespace {

using testing::CompareBf16;
using testing::CompareF32;
using testing::Device;
using testing::Floats;
using testing::HaveGpu;

// Lion on the GPU and on the host (host_lion, for state in DRAM) give the same bits, from
// fp32 and from bf16 gradients, with and without decay, including elements whose mix of
// moment and gradient is exactly zero (sign 0); and both track optimizer.h's LionStep (in
// double) to fp32 rounding.
TEST(GpuOpsTest, LionGivesTheHostsBitsAndTracksTheReference) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(26);
  const int64_t n = 100003;
  std::normal_distribution<float> normal(0.f, 0.02f);
  std::vector<float> grads(n), master(n), m(n);
  for (int64_t i = 0; i < n; ++i) {
    grads[i] = normal(rng) * 3.f;
    master[i] = normal(rng);
    m[i] = normal(rng) * 0.1f;
  }
  for (int64_t i = 0; i < 100; ++i) grads[i] = m[i] = 0.f;  // c = 0: no sign, only decay
  std::vector<Bf16> grads16(n);
  for (int64_t i = 0; i < n; ++i) grads16[i] = ToBf16(grads[i]);
  for (bool bf16 : {false, true}) {
    for (bool decay : {true, false}) {
      SCOPED_TRACE(std::string(bf16 ? "bf16" : "fp32") + " gradients, decay " + (decay ? "on" : "off"));
      AdamWParams p;
      p.lr = 1e-4f;
      p.beta1 = 0.9f;
      p.beta2 = 0.99f;
      p.weight_decay = 0.3f;
      p.grad_scale = 0.37f;
      p.decay = decay;
      Device<float> d_master(master), d_m(m), d_g(grads);
      Device<Bf16> d_g16(grads16), d_w{std::vector<Bf16>(n)};
      if (bf16) {
        Lion(d_master.get(), d_m.get(), d_w.get(), d_g16.get(), n, p, nullptr);
      } else {
        Lion(d_master.get(), d_m.get(), d_w.get(), d_g.get(), n, p, nullptr);
      }
      std::vector<float> h_master = master, h_m = m, g = grads;
      if (bf16) {
        for (int64_t i = 0; i < n; ++i) g[i] = FromBf16(grads16[i]);
      }
      std::vector<uint16_t> h_w(n);
      HostLionParams hp;
      hp.lr = p.lr;
      hp.beta1 = p.beta1;
      hp.beta2 = p.beta2;
      hp.weight_decay = p.weight_decay;
      hp.grad_scale = p.grad_scale;
      hp.decay = decay;
      HostLion(h_master.data(), h_m.data(), g.data(), n, hp, 0, h_w.data());
      const std::vector<float> g_master = d_master.Host(), g_m = d_m.Host();
      const std::vector<Bf16> g_w = d_w.Host();
      int64_t differ = 0;
      for (int64_t i = 0; i < n; ++i) {
        differ += std::memcmp(&g_master[i], &h_master[i], 4) != 0 || std::memcmp(&g_m[i], &h_m[i], 4) != 0 ||
                  g_w[i] != h_w[i];
      }
      EXPECT_EQ(differ, 0) << "of " << n << " elements differ in some bit";
      // The reference, in double: the same values up to fp32 rounding.
      std::vector<float> r_master = master, r_m = m, scaled(n);
      for (int64_t i = 0; i < n; ++i) scaled[i] = g[i] * p.grad_scale;
      LionOptions o;
      o.beta1 = p.beta1;
      o.beta2 = p.beta2;
      o.weight_decay = p.weight_decay;
      LionStep(r_master.data(), scaled.data(), r_m.data(), n, p.lr, o, decay);
      EXPECT_EQ(CompareF32(g_master, r_master, 1e-6f, 1e-9f, "lion master"), 0);
      EXPECT_EQ(CompareF32(g_m, r_m, 1e-5f, 1e-9f, "lion m"), 0);
      if (!decay) {
        EXPECT_EQ(g_master[5], master[5]) << "c = 0 and no decay: the weight does not move";
      }
    }
  }
}

// Adafactor on the GPU against optimizer.h's AdafactorStep (double) and the host's
// HostAdafactor over three steps, a matrix (factored state) and a vector, from fp32 and bf16
// gradients: master weights within 2e-6 relative of the reference, plus 1e-8 (a few fp32
// roundings of the 3e-3 the updates move a weight), the state within 1e-4; the host's as close
// to the GPU's (it sums in the kernels' order, but on the H200 a matrix's weights still differ
// from the GPU's in the last bits: ~13% of them after three steps, so the bound is fp32
// rounding, not the bits); and a second run gives the same bits.
TEST(GpuOpsTest, AdafactorTracksTheReferenceAndRepeatsBitForBit) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(36);
  std::normal_distribution<float> normal(0.f, 1.f);
  for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{200, 352}, {1000, 0}}) {
    for (bool bf16 : {false, true}) {
      SCOPED_TRACE(std::string(cols == 0 ? "vector" : "matrix") + (bf16 ? ", bf16 gradients" : ", fp32 gradients"));
      const int64_t n = cols == 0 ? rows : rows * cols;
      std::vector<float> master(n);
      for (float& w : master) w = normal(rng) * 0.02f;
      std::vector<float> ref = master, host = master, ref_state(AdafactorStateCount(rows, cols), 0.f),
                         host_state = ref_state;
      Device<float> d_master(master), d_state(ref_state),
          d_scratch{std::vector<float>(AdafactorScratchFloats(cols), 0.f)};
      Device<float> d_master2(master), d_state2(ref_state);
      Device<Bf16> d_w{std::vector<Bf16>(n)}, d_w2{std::vector<Bf16>(n)};
      AdafactorOptions o;
      for (int step = 1; step <= 3; ++step) {
        std::vector<float> g(n), scaled(n);
        std::vector<Bf16> g16(n);
        for (int64_t i = 0; i < n; ++i) {
          g16[i] = ToBf16(normal(rng) * (1.f + static_cast<float>(i % 5)));
          g[i] = bf16 ? FromBf16(g16[i]) : normal(rng) * (1.f + static_cast<float>(i % 5));
          scaled[i] = g[i] * 0.25f;
        }
        Device<float> d_g(g);
        Device<Bf16> d_g16(g16);
        AdafactorParams p;
        p.lr = 1e-3f;
        p.beta2t = static_cast<float>(1.0 - std::pow(step, o.decay_rate));
        p.grad_scale = 0.25f;
        for (int run = 0; run < 2; ++run) {
          float* m = run == 0 ? d_master.get() : d_master2.get();
          float* st = run == 0 ? d_state.get() : d_state2.get();
          Bf16* w = run == 0 ? d_w.get() : d_w2.get();
          const cudaError_t e = bf16 ? Adafactor(m, st, w, d_g16.get(), rows, cols, p, d_scratch.get(), nullptr)
                                     : Adafactor(m, st, w, d_g.get(), rows, cols, p, d_scratch.get(), nullptr);
          ASSERT_EQ(e, cudaSuccess);
        }
        HostAdafactorParams hp;
        hp.lr = p.lr;
        hp.beta2t = p.beta2t;
        hp.grad_scale = p.grad_scale;
        HostAdafactor(host.data(), host_state.data(), g.data(), rows, cols, hp);
        AdafactorStep(ref.data(), scaled.data(), ref_state.data(), rows, cols, 1e-3, step, o, true);
      }
      const std::vector<float> got = d_master.Host(), got_state = d_state.Host();
      EXPECT_EQ(CompareF32(got, ref, 2e-6f, 1e-8f, "adafactor master vs reference"), 0);
      EXPECT_EQ(CompareF32(got, host, 2e-6f, 1e-8f, "adafactor master vs host"), 0);
      EXPECT_EQ(CompareF32(got_state, ref_state, 1e-4f, 1e-30f, "adafactor state"), 0);
      EXPECT_EQ(got, d_master2.Host()) << "a second run gives the same bits";
      EXPECT_EQ(CompareBf16(Floats(d_w.Host()), got, 0.f, "bf16 weights"), 0);
    }
  }
}

}  // namespace
}  // namespace tierd::trainer::gpu
