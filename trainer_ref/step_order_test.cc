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
