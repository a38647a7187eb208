// Adafactor on the GPU (gpu_ops.h; optimizer.h's AdafactorStep is the reference): a few
// kernels a tensor, every sum in a fixed order (per-block trees and ordered partials, no
// atomics), so a run repeats bit for bit. Sums accumulate in double (a column of the
// embedding is 32000 values): the memory traffic, not the arithmetic, sets their time.
#include "trainer_ref/kernels/gpu_kernel_util.cuh"
#include "trainer_ref/kernels/gpu_ops.h"

namespace tierd::trainer::gpu {
namespace {

constexpr int kRowChunks = 32;        // column sums: this many row ranges, summed in order after
constexpr int kPartialBlocks = 1024;  // the update's sum of squares: fixed blocks, ordered partials
constexpr int kBlock = 256;

__device__ __forceinline__ float GradOf(const float* g, int64_t i, float scale) { return __fmul_rn(g[i], scale); }
__device__ __forceinline__ float GradOf(const Bf16* g, int64_t i, float scale) { return __fmul_rn(Load(g, i), scale); }

// The block's sum of `x` in a fixed tree; every thread gets it.
__device__ double BlockSum(double x) {
  __shared__ double sums[kBlock];
  sums[threadIdx.x] = x;
  __syncthreads();
  for (int stride = kBlock / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) sums[threadIdx.x] = __dadd_rn(sums[threadIdx.x], sums[threadIdx.x + stride]);
    __syncthreads();
  }
  const double total = sums[0];
  __syncthreads();
  return total;
}

__device__ __forceinline__ float Square(float g, float eps1) { return __fadd_rn(__fmul_rn(g, g), eps1); }

// Row i's mean of g^2 + eps1 into R[i] (one block a row).
template <typename G>
__global__ void RowKernel(float* r, const G* grads, int64_t cols, AdafactorParams p) {
  const int64_t i = blockIdx.x;
  float sum = 0.f;
  for (int64_t j = threadIdx.x; j < cols; j += kBlock)
    sum = __fadd_rn(sum, Square(GradOf(grads, i * cols + j, p.grad_scale), p.eps1));
  const float total = BlockSum(sum);
  if (threadIdx.x == 0) {
    r[i] = __fadd_rn(__fmul_rn(p.beta2t, r[i]), __fmul_rn(1.f - p.beta2t, __fdiv_rn(total, static_cast<float>(cols))));
  }
}

// Column sums over row range blockIdx.y into partial[blockIdx.y][j].
template <typename G>
__global__ void ColumnPartialKernel(double* partial, const G* grads, int64_t rows, int64_t cols, AdafactorParams p) {
  const int64_t j = blockIdx.x * int64_t{kBlock} + threadIdx.x;
  if (j >= cols) return;
  const int64_t per = (rows + kRowChunks - 1) / kRowChunks, from = blockIdx.y * per, to = min(rows, from + per);
  double sum = 0;
  for (int64_t i = from; i < to; ++i) sum = __dadd_rn(sum, Square(GradOf(grads, i * cols + j, p.grad_scale), p.eps1));
  partial[blockIdx.y * cols + j] = sum;
}

__global__ void ColumnKernel(float* c, const double* partial, int64_t rows, int64_t cols, AdafactorParams p) {
  const int64_t j = blockIdx.x * int64_t{kBlock} + threadIdx.x;
  if (j >= cols) return;
  double sum = 0;
  for (int k = 0; k < kRowChunks; ++k) sum = __dadd_rn(sum, partial[k * cols + j]);
  const float mean = static_cast<float>(__ddiv_rn(sum, static_cast<double>(rows)));
  c[j] = __fadd_rn(__fmul_rn(p.beta2t, c[j]), __fmul_rn(1.f - p.beta2t, mean));
}

// scalars[0] = mean(R) (one block).
__global__ void MeanKernel(float* scalars, const float* r, int64_t rows) {
  double sum = 0;
  for (int64_t i = threadIdx.x; i < rows; i += kBlock) sum = __dadd_rn(sum, r[i]);
  const double total = BlockSum(sum);
  if (threadIdx.x == 0) scalars[0] = static_cast<float>(__ddiv_rn(total, static_cast<double>(rows)));
}

// The update of element k before clipping: g / sqrt(R_i C_j / mean(R)), or (a vector) g / sqrt(V_k).
template <typename G>
__device__ __forceinline__ float Update(const G* grads, const float* state, int64_t rows, int64_t cols, float mean_r,
                                        int64_t k, const AdafactorParams& p) {
  const float g = GradOf(grads, k, p.grad_scale);
  if (cols == 0) return __fdiv_rn(g, __fsqrt_rn(state[k]));
  const int64_t i = k / cols, j = k % cols;
  return __fdiv_rn(g, __fsqrt_rn(__fmul_rn(__fdiv_rn(state[i], mean_r), state[rows + j])));
}

// A vector's V = b2 V + (1 - b2)(g^2 + eps1), element-wise (before the sum of squares).
template <typename G>
__global__ void VectorKernel(float* v, const G* grads, int64_t n, AdafactorParams p) {
  for (int64_t k = blockIdx.x * int64_t{kBlock} + threadIdx.x; k < n; k += int64_t{gridDim.x} * kBlock) {
    v[k] =
        __fadd_rn(__fmul_rn(p.beta2t, v[k]), __fmul_rn(1.f - p.beta2t, Square(GradOf(grads, k, p.grad_scale), p.eps1)));
  }
}

// partial[block] = the block's sum of u^2 over its fixed share of the elements.
template <typename G>
__global__ void SquaresKernel(double* partial, const G* grads, const float* state, const float* scalars, int64_t rows,
                              int64_t cols, AdafactorParams p) {
  const int64_t n = cols == 0 ? rows : rows * cols;
  const float mean_r = cols == 0 ? 1.f : scalars[0];
  double sum = 0;
  for (int64_t k = blockIdx.x * int64_t{kBlock} + threadIdx.x; k < n; k += int64_t{kPartialBlocks} * kBlock) {
    const float u = Update(grads, state, cols == 0 ? n : rows, cols, mean_r, k, p);
    sum = __dadd_rn(sum, __dmul_rn(u, u));
  }
  const double total = BlockSum(sum);
  if (threadIdx.x == 0) partial[blockIdx.x] = total;
}

// scalars[1] = 1 / max(1, RMS(u) / clip) from the ordered partials (one block).
__global__ void ClipKernel(float* scalars, const double* partial, int64_t n, AdafactorParams p) {
  double sum = 0;
  for (int b = threadIdx.x; b < kPartialBlocks; b += kBlock) sum = __dadd_rn(sum, partial[b]);
  const double total = BlockSum(sum);
  if (threadIdx.x == 0) {
    const float rms = static_cast<float>(__dsqrt_rn(__ddiv_rn(total, static_cast<double>(n))));
    scalars[1] = __fdiv_rn(1.f, fmaxf(1.f, __fdiv_rn(rms, p.clip_threshold)));
  }
}

template <typename G>
__global__ void ApplyKernel(float* master, Bf16* weights, const G* grads, const float* state, const float* scalars,
                            int64_t rows, int64_t cols, AdafactorParams p) {
  const int64_t n = cols == 0 ? rows : rows * cols;
  const float mean_r = cols == 0 ? 1.f : scalars[0], scale = scalars[1];
  const float decay = p.decay ? __fmul_rn(p.lr, p.weight_decay) : 0.f, step = __fmul_rn(p.lr, scale);
  for (int64_t k = blockIdx.x * int64_t{kBlock} + threadIdx.x; k < n; k += int64_t{gridDim.x} * kBlock) {
    const float u = Update(grads, state, cols == 0 ? n : rows, cols, mean_r, k, p);
    float w = master[k];
    w = __fsub_rn(w, __fmul_rn(decay, w));
    w = __fsub_rn(w, __fmul_rn(step, u));
    master[k] = w;
    Store(weights, k, w);
  }
}

template <typename G>
cudaError_t LaunchAdafactor(float* master, float* state, Bf16* weights, const G* grads, int64_t rows, int64_t cols,
                            const AdafactorParams& p, float* scratch, cudaStream_t stream) {
  const int64_t n = cols == 0 ? rows : rows * cols;
  if (n <= 0) return cudaSuccess;
  double* col_partial = reinterpret_cast<double*>(scratch);  // kRowChunks x cols
  double* partial = col_partial + int64_t{kRowChunks} * cols;
  float* scalars = reinterpret_cast<float*>(partial + kPartialBlocks);
  if (cols == 0) {
    VectorKernel<<<Blocks(n), kBlock, 0, stream>>>(state, grads, n, p);
  } else {
    RowKernel<<<static_cast<unsigned>(rows), kBlock, 0, stream>>>(state, grads, cols, p);
    const unsigned col_blocks = static_cast<unsigned>((cols + kBlock - 1) / kBlock);
    ColumnPartialKernel<<<dim3(col_blocks, kRowChunks), kBlock, 0, stream>>>(col_partial, grads, rows, cols, p);
    ColumnKernel<<<col_blocks, kBlock, 0, stream>>>(state + rows, col_partial, rows, cols, p);
    MeanKernel<<<1, kBlock, 0, stream>>>(scalars, state, rows);
  }
  SquaresKernel<<<kPartialBlocks, kBlock, 0, stream>>>(partial, grads, state, scalars, rows, cols, p);
  ClipKernel<<<1, kBlock, 0, stream>>>(scalars, partial, n, p);
  ApplyKernel<<<Blocks(n), kBlock, 0, stream>>>(master, weights, grads, state, scalars, rows, cols, p);
  return cudaGetLastError();
}

}  // namespace

int64_t AdafactorScratchFloats(int64_t cols) { return 2 * (int64_t{kRowChunks} * cols + kPartialBlocks) + 4; }

cudaError_t Adafactor(float* master, float* state, Bf16* weights, const float* grads, int64_t rows, int64_t cols,
                      const AdafactorParams& p, float* scratch, cudaStream_t stream) {
  return LaunchAdafactor(master, state, weights, grads, rows, cols, p, scratch, stream);
}

cudaError_t Adafactor(float* master, float* state, Bf16* weights, const Bf16* grads, int64_t rows, int64_t cols,
                      const AdafactorParams& p, float* scratch, cudaStream_t stream) {
  return LaunchAdafactor(master, state, weights, grads, rows, cols, p, scratch, stream);
}

}  // namespace tierd::trainer::gpu
