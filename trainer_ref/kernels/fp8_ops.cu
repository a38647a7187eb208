#include <cuda_fp8.h>

#include "trainer_ref/kernels/fp8_ops.h"
#include "trainer_ref/kernels/gpu_kernel_util.cuh"

namespace tierd::trainer::gpu {
namespace {

// Non-negative floats order as their bits: the block's largest |x| goes in with one atomicMax
// on the bits, whatever the order blocks finish in. NaN (bits above +inf) wins, as it should.
__global__ void AbsMaxKernel(unsigned int* amax_bits, const Bf16* in, int64_t n) {
  __shared__ unsigned int block_max;
  if (threadIdx.x == 0) block_max = 0;
  __syncthreads();
  unsigned int mine = 0;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    mine = max(mine, __float_as_uint(fabsf(Load(in, i))));
  }
  atomicMax(&block_max, mine);
  __syncthreads();
  if (threadIdx.x == 0) atomicMax(amax_bits, block_max);
}

__global__ void QuantizeKernel(uint8_t* out, const Bf16* in, int64_t n, const float* scale, bool e5m2) {
  const float s = *scale;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const float x = __fmul_rn(Load(in, i), s);  // one rounding, as the CPU reference's x * scale
    out[i] = __nv_cvt_float_to_fp8(x, __NV_SATFINITE, e5m2 ? __NV_E5M2 : __NV_E4M3);
  }
}

// 32 x 32 tiles through shared memory: reads and writes both along rows.
constexpr int kTile = 32;
__global__ void QuantizeTransposedKernel(uint8_t* out, const Bf16* in, int rows, int cols, const float* scale,
                                         bool e5m2) {
  __shared__ uint8_t tile[kTile][kTile + 1];
  const float s = *scale;
  const int c0 = blockIdx.x * kTile, r0 = blockIdx.y * kTile;
  for (int dy = threadIdx.y; dy < kTile; dy += blockDim.y) {
    const int r = r0 + dy, c = c0 + threadIdx.x;
    if (r < rows && c < cols) {
      const float x = __fmul_rn(Load(in, int64_t{r} * cols + c), s);
      tile[dy][threadIdx.x] = __nv_cvt_float_to_fp8(x, __NV_SATFINITE, e5m2 ? __NV_E5M2 : __NV_E4M3);
    }
  }
  __syncthreads();
  for (int dy = threadIdx.y; dy < kTile; dy += blockDim.y) {
    const int c = c0 + dy, r = r0 + threadIdx.x;  // out row c, column r
    if (r < rows && c < cols) out[int64_t{c} * rows + r] = tile[threadIdx.x][dy];
  }
}

__global__ void ScaleFromAmaxKernel(float* scale, float* scale_inv, const float* amax, float max_finite) {
  // As fp8::CurrentScale: one fp32 division, and 1 for a degenerate amax.
  const float a = *amax;
  float s = 1.0f;
  if (a > 0 && isfinite(a)) {
    const float q = __fdiv_rn(max_finite, a);
    if (isfinite(q)) s = q;
  }
  *scale = s;
  *scale_inv = __fdiv_rn(1.0f, s);
}

}  // namespace

void ScaleFromAmax(float* scale, float* scale_inv, const float* amax, bool e5m2, cudaStream_t stream) {
  ScaleFromAmaxKernel<<<1, 1, 0, stream>>>(scale, scale_inv, amax, e5m2 ? 57344.0f : 448.0f);
}

void QuantizeFp8Transposed(uint8_t* out, const Bf16* in, int rows, int cols, const float* scale, bool e5m2,
                           cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  const dim3 grid((cols + kTile - 1) / kTile, (rows + kTile - 1) / kTile), block(kTile, 8);
  QuantizeTransposedKernel<<<grid, block, 0, stream>>>(out, in, rows, cols, scale, e5m2);
}

void AbsMax(float* amax, const Bf16* in, int64_t n, cudaStream_t stream) {
  cudaMemsetAsync(amax, 0, sizeof(float), stream);
  if (n == 0) return;
  AbsMaxKernel<<<Blocks(n) < 1024 ? Blocks(n) : 1024, kThreads, 0, stream>>>(reinterpret_cast<unsigned int*>(amax), in,
                                                                             n);
}

void QuantizeFp8(uint8_t* out, const Bf16* in, int64_t n, const float* scale, bool e5m2, cudaStream_t stream) {
  if (n == 0) return;
  QuantizeKernel<<<Blocks(n), kThreads, 0, stream>>>(out, in, n, scale, e5m2);
}

}  // namespace tierd::trainer::gpu
