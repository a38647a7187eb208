#include "trainer_ref/host_adafactor.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <vector>

#include "trainer_ref/host_adamw.h"
#include "trainer_ref/parallel.h"

namespace tierd::trainer {
namespace {

// The GPU kernels' shapes (kernels/adafactor_ops.cu), which the sums below follow step for
// step: blocks of 256 lanes, each lane summing every 256th value in order, then a tree over
// the lanes (strides 128, 64, ..., 1); column sums over 32 row ranges, then the ranges in
// order; the update's sum of squares over 1024 blocks of 256 lanes, each lane taking every
// (1024 x 256)th value, then the blocks 4 to a lane.
constexpr int kLanes = 256, kRowChunks = 32, kPartialBlocks = 1024;
using Lanes = std::array<double, kLanes>;

double TreeSum(Lanes& lanes) {
  for (int stride = kLanes / 2; stride > 0; stride /= 2) {
    for (int t = 0; t < stride; ++t) lanes[t] += lanes[t + stride];
  }
  return lanes[0];
}

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
            Lanes lanes{};
            for (int64_t j = 0; j < cols; ++j) lanes[j % kLanes] += square(i * cols + j);
            const float mean = static_cast<float>(TreeSum(lanes) / static_cast<double>(cols));
            r[i] = b2 * r[i] + keep * mean;
          }
        },
        threads);
    const int64_t per = (rows + kRowChunks - 1) / kRowChunks;
    ParallelFor(
        cols, 4.0 * n,
        [&](int64_t begin, int64_t end) {
          for (int64_t j = begin; j < end; ++j) {
            double sum = 0;
            for (int chunk = 0; chunk < kRowChunks; ++chunk) {
              double part = 0;
              for (int64_t i = chunk * per; i < std::min(rows, (chunk + 1) * per); ++i) part += square(i * cols + j);
              sum += part;
            }
            const float mean = static_cast<float>(sum / static_cast<double>(rows));
            c[j] = b2 * c[j] + keep * mean;
          }
        },
        threads);
    Lanes lanes{};
    for (int64_t i = 0; i < rows; ++i) lanes[i % kLanes] += r[i];
    mean_r = static_cast<float>(TreeSum(lanes) / static_cast<double>(rows));
  }
  auto update = [&](int64_t k) {
    const float g = grads[k] * scale;
    if (cols == 0) return g / std::sqrt(state[k]);
    return g / std::sqrt(state[k / cols] / mean_r * state[rows + k % cols]);
  };
  std::vector<double> partial(kPartialBlocks);
  constexpr int64_t kStride = int64_t{kPartialBlocks} * kLanes;
  ParallelFor(
      kPartialBlocks, 6.0 * n,
      [&](int64_t begin, int64_t end) {
        for (int64_t block = begin; block < end; ++block) {
          Lanes lanes{};
          for (int t = 0; t < kLanes; ++t) {
            for (int64_t k = block * kLanes + t; k < n; k += kStride) {
              const double u = update(k);
              lanes[t] += u * u;
            }
          }
          partial[block] = TreeSum(lanes);
        }
      },
      threads);
  Lanes lanes{};
  for (int b = 0; b < kPartialBlocks; ++b) lanes[b % kLanes] += partial[b];
  const float rms = static_cast<float>(std::sqrt(TreeSum(lanes) / static_cast<double>(n)));
  const float step = p.lr * (1.f / std::max(1.f, rms / p.clip_threshold));
  const float decay = p.decay ? p.lr * p.weight_decay : 0.f;
  ParallelFor(
      n, 6.0 * n,
      [&](int64_t begin, int64_t end) {
        for (int64_t k = begin; k < end; ++k) {
          float w = master[k];
          w = w - decay * w;
          w = w - step * update(k);
          master[k] = w;
          if (weights_bf16 != nullptr) weights_bf16[k] = Bf16Bits(w);
        }
      },
      threads);
}

}  // namespace tierd::trainer
