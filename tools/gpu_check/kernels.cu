#include "tools/gpu_check/kernels.h"
#include "tools/gpu_check/pattern.h"

namespace tierd::gpu_check {
namespace {

__global__ void Spin(uint64_t nanoseconds) {
  uint64_t start;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  uint64_t now = start;
  while (now - start < nanoseconds) asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
}

__global__ void FillPattern(uint32_t* words, size_t count, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < count;
       i += size_t{gridDim.x} * blockDim.x) {
    words[i] = PatternWord(i, seed);
  }
}

__global__ void CountMismatches(const uint32_t* words, size_t count, uint32_t seed,
                                unsigned long long* mismatches) {
  unsigned long long local = 0;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < count;
       i += size_t{gridDim.x} * blockDim.x) {
    local += words[i] != PatternWord(i, seed);
  }
  if (local != 0) atomicAdd(mismatches, local);
}

}  // namespace

cudaError_t LaunchSpin(cudaStream_t stream, uint64_t nanoseconds) {
  Spin<<<1, 1, 0, stream>>>(nanoseconds);
  return cudaGetLastError();
}

cudaError_t LaunchFillPattern(cudaStream_t stream, uint32_t* words, size_t count, uint32_t seed) {
  FillPattern<<<1024, 256, 0, stream>>>(words, count, seed);
  return cudaGetLastError();
}

cudaError_t LaunchCountMismatches(cudaStream_t stream, const uint32_t* words, size_t count,
                                  uint32_t seed, unsigned long long* mismatches) {
  CountMismatches<<<1024, 256, 0, stream>>>(words, count, seed, mismatches);
  return cudaGetLastError();
}

}  // namespace tierd::gpu_check
