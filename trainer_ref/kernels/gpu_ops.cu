// CUDA kernels of the reference trainer (see gpu_ops.h): the embedding, the row ops (norm,
// cross-entropy: fp32 reductions through warp shuffles and shared memory) and the sums.
// RoPE, SwiGLU and the residual adds are elementwise_ops.cu, attention attention.cu (and
// attention_tc.cu), the optimizers gpu_optimizer_ops.cu.
#include <cuda_bf16.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "trainer_ref/kernels/gpu_ops.h"
#include "trainer_ref/kernels/gpu_kernel_util.cuh"

namespace tierd::trainer::gpu {
namespace {

// The sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets it.
__device__ float BlockSum(float x) {
  __shared__ float partial[32];
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  __syncthreads();  // partial may still be read by a previous call
  if (lane == 0) partial[warp] = x;
  __syncthreads();
  x = lane < blockDim.x / 32 ? partial[lane] : 0.f;
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}
__device__ float BlockMax(float x) {
  __shared__ float partial[32];
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  __syncthreads();
  if (lane == 0) partial[warp] = x;
  __syncthreads();
  x = lane < blockDim.x / 32 ? partial[lane] : -INFINITY;
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}

__global__ void EmbeddingForwardKernel(float* out, const int32_t* tokens, const Bf16* wte, int n, int c, int v) {
  const int64_t total = int64_t{n} * c;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total; i += int64_t{gridDim.x} * blockDim.x) {
    const int row = static_cast<int>(i / c), col = static_cast<int>(i % c);
    const int token = tokens[row];
    out[i] = token >= 0 && token < v ? Load(wte, int64_t{token} * c + col) : 0.f;
  }
}

// One block per (token segment, 256 columns): the segment's rows summed in order.
__global__ void EmbeddingBackwardKernel(float* dwte, const float* dout, const int32_t* index, int rows, int segments,
                                        int c) {
  const int segment = blockIdx.x;
  const int col = blockIdx.y * blockDim.x + threadIdx.x;
  if (col >= c) return;
  const int32_t* starts = index + rows;
  const int token = index[rows + segments + 1 + segment];
  float sum = 0.f;
  for (int k = starts[segment]; k < starts[segment + 1]; ++k) sum += dout[int64_t{index[k]} * c + col];
  dwte[int64_t{token} * c + col] += sum;
}

// Row kernels: one block per row. With C a multiple of 4 and 16-byte-aligned rows (`vec`)
// every access is a float4 (fp32) or four bf16, several in flight per thread; the scalar
// loops are for other shapes. Both give the same values up to the order of the row's sum.

// out = x * rstd * weight, one block a row. With `residual`, x += residual first (written back,
// as AddInto); with `saved`, x (after the add) is copied there too (what the backward keeps):
// one read of x where AddInto, a copy and the norm read it three times. The plain norm is
// this kernel with neither, so the fused forms give its bits exactly.
// With q.codes, the output's E4M3 codes too (Fp8Out), or only them with a null `out`.
// The norm of x_in (+ residual, where given), that sum written to x_out and to saved where
// they are given; the second pass reads back the sum from where the first wrote it.
__global__ void RmsNormForwardKernel(Bf16* out, float* rstd, const float* x_in, float* x_out, const Bf16* residual,
                                     float* saved, const float* weight, int c, float eps, bool vec, Fp8Out q) {
  PdlWait();
  PdlLetNextStart();
  const int64_t row = blockIdx.x;
  const float* src = x_in + row * c;
  float* dst = x_out != nullptr ? x_out + row * c : nullptr;
  float* copy = saved != nullptr ? saved + row * c : nullptr;
  float sum = 0.f;
  if (vec) {
    for (int j = threadIdx.x; j < c / 4; j += blockDim.x) {
      float4 v = reinterpret_cast<const float4*>(src)[j];
      if (residual != nullptr) {
        const float4 r = Load4(residual + row * c + 4 * j);
        v.x += r.x, v.y += r.y, v.z += r.z, v.w += r.w;
      }
      if (dst != nullptr) reinterpret_cast<float4*>(dst)[j] = v;
      if (copy != nullptr) reinterpret_cast<float4*>(copy)[j] = v;
      sum += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
  } else {
    for (int j = threadIdx.x; j < c; j += blockDim.x) {
      float v = src[j];
      if (residual != nullptr) v += Load(residual, row * c + j);
      if (dst != nullptr) dst[j] = v;
      if (copy != nullptr) copy[j] = v;
      sum += v * v;
    }
  }
  const float* x = dst != nullptr ? dst : copy != nullptr ? copy : src;
  sum = BlockSum(sum);
  const float r = rsqrtf(sum / c + eps);
  if (threadIdx.x == 0) rstd[row] = r;
  // Each thread reads back only the elements it wrote above.
  const float code_scale = q.codes != nullptr ? *q.scale : 0.f;
  unsigned int most = 0;
  if (vec) {
    const auto* x4 = reinterpret_cast<const float4*>(x);
    const auto* w4 = reinterpret_cast<const float4*>(weight);
    for (int j = threadIdx.x; j < c / 4; j += blockDim.x) {
      const float4 v = x4[j], w = w4[j];
      const float4 h = make_float4(v.x * r * w.x, v.y * r * w.y, v.z * r * w.z, v.w * r * w.w);
      if (out != nullptr) Store4(out + row * c + 4 * j, h);
      if (q.codes == nullptr) continue;
      const float hs[4] = {RoundedToBf16(h.x), RoundedToBf16(h.y), RoundedToBf16(h.z), RoundedToBf16(h.w)};
      uint32_t packed = 0;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        most = max(most, __float_as_uint(fabsf(hs[e])));
        packed |= uint32_t{Fp8(hs[e], code_scale, false)} << (8 * e);
      }
      reinterpret_cast<uint32_t*>(q.codes + row * c)[j] = packed;
    }
  } else {
    for (int j = threadIdx.x; j < c; j += blockDim.x) {
      const float h = x[j] * r * weight[j];
      if (out != nullptr) Store(out, row * c + j, h);
      if (q.codes == nullptr) continue;
      const float hs = RoundedToBf16(h);
      most = max(most, __float_as_uint(fabsf(hs)));
      q.codes[row * c + j] = Fp8(hs, code_scale, false);
    }
  }
  if (q.codes != nullptr) WarpAmax(reinterpret_cast<unsigned int*>(q.amax), most);
}

// din += the norm's input gradient, and the weight gradient's partial sums: a block takes
// kNormRowsPerBlock rows, one after the other. A row's values stay in registers between the dot
// product and the update (kPer float4s a thread, C / 4 <= kPer * blockDim.x), with din's loads
// issued beside the others; the weights are read once a block; each thread's columns of
// dy * x * rstd add up over the block's rows in registers, in row order, and go to partial
// (block, C): the weight gradient without a second pass over dy and x.
constexpr int kNormRowsPerBlock = 8;
// One row's dy, x and the din it adds to, each thread its kPer float4 columns.
template <int kPer>
__device__ __forceinline__ void LoadNormRow(float4 (&d)[kPer], float4 (&v)[kPer], float4 (&o)[kPer],
                                            const Bf16* __restrict__ dy, const float4* __restrict__ x4,
                                            const float4* dx4, int c4) {
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int j = threadIdx.x + k * blockDim.x;
    if (j >= c4) continue;
    d[k] = Load4(dy + 4 * j);
    v[k] = x4[j];
    o[k] = dx4[j];
  }
}

