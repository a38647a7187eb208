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

// A rank-one g^2 (g_ij = a_i b_j) is exactly what the factored second moment represents: at
// step 1 (b2 = 0) R_i C_j / mean(R) = g_ij^2 (up to eps1), so u = sign(g), its RMS is 1 (no
// clipping) and every parameter moves by the learning rate. The state holds the row and
// column means of g^2; a vector's holds g^2 itself.
TEST(AdafactorTest, FirstStepOfARankOneGradientMovesEachParameterByTheLearningRate) {
  const size_t rows = 3, cols = 4;
  const double a[rows] = {0.5, -2.0, 1e-3}, b[cols] = {1.0, 3.0, -0.25, 7.0};
  std::vector<float> g(rows * cols), p(rows * cols, 1.0f), state(AdafactorStateCount(rows, cols), 0.0f);
  for (size_t i = 0; i < rows; ++i) {
    for (size_t j = 0; j < cols; ++j) g[i * cols + j] = static_cast<float>(a[i] * b[j]);
  }
  AdafactorOptions o;
  AdafactorStep(p.data(), g.data(), state.data(), rows, cols, 0.01, 1, o, /*decay=*/false);
  for (size_t k = 0; k < p.size(); ++k) EXPECT_NEAR(p[k], 1.0 - 0.01 * (g[k] > 0 ? 1 : -1), 1e-6) << k;
  double mean_b2 = 0;
  for (double x : b) mean_b2 += x * x / cols;
  EXPECT_NEAR(state[1], static_cast<float>(a[1] * a[1] * mean_b2), 1e-5) << "row 1's mean of g^2";
  EXPECT_EQ(state.size(), rows + cols);
  std::vector<float> v_p = {1.0f, 1.0f}, v_g = {0.5f, -4.0f}, v_state(AdafactorStateCount(2, 0), 0.0f);
  AdafactorStep(v_p.data(), v_g.data(), v_state.data(), 2, 0, 0.01, 1, o, /*decay=*/true);
  EXPECT_NEAR(v_state[1], 16.0f, 1e-6);
  EXPECT_NEAR(v_p[0], 1.0 - 0.01 * 0.1 - 0.01, 1e-6) << "decoupled decay, then the sign-sized step";
  EXPECT_NEAR(v_p[1], 1.0 - 0.01 * 0.1 + 0.01, 1e-6);
}

// Updates larger than the clip threshold in RMS are scaled down to it: one huge element among
// small ones (a step-1 vector update is +-1 everywhere, so the RMS is 1; a threshold of 0.5
// halves every step).
TEST(AdafactorTest, UpdatesAreClippedToTheThresholdInRms) {
  std::vector<float> p(8, 0.0f), g = {1, -2, 3, -4, 5, -6, 7, -8}, state(8, 0.0f);
  AdafactorOptions o;
  o.clip_threshold = 0.5;
  AdafactorStep(p.data(), g.data(), state.data(), 8, 0, 0.1, 1, o, false);
  for (size_t k = 0; k < p.size(); ++k) EXPECT_NEAR(std::fabs(p[k]), 0.05, 1e-6) << k;
}

TEST(AdafactorTest, MinimisesAQuadratic) {
  const size_t rows = 16, cols = 24;
  std::vector<float> p(rows * cols, 0.0f), target(rows * cols), g(rows * cols), state(rows + cols, 0.0f);
  for (size_t k = 0; k < target.size(); ++k) target[k] = static_cast<float>(std::sin(0.7 * k) * (1 + k % 5));
  auto loss = [&] {
    double l = 0;
    for (size_t k = 0; k < p.size(); ++k) l += 0.5 * (p[k] - target[k]) * (p[k] - target[k]);
    return l;
  };
  const double before = loss();
  for (int step = 1; step <= 300; ++step) {
    for (size_t k = 0; k < p.size(); ++k) g[k] = p[k] - target[k];
    AdafactorStep(p.data(), g.data(), state.data(), rows, cols, 0.05, step, AdafactorOptions{}, false);
  }
  EXPECT_LT(loss(), before / 100) << "from " << before;
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
