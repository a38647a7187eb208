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

// Eight bf16 values (16 bytes, one load or store) to and from floats; the rounding is
// Store's, so a vectorised kernel writes the bits its scalar loop would.
__device__ __forceinline__ void Load8(const Bf16* p, float out[8]) {
  const uint4 raw = *reinterpret_cast<const uint4*>(p);
  const auto* pairs = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __bfloat1622float2(pairs[i]);
    out[2 * i] = f.x;
    out[2 * i + 1] = f.y;
  }
}
__device__ __forceinline__ void Store8(Bf16* p, const float in[8]) {
  uint4 raw;
  auto* pairs = reinterpret_cast<__nv_bfloat162*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) pairs[i] = __floats2bfloat162_rn(in[2 * i], in[2 * i + 1]);
  *reinterpret_cast<uint4*>(p) = raw;
}
// Four bf16 values (8 bytes).
__device__ __forceinline__ float4 Load4(const Bf16* p) {
  const uint2 raw = *reinterpret_cast<const uint2*>(p);
  const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.x));
  const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.y));
  return make_float4(a.x, a.y, b.x, b.y);
}
__device__ __forceinline__ void Store4(Bf16* p, float4 v) {
  uint2 raw;
  *reinterpret_cast<__nv_bfloat162*>(&raw.x) = __floats2bfloat162_rn(v.x, v.y);
  *reinterpret_cast<__nv_bfloat162*>(&raw.y) = __floats2bfloat162_rn(v.z, v.w);
  *reinterpret_cast<uint2*>(p) = raw;
}

// SwiGLU (silu(gate) * up): its sigmoid, and its backward for one value (the gradients of
// gate and up from the output's), shared by SwiGluBackward and the kernel that writes those
// gradients as FP8 codes (SwiGluBackwardFp8), so that both compute the same bits.
__device__ __forceinline__ float Sigmoid(float x) { return 1.f / (1.f + __expf(-x)); }
__device__ __forceinline__ void SwiGluGrads(float g, float u, float dy, float& dg, float& du) {
  const float s = Sigmoid(g);
  dg = dy * u * s * (1.f + g * (1.f - s));
  du = dy * g * s;
}

// True when every pointer is 16-byte aligned: a kernel then takes 16-byte loads and stores.
template <typename... P>
inline bool Aligned16(const P*... p) {
  return ((reinterpret_cast<uintptr_t>(p) % 16 == 0) && ...);
}

// out (C, fp32) += the sum over `chunks` rows of partial (chunks, C), in row order: the second
// half of a deterministic column sum (gpu_ops.cu).
void SumRowChunksInto(float* out, const float* partial, int chunks, int c, cudaStream_t stream);

inline int Blocks(int64_t count) {
  const int64_t blocks = (count + kThreads - 1) / kThreads;
  return static_cast<int>(blocks < 65535 * 16 ? (blocks > 0 ? blocks : 1) : 65535 * 16);
}

}  // namespace tierd::trainer::gpu

#endif  // TIERD_TRAINER_REF_KERNELS_GPU_KERNEL_UTIL_CUH_