// The next row's loads are issued before this row's block-wide sum: at 1.3B's micro-batch a
// block of 128 threads a row waited on its loads, then on the barriers, row after row.
template <int kPer>
__global__ void RmsNormBackwardVecKernel(float* __restrict__ din, const Bf16* __restrict__ dout,
                                         const float* __restrict__ in, const float* __restrict__ weight,
                                         const float* __restrict__ rstd, int n, int c, Bf16* __restrict__ din_bf16,
                                         float* __restrict__ partial) {
  PdlWait();
  PdlLetNextStart();
  const int c4 = c / 4;
  const auto* w4 = reinterpret_cast<const float4*>(weight);
  float4 w[kPer], acc[kPer];
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int j = threadIdx.x + k * blockDim.x;
    acc[k] = make_float4(0.f, 0.f, 0.f, 0.f);
    if (j < c4) w[k] = w4[j];
  }
  const int64_t first = int64_t{blockIdx.x} * kNormRowsPerBlock;
  const int rows = static_cast<int>(min(int64_t{kNormRowsPerBlock}, n - first));
  float4 d[kPer], v[kPer], o[kPer], next_d[kPer], next_v[kPer], next_o[kPer];
  if (rows > 0) {
    LoadNormRow<kPer>(d, v, o, dout + first * c, reinterpret_cast<const float4*>(in + first * c),
                      reinterpret_cast<const float4*>(din + first * c), c4);
  }
  for (int i = 0; i < rows; ++i) {
    const int64_t row = first + i;
    if (i + 1 < rows) {  // another row's din: no alias with this row's stores below
      LoadNormRow<kPer>(next_d, next_v, next_o, dout + (row + 1) * c,
                        reinterpret_cast<const float4*>(in + (row + 1) * c),
                        reinterpret_cast<const float4*>(din + (row + 1) * c), c4);
    }
    auto* dx4 = reinterpret_cast<float4*>(din + row * c);
    const float r = rstd[row];
    float dot = 0.f;
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      const int j = threadIdx.x + k * blockDim.x;
      if (j >= c4) continue;
      dot += d[k].x * w[k].x * v[k].x + d[k].y * w[k].y * v[k].y + d[k].z * w[k].z * v[k].z +
             d[k].w * w[k].w * v[k].w;
    }
    const float mean = BlockSum(dot) / c, rrm = r * r * mean;
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      const int j = threadIdx.x + k * blockDim.x;
      if (j >= c4) continue;
      o[k].x += r * (w[k].x * d[k].x - v[k].x * rrm);
      o[k].y += r * (w[k].y * d[k].y - v[k].y * rrm);
      o[k].z += r * (w[k].z * d[k].z - v[k].z * rrm);
      o[k].w += r * (w[k].w * d[k].w - v[k].w * rrm);
      dx4[j] = o[k];
      if (din_bf16 != nullptr) Store4(din_bf16 + row * c + 4 * j, o[k]);
      acc[k].x += d[k].x * v[k].x * r;
      acc[k].y += d[k].y * v[k].y * r;
      acc[k].z += d[k].z * v[k].z * r;
      acc[k].w += d[k].w * v[k].w * r;
    }
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      d[k] = next_d[k];
      v[k] = next_v[k];
      o[k] = next_o[k];
    }
  }
  auto* p4 = reinterpret_cast<float4*>(partial + int64_t{blockIdx.x} * c);
