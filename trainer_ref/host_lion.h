// Lion on the host, for the state in the DRAM tier: fp32, vectorised, on the host's threads
// (optimizer.h's LionStep, in double, is its oracle).
#ifndef TIERD_TRAINER_REF_HOST_LION_H_
#define TIERD_TRAINER_REF_HOST_LION_H_

#include <cstdint>

namespace tierd::trainer {

struct HostLionParams {
  float lr = 1e-4f, beta1 = 0.9f, beta2 = 0.99f, weight_decay = 0.1f;
  float grad_scale = 1.f;  // the clip factor, applied to each gradient
  bool decay = true;       // false for norm weights
};

// master and m updated in place from grads; when `weights_bf16` is not null it receives the
// new master rounded to bf16 (as the GPU's weights are). Every operation rounded on its own
// (built with -ffp-contract=off), so the GPU's Lion kernel gives the same bits. `threads` 0:
// CpuThreads().
void HostLion(float* master, float* m, const float* grads, int64_t n, const HostLionParams& p, int threads = 0,
              uint16_t* weights_bf16 = nullptr);

}  // namespace tierd::trainer

#endif  // TIERD_TRAINER_REF_HOST_LION_H_
