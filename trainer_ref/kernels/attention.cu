// Attention's entry points (gpu_ops.h): the tensor-core kernels (attention_tc.h) where the
// head size allows, else a warp per query row (any head size up to 256: the CPU-oracle
// shapes of the tests and the tiny models). Causal, fp32 softmax statistics.
#include <cuda_bf16.h>

#include <cmath>

#include "trainer_ref/kernels/attention_tc.h"
#include "trainer_ref/kernels/gpu_kernel_util.cuh"
#include "trainer_ref/kernels/gpu_ops.h"

namespace tierd::trainer::gpu {
namespace {

constexpr int kMaxPerLane = 8;

__device__ __forceinline__ float WarpSum(float x) {
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

// Element `index` of a head's D values starting at `row`, 0 past D (lanes beyond it).
__device__ __forceinline__ float Elem(const Bf16* p, int64_t row, int index, int d) {
  return index < d ? Load(p, row + index) : 0.f;
}

// Row `row` of (B, T, H*D) for head `head`: the D values start here.
__device__ __forceinline__ int64_t RowAt(int bi, int ti, int head, int t, int h, int d) {
  return (int64_t{bi} * t + ti) * h * d + int64_t{head} * d;
}

__global__ void AttentionForwardKernel(Bf16* out, float* lse, const Bf16* q, const Bf16* k, const Bf16* v, int b, int t,
                                       int h, int d, float scale) {
  const int64_t warp = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (warp >= int64_t{b} * h * t) return;
  const int ti = static_cast<int>(warp % t), head = static_cast<int>((warp / t) % h),
            bi = static_cast<int>(warp / (int64_t{t} * h));
  const int per = (d + 31) / 32;
  float qv[kMaxPerLane], acc[kMaxPerLane];
  const int64_t qrow = RowAt(bi, ti, head, t, h, d);
  for (int e = 0; e < per; ++e) {
    qv[e] = Elem(q, qrow, lane + 32 * e, d) * scale;
    acc[e] = 0.f;
  }
  float max = -INFINITY, sum = 0.f;
  for (int tj = 0; tj <= ti; ++tj) {
    const int64_t krow = RowAt(bi, tj, head, t, h, d);
    float s = 0.f;
    for (int e = 0; e < per; ++e) s += qv[e] * Elem(k, krow, lane + 32 * e, d);
    s = WarpSum(s);
    const float new_max = fmaxf(max, s);
    const float correction = __expf(max - new_max), p = __expf(s - new_max);
    sum = sum * correction + p;
    for (int e = 0; e < per; ++e) acc[e] = acc[e] * correction + p * Elem(v, krow, lane + 32 * e, d);
    max = new_max;
  }
  for (int e = 0; e < per; ++e) {
    if (lane + 32 * e < d) Store(out, qrow + lane + 32 * e, acc[e] / sum);
  }
  if (lane == 0) lse[(int64_t{bi} * h + head) * t + ti] = max + logf(sum);
}

// dq: one warp per query row i, over keys j <= i.
__global__ void AttentionBackwardQueryKernel(Bf16* dq, const Bf16* dout, const Bf16* out, const float* lse,
                                             const Bf16* q, const Bf16* k, const Bf16* v, int b, int t, int h, int d,
                                             float scale) {
  const int64_t warp = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (warp >= int64_t{b} * h * t) return;
  const int ti = static_cast<int>(warp % t), head = static_cast<int>((warp / t) % h),
            bi = static_cast<int>(warp / (int64_t{t} * h));
  const int per = (d + 31) / 32;
  const int64_t row = RowAt(bi, ti, head, t, h, d);
  float qv[kMaxPerLane], dov[kMaxPerLane], grad[kMaxPerLane];
  float delta = 0.f;  // D_i = dO_i . O_i
  for (int e = 0; e < per; ++e) {
    qv[e] = Elem(q, row, lane + 32 * e, d) * scale;
    dov[e] = Elem(dout, row, lane + 32 * e, d);
    delta += dov[e] * Elem(out, row, lane + 32 * e, d);
    grad[e] = 0.f;
  }
  delta = WarpSum(delta);
  const float l = lse[(int64_t{bi} * h + head) * t + ti];
  for (int tj = 0; tj <= ti; ++tj) {
    const int64_t krow = RowAt(bi, tj, head, t, h, d);
    float s = 0.f, dp = 0.f;
    for (int e = 0; e < per; ++e) {
      s += qv[e] * Elem(k, krow, lane + 32 * e, d);
      dp += dov[e] * Elem(v, krow, lane + 32 * e, d);
    }
    s = WarpSum(s);
    dp = WarpSum(dp);
    const float ds = __expf(s - l) * (dp - delta);
    for (int e = 0; e < per; ++e) grad[e] += ds * Elem(k, krow, lane + 32 * e, d);
  }
  for (int e = 0; e < per; ++e) {
    if (lane + 32 * e >= d) continue;
    const int64_t at = row + lane + 32 * e;
    Store(dq, at, Load(dq, at) + grad[e] * scale);
  }
}

// dk, dv: one warp per key row j, over queries i >= j.
__global__ void AttentionBackwardKeyKernel(Bf16* dk, Bf16* dv, const Bf16* dout, const Bf16* out, const float* lse,
                                           const Bf16* q, const Bf16* k, const Bf16* v, int b, int t, int h, int d,
                                           float scale) {
  const int64_t warp = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (warp >= int64_t{b} * h * t) return;
  const int tj = static_cast<int>(warp % t), head = static_cast<int>((warp / t) % h),
            bi = static_cast<int>(warp / (int64_t{t} * h));
  const int per = (d + 31) / 32;
  const int64_t krow = RowAt(bi, tj, head, t, h, d);
  float kv[kMaxPerLane], vv[kMaxPerLane], gk[kMaxPerLane], gv[kMaxPerLane];
  for (int e = 0; e < per; ++e) {
    kv[e] = Elem(k, krow, lane + 32 * e, d);
    vv[e] = Elem(v, krow, lane + 32 * e, d);
    gk[e] = gv[e] = 0.f;
  }
  for (int ti = tj; ti < t; ++ti) {
    const int64_t row = RowAt(bi, ti, head, t, h, d);
    float s = 0.f, dp = 0.f, delta = 0.f;
    for (int e = 0; e < per; ++e) {
      const float dov = Elem(dout, row, lane + 32 * e, d);
      s += Elem(q, row, lane + 32 * e, d) * kv[e];
      dp += dov * vv[e];
      delta += dov * Elem(out, row, lane + 32 * e, d);
    }
    s = WarpSum(s) * scale;
    dp = WarpSum(dp);
    delta = WarpSum(delta);
    const float p = __expf(s - lse[(int64_t{bi} * h + head) * t + ti]);
    const float ds = p * (dp - delta);
    for (int e = 0; e < per; ++e) {
      gv[e] += p * Elem(dout, row, lane + 32 * e, d);
      gk[e] += ds * Elem(q, row, lane + 32 * e, d);
    }
  }
  for (int e = 0; e < per; ++e) {
    if (lane + 32 * e >= d) continue;
    const int64_t at = krow + lane + 32 * e;
    Store(dk, at, Load(dk, at) + gk[e] * scale);
    Store(dv, at, Load(dv, at) + gv[e]);
  }
}

int WarpBlocks(int64_t warps) { return static_cast<int>((warps * 32 + kThreads - 1) / kThreads); }

}  // namespace

cudaError_t AttentionForward(Bf16* out, float* lse, const Bf16* q, const Bf16* k, const Bf16* v, int b, int t, int h,
                             int d, cudaStream_t stream) {
  const int64_t rows = int64_t{b} * h * t;
  if (rows == 0) return cudaSuccess;
  if (TensorCoreAttention(d)) return AttentionForwardTc(out, lse, q, k, v, b, t, h, d, stream);
  AttentionForwardKernel<<<WarpBlocks(rows), kThreads, 0, stream>>>(out, lse, q, k, v, b, t, h, d,
                                                                    1.f / sqrtf(static_cast<float>(d)));
  return cudaPeekAtLastError();
}

cudaError_t AttentionBackward(Bf16* dq, Bf16* dk, Bf16* dv, const Bf16* dout, const Bf16* out, const float* lse,
                              void* scratch, int64_t scratch_bytes, const Bf16* q, const Bf16* k, const Bf16* v, int b,
                              int t, int h, int d, cudaStream_t stream) {
  const int64_t rows = int64_t{b} * h * t;
  if (rows == 0) return cudaSuccess;
  if (TensorCoreAttention(d)) {
    return AttentionBackwardTc(dq, dk, dv, dout, out, lse, scratch, scratch_bytes, q, k, v, b, t, h, d, stream);
  }
  const float scale = 1.f / sqrtf(static_cast<float>(d));
  for (Bf16* p : {dq, dk, dv}) {  // the warp kernels add into them
    if (const cudaError_t e = cudaMemsetAsync(p, 0, rows * d * sizeof(Bf16), stream); e != cudaSuccess) return e;
  }
  AttentionBackwardQueryKernel<<<WarpBlocks(rows), kThreads, 0, stream>>>(dq, dout, out, lse, q, k, v, b, t, h, d,
                                                                          scale);
  AttentionBackwardKeyKernel<<<WarpBlocks(rows), kThreads, 0, stream>>>(dk, dv, dout, out, lse, q, k, v, b, t, h, d,
                                                                        scale);
  return cudaPeekAtLastError();
}

}  // namespace tierd::trainer::gpu