#pragma unroll
  for (int k = 0; k < kPer; ++k) {
    const int j = threadIdx.x + k * blockDim.x;
    if (j < c4) p4[j] = acc[k];
  }
}

// The scalar form, for C not a multiple of 4 or rows not 16-byte aligned.
__global__ void RmsNormBackwardKernel(float* din, const Bf16* dout, const float* in, const float* weight,
                                      const float* rstd, int c, Bf16* din_bf16) {
  const int64_t row = blockIdx.x;
  const float* x = in + row * c;
  const Bf16* dy = dout + row * c;
  float* dx = din + row * c;
  const float r = rstd[row];
  float dot = 0.f;
  for (int j = threadIdx.x; j < c; j += blockDim.x) dot += Load(dy, j) * weight[j] * x[j];
  const float mean = BlockSum(dot) / c, rrm = r * r * mean;
  for (int j = threadIdx.x; j < c; j += blockDim.x) {
    dx[j] += r * (weight[j] * Load(dy, j) - x[j] * rrm);
    if (din_bf16 != nullptr) Store(din_bf16, row * c + j, dx[j]);
  }
}

constexpr int kNormRowsPerChunk = 64;

// partial (chunks, C): each chunk of 64 rows' sum of dy * x * rstd per column, in a fixed
// order. Vector form: a block is 32 threads across 128 columns (a float4 each) by 8 across
// rows; a thread sums rows ty, ty + 8, ... of the chunk (eight loads in flight), then the 8
// sums of a column add in ty order. (One thread a column over 64 rows kept a 1.3B layer's
// norm at 40% of the memory's rate: 128 blocks for 132 SMs, one load at a time.)
constexpr int kPartialColumns4 = 32, kPartialRowThreads = 8;
__global__ void RmsNormWeightPartialVecKernel(float* __restrict__ partial, const Bf16* __restrict__ dout,
                                             const float* __restrict__ in, const float* __restrict__ rstd, int n,
                                             int c) {
  __shared__ float4 sums[kPartialRowThreads][kPartialColumns4];
  const int chunk = blockIdx.y, tx = threadIdx.x % kPartialColumns4, ty = threadIdx.x / kPartialColumns4;
  const int j4 = blockIdx.x * kPartialColumns4 + tx, c4 = c / 4;
  const int first = chunk * kNormRowsPerChunk, end = min(n, first + kNormRowsPerChunk);
  float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
  if (j4 < c4) {
#pragma unroll
    for (int i = 0; i < kNormRowsPerChunk / kPartialRowThreads; ++i) {
      const int row = first + ty + i * kPartialRowThreads;
      if (row >= end) break;
      const int64_t at = int64_t{row} * c + 4 * j4;
      const float4 d = Load4(dout + at), v = *reinterpret_cast<const float4*>(in + at);
      const float r = rstd[row];
      sum.x += d.x * v.x * r;
      sum.y += d.y * v.y * r;
      sum.z += d.z * v.z * r;
      sum.w += d.w * v.w * r;
    }
  }
  sums[ty][tx] = sum;
  __syncthreads();
  if (ty != 0 || j4 >= c4) return;
  for (int k = 1; k < kPartialRowThreads; ++k) {
    const float4 s = sums[k][tx];
    sum.x += s.x, sum.y += s.y, sum.z += s.z, sum.w += s.w;
  }
  reinterpret_cast<float4*>(partial + int64_t{chunk} * c)[j4] = sum;
}

