#include "trainer_ref/optimizer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace tierd::trainer {
namespace {

TEST(AdamWTest, FirstStepMovesEachParameterByTheLearningRate) {
  // After one step, m/c1 = g and v/c2 = g^2: the update is lr * g / (|g| + eps) = lr * sign(g).
  std::vector<float> p = {1.0f, -2.0f, 0.5f}, g = {0.3f, -4.0f, 0.01f}, m(3, 0), v(3, 0);
  AdamWOptions o;
  o.weight_decay = 0;
  AdamWStep(p.data(), g.data(), m.data(), v.data(), 3, 0.01, 1, o, true);
  EXPECT_NEAR(p[0], 1.0 - 0.01, 1e-6);
  EXPECT_NEAR(p[1], -2.0 + 0.01, 1e-6);
  EXPECT_NEAR(p[2], 0.5 - 0.01, 1e-5);
  EXPECT_NEAR(m[0], 0.1 * 0.3, 1e-7);
  EXPECT_NEAR(v[1], 0.05 * 16.0, 1e-6);
}

TEST(AdamWTest, WeightDecayIsDecoupledAndSkippedWhenAsked) {
  std::vector<float> p = {2.0f, 2.0f}, g = {0.0f, 0.0f}, m(2, 0), v(2, 0);
  AdamWOptions o;
  o.weight_decay = 0.5;
  AdamWStep(p.data(), g.data(), m.data(), v.data(), 1, 0.1, 1, o, /*decay=*/true);
  AdamWStep(p.data() + 1, g.data() + 1, m.data() + 1, v.data() + 1, 1, 0.1, 1, o, /*decay=*/false);
  EXPECT_NEAR(p[0], 2.0 - 0.1 * 0.5 * 2.0, 1e-6);  // zero gradient: only the decay moves it
  EXPECT_FLOAT_EQ(p[1], 2.0f);
}

TEST(AdamWTest, MinimisesAQuadratic) {
  std::vector<float> p = {5.0f, -3.0f}, m(2, 0), v(2, 0), g(2);
  AdamWOptions o;
  o.weight_decay = 0;
  for (int step = 1; step <= 2000; ++step) {
    for (int i = 0; i < 2; ++i) g[i] = 2 * (p[i] - (i == 0 ? 1.0f : 2.0f));  // (p0-1)^2 + (p1-2)^2
    AdamWStep(p.data(), g.data(), m.data(), v.data(), 2, 0.05, step, o, true);
  }
  EXPECT_NEAR(p[0], 1.0, 1e-2);
  EXPECT_NEAR(p[1], 2.0, 1e-2);
}

TEST(ClipTest, GlobalNormAndFactor) {
  std::vector<float> g = {3.0f, 4.0f};
  EXPECT_DOUBLE_EQ(GlobalNorm(g.data(), 2), 5.0);
  EXPECT_NEAR(ClipFactor(5.0, 1.0), 0.2, 1e-6);
  EXPECT_DOUBLE_EQ(ClipFactor(0.5, 1.0), 1.0);
  EXPECT_DOUBLE_EQ(ClipFactor(50.0, 0.0), 1.0);  // off
}

TEST(ScheduleTest, WarmupThenCosineToTheFloor) {
  EXPECT_NEAR(LearningRate(0, 10, 110, 1e-3, 1e-4), 1e-4, 1e-12);
  EXPECT_NEAR(LearningRate(9, 10, 110, 1e-3, 1e-4), 1e-3, 1e-12);
  EXPECT_NEAR(LearningRate(10, 10, 110, 1e-3, 1e-4), 1e-3, 1e-12);
  EXPECT_NEAR(LearningRate(60, 10, 110, 1e-3, 1e-4), 0.55e-3, 1e-12);  // halfway down
  EXPECT_NEAR(LearningRate(110, 10, 110, 1e-3, 1e-4), 1e-4, 1e-12);
  EXPECT_NEAR(LearningRate(500, 10, 110, 1e-3, 1e-4), 1e-4, 1e-12);
  for (int64_t s = 10; s < 110; ++s) {
    EXPECT_LE(LearningRate(s + 1, 10, 110, 1e-3, 1e-4), LearningRate(s, 10, 110, 1e-3, 1e-4) + 1e-15);
  }
}

}  // namespace
}  // namespace tierd::trainer
