// Causal attention on tensor cores, flash-style (the FlashAttention-2 schedule): mma.sync
// m16n8k16 (bf16 in, fp32 accumulate) with every accumulator in registers, ldmatrix from
// padded shared memory, tiles streamed in by cp.async with double buffering, online softmax
// in fp32 (base 2), never a T x T matrix. Head sizes 64 and 128 (the models' sizes);
// gpu_ops.cu falls back to its warp-per-row kernels for others. The forward is here, the
// backward in attention_tc_backward.cu, the tiles they share in attention_tc_tiles.cuh.
//   forward:  per (batch, head, 128-query tile), 4 warps of two 16-row query tiles; the score
//             tile S = Q K^T stays in registers and becomes P's A operand without a round trip.
#include <cuda_bf16.h>

#include <cstdint>

#include "trainer_ref/kernels/attention_tc.h"
#include "trainer_ref/kernels/attention_tc_tiles.cuh"

namespace tierd::trainer::gpu {
namespace attention_tc {
namespace {

// The forward's warps take M = 2 row tiles (32 query rows) each, 128 a block: every K and V
// fragment read from shared memory feeds two MMAs instead of one, and a K/V tile loaded once
// serves twice the queries (FlashAttention-2's tiling for head size 128).
constexpr int kFwdTiles = 2;
constexpr int kFwdRows = kWarps * 16 * kFwdTiles;

// acc[i] (row tile i: 16 x N) += A rows [16 i, 16 i + 16) (at `a`, row-major, shared) x M^T,
// M (N x D rows at `m`, shared); each B fragment loaded once for all the row tiles.
template <int D, int N, int Tiles>
__device__ __forceinline__ void TilesTimesRowsT(float (*acc)[N / 8][4], const __nv_bfloat16* a,
                                                const __nv_bfloat16* m) {
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    uint32_t fa[Tiles][4];
#pragma unroll
    for (int i = 0; i < Tiles; ++i) LoadA(fa[i], a + i * 16 * kLd<D> + kk * 16, kLd<D>);
#pragma unroll
    for (int j = 0; j < N / 16; ++j) {
      uint32_t fb[4];
      LoadBFromRowsN(fb, m + j * 16 * kLd<D> + kk * 16, kLd<D>);
#pragma unroll
      for (int i = 0; i < Tiles; ++i) {
        Mma(acc[i][2 * j], fa[i], fb[0], fb[1]);
        Mma(acc[i][2 * j + 1], fa[i], fb[2], fb[3]);
      }
    }
  }
}

// acc[i] (16 x D) += P[i] (16 x N, C fragments in registers) x M (N x D rows at `m`, shared).
template <int D, int N, int Tiles>
__device__ __forceinline__ void TilesRegsTimesRows(float (*acc)[D / 8][4], const float (*p)[N / 8][4],
                                                   const __nv_bfloat16* m) {
#pragma unroll
  for (int j = 0; j < N / 16; ++j) {
    uint32_t fa[Tiles][4];
#pragma unroll
    for (int i = 0; i < Tiles; ++i) CToA(fa[i], p[i][2 * j], p[i][2 * j + 1]);
#pragma unroll
    for (int dp = 0; dp < D / 16; ++dp) {
      uint32_t fb[4];
      LoadBFromRowsK(fb, m + j * 16 * kLd<D> + dp * 16, kLd<D>);
#pragma unroll
      for (int i = 0; i < Tiles; ++i) {
        Mma(acc[i][2 * dp], fa[i], fb[0], fb[1]);
        Mma(acc[i][2 * dp + 1], fa[i], fb[2], fb[3]);
      }
    }
  }
}

template <int D>
struct ForwardSmem {
  __nv_bfloat16 q[kFwdRows * kLd<D>];
  __nv_bfloat16 k[2][kTile * kLd<D>], v[2][kTile * kLd<D>];
};

template <int D>
__global__ void __launch_bounds__(kWarps * 32) ForwardKernel(Bf16* out, float* lse, const Bf16* q, const Bf16* k,
                                                             const Bf16* v, int t, int h, float scale) {
  constexpr int M = kFwdTiles;
  extern __shared__ __align__(128) unsigned char raw[];
  auto& sm = *reinterpret_cast<ForwardSmem<D>*>(raw);
  const int qb = gridDim.x - 1 - blockIdx.x;  // the longest rows (latest queries) first
  const int q0 = qb * kFwdRows, head = blockIdx.y, bi = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
  const float scale2 = scale * kLog2e;  // scores in base-2 units
  const int warp_row0 = q0 + warp * 16 * M;  // this warp's rows: warp_row0 .. + 16 M - 1
  const int last_tile = min((q0 + kFwdRows - 1) / kTile, (t - 1) / kTile);
  LoadRows<D, kFwdRows>(sm.q, q, bi, q0, head, t, h);
  LoadRows<D, kTile>(sm.k[0], k, bi, 0, head, t, h);
  LoadRows<D, kTile>(sm.v[0], v, bi, 0, head, t, h);
  CpAsyncCommit();
  float o[M][D / 8][4] = {};
  float m[M][2], l[M][2];  // l: this thread's partial sums
#pragma unroll
  for (int i = 0; i < M; ++i) m[i][0] = m[i][1] = -INFINITY, l[i][0] = l[i][1] = 0.f;
  for (int kt = 0; kt <= last_tile; ++kt) {
    const int k0 = kt * kTile, buf = kt % 2;
    NextTileThenWait(kt < last_tile, [&] {
      LoadRows<D, kTile>(sm.k[buf ^ 1], k, bi, k0 + kTile, head, t, h);
      LoadRows<D, kTile>(sm.v[buf ^ 1], v, bi, k0 + kTile, head, t, h);
    });
    if (k0 <= warp_row0 + 16 * M - 1) {  // else every key here is after every row of this warp
      float s[M][kTile / 8][4] = {};
      TilesTimesRowsT<D, kTile, M>(s, sm.q + warp * 16 * M * kLd<D>, sm.k[buf]);
      const bool edge = k0 + kTile > warp_row0 || k0 + kTile > t;  // a key after a row, or past T
#pragma unroll
      for (int i = 0; i < M; ++i) {
#pragma unroll
        for (int nt = 0; nt < kTile / 8; ++nt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int key = k0 + nt * 8 + 2 * c + (e & 1), row = warp_row0 + 16 * i + g + (e >= 2 ? 8 : 0);
            s[i][nt][e] = edge && (key > row || key >= t) ? -INFINITY : s[i][nt][e] * scale2;
          }
        }
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          float mx = m[i][r];
#pragma unroll
          for (int nt = 0; nt < kTile / 8; ++nt) mx = fmaxf(mx, fmaxf(s[i][nt][2 * r], s[i][nt][2 * r + 1]));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
          const float base = mx == -INFINITY ? 0.f : mx;
          const float correction = exp2f(m[i][r] - base);  // 0 while m is -inf
          m[i][r] = mx;
          float sum = 0.f;
#pragma unroll
          for (int nt = 0; nt < kTile / 8; ++nt) {
            s[i][nt][2 * r] = exp2f(s[i][nt][2 * r] - base);
            s[i][nt][2 * r + 1] = exp2f(s[i][nt][2 * r + 1] - base);
            sum += s[i][nt][2 * r] + s[i][nt][2 * r + 1];
          }
          l[i][r] = l[i][r] * correction + sum;
#pragma unroll
          for (int dt = 0; dt < D / 8; ++dt) {
            o[i][dt][2 * r] *= correction;
            o[i][dt][2 * r + 1] *= correction;
          }
        }
      }
      TilesRegsTimesRows<D, kTile, M>(o, s, sm.v[buf]);
    }
    __syncthreads();  // every warp is done with this buffer before it is refilled
  }
#pragma unroll
  for (int i = 0; i < M; ++i) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      l[i][r] += __shfl_xor_sync(0xffffffffu, l[i][r], 1);
      l[i][r] += __shfl_xor_sync(0xffffffffu, l[i][r], 2);
      const int row = warp_row0 + 16 * i + g + 8 * r;
      if (row >= t) continue;
      const float inv = 1.f / l[i][r];
      auto* dst = reinterpret_cast<__nv_bfloat162*>(out + RowOf(bi, row, head, t, h, D));
#pragma unroll
      for (int dt = 0; dt < D / 8; ++dt) {
        dst[(dt * 8 + 2 * c) / 2] = __floats2bfloat162_rn(o[i][dt][2 * r] * inv, o[i][dt][2 * r + 1] * inv);
      }
      if (c == 0) lse[(int64_t{bi} * h + head) * t + row] = (m[i][r] + log2f(l[i][r])) * kLn2;
    }
  }
}

template <int D>
cudaError_t Forward(Bf16* out, float* lse, const Bf16* q, const Bf16* k, const Bf16* v, int b, int t, int h,
                    cudaStream_t stream) {
  const dim3 grid((t + kFwdRows - 1) / kFwdRows, h, b);
  return Launch(ForwardKernel<D>, sizeof(ForwardSmem<D>), grid, stream, out, lse, q, k, v, t, h,
                1.f / sqrtf(static_cast<float>(D)));
}

}  // namespace
}  // namespace attention_tc

bool TensorCoreAttention(int d) { return d == 64 || d == 128; }

cudaError_t AttentionForwardTc(Bf16* out, float* lse, const Bf16* q, const Bf16* k, const Bf16* v, int b, int t,
                               int h, int d, cudaStream_t stream) {
  return d == 64 ? attention_tc::Forward<64>(out, lse, q, k, v, b, t, h, stream)
                 : attention_tc::Forward<128>(out, lse, q, k, v, b, t, h, stream);
}

}  // namespace tierd::trainer::gpu
