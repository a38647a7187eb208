// The optimizer-placement cost model on the cases it must get right: everything fits the
// GPU (stay), the lent H200's PCIe with a 7B in 24 GiB (the GPU path wins), a consumer
// card's slower link (the host wins), and a slow host (the GPU wins again).
#include "trainer_ref/optimizer_place.h"

#include <gtest/gtest.h>

namespace tierd::trainer {
namespace {

OptimizerCostInputs SevenB() {
  OptimizerCostInputs in;
  in.params = 6.74e9;
  in.state_bytes = 131e9;  // weights 13.5, master 27, gradients 27, moments 54, activations 9.7 GB
  in.gpu_bytes = 25e9;
  in.host_params_per_s = 3e9;
  return in;
}

TEST(OptimizerPlaceTest, StateThatFitsTheGpuStaysThere) {
  OptimizerCostInputs in = SevenB();
  in.gpu_bytes = 140e9;
  const OptimizerChoice c = ChooseOptimizerPlace(in);
  EXPECT_EQ(c.offloaded_fraction, 0.0);
  EXPECT_FALSE(c.on_cpu) << c.why;
}

TEST(OptimizerPlaceTest, FastPcieStreamsThroughTheGpu) {
  const OptimizerChoice c = ChooseOptimizerPlace(SevenB());  // 55 GB/s each way
  EXPECT_EQ(c.offloaded_fraction, 1.0);
  // 81 GB each way at 55 GB/s: 1.47 s (+ the kernel); host 6.74e9 / 3e9 = 2.25 s.
  EXPECT_NEAR(c.gpu_seconds, 12 * 6.74e9 / 55e9 + 6.74e9 / 1e11, 1e-6);
  EXPECT_NEAR(c.cpu_seconds, 6.74e9 / 3e9, 1e-6);
  EXPECT_FALSE(c.on_cpu) << c.why;
  EXPECT_NE(c.why.find("-> gpu"), std::string::npos) << c.why;
}

TEST(OptimizerPlaceTest, ASlowLinkStepsOnTheHost) {
  OptimizerCostInputs in = SevenB();
  in.h2d_bytes_per_s = in.d2h_bytes_per_s = 25e9;  // PCIe 4 x16, a 24 GB consumer card
  const OptimizerChoice c = ChooseOptimizerPlace(in);
  EXPECT_GT(c.gpu_seconds, 3.0);
  EXPECT_TRUE(c.on_cpu) << c.why;
  // ...unless the host is slow.
  in.host_params_per_s = 1e9;
  EXPECT_FALSE(ChooseOptimizerPlace(in).on_cpu);
}

TEST(OptimizerPlaceTest, CalibrationMeasuresSomething) {
  const double rate = CalibrateHostAdamW(int64_t{1} << 16);
  EXPECT_GT(rate, 1e6);   // a million parameters a second is far below any real host
  EXPECT_LT(rate, 1e12);  // and a trillion far above
}

}  // namespace
}  // namespace tierd::trainer