// The scalar form: one thread a column, the chunk's rows in order.
__global__ void RmsNormWeightPartialKernel(float* partial, const Bf16* dout, const float* in, const float* rstd, int n,
                                           int c) {
  const int chunk = blockIdx.y;
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= c) return;
  const int end = min(n, (chunk + 1) * kNormRowsPerChunk);
  float sum = 0.f;
  for (int row = chunk * kNormRowsPerChunk; row < end; ++row) {
    const int64_t at = int64_t{row} * c + j;
    sum += Load(dout, at) * in[at] * rstd[row];
  }
  partial[int64_t{chunk} * c + j] = sum;
}


constexpr int kCrossEntropyThreads = 512;  // 1.3B's 32,000 logits: ~8 loads of 8 a thread

__global__ void CrossEntropyKernel(float* losses, Bf16* dlogits, const Bf16* logits, const int32_t* targets, int v,
                                   int counted) {
  const int64_t row = blockIdx.x;
  const Bf16* z = logits + row * v;
  const int target = targets[row];
  float max = -INFINITY;
  for (int j = threadIdx.x; j < v; j += blockDim.x) max = fmaxf(max, Load(z, j));
  max = BlockMax(max);
  float sum = 0.f;
  for (int j = threadIdx.x; j < v; j += blockDim.x) sum += __expf(Load(z, j) - max);
  sum = BlockSum(sum);
  const bool counts = target >= 0 && target < v && counted > 0;
  if (threadIdx.x == 0) losses[row] = counts ? logf(sum) + max - Load(z, target) : 0.f;
  if (dlogits == nullptr) return;
  const float scale = counts ? 1.f / counted : 0.f;
  for (int j = threadIdx.x; j < v; j += blockDim.x) {
    const float p = __expf(Load(z, j) - max) / sum;
    Store(dlogits, row * v + j, (p - (j == target ? 1.f : 0.f)) * scale);
  }
}

