// The host's Adafactor against optimizer.h's AdafactorStep (in double) on random matrices and
// vectors, and its independence of the thread count.
#include "trainer_ref/host_adafactor.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "trainer_ref/host_adamw.h"
#include "trainer_ref/optimizer.h"

namespace tierd::trainer {
namespace {

// Three steps on a 96 x 160 matrix and a 300-vector, with decay and gradient scaling, against
// the reference: every master weight within 1e-6 relative (+1e-9); the state within 1e-4
// relative. The same bits on 1 thread and on 3.
TEST(HostAdafactorTest, TracksTheReferenceAndIgnoresTheThreadCount) {
  std::mt19937_64 rng(7);
  std::normal_distribution<float> normal(0.f, 1.f);
  for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{96, 160}, {300, 0}}) {
    SCOPED_TRACE(cols == 0 ? "vector" : "matrix");
    const int64_t n = cols == 0 ? rows : rows * cols;
    std::vector<float> master(n), ref(n), state(AdafactorStateCount(rows, cols), 0.f), ref_state = state,
                                                                                       other_state = state;
    for (float& w : master) w = normal(rng) * 0.02f;
    ref = master;
    std::vector<float> other = master;
    std::vector<uint16_t> bf16(n);
    AdafactorOptions o;
    for (int step = 1; step <= 3; ++step) {
      std::vector<float> g(n), scaled(n);
      for (int64_t i = 0; i < n; ++i) {
        g[i] = normal(rng) * (1.f + static_cast<float>(i % 7));
        scaled[i] = g[i] * 0.5f;
      }
      HostAdafactorParams p;
      p.lr = 1e-3f;
      p.beta2t = static_cast<float>(1.0 - std::pow(step, o.decay_rate));
      p.grad_scale = 0.5f;
      HostAdafactor(master.data(), state.data(), g.data(), rows, cols, p, bf16.data(), 3);
      HostAdafactor(other.data(), other_state.data(), g.data(), rows, cols, p, nullptr, 1);
      AdafactorStep(ref.data(), scaled.data(), ref_state.data(), rows, cols, 1e-3, step, o, true);
    }
    int64_t off = 0;
    for (int64_t i = 0; i < n; ++i) off += std::fabs(master[i] - ref[i]) > 1e-6f * std::fabs(ref[i]) + 1e-9f;
    EXPECT_EQ(off, 0) << "of " << n << " master weights off the reference";
    for (size_t i = 0; i < state.size(); ++i) {
      EXPECT_NEAR(state[i], ref_state[i], 1e-4 * std::fabs(ref_state[i])) << i;
    }
    EXPECT_EQ(master, other) << "1 thread and 3 give the same bits";
    EXPECT_EQ(bf16[5], Bf16Bits(master[5]));
  }
}

// The embedding's and the head's kind of gradient: most rows zero (tokens not in the batch)
// or many decades below the others (rare tokens in the head): against the reference, to 1e-6.
TEST(HostAdafactorTest, SparseAndSkewedRowsTrackTheReference) {
  std::mt19937_64 rng(8);
  std::normal_distribution<float> normal(0.f, 1.f);
  const int64_t rows = 512, cols = 128, n = rows * cols;
  std::vector<float> master(n), state(rows + cols, 0.f), ref_state = state;
  for (float& w : master) w = normal(rng) * 0.02f;
  std::vector<float> ref = master;
  AdafactorOptions o;
  for (int step = 1; step <= 4; ++step) {
    std::vector<float> g(n, 0.f);
    for (int64_t i = 0; i < rows; ++i) {
      const bool used = i % 5 == step % 5 || i < 8;
      const float row_scale = std::pow(10.f, -static_cast<float>(i % 9));
      for (int64_t j = 0; j < cols; ++j) g[i * cols + j] = used ? normal(rng) * row_scale : 0.f;
    }
    HostAdafactorParams p;
    p.lr = 1e-3f;
    p.beta2t = static_cast<float>(1.0 - std::pow(step, o.decay_rate));
    HostAdafactor(master.data(), state.data(), g.data(), rows, cols, p);
    AdafactorStep(ref.data(), g.data(), ref_state.data(), rows, cols, 1e-3, step, o, true);
  }
  int64_t off = 0;
  double worst = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = std::fabs(master[i] - ref[i]);
    worst = std::max(worst, d);
    off += d > 1e-6 * std::fabs(ref[i]) + 1e-8;
  }
  EXPECT_EQ(off, 0) << "of " << n << " master weights off the reference, by at most " << worst;
}

}  // namespace
}  // namespace tierd::trainer
