// What the trainer's .cu files share: the block size, bf16 loads and stores with fp32
// arithmetic, and a grid for an element-wise kernel. Device code; included by nvcc only.
#ifndef TIERD_TRAINER_REF_KERNELS_GPU_KERNEL_UTIL_CUH_
#define TIERD_TRAINER_REF_KERNELS_GPU_KERNEL_UTIL_CUH_

#include <cuda_bf16.h>

#include <cstdint>

#include "trainer_ref/kernels/gpu_ops.h"

namespace tierd::trainer::gpu {

inline constexpr int kThreads = 256;

__device__ __forceinline__ float Load(const Bf16* p, int64_t i) {
  return __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(p)[i]);
}
__device__ __forceinline__ void Store(Bf16* p, int64_t i, float x) {
  reinterpret_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(x);
}

inline int Blocks(int64_t count) {
  const int64_t blocks = (count + kThreads - 1) / kThreads;
  return static_cast<int>(blocks < 65535 * 16 ? (blocks > 0 ? blocks : 1) : 65535 * 16);
}

}  // namespace tierd::trainer::gpu

#endif  // TIERD_TRAINER_REF_KERNELS_GPU_KERNEL_UTIL_CUH_
