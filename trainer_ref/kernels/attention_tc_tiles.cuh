// The tile machinery attention_tc.cu (forward) and attention_tc_backward.cu share: cp.async
// loads into padded shared memory, ldmatrix fragments, mma.sync m16n8k16 (bf16 in, fp32
// accumulate), and the warp-level products the kernels are built from.
// Fragment layouts (PTX ISA, mma.m16n8k16): lane = 4 * g + c. A (16 x 16, row): a0 (g, 2c..),
// a1 (g + 8, 2c..), a2 (g, 2c + 8..), a3 (g + 8, 2c + 8..). B (16 x 8, col): b0 (k 2c.., n g),
// b1 (k 2c + 8.., n g). C (16 x 8): c0, c1 (g, 2c..), c2, c3 (g + 8, 2c..). So C fragments
// of two adjacent n-tiles are, packed to bf16, the A fragment of one k-step.
#ifndef TIERD_TRAINER_REF_KERNELS_ATTENTION_TC_TILES_CUH_
#define TIERD_TRAINER_REF_KERNELS_ATTENTION_TC_TILES_CUH_

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

#include "trainer_ref/kernels/gpu_ops.h"

namespace tierd::trainer::gpu::attention_tc {

inline constexpr int kTile = 64;  // rows (queries or keys) per block; keys per tile in the loops
inline constexpr int kWarps = 4;  // 16 rows each
inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr float kLn2 = 0.6931471805599453f;

// Shared-memory row length in bf16: 8 more than D keeps rows 16-byte aligned and puts the
// eight rows one ldmatrix reads in different banks.
template <int D>
inline constexpr int kLd = D + 8;

__device__ __forceinline__ int64_t RowOf(int bi, int ti, int head, int t, int h, int d) {
  return (int64_t{bi} * t + ti) * h * d + int64_t{head} * d;
}

__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void CpAsync16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(SmemAddr(dst)), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void CpAsync4(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(SmemAddr(dst)), "l"(src), "r"(valid ? 4 : 0));
}
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// A double-buffered loop's turn: when there is a next tile, its loads (`load_next`: cp.async
// into the other buffer) are issued before this tile's are waited for; then the block meets.
template <typename LoadNext>
__device__ __forceinline__ void NextTileThenWait(bool has_next, LoadNext&& load_next) {
  if (has_next) {
    load_next();
    CpAsyncCommit();
    CpAsyncWait<1>();
  } else {
    CpAsyncWait<0>();
  }
  __syncthreads();
}

// Rows [first, first + Rows) of one head into shared memory (row length kLd<D>), 16 bytes per
// copy; rows at or beyond T are zero-filled.
template <int D, int Rows>
__device__ void LoadRows(__nv_bfloat16* dst, const Bf16* src, int bi, int first, int head, int t, int h) {
  constexpr int kChunks = D / 8;
  for (int i = threadIdx.x; i < Rows * kChunks; i += blockDim.x) {
    const int r = i / kChunks, ch = i % kChunks;
    const bool in = first + r < t;
    CpAsync16(dst + r * kLd<D> + ch * 8, src + RowOf(bi, in ? first + r : 0, head, t, h, D) + ch * 8, in);
  }
}

// `count` floats of a (batch, head) row of lse or delta from `first`; zeros beyond T.
__device__ inline void LoadFloats(float* dst, const float* src, int64_t row_base, int first, int count, int t) {
  for (int i = threadIdx.x; i < count; i += blockDim.x) {
    const bool in = first + i < t;
    CpAsync4(dst + i, src + row_base + (in ? first + i : 0), in);
  }
}

__device__ __forceinline__ void LdMatrixX4(uint32_t r[4], const __nv_bfloat16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SmemAddr(p)));
}
__device__ __forceinline__ void LdMatrixX4Trans(uint32_t r[4], const __nv_bfloat16* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SmemAddr(p)));
}

// c (16 x 8) += a (16 x 16) b (16 x 8).
__device__ __forceinline__ void Mma(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ uint32_t Pack(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);  // lo in the low half: the lower column
  return *reinterpret_cast<const uint32_t*>(&v);
}

