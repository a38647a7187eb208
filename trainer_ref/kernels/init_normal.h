// The initial weights' values, element by element: N(0, sigma) from counter-based streams
// (SplitMix64 + Box-Muller in double), so any element can be made alone, on the host or the
// GPU, in any order. A tensor is cut in slices of 2^16 values; slice k of the tensor with
// stream id `entry` draws from its own stream, pairs of uniforms giving pairs of normals.
// Host and device share this header: InitNormalValue is the CPU reference of the
// InitNormal kernel (gpu_ops.h).
#ifndef TIERD_TRAINER_REF_KERNELS_INIT_NORMAL_H_
#define TIERD_TRAINER_REF_KERNELS_INIT_NORMAL_H_

#include <cmath>
#include <cstdint>

#ifdef __CUDACC__
#define TIERD_HOST_DEVICE __host__ __device__
#else
#define TIERD_HOST_DEVICE
#endif

namespace tierd::trainer::gpu {

inline constexpr uint64_t kInitSliceValues = uint64_t{1} << 16;

TIERD_HOST_DEVICE inline uint64_t SplitMixAt(uint64_t state, uint64_t call) {  // the call-th draw (1-based)
  uint64_t z = state + call * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Element `index` of the tensor whose stream id is `entry`.
TIERD_HOST_DEVICE inline float InitNormalValue(uint64_t seed, uint64_t entry, uint64_t index, double sigma) {
  const uint64_t slice = index / kInitSliceValues, within = index % kInitSliceValues, pair = within / 2;
  const uint64_t state = seed * 0x100000001B3ull + (entry * 1000003 + slice) * 0x9E3779B97F4A7C15ull;
  const double u1 = (static_cast<double>(SplitMixAt(state, 2 * pair + 1) >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]
  const double u2 = static_cast<double>(SplitMixAt(state, 2 * pair + 2) >> 11) * 0x1.0p-53;
  const double r = sigma * sqrt(-2.0 * log(u1)), angle = 2.0 * 3.14159265358979323846 * u2;
  return static_cast<float>(within % 2 == 0 ? r * cos(angle) : r * sin(angle));
}

}  // namespace tierd::trainer::gpu

#endif  // TIERD_TRAINER_REF_KERNELS_INIT_NORMAL_H_
