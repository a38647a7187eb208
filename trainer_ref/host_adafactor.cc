#include "trainer_ref/host_adafactor.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "trainer_ref/host_adamw.h"
#include "trainer_ref/parallel.h"

namespace tierd::trainer {
namespace {

constexpr int64_t kPieces = 64;  // the fixed pieces sums are taken over

}  // namespace

void HostAdafactor(float* master, float* state, const float* grads, int64_t rows, int64_t cols,
                   const HostAdafactorParams& p, uint16_t* weights_bf16, int threads) {
  const int64_t n = cols == 0 ? rows : rows * cols;
  if (n <= 0) return;
  const float b2 = p.beta2t, keep = 1.f - p.beta2t, eps1 = p.eps1, scale = p.grad_scale;
  auto square = [&](int64_t k) {
    const float g = grads[k] * scale;
    return g * g + eps1;
  };
  float mean_r = 1.f;
  if (cols == 0) {
    ParallelFor(
        n, 4.0 * n,
        [&](int64_t begin, int64_t end) {
          for (int64_t k = begin; k < end; ++k) state[k] = b2 * state[k] + keep * square(k);
        },
        threads);
  } else {
    float* r = state;
    float* c = state + rows;
    ParallelFor(
        rows, 4.0 * n,
        [&](int64_t begin, int64_t end) {
          for (int64_t i = begin; i < end; ++i) {
            double sum = 0;
            for (int64_t j = 0; j < cols; ++j) sum += square(i * cols + j);
            r[i] = b2 * r[i] + keep * static_cast<float>(sum / static_cast<double>(cols));
          }
        },
        threads);
    // Column sums over fixed row ranges, then the ranges in order.
    const int64_t pieces = std::min(kPieces, rows), per = (rows + pieces - 1) / pieces;
    std::vector<double> partial(static_cast<size_t>(pieces * cols), 0.0);
    ParallelFor(
        pieces, 4.0 * n,
        [&](int64_t begin, int64_t end) {
          for (int64_t piece = begin; piece < end; ++piece) {
            double* out = partial.data() + piece * cols;
            for (int64_t i = piece * per; i < std::min(rows, (piece + 1) * per); ++i) {
              for (int64_t j = 0; j < cols; ++j) out[j] += square(i * cols + j);
            }
          }
        },
        threads);
    for (int64_t j = 0; j < cols; ++j) {
      double sum = 0;
      for (int64_t piece = 0; piece < pieces; ++piece) sum += partial[piece * cols + j];
      c[j] = b2 * c[j] + keep * static_cast<float>(sum / static_cast<double>(rows));
    }
    double sum = 0;
    for (int64_t i = 0; i < rows; ++i) sum += r[i];
    mean_r = static_cast<float>(sum / static_cast<double>(rows));
  }
  auto update = [&](int64_t k) {
    const float g = grads[k] * scale;
    if (cols == 0) return g / std::sqrt(state[k]);
    return g / std::sqrt(state[k / cols] / mean_r * state[rows + k % cols]);
  };
  const int64_t pieces = std::min(kPieces, n), per = (n + pieces - 1) / pieces;
  std::vector<double> squares(static_cast<size_t>(pieces), 0.0);
  ParallelFor(
      pieces, 6.0 * n,
      [&](int64_t begin, int64_t end) {
        for (int64_t piece = begin; piece < end; ++piece) {
          double sum = 0;
          for (int64_t k = piece * per; k < std::min(n, (piece + 1) * per); ++k) {
            const float u = update(k);
            sum += static_cast<double>(u) * u;
          }
          squares[piece] = sum;
        }
      },
      threads);
  double total = 0;
  for (double s : squares) total += s;
  const float rms = static_cast<float>(std::sqrt(total / static_cast<double>(n)));
  const float step = p.lr * (1.f / std::max(1.f, rms / p.clip_threshold));
  const float decay = p.decay ? p.lr * p.weight_decay : 0.f;
  ParallelFor(
      n, 6.0 * n,
      [&](int64_t begin, int64_t end) {
        for (int64_t k = begin; k < end; ++k) {
          float w = master[k];
          w -= decay * w;
          w -= step * update(k);
          master[k] = w;
          if (weights_bf16 != nullptr) weights_bf16[k] = Bf16Bits(w);
        }
      },
      threads);
}

}  // namespace tierd::trainer