// (m, s): a set of values' largest m and sum s of exp(x - m). The pair of the union of two sets;
// the same either way round (a sum of two products), so a butterfly leaves every lane the same.
__device__ __forceinline__ void MergeSoftmaxStats(float& m, float& s, float m2, float s2) {
  const float top = fmaxf(m, m2);
  if (top == -INFINITY) return;  // both sets empty (or all -inf)
  s = s * __expf(m - top) + s2 * __expf(m2 - top);
  m = top;
}
__device__ void BlockSoftmaxStats(float& m, float& s) {
  __shared__ float ms[32], ss[32];
  for (int o = 16; o > 0; o >>= 1) {
    MergeSoftmaxStats(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
  }
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) ms[warp] = m, ss[warp] = s;
  __syncthreads();
  m = lane < blockDim.x / 32 ? ms[lane] : -INFINITY;
  s = lane < blockDim.x / 32 ? ss[lane] : 0.f;
  for (int o = 16; o > 0; o >>= 1) {
    MergeSoftmaxStats(m, s, __shfl_xor_sync(0xffffffffu, m, o), __shfl_xor_sync(0xffffffffu, s, o));
  }
}

// CrossEntropyKernel's loss and gradient with eight logits a load: the row's largest value and
// its sum of exponentials in one pass (each thread's running pair, rescaled when its largest
// grows), then one pass that writes the gradient. The scalar kernel reads the row three times,
// two bytes a load (1.3B's 4,096 x 32,000 logits: ~600 us a micro-batch on the H100).
// v % 8 == 0 and 16-byte aligned rows.
__global__ void __launch_bounds__(kCrossEntropyThreads)
    CrossEntropyVecKernel(float* losses, Bf16* dlogits, const Bf16* logits, const int32_t* targets, int v,
                          int counted) {
  const int64_t row = blockIdx.x;
  const Bf16* z = logits + row * v;
  const int target = targets[row];
  float m = -INFINITY, s = 0.f;
  for (int j = 8 * threadIdx.x; j < v; j += 8 * kCrossEntropyThreads) {
    float x[8];
    Load8(z + j, x);
    float top = x[0];
#pragma unroll
    for (int k = 1; k < 8; ++k) top = fmaxf(top, x[k]);
    if (top > m) {
      s *= __expf(m - top);  // 0 while m is -inf (s is 0 then too)
      m = top;
    }
#pragma unroll
    for (int k = 0; k < 8; ++k) s += __expf(x[k] - m);
  }
  BlockSoftmaxStats(m, s);
  const bool counts = target >= 0 && target < v && counted > 0;
  if (threadIdx.x == 0) losses[row] = counts ? logf(s) + m - Load(z, target) : 0.f;
  if (dlogits == nullptr) return;
  const float scale = counts ? 1.f / counted : 0.f;
  for (int j = 8 * threadIdx.x; j < v; j += 8 * kCrossEntropyThreads) {
    float x[8];
    Load8(z + j, x);
#pragma unroll
    for (int k = 0; k < 8; ++k) x[k] = (__expf(x[k] - m) / s - (j + k == target ? 1.f : 0.f)) * scale;
    Store8(dlogits + row * v + j, x);
  }
}

__global__ void SumSquaresKernel(const float* x, int64_t n, float* partial) {
  PdlWait();
  PdlLetNextStart();
  float sum = 0.f;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    sum += x[i] * x[i];
  }
  sum = BlockSum(sum);
  if (threadIdx.x == 0) partial[blockIdx.x] = sum;
}

