// The optimizer interface: each optimizer's state and checkpoint words (no GPU needed), and,
// on a GPU, its GPU step giving its host step's bits through the interface (Adafactor's
// matrices: within a few ulps), with fp32 and with the compact state's bf16 gradients, on a
// matrix and on a vector below the 8-bit threshold.
#include "trainer_ref/gpu/gpu_optimizer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "trainer_ref/adamw8bit.h"
#include "trainer_ref/kernels/gpu_test_util.h"

namespace tierd::trainer::gpu {
namespace {

using testing::Device;
using testing::HaveGpu;

TensorLayout Matrix(int64_t rows, int64_t cols) {
  return {"m", {rows, cols}, 0, static_cast<size_t>(rows * cols)};
}
TensorLayout Vector(int64_t n) { return {"v", {n}, 0, static_cast<size_t>(n)}; }

TEST(GpuOptimizerTest, EachOptimizerSaysItsStateAndItsRecords) {
  const TensorLayout matrix = Matrix(1000, 64), vector = Vector(64);
  auto adamw = MakeGpuOptimizer({});
  EXPECT_EQ(adamw->StateBytes(matrix), 64000u * 4);
  EXPECT_TRUE(adamw->HasSecondPart());
  EXPECT_FALSE(adamw->StateAtTensorOffsets());
  EXPECT_EQ(adamw->MomentsRecord() + adamw->OptimizerRecord(), "");

  auto q8 = MakeGpuOptimizer({.moments_8bit = true, .moments_8bit_min = 4096});
  EXPECT_EQ(q8->StateBytes(matrix), Moment8bitBytes(64000));
  EXPECT_EQ(q8->StateBytes(vector), 64u * 4);  // under the threshold: fp32, at its offset
  EXPECT_TRUE(q8->HasSecondPart());
  EXPECT_TRUE(q8->StateAtTensorOffsets());
  EXPECT_EQ(q8->MomentsRecord(), " moments=8bit-root-v-blocks-256 moments-fp32-under=4096");
  EXPECT_EQ(MakeGpuOptimizer({.moments_8bit = true})->MomentsRecord(), " moments=8bit-root-v-blocks-256");

  auto lion = MakeGpuOptimizer({.lion = true});
  EXPECT_EQ(lion->StateBytes(matrix), 64000u * 4);
  EXPECT_FALSE(lion->HasSecondPart());
  EXPECT_FALSE(lion->StateAtTensorOffsets());
  EXPECT_EQ(lion->OptimizerRecord(), " optimizer=lion");

  auto adafactor = MakeGpuOptimizer({.adafactor = true});
  EXPECT_EQ(adafactor->StateBytes(matrix), (1000u + 64u) * 4);  // row and column means
  EXPECT_EQ(adafactor->StateBytes(vector), 64u * 4);
  EXPECT_FALSE(adafactor->HasSecondPart());
  EXPECT_TRUE(adafactor->StateAtTensorOffsets());
  EXPECT_GT(adafactor->ScratchFloats({matrix, vector}), 0);
  EXPECT_EQ(adafactor->OptimizerRecord(), " optimizer=adafactor");
}

// Three steps of one tensor through StepGpu and through StepHost from the same start: the
// master, the bf16 weights and the state bytes agree bit for bit.
void ExpectGpuStepIsHostStep(const OptimizerKind& kind, const TensorLayout& tensor, bool bf16_grads) {
  SCOPED_TRACE(std::string(bf16_grads ? "bf16" : "fp32") + " gradients, " + std::to_string(tensor.count) +
               " values, " + (kind.lion ? "lion" : kind.adafactor ? "adafactor" : kind.moments_8bit ? "8-bit" : "adamw"));
  auto optimizer = MakeGpuOptimizer(kind);
  const size_t n = tensor.count;
  const uint64_t state_bytes = optimizer->StateBytes(tensor);
  std::mt19937_64 rng(n * 31 + bf16_grads);
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> master(n);
  for (float& x : master) x = 0.02f * normal(rng);
  std::vector<unsigned char> m(state_bytes, 0), v(optimizer->HasSecondPart() ? state_bytes : 0, 0);
  std::vector<Bf16> weights(n, 0);
  Device<float> d_master(master);
  Device<unsigned char> d_m(m.empty() ? std::vector<unsigned char>(1) : m),
      d_v(v.empty() ? std::vector<unsigned char>(1) : v);
  Device<Bf16> d_weights(weights);
  Device<float> d_scratch(std::vector<float>(std::max<int64_t>(1, optimizer->ScratchFloats({tensor}))));
  for (int step = 1; step <= 3; ++step) {
    const testing::Bf16Data g = testing::Random(n, rng, 0.1f);  // bf16 values, exact in fp32 too
    AdamWParams p;
    p.lr = 1e-2f;
    p.step = step;
    p.grad_scale = 0.5f;
    Device<float> d_grads(g.values);
    Device<Bf16> d_grads16(g.bits);
    TensorUpdate gpu{.tensor = &tensor, .count = static_cast<int64_t>(n), .master = d_master.get(),
                     .m = d_m.get(), .v = v.empty() ? nullptr : d_v.get(), .weights = d_weights.get(),
                     .grads = bf16_grads ? nullptr : d_grads.get(), .grads_bf16 = bf16_grads ? d_grads16.get() : nullptr,
                     .params = p};
    ASSERT_TRUE(optimizer->StepGpu(gpu, d_scratch.get(), nullptr).ok());
    TensorUpdate host{.tensor = &tensor, .count = static_cast<int64_t>(n), .master = master.data(), .m = m.data(),
                      .v = v.empty() ? nullptr : v.data(), .weights = weights.data(), .grads = g.values.data(),
                      .params = p};
    optimizer->StepHost(host);
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  if (kind.adafactor && tensor.shape.size() == 2) {
    // A matrix's factored update is not the host's bits yet: the row and column means are
    // summed in another order (tests/gpu_trainer_tierd_test.cc's Adafactor bound). Within
    // a few float ulps over three steps, and the factored state likewise.
    auto relative_l2 = [](const float* a, const float* b, size_t count) {
      double diff = 0, norm = 0;
      for (size_t i = 0; i < count; ++i) {
        diff += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
        norm += double(b[i]) * b[i];
      }
      return std::sqrt(diff / std::max(norm, 1e-30));
    };
    const std::vector<float> gpu_master = d_master.Host();
    EXPECT_LT(relative_l2(gpu_master.data(), master.data(), n), 1e-5) << "master";
    const std::vector<unsigned char> gpu_state = d_m.Host();
    EXPECT_LT(relative_l2(reinterpret_cast<const float*>(gpu_state.data()), reinterpret_cast<const float*>(m.data()),
                          state_bytes / sizeof(float)),
              1e-5)
        << "factored state";
    return;
  }
  EXPECT_EQ(std::memcmp(d_master.Host().data(), master.data(), n * sizeof(float)), 0) << "master";
  EXPECT_EQ(d_weights.Host(), weights) << "bf16 weights";
  if (!m.empty()) EXPECT_EQ(d_m.Host(), m) << "first state part";
  if (!v.empty()) EXPECT_EQ(d_v.Host(), v) << "second state part";
}

TEST(GpuOptimizerTest, TheGpuStepGivesTheHostStepsBitsForEachOptimizer) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device here: the optimizers' GPU steps are checked on the lent GPU machine";
  const TensorLayout matrix = Matrix(96, 80), vector = Vector(96);
  for (const OptimizerKind& kind : {OptimizerKind{}, OptimizerKind{.moments_8bit = true, .moments_8bit_min = 4096},
                                    OptimizerKind{.lion = true}, OptimizerKind{.adafactor = true}}) {
    for (bool bf16 : {false, true}) {
      ExpectGpuStepIsHostStep(kind, matrix, bf16);
      ExpectGpuStepIsHostStep(kind, vector, bf16);
    }
  }
}

}  // namespace
}  // namespace tierd::trainer::gpu
