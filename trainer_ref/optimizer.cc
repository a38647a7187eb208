#include "trainer_ref/optimizer.h"

#include <algorithm>
#include <cmath>
#include <vector>

namespace tierd::trainer {

void AdamWStep(float* params, const float* grads, float* m, float* v, size_t n, double lr, int64_t step,
               const AdamWOptions& o, bool decay) {
  const double c1 = 1.0 - std::pow(o.beta1, static_cast<double>(step));
  const double c2 = 1.0 - std::pow(o.beta2, static_cast<double>(step));
  for (size_t i = 0; i < n; ++i) {
    const double g = grads[i];
    const double mi = o.beta1 * m[i] + (1 - o.beta1) * g;
    const double vi = o.beta2 * v[i] + (1 - o.beta2) * g * g;
    m[i] = static_cast<float>(mi);
    v[i] = static_cast<float>(vi);
    double p = params[i];
    if (decay) p -= lr * o.weight_decay * p;
    p -= lr * (mi / c1) / (std::sqrt(vi / c2) + o.eps);
    params[i] = static_cast<float>(p);
  }
}

void LionStep(float* params, const float* grads, float* m, size_t n, double lr, const LionOptions& options,
              bool decay) {
  const double b1 = options.beta1, b2 = options.beta2, wd = decay ? options.weight_decay : 0.0;
  for (size_t i = 0; i < n; ++i) {
    const double g = grads[i], c = b1 * m[i] + (1 - b1) * g;
    const double sign = c > 0 ? 1.0 : c < 0 ? -1.0 : 0.0;
    params[i] = static_cast<float>(params[i] - lr * (sign + wd * params[i]));
    m[i] = static_cast<float>(b2 * m[i] + (1 - b2) * g);
  }
}

void AdafactorStep(float* params, const float* grads, float* state, size_t rows, size_t cols, double lr, int64_t step,
                   const AdafactorOptions& options, bool decay) {
  const double b2 = 1.0 - std::pow(static_cast<double>(step), options.decay_rate), eps1 = options.eps1;
  const size_t n = cols == 0 ? rows : rows * cols;
  std::vector<double> u(n);
  if (cols == 0) {
    for (size_t i = 0; i < n; ++i) {
      const double g = grads[i];
      state[i] = static_cast<float>(b2 * state[i] + (1 - b2) * (g * g + eps1));
      u[i] = g / std::sqrt(static_cast<double>(state[i]));
    }
  } else {
    float* r = state;
    float* c = state + rows;
    std::vector<double> row(rows, 0.0), col(cols, 0.0);
    for (size_t i = 0; i < rows; ++i) {
      for (size_t j = 0; j < cols; ++j) {
        const double g = grads[i * cols + j], a = g * g + eps1;
        row[i] += a;
        col[j] += a;
      }
    }
    double mean_r = 0;
    for (size_t i = 0; i < rows; ++i) {
      r[i] = static_cast<float>(b2 * r[i] + (1 - b2) * row[i] / static_cast<double>(cols));
      mean_r += r[i];
    }
    mean_r /= static_cast<double>(rows);
    for (size_t j = 0; j < cols; ++j)
      c[j] = static_cast<float>(b2 * c[j] + (1 - b2) * col[j] / static_cast<double>(rows));
    for (size_t i = 0; i < rows; ++i) {
      for (size_t j = 0; j < cols; ++j) {
        u[i * cols + j] = grads[i * cols + j] / std::sqrt(static_cast<double>(r[i]) / mean_r * c[j]);
      }
    }
  }
  double sum = 0;
  for (double x : u) sum += x * x;
  const double rms = std::sqrt(sum / static_cast<double>(n)), scale = 1.0 / std::max(1.0, rms / options.clip_threshold);
  const double wd = decay ? options.weight_decay : 0.0;
  for (size_t i = 0; i < n; ++i) {
    const double p = params[i] - lr * wd * params[i];
    params[i] = static_cast<float>(p - lr * scale * u[i]);
  }
}

double GlobalNorm(const float* grads, size_t n) {
  double sum = 0;
  for (size_t i = 0; i < n; ++i) sum += static_cast<double>(grads[i]) * grads[i];
  return std::sqrt(sum);
}

double ClipFactor(double norm, double max_norm) {
  if (max_norm <= 0 || norm <= max_norm) return 1.0;
  return max_norm / (norm + 1e-6);
}

double LearningRate(int64_t step, int64_t warmup_steps, int64_t total_steps, double max_lr, double min_lr) {
  if (warmup_steps > 0 && step < warmup_steps) return max_lr * static_cast<double>(step + 1) / warmup_steps;
  if (step >= total_steps || total_steps <= warmup_steps) return min_lr;
  const double progress = static_cast<double>(step - warmup_steps) / static_cast<double>(total_steps - warmup_steps);
  return min_lr + 0.5 * (max_lr - min_lr) * (1.0 + std::cos(M_PI * progress));
}

}  // namespace tierd::trainer
