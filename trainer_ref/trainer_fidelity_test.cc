// The optimizer's fidelity over a whole run (slow: apart from trainer_test).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>

#include "trainer_ref/trainer.h"
#include "trainer_ref/trainer_test_util.h"

namespace tierd::trainer {
namespace {

// 8-bit blockwise moments against fp32 ones: the tiny model, 300 steps, the same data and
// seed; the final validation loss (32 held-out batches) within 1%, and the training loss (the
// mean of the last 50 steps, noisier: 128 tokens a step) within 2%.
// A state with 8-bit moments refuses to load into an fp32 run.
TEST(TrainerFidelityTest, EightBitMomentsTrainAsWellAsFp32) {
  const ModelConfig config = *ModelPreset("tiny");
  auto data = LoadDataset("embedded", config.vocab, 32, 0.1);
  ASSERT_TRUE(data.ok());
  double last[2] = {0, 0}, validation[2] = {0, 0};
  std::string state8;
  for (int eight : {0, 1}) {
    TrainOptions o = Small();
    o.steps = 300;
    o.warmup = 20;
    o.moments_8bit = eight;
    auto home = PlainHomeFor(config, o);
    auto trainer = Trainer::Create(config, o, *data, *home);
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    for (int i = 0; i < 300; ++i) {
      auto r = (*trainer)->Step();
      ASSERT_TRUE(r.ok()) << r.status();
      if (i >= 250) last[eight] += r->loss / 50;
    }
    validation[eight] = *(*trainer)->ValidationLoss(32);
    if (eight) state8 = *(*trainer)->SaveState();
  }
  std::printf("after 300 steps: fp32 moments loss %.4f (validation %.4f), 8-bit %.4f (%.4f)\n", last[0],
              validation[0], last[1], validation[1]);
  EXPECT_LT(std::abs(validation[1] - validation[0]) / validation[0], 0.01);
  EXPECT_LT(std::abs(last[1] - last[0]) / last[0], 0.02);
  TrainOptions fp32 = Small();
  auto home = PlainHomeFor(config, fp32);
  auto other = *Trainer::Create(config, fp32, *data, *home);
  const absl::Status refused = other->LoadState(state8);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("the state's moments are 8-bit; this run's are fp32"), absl::string_view::npos)
      << refused;
}

}  // namespace
}  // namespace tierd::trainer