__global__ void SumPartialsKernel(const float* partial, int count, float* out) {
  PdlWait();
  PdlLetNextStart();
  float sum = 0.f;
  for (int k = threadIdx.x; k < count; k += blockDim.x) sum += partial[k];
  sum = BlockSum(sum);
  if (threadIdx.x == 0) *out += sum;
}

int RowThreads(int c) {
  int threads = 32;
  while (threads < c && threads < 1024) threads *= 2;
  return threads;
}

// A row kernel's block: with float4 accesses about four of them a thread (several loads in
// flight each, and several blocks an SM), at most 256 threads.
int VecRowThreads(int c, bool vec) { return vec ? std::min(256, RowThreads((c / 4 + 3) / 4)) : RowThreads(c); }

}  // namespace

namespace {
// out[j] += the sum over chunks of partial[k][j], in an order fixed by the shape: a block is 32
// columns by 8 row threads; row thread ty sums chunks ty, ty + 8, ..., then the 8 sums of a
// column add in ty order (one thread a column over hundreds of chunks left most SMs idle).
constexpr int kSumColumns = 32, kSumRowThreads = 8;
__global__ void SumChunksIntoKernel(float* out, const float* partial, int chunks, int c) {
  PdlWait();
  PdlLetNextStart();
  __shared__ float sums[kSumRowThreads][kSumColumns];
  const int tx = threadIdx.x % kSumColumns, ty = threadIdx.x / kSumColumns;
  const int j = blockIdx.x * kSumColumns + tx;
  float sum = 0.f;
  if (j < c) {
    for (int k = ty; k < chunks; k += kSumRowThreads) sum += partial[int64_t{k} * c + j];
  }
  sums[ty][tx] = sum;
  __syncthreads();
  if (ty != 0 || j >= c) return;
  float total = 0.f;
  for (int r = 0; r < kSumRowThreads; ++r) total += sums[r][tx];
  out[j] += total;
}
}  // namespace

void SumRowChunksInto(float* out, const float* partial, int chunks, int c, cudaStream_t stream) {
  if (c <= 0) return;
  Launch(SumChunksIntoKernel, (c + kSumColumns - 1) / kSumColumns, kSumColumns * kSumRowThreads, 0, stream, out,
         partial, chunks, c);
}

void EmbeddingForward(float* out, const int32_t* tokens, const Bf16* wte, int n, int c, int v, cudaStream_t stream) {
  EmbeddingForwardKernel<<<Blocks(int64_t{n} * c), kThreads, 0, stream>>>(out, tokens, wte, n, c, v);
}

TokenSegments SegmentTokens(const int32_t* tokens, int n, int v) {
  // A counting sort by token, stable: rows stay in order within a token.
  std::vector<int32_t> count(static_cast<size_t>(v) + 1, 0);
  TokenSegments out;
  for (int i = 0; i < n; ++i) {
    if (tokens[i] >= 0 && tokens[i] < v) ++count[tokens[i] + 1], ++out.rows;
  }
  for (int t = 0; t < v; ++t) {
    out.segments += count[t + 1] > 0;
    count[t + 1] += count[t];
  }
  out.index.assign(static_cast<size_t>(out.rows) + 2 * out.segments + 1, 0);
  std::vector<int32_t> next(count.begin(), count.end() - 1);
  for (int i = 0; i < n; ++i) {
    if (tokens[i] >= 0 && tokens[i] < v) out.index[next[tokens[i]]++] = i;
  }
  int32_t* starts = out.index.data() + out.rows;
  int32_t* seg_tokens = starts + out.segments + 1;
  int s = 0;
  for (int t = 0; t < v; ++t) {
    if (count[t + 1] == count[t]) continue;
    starts[s] = count[t];
    seg_tokens[s++] = t;
  }
  starts[out.segments] = out.rows;
  return out;
}

void EmbeddingBackward(float* dwte, const float* dout, const int32_t* index, int rows, int segments, int c,
                       cudaStream_t stream) {
  if (segments == 0) return;
  const dim3 grid(segments, (c + kThreads - 1) / kThreads);
  EmbeddingBackwardKernel<<<grid, kThreads, 0, stream>>>(dwte, dout, index, rows, segments, c);
}

