// The check pattern: word i of a buffer seeded with `seed`. One definition for the
// CUDA kernels and their CPU reference.
#ifndef TIERD_TOOLS_GPU_CHECK_PATTERN_H_
#define TIERD_TOOLS_GPU_CHECK_PATTERN_H_

#include <cstdint>

#ifdef __CUDACC__
#define TIERD_HOST_DEVICE __host__ __device__
#else
#define TIERD_HOST_DEVICE
#endif

namespace tierd::gpu_check {

TIERD_HOST_DEVICE inline uint32_t PatternWord(uint64_t index, uint32_t seed) {
  uint64_t x = index * 0x9E3779B97F4A7C15ull + seed * 0xD1B54A32D192ED03ull + 1;
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  return static_cast<uint32_t>(x);
}

}  // namespace tierd::gpu_check

#endif  // TIERD_TOOLS_GPU_CHECK_PATTERN_H_
