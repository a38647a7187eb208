// The kernel benchmarks' timer: `warmup` untimed runs, then the mean of `runs` timed ones
// between two CUDA events on the default stream, in milliseconds.
#ifndef TIERD_TRAINER_REF_KERNELS_BENCH_TIMER_H_
#define TIERD_TRAINER_REF_KERNELS_BENCH_TIMER_H_

#include <cuda_runtime_api.h>

namespace tierd::trainer::gpu {

template <typename Run>
double MeanMs(Run&& run, cudaEvent_t start, cudaEvent_t stop, int warmup = 3, int runs = 20) {
  for (int i = 0; i < warmup; ++i) run();
  cudaEventRecord(start);
  for (int i = 0; i < runs; ++i) run();
  cudaEventRecord(stop);
  cudaEventSynchronize(stop);
  float ms = 0;
  cudaEventElapsedTime(&ms, start, stop);
  return ms / runs;
}

}  // namespace tierd::trainer::gpu

#endif  // TIERD_TRAINER_REF_KERNELS_BENCH_TIMER_H_
