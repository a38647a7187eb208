// --step_order=auto on the cases measured on the H200 (docs/BENCHMARKS.md): 7B in 24 GiB
// with 8-bit moments (layer-major fits DRAM: it was the faster order) and with fp32 moments
// (it does not: one micro-batch at a time was faster), and the cases with nothing to choose.
#include "trainer_ref/step_order.h"

#include <gtest/gtest.h>

namespace tierd::trainer {
namespace {

constexpr double kGiB = 1024.0 * 1024 * 1024;

StepOrderInputs SevenB(double moment_gib) {
  StepOrderInputs in;
  in.tierd = true;
  in.micro_batches = 8;
  const double rest = 12.6 + 25.1 + 25.1 + 2 * moment_gib;  // weights, master, gradients, moments
  in.micro_state_bytes = (rest + 4.0) * kGiB;               // one input a layer
  in.layer_state_bytes = (rest + 32.0) * kGiB;              // eight
  in.gpu_bytes = 18.3 * kGiB;
  in.dram_bytes = 100 * kGiB;
  return in;
}

TEST(StepOrderTest, SevenBWithEightBitMomentsGoesLayerMajor) {
  const StepOrderChoice c = ChooseStepOrder(SevenB(6.3));
  EXPECT_TRUE(c.layer_major) << c.why;
  EXPECT_NE(c.why.find("twice a step instead of 16 times"), std::string::npos) << c.why;
}

TEST(StepOrderTest, SevenBWithFp32MomentsStaysOneMicroBatchAtATime) {
  const StepOrderChoice c = ChooseStepOrder(SevenB(25.1));
  EXPECT_FALSE(c.layer_major) << c.why;
  EXPECT_NE(c.why.find("more than DRAM's"), std::string::npos) << c.why;
}

// 13B in 24 GiB at 4 x 3 with 8-bit moments: the full layer-major state (164 GiB) overflows
// GPU + DRAM, the compact one (116 GiB) does not: layer-major, and it says why; without the
// compact state (the host's optimizer, or --compact_state=off), one micro-batch at a time.
TEST(StepOrderTest, ThirteenBGoesLayerMajorWhenTheCompactStateFits) {
  StepOrderInputs in;
  in.tierd = true;
  in.micro_batches = 3;
  in.micro_state_bytes = 152 * kGiB;
  in.layer_state_bytes = 164.3 * kGiB;
  in.layer_compact_state_bytes = 115.8 * kGiB;
  in.gpu_bytes = 16.9 * kGiB;
  in.dram_bytes = 100 * kGiB;
  StepOrderChoice c = ChooseStepOrder(in);
  EXPECT_TRUE(c.layer_major) << c.why;
  EXPECT_NE(c.why.find("with the compact state"), std::string::npos) << c.why;
  in.layer_compact_state_bytes = 0;
  c = ChooseStepOrder(in);
  EXPECT_FALSE(c.layer_major) << c.why;
  in.layer_compact_state_bytes = 130 * kGiB;  // beyond DRAM as well
  EXPECT_FALSE(ChooseStepOrder(in).layer_major);
}

TEST(StepOrderTest, NothingToChooseWithoutTierdOrWithOneMicroBatch) {
  StepOrderInputs in = SevenB(6.3);
  in.tierd = false;
  EXPECT_FALSE(ChooseStepOrder(in).layer_major);
  in.tierd = true;
  in.micro_batches = 1;
  EXPECT_FALSE(ChooseStepOrder(in).layer_major);
  in.micro_batches = 2;
  in.dram_bytes = 0;  // unbounded
  EXPECT_TRUE(ChooseStepOrder(in).layer_major);
}

}  // namespace
}  // namespace tierd::trainer
