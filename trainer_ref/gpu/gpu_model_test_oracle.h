// The GPU model's tests against the CPU model (the oracle): the same initial parameters,
// and training both side by side.
#ifndef TIERD_TRAINER_REF_GPU_GPU_MODEL_TEST_ORACLE_H_
#define TIERD_TRAINER_REF_GPU_GPU_MODEL_TEST_ORACLE_H_

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "trainer_ref/gpu/gpu_model.h"
#include "trainer_ref/kernels/gpu_test_util.h"
#include "trainer_ref/model.h"
#include "trainer_ref/optimizer.h"

namespace tierd::trainer::gpu::testing {

// Each tensor's relative L2 distance of `got` (ParamLayout order) from the CPU model's
// gradients; infinity for a tensor whose CPU gradient is zero (a check on it would be empty).
inline std::vector<double> GradientErrors(Model<float>& cpu, const std::vector<float>& got) {
  std::vector<double> errors;
  for (const TensorLayout& t : cpu.layout()) {
    double diff = 0, norm = 0;
    for (size_t i = 0; i < t.count; ++i) {
      const double g = cpu.grads()[t.offset + i], x = got[t.offset + i];
      diff += (x - g) * (x - g);
      norm += g * g;
    }
    errors.push_back(norm > 0 ? std::sqrt(diff / norm) : INFINITY);
  }
  return errors;
}

// The CPU model's seeded parameters with every matrix rounded to bf16 (what the GPU's
// weights hold; norm weights stay fp32 on both), so only the arithmetic differs.
inline void InitWithBf16Matrices(Model<float>& cpu, uint64_t seed) {
  cpu.InitParams(seed);
  for (const TensorLayout& t : cpu.layout()) {
    if (t.shape.size() < 2) continue;
    for (size_t i = 0; i < t.count; ++i) cpu.params()[t.offset + i] = FromBf16(ToBf16(cpu.params()[t.offset + i]));
  }
}

// 8 AdamW steps (lr 3e-3) on the same random batches of n tokens for both: each step's GPU
// loss within `tolerance` (relative) of the CPU's.
inline void ExpectTrainingTracksTheCpu(Model<float>& cpu, GpuModel& gpu, int n, std::mt19937_64& rng, double tolerance,
                                       const char* label) {
  AdamWOptions adam;
  std::vector<float> m(cpu.params().size(), 0.f), v(cpu.params().size(), 0.f);
  for (int step = 1; step <= 8; ++step) {
    const Batch s = RandomBatch(n, cpu.config().vocab, rng);
    cpu.ZeroGrads();
    const double lc = cpu.Forward(s.tokens.data(), s.targets.data());
    cpu.Backward();
    for (const TensorLayout& t : cpu.layout()) {
      AdamWStep(cpu.params().data() + t.offset, cpu.grads().data() + t.offset, m.data() + t.offset, v.data() + t.offset,
                t.count, 3e-3, step, adam, /*decay=*/t.shape.size() > 1);
    }
    ASSERT_TRUE(gpu.ZeroGrads().ok());
    auto lg = gpu.Forward(s.tokens.data(), s.targets.data());
    ASSERT_TRUE(lg.ok()) << lg.status();
    ASSERT_TRUE(gpu.Backward().ok());
    ASSERT_TRUE(gpu.AdamWStep(3e-3, step, adam, 1.0).ok());
    std::printf("%sstep %d: loss cpu %.5f gpu %.5f\n", label, step, lc, *lg);
    EXPECT_NEAR(*lg, lc, tolerance * lc) << label << "step " << step;
  }
}

}  // namespace tierd::trainer::gpu::testing

#endif  // TIERD_TRAINER_REF_GPU_GPU_MODEL_TEST_ORACLE_H_
