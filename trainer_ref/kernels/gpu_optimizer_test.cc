// The optimizers' kernels (AdamW with fp32 and 8-bit moments, Lion, Adafactor) against the
// host's loops and optimizer.h's references, on random data. Part of gpu_ops_test (one binary
// to carry); needs a CUDA device.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <algorithm>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "trainer_ref/adamw8bit.h"
#include "trainer_ref/host_adafactor.h"
#include "trainer_ref/host_adamw.h"
#include "trainer_ref/host_lion.h"
#include "trainer_ref/kernels/gpu_ops.h"
#include "trainer_ref/kernels/gpu_test_util.h"
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

// Gradients, master weights and AdamW moments of n values, random from `seed` (v positive).
struct AdamWState {
  std::vector<float> grads, master, m, v;
};
AdamWState RandomAdamWState(uint64_t seed, int64_t n) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.f, 0.02f);
  AdamWState s{std::vector<float>(n), std::vector<float>(n), std::vector<float>(n), std::vector<float>(n)};
  for (int64_t i = 0; i < n; ++i) {
    s.grads[i] = normal(rng) * 3.f;
    s.master[i] = normal(rng);
    s.m[i] = normal(rng) * 0.1f;
    s.v[i] = std::fabs(normal(rng)) * 1e-3f + 1e-7f;
  }
  return s;
}

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
  const int64_t n = 100003;
  const auto [grads, master, m, v] = RandomAdamWState(16, n);
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