// The A fragment of rows 0..15, columns 0..15 of a row-major tile at `p` (row length ld).
__device__ __forceinline__ void LoadA(uint32_t a[4], const __nv_bfloat16* p, int ld) {
  const int lane = threadIdx.x % 32;
  LdMatrixX4(a, p + (lane % 16) * ld + (lane / 16) * 8);
}
// B fragments for two n-tiles when B[k][n] = M[n][k], M row-major at `p` (its rows n 0..15,
// columns k 0..15): b[0], b[1] for n 0..7, b[2], b[3] for n 8..15.
__device__ __forceinline__ void LoadBFromRowsN(uint32_t b[4], const __nv_bfloat16* p, int ld) {
  const int lane = threadIdx.x % 32;
  LdMatrixX4(b, p + ((lane / 16) * 8 + lane % 8) * ld + ((lane / 8) % 2) * 8);
}
// B fragments for two n-tiles when B[k][n] = M[k][n], M row-major at `p` (rows k 0..15,
// columns n 0..15): the transposing load.
__device__ __forceinline__ void LoadBFromRowsK(uint32_t b[4], const __nv_bfloat16* p, int ld) {
  const int lane = threadIdx.x % 32;
  LdMatrixX4Trans(b, p + (((lane / 8) % 2) * 8 + lane % 8) * ld + (lane / 16) * 8);
}

// C fragments of n-tiles 2j and 2j + 1 as the bf16 A fragment of k-step j.
__device__ __forceinline__ void CToA(uint32_t a[4], const float c0[4], const float c1[4]) {
  a[0] = Pack(c0[0], c0[1]);
  a[1] = Pack(c0[2], c0[3]);
  a[2] = Pack(c1[0], c1[1]);
  a[3] = Pack(c1[2], c1[3]);
}

// acc (16 x N, N / 8 C fragments) += A (16 x D rows at `a`, row-major) x M^T, M (N x D) rows
// at `m`: both in shared memory.
template <int D, int N>
__device__ __forceinline__ void RowsTimesRowsT(float (*acc)[4], const __nv_bfloat16* a, const __nv_bfloat16* m) {
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk) {
    uint32_t fa[4];
    LoadA(fa, a + kk * 16, kLd<D>);
#pragma unroll
    for (int j = 0; j < N / 16; ++j) {
      uint32_t fb[4];
      LoadBFromRowsN(fb, m + j * 16 * kLd<D> + kk * 16, kLd<D>);
      Mma(acc[2 * j], fa, fb[0], fb[1]);
      Mma(acc[2 * j + 1], fa, fb[2], fb[3]);
    }
  }
}

// acc (16 x D) += P (16 x N, C fragments in registers) x M (N x D rows at `m`, shared).
template <int D, int N>
__device__ __forceinline__ void RegsTimesRows(float (*acc)[4], const float (*p)[4], const __nv_bfloat16* m) {
#pragma unroll
  for (int j = 0; j < N / 16; ++j) {
    uint32_t fa[4];
    CToA(fa, p[2 * j], p[2 * j + 1]);
#pragma unroll
    for (int dp = 0; dp < D / 16; ++dp) {
      uint32_t fb[4];
      LoadBFromRowsK(fb, m + j * 16 * kLd<D> + dp * 16, kLd<D>);
      Mma(acc[2 * dp], fa, fb[0], fb[1]);
      Mma(acc[2 * dp + 1], fa, fb[2], fb[3]);
    }
  }
}

// out rows (bf16) from `first` = scale * acc (this warp's 16 x D accumulators).
template <int D>
__device__ void StoreRowsToGlobal(Bf16* out, const float (*acc)[4], float scale, int bi, int first, int head, int t,
                                  int h) {
  const int lane = threadIdx.x % 32, g = lane / 4, c = lane % 4;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int row = first + g + 8 * half;
    if (row >= t) continue;
    auto* o = reinterpret_cast<__nv_bfloat162*>(out + RowOf(bi, row, head, t, h, D));
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) {
      o[(dt * 8 + 2 * c) / 2] = __floats2bfloat162_rn(acc[dt][2 * half] * scale, acc[dt][2 * half + 1] * scale);
    }
  }
}

template <typename Kernel>
cudaError_t Launch(Kernel kernel, size_t smem, dim3 grid, cudaStream_t stream, auto... args) {
  const cudaError_t e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  if (e != cudaSuccess) return e;
  kernel<<<grid, kWarps * 32, smem, stream>>>(args...);
  return cudaPeekAtLastError();
}

}  // namespace tierd::trainer::gpu::attention_tc

#endif  // TIERD_TRAINER_REF_KERNELS_ATTENTION_TC_TILES_CUH_
