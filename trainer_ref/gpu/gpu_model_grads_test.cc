// A step's gradients on the GPU model: the first backward through a layer writes its linear
// maps' gradients (the GEMMs' beta 0: no zeros written first and read back), every later one
// adds. Part of gpu_model_test (one binary to carry); needs a CUDA device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "trainer_ref/gpu/gpu_model.h"
#include "trainer_ref/gpu/gpu_model_test_oracle.h"
#include "trainer_ref/kernels/gpu_test_util.h"
#include "trainer_ref/model.h"

namespace tierd::trainer::gpu {
namespace {

using testing::Batch;
using testing::HaveGpu;
using testing::InitWithBf16Matrices;
using testing::RandomBatch;

// The worst per-tensor relative L2 distance of `got` from the CPU model's gradients (infinite
// where a CPU gradient is zero: an empty check passes nothing).
double WorstRelativeError(Model<float>& cpu, const std::vector<float>& got) {
  const std::vector<double> errors = testing::GradientErrors(cpu, got);
  return *std::max_element(errors.begin(), errors.end());
}

// Two micro-batches give the CPU model's sum of both; the next step's single micro-batch its
// own gradients only, with nothing of the last step's left in the linear maps' (which ZeroGrads
// does not zero: their first backward writes them). bf16 matmuls (5% bound, as
// ForwardBackwardAndTrainingTrackTheCpuModel) and FP8 ones (25%, as Fp8MatmulsTrackTheCpuModel);
// last step's gradients left in would be ~100% off.
TEST(GpuModelTest, EachStepsGradientsStartAtItsFirstBackward) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device here: the GPU model is checked on the lent GPU machine";
  const ModelConfig config = *ModelPreset("tiny");
  const int batch = 2, seq = 32, n = batch * seq;
  for (const bool fp8 : {false, true}) {
    SCOPED_TRACE(fp8 ? "fp8" : "bf16");
    const double bound = fp8 ? 0.25 : 0.05;
    Model<float> cpu(config, batch, seq);
    InitWithBf16Matrices(cpu, 21);
    auto gpu = GpuModel::Create(config, batch, seq);
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    if (fp8) ASSERT_TRUE((*gpu)->UseFp8().ok());
    ASSERT_TRUE((*gpu)->SetParams(cpu.params()).ok());
    std::mt19937_64 rng(22);
    const Batch b1 = RandomBatch(n, config.vocab, rng), b2 = RandomBatch(n, config.vocab, rng),
                b3 = RandomBatch(n, config.vocab, rng);
    std::vector<float> grads;

    cpu.ZeroGrads();
    ASSERT_TRUE((*gpu)->ZeroGrads().ok());
    for (const Batch* b : {&b1, &b2}) {
      cpu.Forward(b->tokens.data(), b->targets.data());
      cpu.Backward();
      ASSERT_TRUE((*gpu)->Forward(b->tokens.data(), b->targets.data()).ok());
      ASSERT_TRUE((*gpu)->Backward().ok());
    }
    ASSERT_TRUE((*gpu)->GetGrads(&grads).ok());
    const double two = WorstRelativeError(cpu, grads);
    EXPECT_LT(two, bound) << "two micro-batches' gradients are not the sum of both";

    cpu.ZeroGrads();
    ASSERT_TRUE((*gpu)->ZeroGrads().ok());
    cpu.Forward(b3.tokens.data(), b3.targets.data());
    cpu.Backward();
    ASSERT_TRUE((*gpu)->Forward(b3.tokens.data(), b3.targets.data()).ok());
    ASSERT_TRUE((*gpu)->Backward().ok());
    ASSERT_TRUE((*gpu)->GetGrads(&grads).ok());
    const double next = WorstRelativeError(cpu, grads);
    EXPECT_LT(next, bound) << "the next step's gradients are not its own micro-batch's";
    std::printf("%s: worst gradient relative L2 error, two micro-batches %.4f, the next step's one %.4f\n",
                fp8 ? "fp8" : "bf16", two, next);
  }
}

}  // namespace
}  // namespace tierd::trainer::gpu
