#include "trainer_ref/schedule.h"

#include <gtest/gtest.h>

namespace tierd::trainer {
namespace {

TEST(ScheduleTest, FineTuningTakesAFineTuningRateAndAShortWarmup) {
  const ModelConfig c = *ModelPreset("7b");
  const Schedule s = ChooseSchedule(c, 1000, /*fine_tune=*/true, /*gpu=*/true, /*lion=*/false, 0, -1);
  EXPECT_DOUBLE_EQ(s.lr, 2e-5);
  EXPECT_EQ(s.warmup, 30);
  EXPECT_NE(s.why.find("lr 2e-05 (2e-05, full fine-tuning's usual AdamW rate (--init_from)), warmup 30 steps (3% of "
                       "the steps), then cosine to 2e-06 at step 1000"),
            std::string::npos)
      << s.why;
  EXPECT_EQ(ChooseSchedule(c, 10, true, true, false, 0, -1).warmup, 1) << "at least one step";
  EXPECT_NEAR(ChooseSchedule(c, 10, true, true, /*lion=*/true, 0, -1).lr, 2e-5 / 3, 1e-12);
}

TEST(ScheduleTest, FromScratchTheRateFallsAndTheWarmupGrowsWithTheModel) {
  const Schedule small = ChooseSchedule(*ModelPreset("124m"), 1000, false, true, false, 0, -1);
  const Schedule mid = ChooseSchedule(*ModelPreset("1.3b"), 1000, false, true, false, 0, -1);
  const Schedule big = ChooseSchedule(*ModelPreset("7b"), 1000, false, true, false, 0, -1);
  EXPECT_NEAR(small.lr, 6e-4, 3e-5);  // 0.13B: just past GPT-3's 125M rate
  EXPECT_NEAR(mid.lr, 2e-4, 1e-5);  // 1.35B: GPT-3's 1.3B rate
  EXPECT_NEAR(big.lr, 1.2e-4, 2e-6);
  EXPECT_LT(big.warmup, 100);
  EXPECT_GT(big.warmup, mid.warmup);
  EXPECT_EQ(big.warmup, 70);
  EXPECT_EQ(ChooseSchedule(*ModelPreset("7b"), 50, false, true, false, 0, -1).warmup, 25) << "at most half the steps";
  EXPECT_NEAR(ChooseSchedule(*ModelPreset("13b"), 1000, false, true, false, 0, -1).lr, 1e-4, 1e-6);
}

TEST(ScheduleTest, GivenValuesAreKeptAndTheCpuKeepsItsOwn) {
  const Schedule given = ChooseSchedule(*ModelPreset("7b"), 100, true, true, false, 1e-4, 5);
  EXPECT_DOUBLE_EQ(given.lr, 1e-4);
  EXPECT_EQ(given.warmup, 5);
  EXPECT_NE(given.why.find("lr 0.0001 (--lr), warmup 5 steps (--warmup)"), std::string::npos) << given.why;
  const Schedule cpu = ChooseSchedule(*ModelPreset("tiny"), 200, false, false, false, 0, -1);
  EXPECT_DOUBLE_EQ(cpu.lr, 3e-3);
  EXPECT_EQ(cpu.warmup, 20);
  EXPECT_EQ(ChooseSchedule(*ModelPreset("tiny"), 200, false, false, false, 0, 0).warmup, 0) << "--warmup=0 is kept";
}

}  // namespace
}  // namespace tierd::trainer
