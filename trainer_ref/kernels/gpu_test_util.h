// What the GPU kernels' tests share: device buffers, random bf16 data with its float values,
// and the comparisons against the CPU reference with the tolerances gpu_ops_test.cc states.
#ifndef TIERD_TRAINER_REF_KERNELS_GPU_TEST_UTIL_H_
#define TIERD_TRAINER_REF_KERNELS_GPU_TEST_UTIL_H_

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "trainer_ref/host_adamw.h"
#include "trainer_ref/kernels/gpu_ops.h"

namespace tierd::trainer::gpu::testing {

inline bool HaveGpu() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

#define SKIP_WITHOUT_GPU() \
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device here: the kernels are checked on the lent GPU machine"

template <typename T>
class Device {
 public:
  explicit Device(const std::vector<T>& host) : count_(host.size()) {
    EXPECT_EQ(cudaMalloc(&ptr_, Bytes()), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(ptr_, host.data(), Bytes(), cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~Device() { cudaFree(ptr_); }
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;
  T* get() { return static_cast<T*>(ptr_); }
  std::vector<T> Host() {
    std::vector<T> out(count_);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(out.data(), ptr_, Bytes(), cudaMemcpyDeviceToHost), cudaSuccess);
    return out;
  }

 private:
  size_t Bytes() const { return std::max<size_t>(count_, 1) * sizeof(T); }
  void* ptr_ = nullptr;
  size_t count_;
};

// Random values, rounded to bf16: the bits for the device and the floats for the reference.
struct Bf16Data {
  std::vector<Bf16> bits;
  std::vector<float> values;
};
inline Bf16Data Random(size_t n, std::mt19937_64& rng, float scale = 1.f) {
  std::normal_distribution<float> normal(0.f, scale);
  Bf16Data d;
  for (size_t i = 0; i < n; ++i) {
    float x = normal(rng);
    if (x == 0.f) x = scale * 1e-3f;  // never zeros
    d.bits.push_back(ToBf16(x));
    d.values.push_back(FromBf16(d.bits.back()));
  }
  return d;
}
inline std::vector<float> Floats(const std::vector<Bf16>& bits) {
  std::vector<float> out;
  for (Bf16 b : bits) out.push_back(FromBf16(b));
  return out;
}

// Returns how many elements are off; prints the first few.
inline int CompareBf16(const std::vector<float>& gpu, const std::vector<float>& cpu, float atol,
                       const std::string& what) {
  EXPECT_EQ(gpu.size(), cpu.size()) << what;
  int off = 0;
  for (size_t i = 0; i < std::min(gpu.size(), cpu.size()); ++i) {
    const float tolerance = std::ldexp(std::fabs(cpu[i]), -7) + atol;
    if (!(std::fabs(gpu[i] - cpu[i]) <= tolerance)) {
      if (off++ < 5) ADD_FAILURE() << what << "[" << i << "]: gpu " << gpu[i] << " cpu " << cpu[i];
    }
  }
  return off;
}
inline int CompareF32(const std::vector<float>& gpu, const std::vector<float>& cpu, float rtol, float atol,
                      const std::string& what) {
  EXPECT_EQ(gpu.size(), cpu.size()) << what;
  int off = 0;
  for (size_t i = 0; i < std::min(gpu.size(), cpu.size()); ++i) {
    if (!(std::fabs(gpu[i] - cpu[i]) <= rtol * std::fabs(cpu[i]) + atol)) {
      if (off++ < 5) ADD_FAILURE() << what << "[" << i << "]: gpu " << gpu[i] << " cpu " << cpu[i];
    }
  }
  return off;
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

#endif  // TIERD_TRAINER_REF_KERNELS_GPU_TEST_UTIL_H_
