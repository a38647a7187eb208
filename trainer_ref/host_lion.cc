#include "trainer_ref/host_lion.h"

#include "trainer_ref/host_adamw.h"
#include "trainer_ref/parallel.h"

namespace tierd::trainer {

void HostLion(float* master, float* m, const float* grads, int64_t n, const HostLionParams& p, int threads,
              uint16_t* weights_bf16) {
  const float b1 = p.beta1, b2 = p.beta2, wd = p.decay ? p.weight_decay : 0.f, lr = p.lr, scale = p.grad_scale;
  ParallelFor(
      n, 8.0 * n,
      [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
          const float g = grads[i] * scale, c = b1 * m[i] + (1.f - b1) * g;
          const float sign = c > 0.f ? 1.f : (c < 0.f ? -1.f : 0.f);
          master[i] -= lr * (sign + wd * master[i]);
          m[i] = b2 * m[i] + (1.f - b2) * g;
          if (weights_bf16 != nullptr) weights_bf16[i] = Bf16Bits(master[i]);
        }
      },
      threads);
}

}  // namespace tierd::trainer
