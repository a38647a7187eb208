#include "trainer_ref/host_adamw.h"

#include <cmath>
#include <cstring>

#include "trainer_ref/parallel.h"

namespace tierd::trainer {

namespace {

// One slice. No branches on data and no calls but sqrt (built with -fno-math-errno), so
// GCC vectorises it; cloned for AVX-512 and AVX2 and picked at load time by the CPU (the
// same bits on each: every operation is rounded on its own, no FMA).
__attribute__((target_clones("avx512f", "avx2", "default"))) void Slice(float* __restrict master, float* __restrict m, float* __restrict v, uint16_t* __restrict weights,
           const float* __restrict grads, int64_t n, const HostAdamWParams& p, float c1, float c2) {
  const float decay = p.decay ? p.lr * p.weight_decay : 0.f;  // w -= 0 * w leaves a finite w as it was
  const float lr = p.lr, beta1 = p.beta1, beta2 = p.beta2, eps = p.eps, scale = p.grad_scale;
  for (int64_t i = 0; i < n; ++i) {
    const float g = grads[i] * scale;
    const float mi = beta1 * m[i] + (1.f - beta1) * g;
    const float vi = beta2 * v[i] + (1.f - beta2) * g * g;
    m[i] = mi;
    v[i] = vi;
    float w = master[i];
    w -= decay * w;
    w -= lr * (mi / c1) / (std::sqrt(vi / c2) + eps);
    master[i] = w;
  }
  if (weights != nullptr) {
    for (int64_t i = 0; i < n; ++i) weights[i] = Bf16Bits(master[i]);
  }
}

float BiasCorrection(float beta, int64_t step) {
  return static_cast<float>(1.0 - std::pow(static_cast<double>(beta), static_cast<double>(step)));
}

}  // namespace

void HostMomentum(float* m, const float* grads, int64_t n, const HostAdamWParams& p) {
  const float beta1 = p.beta1, scale = p.grad_scale;
  for (int64_t i = 0; i < n; ++i) m[i] = beta1 * m[i] + (1.f - beta1) * (grads[i] * scale);
}

void HostAdamWFromMoments(float* master, const float* m_used, const float* v, int64_t n, const HostAdamWParams& p) {
  const float c1 = BiasCorrection(p.beta1, p.step), c2 = BiasCorrection(p.beta2, p.step);
  const float decay = p.decay ? p.lr * p.weight_decay : 0.f, lr = p.lr, eps = p.eps;
  for (int64_t i = 0; i < n; ++i) {
    float w = master[i];
    w -= decay * w;
    w -= lr * (m_used[i] / c1) / (std::sqrt(v[i] / c2) + eps);
    master[i] = w;
  }
}

void HostAdamW(float* master, float* m, float* v, uint16_t* weights_bf16, const float* grads, int64_t n,
               const HostAdamWParams& p, int threads) {
  const float c1 = BiasCorrection(p.beta1, p.step), c2 = BiasCorrection(p.beta2, p.step);
  ParallelFor(
      n, 20.0 * n,
      [&](int64_t begin, int64_t end) {
        Slice(master + begin, m + begin, v + begin, weights_bf16 == nullptr ? nullptr : weights_bf16 + begin,
              grads + begin, end - begin, p, c1, c2);
      },
      threads);
}

}  // namespace tierd::trainer
