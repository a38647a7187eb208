// Adafactor on the host, for the state in the DRAM tier (the GPU trainer's --optimizer_place=cpu):
// optimizer.h's AdafactorStep in fp32, its sums in double, on the host's threads. Every sum
// follows the GPU kernels' order step for step (their 256-lane blocks and trees; built with
// -ffp-contract=off, every operation rounded on its own), so the host and the GPU give the
// same bits and a run may step either place and stay the same run; and the result does not
// depend on the thread count.
#ifndef TIERD_TRAINER_REF_HOST_ADAFACTOR_H_
#define TIERD_TRAINER_REF_HOST_ADAFACTOR_H_

#include <cstdint>

namespace tierd::trainer {

struct HostAdafactorParams {
  float lr = 1e-3f, beta2t = 0.f, eps1 = 1e-30f, clip_threshold = 1.f, weight_decay = 0.1f, grad_scale = 1.f;
  bool decay = true;
};

// One tensor: rows x cols (cols 0: a vector of `rows`); `state` as AdafactorStep's. When
// `weights_bf16` is not null it receives the new master rounded to bf16. `threads` 0:
// CpuThreads().
void HostAdafactor(float* master, float* state, const float* grads, int64_t rows, int64_t cols,
                   const HostAdafactorParams& p, uint16_t* weights_bf16 = nullptr, int threads = 0);

}  // namespace tierd::trainer

#endif  // TIERD_TRAINER_REF_HOST_ADAFACTOR_H_