void RmsNormForward(Bf16* out, float* rstd, const float* in, const float* weight, int n, int c, float eps,
                    cudaStream_t stream) {
  if (n <= 0) return;
  const bool vec = c % 4 == 0 && Aligned16(in, weight) && Aligned16(out);
  // Neither add nor copy: the kernel only reads x.
  Launch(RmsNormForwardKernel, n, VecRowThreads(c, vec), 0, stream, out, rstd, in, nullptr, nullptr, nullptr, weight, c,
         eps, vec, Fp8Out{});
}

void ResidualRmsNormForward(Bf16* out, float* rstd, float* x, const Bf16* residual, float* saved, const float* weight,
                            int n, int c, float eps, cudaStream_t stream, const Fp8Out& codes) {
  if (n <= 0) return;
  // The alignment test of the plain norm: a misaligned residual or copy takes the scalar loops
  // for both, which sum in another order than the plain norm's vector loops would.
  const bool vec = c % 4 == 0 && Aligned16(x, weight) && Aligned16(out) && (saved == nullptr || Aligned16(saved)) &&
                   (residual == nullptr || Aligned16(residual)) && reinterpret_cast<uintptr_t>(codes.codes) % 4 == 0;
  Launch(RmsNormForwardKernel, n, VecRowThreads(c, vec), 0, stream, out, rstd, x, residual != nullptr ? x : nullptr,
         residual, saved, weight, c, eps, vec, codes);
}

void SumRmsNormForward(Bf16* out, float* rstd, const float* x, const Bf16* residual, float* sum, float* saved,
                       const float* weight, int n, int c, float eps, cudaStream_t stream, const Fp8Out& codes) {
  if (n <= 0) return;
  // ResidualRmsNormForward's alignment test, the sum's place standing for x's.
  const bool vec = c % 4 == 0 && Aligned16(x, weight) && Aligned16(out) && (sum == nullptr || Aligned16(sum)) &&
                   (saved == nullptr || Aligned16(saved)) && Aligned16(residual) &&
                   reinterpret_cast<uintptr_t>(codes.codes) % 4 == 0;
  Launch(RmsNormForwardKernel, n, VecRowThreads(c, vec), 0, stream, out, rstd, x, sum, residual, saved, weight, c, eps,
         vec, codes);
}

int64_t RmsNormScratchFloats(int n, int c) {  // the fused kernel's partial sums: a row of C per block of rows
  return int64_t{(n + kNormRowsPerBlock - 1) / kNormRowsPerBlock} * c;
}

