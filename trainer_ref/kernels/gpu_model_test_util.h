// What the GPU model's tests share: whether a GPU is here, and random batches.
#ifndef TIERD_TRAINER_REF_KERNELS_GPU_MODEL_TEST_UTIL_H_
#define TIERD_TRAINER_REF_KERNELS_GPU_MODEL_TEST_UTIL_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <random>
#include <vector>

namespace tierd::trainer::gpu::testing {

inline bool HaveGpu() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

struct Batch {
  std::vector<int32_t> tokens, targets;
};
// Random tokens and targets, every 17th target from the 5th on not counted (-1).
inline Batch RandomBatch(int n, int vocab, std::mt19937_64& rng) {
  Batch b;
  for (int i = 0; i < n; ++i) b.tokens.push_back(static_cast<int32_t>(rng() % vocab));
  for (int i = 0; i < n; ++i) b.targets.push_back(i % 17 == 5 ? -1 : static_cast<int32_t>(rng() % vocab));
  return b;
}

}  // namespace tierd::trainer::gpu::testing

#endif  // TIERD_TRAINER_REF_KERNELS_GPU_MODEL_TEST_UTIL_H_
