// What the trainer's .cu files share: the block size, bf16 loads and stores with fp32
// arithmetic, and a grid for an element-wise kernel. Device code; included by nvcc only.
#ifndef TIERD_TRAINER_REF_KERNELS_GPU_KERNEL_UTIL_CUH_
#define TIERD_TRAINER_REF_KERNELS_GPU_KERNEL_UTIL_CUH_

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>
#include <utility>

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

// FP8 conversions shared by the conversion kernels (fp8_ops.cu) and the kernels that write
// codes beside their bf16 output (gpu_ops.cu: Fp8Out).
__device__ __forceinline__ uint8_t Fp8(float x, float scale, bool e5m2) {
  // One rounding for x * scale (as the CPU reference's), one for the conversion.
  return __nv_cvt_float_to_fp8(__fmul_rn(x, scale), __NV_SATFINITE, e5m2 ? __NV_E5M2 : __NV_E4M3);
}

__device__ __forceinline__ float RoundedToBf16(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }

// RoPE: the cos and sin of pair i's angle at position pos (sign -1: the backward's turn), and a
// pair (a, b) turned by it; shared by RoPE's kernel and the backward that writes FP8 codes
// (RopeBackwardFp8Transposed), so both compute the same bits.
__device__ __forceinline__ void RopeTrig(int pos, float inv_freq, float sign, float& cs, float& sn) {
  const float angle = sign * pos * inv_freq;
  sincosf(angle, &sn, &cs);
}
__device__ __forceinline__ void RotatePair(float a, float b, float cs, float sn, float& x, float& y) {
  x = a * cs - b * sn;
  y = a * sn + b * cs;
}

// The warp's largest |x| bits (each thread's `mine`) into *amax_bits; every thread of a warp
// that is not done must call it. Nothing with a null amax_bits. No shared memory and no block
// barrier, so the conversions keep their speed; only a warp above what is there already sends
// an atomic (tens of thousands of blocks on one address serialise in L2: ~20 us a conversion
// of 8M values, measured). The max only grows, so a stale read costs an atomic, never a value.
// `seen`: *amax_bits as the caller read it earlier, beside its other loads, so that the check
// waits on no load of its own (a kernel whose warps are short-lived: the 8-bit optimizer step).
__device__ __forceinline__ unsigned int WarpMaxBits(unsigned int mine) {
  for (int offset = 16; offset > 0; offset /= 2) mine = max(mine, __shfl_xor_sync(0xffffffffu, mine, offset));
  return mine;
}
__device__ __forceinline__ bool FirstLaneOfWarp() { return (threadIdx.x + threadIdx.y * blockDim.x) % 32 == 0; }
__device__ __forceinline__ void WarpAmax(unsigned int* amax_bits, unsigned int mine, unsigned int seen) {
  if (amax_bits == nullptr) return;
  mine = WarpMaxBits(mine);
  if (FirstLaneOfWarp() && mine > seen) atomicMax(amax_bits, mine);
}
__device__ __forceinline__ void WarpAmax(unsigned int* amax_bits, unsigned int mine) {
  if (amax_bits == nullptr) return;
  mine = WarpMaxBits(mine);
  if (FirstLaneOfWarp() && mine > *amax_bits) atomicMax(amax_bits, mine);
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
// The same for 8 bytes (eight FP8 codes a store).
template <typename... P>
inline bool Aligned8(const P*... p) {
  return ((reinterpret_cast<uintptr_t>(p) % 8 == 0) && ...);
}

// out (C, fp32) += the sum over `chunks` rows of partial (chunks, C), in an order fixed by the
// shape: the second half of a deterministic column sum (gpu_ops.cu).
void SumRowChunksInto(float* out, const float* partial, int chunks, int c, cudaStream_t stream);

// Programmatic dependent launch (sm_90 and later): a kernel queued by Launch() may be started
// while the kernel before it in the stream drains, instead of after it and a launch's latency.
// Such a kernel calls PdlWait() first, before it reads or writes anything another kernel
// touches (the wait returns once the kernels before it have finished and their writes show),
// then PdlLetNextStart(), so that the kernel after it may start the same way. Both are no-ops
// in a kernel launched without the attribute, and below sm_90.
__device__ __forceinline__ void PdlWait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void PdlLetNextStart() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Whether Launch() asks for the early start: the current device is sm_90 or later and the
// environment's TIERD_PDL is not "0" (the same kernels launched plainly, for a side-by-side run).
bool PdlOn();

// kernel<<<grid, block, shared, stream>>>(args...), with the early start where PdlOn(). Only for
// kernels that begin with PdlWait().
template <typename... Params, typename... Args>
inline void Launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shared, cudaStream_t stream,
                   Args&&... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = shared;
  config.stream = stream;
  cudaLaunchAttribute early[1];
  if (PdlOn()) {
    early[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    early[0].val.programmaticStreamSerializationAllowed = 1;
    config.attrs = early;
    config.numAttrs = 1;
  }
  cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

inline int Blocks(int64_t count) {
  const int64_t blocks = (count + kThreads - 1) / kThreads;
  return static_cast<int>(blocks < 65535 * 16 ? (blocks > 0 ? blocks : 1) : 65535 * 16);
}

}  // namespace tierd::trainer::gpu

#endif  // TIERD_TRAINER_REF_KERNELS_GPU_KERNEL_UTIL_CUH_
