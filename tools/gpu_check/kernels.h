// Kernels of the GPU check: a spin that keeps a stream busy (so a missing cross-process
// wait shows up as stale data), a pattern fill, and a mismatch counter. CPU reference:
// PatternWord() in pattern.h; gpu_ipc_check compares them on the device.
#ifndef TIERD_TOOLS_GPU_CHECK_KERNELS_H_
#define TIERD_TOOLS_GPU_CHECK_KERNELS_H_

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace tierd::gpu_check {

cudaError_t LaunchSpin(cudaStream_t stream, uint64_t nanoseconds);
// words[i] = PatternWord(i, seed), i < count.
cudaError_t LaunchFillPattern(cudaStream_t stream, uint32_t* words, size_t count, uint32_t seed);
// *mismatches += #{i : words[i] != PatternWord(i, seed)}; `mismatches` is device memory.
cudaError_t LaunchCountMismatches(cudaStream_t stream, const uint32_t* words, size_t count,
                                  uint32_t seed, unsigned long long* mismatches);

}  // namespace tierd::gpu_check

#endif  // TIERD_TOOLS_GPU_CHECK_KERNELS_H_
