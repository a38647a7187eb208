#include "trainer_ref/host_lion.h"

#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "trainer_ref/optimizer.h"

namespace tierd::trainer {
namespace {

// The host's fp32 Lion against the double-precision oracle on random state, threaded and
// not: the same signs, so parameters within a few fp32 roundings; the moment likewise.
TEST(HostLionTest, MatchesTheReferenceOnRandomData) {
  const int64_t n = 300001;
  std::mt19937 rng(5);
  std::normal_distribution<float> d;
  std::vector<float> p(n), m(n), g(n);
  for (int64_t i = 0; i < n; ++i) {
    p[i] = d(rng);
    m[i] = 0.01f * d(rng);
    g[i] = 0.02f * d(rng);
  }
  for (bool decay : {true, false}) {
    for (int threads : {1, 4}) {
      std::vector<float> rp = p, rm = m, hp = p, hm = m;
      LionOptions o;
      o.weight_decay = 0.3;
      LionStep(rp.data(), g.data(), rm.data(), n, 1e-3, o, decay);
      HostLionParams h;
      h.lr = 1e-3f;
      h.weight_decay = 0.3f;
      h.decay = decay;
      HostLion(hp.data(), hm.data(), g.data(), n, h, threads);
      int moved_wrong = 0;
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_NEAR(hp[i], rp[i], 4e-7f * (1 + std::fabs(rp[i]))) << i;
        ASSERT_NEAR(hm[i], rm[i], 1e-8f + 1e-6f * std::fabs(rm[i])) << i;
        // Without decay every element moves by lr: the sign, not the size, of the mix.
        if (!decay && std::fabs(std::fabs(hp[i] - p[i]) - 1e-3f) > 2e-6f) ++moved_wrong;
      }
      EXPECT_EQ(moved_wrong, 0);
    }
  }
}

TEST(HostLionTest, GradScaleIsTheClipFactor) {
  std::vector<float> p = {1, 1}, m = {0, 0}, g = {2, -4};
  HostLionParams h;
  h.lr = 0.1f;
  h.decay = false;
  h.grad_scale = 0.5f;
  HostLion(p.data(), m.data(), g.data(), 2, h, 1);
  EXPECT_FLOAT_EQ(p[0], 0.9f);
  EXPECT_FLOAT_EQ(p[1], 1.1f);
  EXPECT_NEAR(m[0], 0.01f, 1e-7f);   // (1 - 0.99) * 1
  EXPECT_NEAR(m[1], -0.02f, 1e-7f);  // (1 - 0.99) * -2
}

}  // namespace
}  // namespace tierd::trainer