void RmsNormBackward(float* din, float* dweight, const Bf16* dout, const float* in, const float* weight,
                     const float* rstd, int n, int c, float* scratch, cudaStream_t stream, Bf16* din_bf16) {
  if (n <= 0) return;
  if (reinterpret_cast<uintptr_t>(din_bf16) % 8 != 0) {  // the copy apart, so the loops stay those of din's alignment
    RmsNormBackward(din, dweight, dout, in, weight, rstd, n, c, scratch, stream);
    ToBf16(din_bf16, din, int64_t{n} * c, stream);
    return;
  }
  const bool vec = c % 4 == 0 && Aligned16(din, in, weight, scratch) && Aligned16(dout);
  const int threads = VecRowThreads(c, vec), chunks = (n + kNormRowsPerChunk - 1) / kNormRowsPerChunk;
  if (vec && (c / 4 + threads - 1) / threads <= 8) {
    const int per = (c / 4 + threads - 1) / threads, blocks = (n + kNormRowsPerBlock - 1) / kNormRowsPerBlock;
    if (per <= 1) {
      Launch(RmsNormBackwardVecKernel<1>, blocks, threads, 0, stream, din, dout, in, weight, rstd, n, c, din_bf16,
             scratch);
    } else if (per <= 2) {
      Launch(RmsNormBackwardVecKernel<2>, blocks, threads, 0, stream, din, dout, in, weight, rstd, n, c, din_bf16,
             scratch);
    } else if (per <= 4) {
      Launch(RmsNormBackwardVecKernel<4>, blocks, threads, 0, stream, din, dout, in, weight, rstd, n, c, din_bf16,
             scratch);
    } else {
      Launch(RmsNormBackwardVecKernel<8>, blocks, threads, 0, stream, din, dout, in, weight, rstd, n, c, din_bf16,
             scratch);
    }
    SumRowChunksInto(dweight, scratch, blocks, c, stream);
    return;
  }
  if (vec) {  // C > 8192: the scalar backward, the vector partial sums
    RmsNormBackwardKernel<<<n, threads, 0, stream>>>(din, dout, in, weight, rstd, c, din_bf16);
    const dim3 grid((c / 4 + kPartialColumns4 - 1) / kPartialColumns4, chunks);
    RmsNormWeightPartialVecKernel<<<grid, kPartialColumns4 * kPartialRowThreads, 0, stream>>>(scratch, dout, in, rstd,
                                                                                            n, c);
  } else {
    RmsNormBackwardKernel<<<n, threads, 0, stream>>>(din, dout, in, weight, rstd, c, din_bf16);
    RmsNormWeightPartialKernel<<<dim3((c + kThreads - 1) / kThreads, chunks), kThreads, 0, stream>>>(scratch, dout, in,
                                                                                                     rstd, n, c);
  }
  SumRowChunksInto(dweight, scratch, chunks, c, stream);
}

void CrossEntropy(float* losses, Bf16* dlogits, const Bf16* logits, const int32_t* targets, int n, int v,
                  int counted, cudaStream_t stream) {
  if (n <= 0) return;
  const bool vec = v % 8 == 0 && reinterpret_cast<uintptr_t>(logits) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(dlogits) % 16 == 0;
  if (vec) {
    CrossEntropyVecKernel<<<n, kCrossEntropyThreads, 0, stream>>>(losses, dlogits, logits, targets, v, counted);
  } else {
    CrossEntropyKernel<<<n, 1024, 0, stream>>>(losses, dlogits, logits, targets, v, counted);
  }
}

void SumSquares(const float* x, int64_t n, float* out, float* scratch, cudaStream_t stream) {
  const int blocks = std::min(Blocks(n), kSumSquaresScratch);
  Launch(SumSquaresKernel, blocks, kThreads, 0, stream, x, n, scratch);
  Launch(SumPartialsKernel, 1, kThreads, 0, stream, scratch, blocks, out);
}

Bf16 ToBf16(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  if ((bits & 0x7f800000u) == 0x7f800000u && (bits & 0x007fffffu) != 0) return static_cast<Bf16>((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);  // round to nearest, ties to even
  return static_cast<Bf16>(bits >> 16);
}

float FromBf16(Bf16 x) {
  const uint32_t bits = static_cast<uint32_t>(x) << 16;
  float out;
  std::memcpy(&out, &bits, sizeof(out));
  return out;
}

namespace {
constexpr int kPdlDevices = 64;
std::atomic<int> pdl_known[kPdlDevices] = {};  // a device's: 1 off, 2 on; 0 not asked yet

bool PdlCapable(int device) {
  int major = 0;
  return cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess && major >= 9;
}
}  // namespace

bool PdlOn() {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= kPdlDevices) return false;
  if (const int k = pdl_known[device].load(std::memory_order_relaxed); k != 0) return k == 2;
  const char* env = std::getenv("TIERD_PDL");
  const bool on = (env == nullptr || std::string_view(env) != "0") && PdlCapable(device);
  pdl_known[device].store(on ? 2 : 1, std::memory_order_relaxed);
  return on;
}

bool UsePdl(bool on) {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= kPdlDevices) return false;
  on = on && PdlCapable(device);
  pdl_known[device].store(on ? 2 : 1, std::memory_order_relaxed);
  return on;
}

}  // namespace tierd::trainer::gpu