// Three 8-bit steps on the GPU and on the host from the same random state: the same bits.
// `shift`: master, gradients and weights start that many values into their arrays (1: not
// 16-byte aligned, so the kernel takes its one-by-one loads rather than its vector ones).
void AdamW8bitAgainstTheHost(int shift) {
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
  auto shifted = [&](const std::vector<float>& x) {
    std::vector<float> out(shift, 0.f);
    out.insert(out.end(), x.begin(), x.end());
    return out;
  };
  Device<float> d_master(shifted(master)), d_grads(shifted(grads));
  Device<uint8_t> d_m(m), d_v(v);
  Device<Bf16> d_weights(std::vector<Bf16>(n + shift, 0));
  std::vector<uint16_t> weights(n);
  AdamWParams p;
  p.lr = 3e-3f;
  p.grad_scale = 0.5f;
  // Steps 2 and 3 also fold the new bf16 weights' largest |x| into an amax: step 2's from
  // zero, step 3's into a larger value already there, which must stay.
  const float larger = 1e9f;
  Device<float> d_amax{std::vector<float>{0.f}};
  for (int step = 1; step <= 3; ++step) {
    p.step = step;
    p.decay = step != 2;
    if (step == 3) ASSERT_EQ(cudaMemcpy(d_amax.get(), &larger, sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
    ASSERT_EQ(AdamW8bit(d_master.get() + shift, d_m.get(), d_v.get(), d_weights.get() + shift, d_grads.get() + shift,
                        n, p, nullptr, step >= 2 ? d_amax.get() : nullptr),
              cudaSuccess);
    HostAdamW8bit(master.data(), m.data(), v.data(), weights.data(), grads.data(), n, p);
    if (step == 2) {  // the host's: |x| of each bf16 value as a float's bits, their max
      uint32_t most = 0;
      for (uint16_t bits : weights) most = std::max<uint32_t>(most, static_cast<uint32_t>(bits & 0x7fffu) << 16);
      float want = 0;
      std::memcpy(&want, &most, sizeof(want));
      ASSERT_GT(want, 0.f);
      EXPECT_EQ(d_amax.Host()[0], want) << "the folded amax is not the new weights' largest |x|";
    }
  }
  EXPECT_EQ(d_amax.Host()[0], larger) << "folding lowered an amax already there";
  EXPECT_EQ(d_master.Host(), shifted(master));
  EXPECT_EQ(d_m.Host(), m);
  EXPECT_EQ(d_v.Host(), v);
  const std::vector<Bf16> w = d_weights.Host();
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(w[shift + i], weights[i]) << i;
}

// AdamW with 8-bit blockwise moments: the kernel gives the host's HostAdamW8bit bits (master,
// bf16 weights, codes and scales) over three steps from random moments, on a size that ends
// mid-block in a CUDA block whose last warps have no quantization block; both ways of finding
// the codes (GpuCodePath: the search, the tables), each with aligned arrays (vector loads) and
// shifted ones (one by one).
TEST(GpuOpsTest, AdamW8bitGivesTheHostsBits) {
  SKIP_WITHOUT_GPU();
  const std::string was = GpuCodePath();
  for (const char* path : {"search", "table"}) {
    for (int shift : {0, 1}) {
      SCOPED_TRACE(std::string(path) + (shift ? ", shifted" : ", aligned"));
      ASSERT_EQ(std::string(UseGpuCodePath(path)), path);
      AdamW8bitAgainstTheHost(shift);
    }
  }
  UseGpuCodePath(was);
}

// Many tensors in one 8-bit launch (AdamW8bitMany, a layer's group at once) give each tensor
// the bits AdamW8bit gives it alone: sizes ending mid-block and mid-CTA, an unaligned tensor
// (one by one) among aligned ones, each with its own params, with and without weights and a
// weights' amax; fp32 and bf16 gradients in one call; more tensors than one launch takes.
TEST(GpuOpsTest, AdamW8bitManyGivesEachTensorTheBitsOfItsOwnLaunch) {
  SKIP_WITHOUT_GPU();
  const std::string was = GpuCodePath();
  const int64_t sizes[] = {3 * 2048 + 517, 2048, 256, 70001, 513, 4096, 1, 9000};
  for (const char* path : {"search", "table"}) {
    SCOPED_TRACE(path);
    ASSERT_EQ(std::string(UseGpuCodePath(path)), path);
    struct One {
      std::vector<float> master;
      std::vector<uint8_t> m8, v8;
      std::vector<Bf16> grads16;
      std::vector<float> grads;
      AdamWParams p;
      int shift;
      bool weights, amax, bf16;
    };
    std::vector<One> all;
    for (int k = 0; k < 19; ++k) {  // 19: past a launch's 16
      const int64_t n = sizes[k % 8];
      const auto [grads, master, m, v] = RandomAdamWState(40 + k, n);
      One o{master, std::vector<uint8_t>(Moment8bitBytes(n)), std::vector<uint8_t>(Moment8bitBytes(n)), {}, grads};
      Quantize8bit(m.data(), n, true, o.m8.data());
      Quantize8bit(v.data(), n, false, o.v8.data());
      o.p.lr = 1e-3f * (1 + k % 3);
      o.p.weight_decay = 0.1f;
      o.p.decay = k % 2 == 0;
      o.p.step = 3;
      o.p.grad_scale = 0.5f;
      o.shift = k == 5 ? 1 : 0;
      o.weights = k % 4 != 3;
      o.amax = o.weights && k % 3 == 0;
      o.bf16 = k % 5 == 2;
      for (float g : grads) o.grads16.push_back(ToBf16(g));
      all.push_back(std::move(o));
    }
    // Device copies: the state shifted by `shift` values (misaligned) where asked.
    struct OnDevice {
      Device<float> master, grads, amax;
      Device<uint8_t> m8, v8;
      Device<Bf16> weights, grads16;
    };
    auto upload = [](const One& o) {
      const int64_t n = static_cast<int64_t>(o.master.size());
      std::vector<float> master(o.shift, 0.f), grads(o.shift, 0.f);
      master.insert(master.end(), o.master.begin(), o.master.end());
      grads.insert(grads.end(), o.grads.begin(), o.grads.end());
      std::vector<Bf16> grads16(o.shift, Bf16{});
      grads16.insert(grads16.end(), o.grads16.begin(), o.grads16.end());
      return std::unique_ptr<OnDevice>(new OnDevice{
          Device<float>(master), Device<float>(grads), Device<float>(std::vector<float>{0.25f}), Device<uint8_t>(o.m8),
          Device<uint8_t>(o.v8), Device<Bf16>(std::vector<Bf16>(n + o.shift)), Device<Bf16>(grads16)});
    };
    std::vector<std::unique_ptr<OnDevice>> alone, together;
    std::vector<AdamW8bitTensor> list;
    for (const One& o : all) {
      const int64_t n = static_cast<int64_t>(o.master.size());
      alone.push_back(upload(o));
      together.push_back(upload(o));
      OnDevice& a = *alone.back();
      OnDevice& t = *together.back();
      Bf16* wa = o.weights ? a.weights.get() + o.shift : nullptr;
      float* amax_a = o.amax ? a.amax.get() : nullptr;
      const cudaError_t e =
          o.bf16 ? AdamW8bit(a.master.get() + o.shift, a.m8.get(), a.v8.get(), wa, a.grads16.get() + o.shift, n, o.p,
                             nullptr, amax_a)
                 : AdamW8bit(a.master.get() + o.shift, a.m8.get(), a.v8.get(), wa, a.grads.get() + o.shift, n, o.p,
                             nullptr, amax_a);
      ASSERT_EQ(e, cudaSuccess);
      list.push_back({.master = t.master.get() + o.shift,
                      .m_bytes = t.m8.get(),
                      .v_bytes = t.v8.get(),
                      .weights = o.weights ? t.weights.get() + o.shift : nullptr,
                      .grads = o.bf16 ? nullptr : t.grads.get() + o.shift,
                      .grads_bf16 = o.bf16 ? t.grads16.get() + o.shift : nullptr,
                      .n = n,
                      .params = o.p,
                      .weights_amax = o.amax ? t.amax.get() : nullptr});
    }
    ASSERT_EQ(AdamW8bitMany(list, nullptr), cudaSuccess);
    for (size_t k = 0; k < all.size(); ++k) {
      SCOPED_TRACE("tensor " + std::to_string(k) + " of " + std::to_string(all[k].master.size()) + " values");
      EXPECT_EQ(together[k]->master.Host(), alone[k]->master.Host());
      EXPECT_EQ(together[k]->m8.Host(), alone[k]->m8.Host());
      EXPECT_EQ(together[k]->v8.Host(), alone[k]->v8.Host());
      EXPECT_EQ(together[k]->weights.Host(), alone[k]->weights.Host());
      EXPECT_EQ(together[k]->amax.Host(), alone[k]->amax.Host());
      EXPECT_NE(together[k]->master.Host(), upload(all[k])->master.Host()) << "the step changed nothing";
    }
  }
  // A tensor naming both kinds of gradients, or neither, is refused.
  AdamW8bitTensor both{.grads = reinterpret_cast<const float*>(16), .grads_bf16 = reinterpret_cast<const Bf16*>(16),
                       .n = 1};
  EXPECT_EQ(AdamW8bitMany({both}, nullptr), cudaErrorInvalidValue);
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

// Without a weights array (null: tierd.torch's fp32 parameters, whose master is the weights)
// AdamW, Lion and 8-bit AdamW step master and moments to the same bits and write nothing else.
TEST(GpuOpsTest, WithoutWeightsTheStepsGiveTheSameMasterAndMoments) {
  SKIP_WITHOUT_GPU();
  const int64_t n = 70001;
  const auto [grads, master, m, v] = RandomAdamWState(23, n);
  AdamWParams p;
  p.lr = 1e-3f;
  p.step = 2;
  p.grad_scale = 0.5f;
  for (const std::string opt : {"adamw", "lion", "adamw8bit"}) {
    std::vector<std::vector<float>> results[2];
    for (int with_weights = 0; with_weights < 2; ++with_weights) {
      Device<float> d_master(master), d_m(m), d_v(v), d_g(grads);
      Device<Bf16> d_w{std::vector<Bf16>(n)};
      Bf16* w = with_weights ? d_w.get() : nullptr;
      if (opt == "adamw") {
        AdamW(d_master.get(), d_m.get(), d_v.get(), w, d_g.get(), n, p, nullptr);
        results[with_weights] = {d_master.Host(), d_m.Host(), d_v.Host()};
      } else if (opt == "lion") {
        Lion(d_master.get(), d_m.get(), w, d_g.get(), n, p, nullptr);
        results[with_weights] = {d_master.Host(), d_m.Host()};
      } else {
        const std::vector<uint8_t> zero(Moment8bitBytes(n), 0);
        Device<uint8_t> d_m8(zero), d_v8(zero);
        ASSERT_EQ(AdamW8bit(d_master.get(), d_m8.get(), d_v8.get(), w, d_g.get(), n, p, nullptr), cudaSuccess);
        const std::vector<uint8_t> m8 = d_m8.Host(), v8 = d_v8.Host();
        results[with_weights] = {d_master.Host(), std::vector<float>(m8.begin(), m8.end()),
                                 std::vector<float>(v8.begin(), v8.end())};
      }
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess) << opt;
      if (with_weights) {
        const std::vector<Bf16> g_w = d_w.Host();
        int64_t zeros = 0;
        for (Bf16 x : g_w) zeros += x == 0;
        EXPECT_LT(zeros, n / 100) << opt << ": the weights were written when asked for";
      }
    }
    for (size_t k = 0; k < results[0].size(); ++k) {
      EXPECT_EQ(std::memcmp(results[0][k].data(), results[1][k].data(), results[0][k].size() * 4), 0)
          << opt << ": array " << k << " differs without weights";
    }
  }
}

}  // namespace
}  // namespace tierd::trainer::gpu
