#include "trainer_ref/trainer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "trainer_ref/checkpoint.h"

namespace tierd::trainer {
namespace {

TrainOptions Small() {
  TrainOptions o;
  o.batch = 4;
  o.seq = 32;
  o.steps = 60;
  o.warmup = 5;
  o.seed = 3;
  return o;
}

TEST(TrainerTest, TheTinyModelLearnsTheEmbeddedCorpus) {
  const ModelConfig config = *ModelPreset("tiny");
  auto data = LoadDataset("embedded", config.vocab, 32, 0.1);
  ASSERT_TRUE(data.ok()) << data.status();
  Trainer trainer(config, Small(), *data);
  const double before = trainer.ValidationLoss(4);
  EXPECT_NEAR(before, std::log(256.0), 0.2);
  for (int i = 0; i < 60; ++i) {
    const StepResult r = trainer.Step();
    ASSERT_FALSE(r.skipped) << r.why;
  }
  const double after = trainer.ValidationLoss(4);
  std::printf("validation loss %.3f -> %.3f after 60 steps\n", before, after);
  EXPECT_LT(after, 0.6 * before) << "seed 3, 60 steps of 4 x 32 tokens";
}

TEST(TrainerTest, ResumingFromAStateContinuesTheExactCurve) {
  const ModelConfig config = *ModelPreset("tiny");
  auto data = LoadDataset("embedded", config.vocab, 32, 0.1);
  ASSERT_TRUE(data.ok());
  TrainOptions o = Small();
  o.grad_accum = 2;
  Trainer straight(config, o, *data);
  std::vector<double> losses;
  for (int i = 0; i < 6; ++i) losses.push_back(straight.Step().loss);
  Trainer first(config, o, *data);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(first.Step().loss, losses[i]);
  const std::string dir = std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp";
  auto path = WriteCheckpoint(dir, first.step(), first.SaveState());
  ASSERT_TRUE(path.ok()) << path.status();
  Trainer resumed(config, o, *data);
  auto latest = LatestCheckpoint(dir);
  ASSERT_TRUE(latest.ok()) << latest.status();
  auto payload = ReadCheckpoint(*latest);
  ASSERT_TRUE(payload.ok()) << payload.status();
  ASSERT_TRUE(resumed.LoadState(*payload).ok());
  EXPECT_EQ(resumed.step(), 3);
  for (int i = 3; i < 6; ++i) EXPECT_EQ(resumed.Step().loss, losses[i]) << "step " << i + 1;
  ASSERT_EQ(resumed.model().params().size(), straight.model().params().size());
  EXPECT_EQ(std::memcmp(resumed.model().params().data(), straight.model().params().data(),
                        straight.model().params().size() * sizeof(float)),
            0)
      << "bit-exact";
}

TEST(TrainerTest, ANonFiniteGradientSkipsTheStepAndSaysWhere) {
  const ModelConfig config = *ModelPreset("tiny");
  auto data = LoadDataset("embedded", config.vocab, 32, 0.1);
  ASSERT_TRUE(data.ok());
  Trainer trainer(config, Small(), *data);
  const TensorLayout& wq = trainer.model().layout()[2];  // layers.0.attn.wq
  trainer.model().params()[wq.offset + 5] = NAN;
  const std::vector<float> before = trainer.model().params();
  const StepResult r = trainer.Step();
  EXPECT_TRUE(r.skipped);
  EXPECT_NE(r.why.find("loss"), std::string::npos) << r.why;  // a NaN weight poisons the loss first
  EXPECT_EQ(std::memcmp(before.data(), trainer.model().params().data(), before.size() * sizeof(float)), 0)
      << "a skipped step changes nothing";
}

TEST(CheckpointTest, DamagedFilesAreRefusedAndTheOlderOneIsUsed) {
  const std::string dir = std::string(std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp") + "/ckpts";
  std::system(("mkdir -p " + dir).c_str());
  ASSERT_TRUE(WriteCheckpoint(dir, 10, std::string(1000, 'a')).ok());
  auto newest = WriteCheckpoint(dir, 20, std::string(1000, 'b'));
  ASSERT_TRUE(newest.ok());
  {
    std::fstream f(*newest, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(500);
    f.put('X');  // one flipped byte
  }
  EXPECT_EQ(ReadCheckpoint(*newest).status().code(), absl::StatusCode::kDataLoss);
  std::string skipped;
  auto latest = LatestCheckpoint(dir, &skipped);
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_NE(latest->find("ckpt-00000010.bin"), std::string::npos);
  EXPECT_NE(skipped.find("fails its checksum"), std::string::npos) << skipped;
  EXPECT_EQ(ReadCheckpoint(dir + "/nope.bin").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(WriteCheckpoint("/nonexistent/dir", 1, "x").status().code(), absl::StatusCode::kInternal);
}

}  // namespace
}  // namespace tierd::trainer
