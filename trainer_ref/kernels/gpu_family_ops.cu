// Kernels for the Llama family's variations on the decoder (gpu_ops.h): q/k/v biases and
// grouped-query attention's repeat of key/value heads and its sum back. Element-wise or
// column sums; deterministic (no atomics).
#include <cuda_bf16.h>

#include "trainer_ref/kernels/gpu_kernel_util.cuh"
#include "trainer_ref/kernels/gpu_ops.h"

namespace tierd::trainer::gpu {
namespace {

constexpr int kBiasRowsPerChunk = 64;

__global__ void BiasForwardKernel(Bf16* out, const float* bias, int64_t count, int oc) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count; i += int64_t{gridDim.x} * blockDim.x) {
    Store(out, i, Load(out, i) + bias[i % oc]);
  }
}

// partial (chunks, OC): each chunk of 64 rows' column sums, in row order.
__global__ void BiasPartialKernel(float* partial, const Bf16* dout, int n, int oc) {
  const int chunk = blockIdx.y;
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= oc) return;
  const int end = min(n, (chunk + 1) * kBiasRowsPerChunk);
  float sum = 0.f;
  for (int row = chunk * kBiasRowsPerChunk; row < end; ++row) sum += Load(dout, int64_t{row} * oc + j);
  partial[int64_t{chunk} * oc + j] = sum;
}

// One thread per value of full (N, H*D): the value of its key/value head.
__global__ void RepeatKvKernel(Bf16* full, const Bf16* kv, int64_t count, int h, int group, int d) {
  const int qd = h * d, kd = h / group * d;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t row = i / qd;
    const int col = static_cast<int>(i % qd), head = col / d, e = col % d;
    reinterpret_cast<__nv_bfloat16*>(full)[i] =
        reinterpret_cast<const __nv_bfloat16*>(kv)[row * kd + (head / group) * d + e];
  }
}

// One thread per value of dkv (N, KV*D): its group's heads of dfull summed in head order.
__global__ void SumKvGroupsKernel(Bf16* dkv, const Bf16* dfull, int64_t count, int h, int group, int d) {
  const int kv_heads = h / group, qd = h * d, kd = kv_heads * d;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t row = i / kd;
    const int col = static_cast<int>(i % kd), head = col / d, e = col % d;
    float sum = 0.f;
    for (int g = 0; g < group; ++g) sum += Load(dfull, row * qd + (head * group + g) * d + e);
    Store(dkv, i, sum);
  }
}

}  // namespace

void BiasForward(Bf16* out, const float* bias, int n, int oc, cudaStream_t stream) {
  const int64_t count = int64_t{n} * oc;
  if (count == 0) return;
  BiasForwardKernel<<<Blocks(count), kThreads, 0, stream>>>(out, bias, count, oc);
}

int64_t BiasScratchFloats(int n, int oc) { return int64_t{(n + kBiasRowsPerChunk - 1) / kBiasRowsPerChunk} * oc; }

void BiasBackward(float* dbias, const Bf16* dout, int n, int oc, float* scratch, cudaStream_t stream) {
  if (n <= 0 || oc <= 0) return;
  const int chunks = (n + kBiasRowsPerChunk - 1) / kBiasRowsPerChunk, blocks = (oc + kThreads - 1) / kThreads;
  BiasPartialKernel<<<dim3(blocks, chunks), kThreads, 0, stream>>>(scratch, dout, n, oc);
  SumRowChunksInto(dbias, scratch, chunks, oc, stream);
}

void RepeatKvHeads(Bf16* full, const Bf16* kv, int n, int h, int kv_heads, int d, cudaStream_t stream) {
  const int64_t count = int64_t{n} * h * d;
  if (count == 0) return;
  RepeatKvKernel<<<Blocks(count), kThreads, 0, stream>>>(full, kv, count, h, h / kv_heads, d);
}

void SumKvHeadGroups(Bf16* dkv, const Bf16* dfull, int n, int h, int kv_heads, int d, cudaStream_t stream) {
  const int64_t count = int64_t{n} * kv_heads * d;
  if (count == 0) return;
  SumKvGroupsKernel<<<Blocks(count), kThreads, 0, stream>>>(dkv, dfull, count, h, h / kv_heads, d);
}

}  // namespace tierd::trainer::gpu
