#include "trainer_ref/model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

namespace tierd::trainer {
namespace {

ModelConfig Small() { return ModelConfig{"check", 2, 8, 2, 12, 11, 5}; }

std::vector<int32_t> Tokens(int n, int vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> t(n);
  for (int32_t& x : t) x = static_cast<int32_t>(rng() % vocab);
  return t;
}

TEST(ModelTest, LayoutNamesEveryTensorOnceInOrder) {
  const auto layout = ParamLayout(*ModelPreset("tiny"));
  EXPECT_EQ(layout.front().name, "embed.w");
  EXPECT_EQ(layout[2].name, "layers.0.attn.wq");
  EXPECT_EQ(layout.back().name, "head.w");
  size_t offset = 0;
  for (const TensorLayout& t : layout) {
    EXPECT_EQ(t.offset, offset) << t.name;
    offset += t.count;
  }
  EXPECT_EQ(offset, ModelPreset("tiny")->Params());
}

// The whole model's gradient (every parameter) against central differences, in double.
TEST(ModelTest, WholeModelGradientMatchesFiniteDifferences) {
  const ModelConfig config = Small();
  const int batch = 2, seq = 5, n = batch * seq;
  Model<double> model(config, batch, seq);
  model.InitParams(7);
  // Larger weights than the init so every path carries signal.
  std::mt19937_64 rng(8);
  std::normal_distribution<double> normal(0, 0.3);
  for (double& p : model.params()) p += normal(rng);
  const std::vector<int32_t> tokens = Tokens(n, config.vocab, 9);
  std::vector<int32_t> targets = Tokens(n, config.vocab, 10);
  targets[3] = -1;  // one ignored position
  model.ZeroGrads();
  model.Forward(tokens.data(), targets.data());
  model.Backward();
  const std::vector<double> analytic = model.grads();
  const double eps = 1e-6;
  double worst = 0;
  for (size_t i = 0; i < model.params().size(); ++i) {
    double& p = model.params()[i];
    const double saved = p;
    p = saved + eps;
    const double up = model.Forward(tokens.data(), targets.data());
    p = saved - eps;
    const double down = model.Forward(tokens.data(), targets.data());
    p = saved;
    const double numeric = (up - down) / (2 * eps);
    const double error = std::abs(analytic[i] - numeric) / std::max(1e-3, std::abs(numeric));
    worst = std::max(worst, error);
    ASSERT_NEAR(analytic[i], numeric, 1e-6 * std::max(1.0, std::abs(numeric))) << "parameter " << i;
  }
  std::printf("worst relative error over %zu parameters: %.3g\n", model.params().size(), worst);
}

TEST(ModelTest, InitialLossIsAboutLogVocabAndGradientDescentLowersIt) {
  const ModelConfig config = *ModelPreset("tiny");
  const int batch = 2, seq = 16, n = batch * seq;
  Model<float> model(config, batch, seq);
  model.InitParams(1);
  // A sequence that repeats: the next token is predictable.
  std::vector<int32_t> tokens(n), targets(n);
  for (int i = 0; i < n; ++i) {
    tokens[i] = (i * 7) % 13;
    targets[i] = ((i + 1) * 7) % 13;
  }
  const float first = model.Forward(tokens.data(), targets.data());
  EXPECT_NEAR(first, std::log(static_cast<float>(config.vocab)), 0.1);
  float loss = first;
  for (int step = 0; step < 30; ++step) {
    model.ZeroGrads();
    loss = model.Forward(tokens.data(), targets.data());
    model.Backward();
    for (size_t i = 0; i < model.params().size(); ++i) model.params()[i] -= 0.5f * model.grads()[i];
  }
  EXPECT_LT(loss, 0.5f * first) << "30 steps of plain gradient descent on a repeating sequence";
}

}  // namespace
}  // namespace tierd::trainer
