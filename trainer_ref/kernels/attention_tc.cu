// Causal attention on tensor cores (WMMA 16x16x16, bf16 in, fp32 accumulate), flash-style:
// tiles of 64 queries x 64 keys in shared memory, online softmax in fp32, never a T x T
// matrix. Head sizes 64 and 128 (the models' sizes); gpu_ops.cu falls back to its
// warp-per-row kernels for others.
//   forward:  per (batch, head, 64-query tile), 4 warps of 16 query rows.
//   backward: delta_i = dO_i . O_i; then per 64-key tile dK, dV (looping over the query
//             tiles at or after it), and per 64-query tile dQ (looping over the key tiles at
//             or before it): every gradient row is summed in one block, in a fixed order
//             (deterministic, no atomics), at the price of computing S and dP twice.
#include <cuda_bf16.h>
#include <mma.h>

#include "trainer_ref/kernels/attention_tc.h"

namespace tierd::trainer::gpu {
namespace {

using namespace nvcuda;
constexpr int kTile = 64;   // queries and keys per tile
constexpr int kWarps = 4;   // 16 rows each
constexpr int kRows = 16;

using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major>;
using FragAT = wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::col_major>;
using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major>;
using FragBT = wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major>;
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

__device__ __forceinline__ int64_t RowOf(int bi, int ti, int head, int t, int h, int d) {
  return (int64_t{bi} * t + ti) * h * d + int64_t{head} * d;
}

// Rows [first, first + 64) of one head into shared memory (D bf16 each, 16-byte copies);
// rows at or beyond T are zeros.
template <int D>
__device__ void LoadTile(__nv_bfloat16* dst, const Bf16* src, int bi, int first, int head, int t, int h) {
  constexpr int kChunks = D / 8;  // 8 bf16 = 16 bytes
  for (int i = threadIdx.x; i < kTile * kChunks; i += blockDim.x) {
    const int r = i / kChunks, ch = i % kChunks;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (first + r < t) v = *reinterpret_cast<const uint4*>(src + RowOf(bi, first + r, head, t, h, D) + ch * 8);
    *reinterpret_cast<uint4*>(dst + r * D + ch * 8) = v;
  }
}

// C (16 x 64, fp32, ld 64) = A (16 x D, bf16 row-major, ld D) x B^T, B (64 x D row-major, ld D).
template <int D>
__device__ void RowsTimesTileT(float* c, const __nv_bfloat16* a, const __nv_bfloat16* b) {
  for (int n = 0; n < kTile / 16; ++n) {
    FragC acc;
    wmma::fill_fragment(acc, 0.f);
    for (int k = 0; k < D / 16; ++k) {
      FragA fa;
      FragBT fb;
      wmma::load_matrix_sync(fa, a + k * 16, D);
      wmma::load_matrix_sync(fb, b + n * 16 * D + k * 16, D);  // B^T: columns are B's rows
      wmma::mma_sync(acc, fa, fb, acc);
    }
    wmma::store_matrix_sync(c + n * 16, acc, kTile, wmma::mem_row_major);
  }
}

// C (16 x D, fp32, ld D) += P (16 x 64, bf16, ld 64) x B (64 x D, bf16 row-major, ld D).
template <int D>
__device__ void AccumulateRowsTimesTile(float* c, const __nv_bfloat16* p, const __nv_bfloat16* b) {
  for (int n = 0; n < D / 16; ++n) {
    FragC acc;
    wmma::load_matrix_sync(acc, c + n * 16, D, wmma::mem_row_major);
    for (int k = 0; k < kTile / 16; ++k) {
      FragA fa;
      FragB fb;
      wmma::load_matrix_sync(fa, p + k * 16, kTile);
      wmma::load_matrix_sync(fb, b + k * 16 * D + n * 16, D);
      wmma::mma_sync(acc, fa, fb, acc);
    }
    wmma::store_matrix_sync(c + n * 16, acc, D, wmma::mem_row_major);
  }
}

// acc[n] (16 x 16 each, registers; D/16 of them) += P^T (16 x 64) x B (64 x D), P stored as
// 64 x 16 (bf16, ld 16), the column-major read of each 64 x 16 block giving its transpose.
template <int D>
__device__ void AccumulateColsTimesTileRegs(FragC* acc, const __nv_bfloat16* p_cols, const __nv_bfloat16* b) {
  for (int k = 0; k < kTile / 16; ++k) {
    FragAT fa;
    wmma::load_matrix_sync(fa, p_cols + k * 16 * 16, 16);
    for (int n = 0; n < D / 16; ++n) {
      FragB fb;
      wmma::load_matrix_sync(fb, b + k * 16 * D + n * 16, D);
      wmma::mma_sync(acc[n], fa, fb, acc[n]);
    }
  }
}

// acc[n] += P (16 x 64, bf16, ld 64) x B (64 x D), in registers.
template <int D>
__device__ void AccumulateRowsTimesTileRegs(FragC* acc, const __nv_bfloat16* p, const __nv_bfloat16* b) {
  for (int k = 0; k < kTile / 16; ++k) {
    FragA fa;
    wmma::load_matrix_sync(fa, p + k * 16, kTile);
    for (int n = 0; n < D / 16; ++n) {
      FragB fb;
      wmma::load_matrix_sync(fb, b + k * 16 * D + n * 16, D);
      wmma::mma_sync(acc[n], fa, fb, acc[n]);
    }
  }
}

// out (bf16, rows of one head from `first`) += scale * acc: each 16 x 16 block through the
// warp's 256-float scratch.
template <int D>
__device__ void AddRowsToGlobal(Bf16* out, FragC* acc, float* scratch, float scale, int bi, int first, int head,
                                int t, int h) {
  const int lane = threadIdx.x % 32;
  auto* o = reinterpret_cast<__nv_bfloat16*>(out);
  for (int n = 0; n < D / 16; ++n) {
    wmma::store_matrix_sync(scratch, acc[n], 16, wmma::mem_row_major);
    __syncwarp();
    for (int e = lane; e < 256; e += 32) {
      const int r = e / 16, col = n * 16 + e % 16;
      if (first + r >= t) continue;
      const int64_t at = RowOf(bi, first + r, head, t, h, D) + col;
      o[at] = __float2bfloat16_rn(__bfloat162float(o[at]) + scratch[e] * scale);
    }
    __syncwarp();
  }
}

__device__ __forceinline__ float WarpMax(float x) {
  for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}
__device__ __forceinline__ float WarpAdd(float x) {
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

template <int D>
struct ForwardSmem {
  __nv_bfloat16 q[kTile * D], k[kTile * D], v[kTile * D];
  float s[kWarps][kRows * kTile];
  __nv_bfloat16 p[kWarps][kRows * kTile];
  float o[kWarps][kRows * D];
  float m[kTile], l[kTile];
};

template <int D>
__global__ void __launch_bounds__(kWarps * 32) ForwardKernel(Bf16* out, float* lse, const Bf16* q, const Bf16* k,
                                                             const Bf16* v, int t, int h, float scale) {
  extern __shared__ __align__(128) unsigned char raw[];
  auto& sm = *reinterpret_cast<ForwardSmem<D>*>(raw);
  const int q0 = blockIdx.x * kTile, head = blockIdx.y, bi = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  LoadTile<D>(sm.q, q, bi, q0, head, t, h);
  for (int i = lane; i < kRows * D; i += 32) sm.o[warp][i] = 0.f;
  if (lane < kRows) {
    sm.m[warp * kRows + lane] = -INFINITY;
    sm.l[warp * kRows + lane] = 0.f;
  }
  const int last_tile = q0 / kTile;  // causal: key tiles up to the diagonal
  for (int kt = 0; kt <= last_tile; ++kt) {
    const int k0 = kt * kTile;
    __syncthreads();  // the previous tile's k, v are no longer read
    LoadTile<D>(sm.k, k, bi, k0, head, t, h);
    LoadTile<D>(sm.v, v, bi, k0, head, t, h);
    __syncthreads();
    RowsTimesTileT<D>(sm.s[warp], sm.q + warp * kRows * D, sm.k);
    __syncwarp();
    for (int r = 0; r < kRows; ++r) {
      const int query = q0 + warp * kRows + r;
      float s2[2];
      for (int j = 0; j < 2; ++j) {
        const int col = lane + 32 * j, key = k0 + col;
        s2[j] = key <= query && key < t ? sm.s[warp][r * kTile + col] * scale : -INFINITY;
      }
      const float m_old = sm.m[warp * kRows + r];
      const float m_new = fmaxf(m_old, WarpMax(fmaxf(s2[0], s2[1])));
      float sum = 0.f;
      for (int j = 0; j < 2; ++j) {
        const float p = m_new == -INFINITY ? 0.f : __expf(s2[j] - m_new);
        sum += p;
        sm.p[warp][r * kTile + lane + 32 * j] = __float2bfloat16_rn(p);
      }
      sum = WarpAdd(sum);
      const float correction = m_old == -INFINITY ? 0.f : __expf(m_old - m_new);
      for (int i = lane; i < D; i += 32) sm.o[warp][r * D + i] *= correction;
      __syncwarp();
      if (lane == 0) {
        sm.l[warp * kRows + r] = sm.l[warp * kRows + r] * correction + sum;
        sm.m[warp * kRows + r] = m_new;
      }
      __syncwarp();
    }
    AccumulateRowsTimesTile<D>(sm.o[warp], sm.p[warp], sm.v);
    __syncwarp();
  }
  for (int r = 0; r < kRows; ++r) {
    const int query = q0 + warp * kRows + r;
    if (query >= t) break;
    const float l = sm.l[warp * kRows + r];
    for (int i = lane; i < D; i += 32) {
      reinterpret_cast<__nv_bfloat16*>(out)[RowOf(bi, query, head, t, h, D) + i] =
          __float2bfloat16_rn(sm.o[warp][r * D + i] / l);
    }
    if (lane == 0) lse[(int64_t{bi} * h + head) * t + query] = sm.m[warp * kRows + r] + logf(l);
  }
}

// delta (B, H, T) = rowsum(dO * O), one warp per row.
__global__ void DeltaKernel(float* delta, const Bf16* dout, const Bf16* out, int b, int t, int h, int d) {
  const int64_t row = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32;
  const int lane = threadIdx.x % 32;
  if (row >= int64_t{b} * h * t) return;
  const int ti = static_cast<int>(row % t), head = static_cast<int>((row / t) % h), bi = static_cast<int>(row / (int64_t{t} * h));
  const int64_t at = RowOf(bi, ti, head, t, h, d);
  float sum = 0.f;
  for (int i = lane; i < d; i += 32) {
    sum += __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(dout)[at + i]) *
           __bfloat162float(reinterpret_cast<const __nv_bfloat16*>(out)[at + i]);
  }
  sum = WarpAdd(sum);
  if (lane == 0) delta[(int64_t{bi} * h + head) * t + ti] = sum;
}

template <int D>
struct KeySmem {
  __nv_bfloat16 k[kTile * D], v[kTile * D], q[kTile * D], dout[kTile * D];
  float s[kWarps][kRows * kTile];           // S^T, then dP^T (16 keys x 64 queries)
  __nv_bfloat16 p[kWarps][kTile * kRows];   // P^T then dS^T, stored 64 queries x 16 keys
  float scratch[kWarps][16 * 16];           // one 16 x 16 block (dP^T, or a result on its way out)
  float lse[kTile], delta[kTile];
};

// dK, dV for 64 keys: over the query tiles at or after them.
template <int D>
__global__ void __launch_bounds__(kWarps * 32) KeyKernel(Bf16* dk, Bf16* dv, const Bf16* dout, const float* lse,
                                                         const float* delta, const Bf16* q, const Bf16* k,
                                                         const Bf16* v, int t, int h, float scale) {
  extern __shared__ __align__(128) unsigned char raw[];
  auto& sm = *reinterpret_cast<KeySmem<D>*>(raw);
  const int k0 = blockIdx.x * kTile, head = blockIdx.y, bi = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  LoadTile<D>(sm.k, k, bi, k0, head, t, h);
  LoadTile<D>(sm.v, v, bi, k0, head, t, h);
  FragC dk_acc[D / 16], dv_acc[D / 16];  // this warp's 16 rows of dK and dV, in registers
  for (int n = 0; n < D / 16; ++n) {
    wmma::fill_fragment(dk_acc[n], 0.f);
    wmma::fill_fragment(dv_acc[n], 0.f);
  }
  const int tiles = (t + kTile - 1) / kTile;
  for (int qt = k0 / kTile; qt < tiles; ++qt) {
    const int q0 = qt * kTile;
    __syncthreads();
    LoadTile<D>(sm.q, q, bi, q0, head, t, h);
    LoadTile<D>(sm.dout, dout, bi, q0, head, t, h);
    for (int i = threadIdx.x; i < kTile; i += blockDim.x) {
      const bool in = q0 + i < t;
      sm.lse[i] = in ? lse[(int64_t{bi} * h + head) * t + q0 + i] : 0.f;
      sm.delta[i] = in ? delta[(int64_t{bi} * h + head) * t + q0 + i] : 0.f;
    }
    __syncthreads();
    const __nv_bfloat16* kw = sm.k + warp * kRows * D;
    const __nv_bfloat16* vw = sm.v + warp * kRows * D;
    // S^T (16 keys x 64 queries) = K_w Q^T; P^T = exp(S^T scale - lse) where query >= key.
    RowsTimesTileT<D>(sm.s[warp], kw, sm.q);
    __syncwarp();
    for (int r = 0; r < kRows; ++r) {
      const int key = k0 + warp * kRows + r;
      for (int j = 0; j < 2; ++j) {
        const int col = lane + 32 * j, query = q0 + col;
        const float p = query >= key && query < t && key < t
                            ? __expf(sm.s[warp][r * kTile + col] * scale - sm.lse[col])
                            : 0.f;
        sm.s[warp][r * kTile + col] = p;  // keep P^T in fp32 for dS
        sm.p[warp][col * kRows + r] = __float2bfloat16_rn(p);
      }
    }
    __syncwarp();
    // dV_w += P^T dO (sm.p holds P^T as 64 queries x 16 keys).
    AccumulateColsTimesTileRegs<D>(dv_acc, sm.p[warp], sm.dout);
    __syncwarp();
    // dP^T (16 keys x 64 queries) = V_w dO^T, a 16 x 16 block at a time through shared
    // memory (an accumulator's layout is opaque); dS^T = P^T (dP^T - delta) replaces P^T.
    for (int n = 0; n < kTile / 16; ++n) {
      FragC acc;
      wmma::fill_fragment(acc, 0.f);
      for (int kk = 0; kk < D / 16; ++kk) {
        FragA fa;
        FragBT fb;
        wmma::load_matrix_sync(fa, vw + kk * 16, D);
        wmma::load_matrix_sync(fb, sm.dout + n * 16 * D + kk * 16, D);
        wmma::mma_sync(acc, fa, fb, acc);
      }
      wmma::store_matrix_sync(sm.scratch[warp], acc, 16, wmma::mem_row_major);
      __syncwarp();
      for (int e = lane; e < kRows * 16; e += 32) {
        const int r = e / 16, col = n * 16 + e % 16;
        const float p = sm.s[warp][r * kTile + col];
        sm.p[warp][col * kRows + r] = __float2bfloat16_rn(p * (sm.scratch[warp][e] - sm.delta[col]));
      }
      __syncwarp();
    }
    // dK_w += dS^T Q (scaled at the end).
    AccumulateColsTimesTileRegs<D>(dk_acc, sm.p[warp], sm.q);
    __syncwarp();
  }
  AddRowsToGlobal<D>(dk, dk_acc, sm.scratch[warp], scale, bi, k0 + warp * kRows, head, t, h);
  AddRowsToGlobal<D>(dv, dv_acc, sm.scratch[warp], 1.f, bi, k0 + warp * kRows, head, t, h);
}

template <int D>
struct QuerySmem {
  __nv_bfloat16 q[kTile * D], dout[kTile * D], k[kTile * D], v[kTile * D];
  float s[kWarps][kRows * kTile], dp[kWarps][kRows * kTile];
  __nv_bfloat16 ds[kWarps][kRows * kTile];
  float scratch[kWarps][16 * 16];
  float lse[kTile], delta[kTile];
};

// dQ for 64 queries: over the key tiles at or before them.
template <int D>
__global__ void __launch_bounds__(kWarps * 32) QueryKernel(Bf16* dq, const Bf16* dout, const float* lse,
                                                           const float* delta, const Bf16* q, const Bf16* k,
                                                           const Bf16* v, int t, int h, float scale) {
  extern __shared__ __align__(128) unsigned char raw[];
  auto& sm = *reinterpret_cast<QuerySmem<D>*>(raw);
  const int q0 = blockIdx.x * kTile, head = blockIdx.y, bi = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  LoadTile<D>(sm.q, q, bi, q0, head, t, h);
  LoadTile<D>(sm.dout, dout, bi, q0, head, t, h);
  for (int i = threadIdx.x; i < kTile; i += blockDim.x) {
    const bool in = q0 + i < t;
    sm.lse[i] = in ? lse[(int64_t{bi} * h + head) * t + q0 + i] : 0.f;
    sm.delta[i] = in ? delta[(int64_t{bi} * h + head) * t + q0 + i] : 0.f;
  }
  FragC dq_acc[D / 16];  // this warp's 16 rows of dQ, in registers
  for (int n = 0; n < D / 16; ++n) wmma::fill_fragment(dq_acc[n], 0.f);
  for (int kt = 0; kt <= q0 / kTile; ++kt) {
    const int k0 = kt * kTile;
    __syncthreads();
    LoadTile<D>(sm.k, k, bi, k0, head, t, h);
    LoadTile<D>(sm.v, v, bi, k0, head, t, h);
    __syncthreads();
    RowsTimesTileT<D>(sm.s[warp], sm.q + warp * kRows * D, sm.k);      // S = Q_w K^T
    RowsTimesTileT<D>(sm.dp[warp], sm.dout + warp * kRows * D, sm.v);  // dP = dO_w V^T
    __syncwarp();
    for (int e = lane; e < kRows * kTile; e += 32) {
      const int r = e / kTile, col = e % kTile;
      const int query = q0 + warp * kRows + r, key = k0 + col;
      float ds = 0.f;
      if (key <= query && key < t && query < t) {
        const float p = __expf(sm.s[warp][e] * scale - sm.lse[warp * kRows + r]);
        ds = p * (sm.dp[warp][e] - sm.delta[warp * kRows + r]);
      }
      sm.ds[warp][e] = __float2bfloat16_rn(ds);
    }
    __syncwarp();
    AccumulateRowsTimesTileRegs<D>(dq_acc, sm.ds[warp], sm.k);  // dQ_w += dS K
    __syncwarp();
  }
  AddRowsToGlobal<D>(dq, dq_acc, sm.scratch[warp], scale, bi, q0 + warp * kRows, head, t, h);
}

template <int D>
cudaError_t Forward(Bf16* out, float* lse, const Bf16* q, const Bf16* k, const Bf16* v, int b, int t, int h,
                    cudaStream_t stream) {
  const size_t smem = sizeof(ForwardSmem<D>);
  cudaError_t e = cudaFuncSetAttribute(ForwardKernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) return e;
  const dim3 grid((t + kTile - 1) / kTile, h, b);
  ForwardKernel<D><<<grid, kWarps * 32, smem, stream>>>(out, lse, q, k, v, t, h, 1.f / sqrtf(static_cast<float>(D)));
  return cudaPeekAtLastError();
}

template <int D>
cudaError_t Backward(Bf16* dq, Bf16* dk, Bf16* dv, const Bf16* dout, const float* lse, const float* delta,
                     const Bf16* q, const Bf16* k, const Bf16* v, int b, int t, int h, cudaStream_t stream) {
  const float scale = 1.f / sqrtf(static_cast<float>(D));
  const dim3 grid((t + kTile - 1) / kTile, h, b);
  cudaError_t e = cudaFuncSetAttribute(KeyKernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, sizeof(KeySmem<D>));
  if (e != cudaSuccess) return e;
  KeyKernel<D><<<grid, kWarps * 32, sizeof(KeySmem<D>), stream>>>(dk, dv, dout, lse, delta, q, k, v, t, h, scale);
  e = cudaFuncSetAttribute(QueryKernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, sizeof(QuerySmem<D>));
  if (e != cudaSuccess) return e;
  QueryKernel<D><<<grid, kWarps * 32, sizeof(QuerySmem<D>), stream>>>(dq, dout, lse, delta, q, k, v, t, h, scale);
  return cudaPeekAtLastError();
}

}  // namespace

bool TensorCoreAttention(int d) { return d == 64 || d == 128; }

cudaError_t AttentionForwardTc(Bf16* out, float* lse, const Bf16* q, const Bf16* k, const Bf16* v, int b, int t,
                               int h, int d, cudaStream_t stream) {
  return d == 64 ? Forward<64>(out, lse, q, k, v, b, t, h, stream) : Forward<128>(out, lse, q, k, v, b, t, h, stream);
}

cudaError_t AttentionBackwardTc(Bf16* dq, Bf16* dk, Bf16* dv, const Bf16* dout, const Bf16* out, const float* lse,
                                float* delta, const Bf16* q, const Bf16* k, const Bf16* v, int b, int t, int h, int d,
                                cudaStream_t stream) {
  const int64_t rows = int64_t{b} * h * t;
  DeltaKernel<<<static_cast<int>((rows * 32 + 255) / 256), 256, 0, stream>>>(delta, dout, out, b, t, h, d);
  return d == 64 ? Backward<64>(dq, dk, dv, dout, lse, delta, q, k, v, b, t, h, stream)
                 : Backward<128>(dq, dk, dv, dout, lse, delta, q, k, v, b, t, h, stream);
}

}  // namespace tierd::trainer::gpu
