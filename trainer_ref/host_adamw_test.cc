// HostAdamW against the optimizer's double-precision reference (AdamWStep) on random data,
// with and without decay and with a gradient scale; its results independent of the thread
// count, bit for bit; and its bf16 rounding.
#include "trainer_ref/host_adamw.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "trainer_ref/optimizer.h"

namespace tierd::trainer {
namespace {

struct State {
  std::vector<float> master, m, v, grads;
};

State Random(size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  State s;
  for (size_t i = 0; i < n; ++i) {
    s.master.push_back(0.02f * normal(rng));
    s.m.push_back(0.01f * normal(rng));
    s.v.push_back(1e-4f * std::abs(normal(rng)));
    s.grads.push_back(normal(rng));
  }
  return s;
}

// fp32 arithmetic against the double reference: relative 1e-5 (a few fp32 roundings of
// values of similar size), plus a tiny absolute floor for values near zero.
void ExpectClose(const std::vector<float>& got, const std::vector<float>& want, const char* what) {
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::abs(got[i] - want[i]) > 1e-5f * std::abs(want[i]) + 1e-9f && ++bad <= 3) {
      ADD_FAILURE() << what << "[" << i << "]: " << got[i] << " vs " << want[i];
    }
  }
  EXPECT_EQ(bad, 0) << what;
}

TEST(HostAdamWTest, MatchesTheReference) {
  const size_t n = 10007;
  for (bool decay : {true, false}) {
    for (float scale : {1.f, 0.37f}) {
      for (int64_t step : {1, 7}) {
        State host = Random(n, 11), ref = host;
        HostAdamWParams p;
        p.lr = 3e-3f;
        p.step = step;
        p.grad_scale = scale;
        p.decay = decay;
        std::vector<uint16_t> bf16(n);
        HostAdamW(host.master.data(), host.m.data(), host.v.data(), bf16.data(), host.grads.data(), n, p);
        for (float& g : ref.grads) g *= scale;
        AdamWOptions o;
        o.beta1 = p.beta1;
        o.beta2 = p.beta2;
        o.eps = p.eps;
        o.weight_decay = p.weight_decay;
        AdamWStep(ref.master.data(), ref.grads.data(), ref.m.data(), ref.v.data(), n, p.lr, step, o, decay);
        ExpectClose(host.master, ref.master, "master");
        ExpectClose(host.m, ref.m, "m");
        ExpectClose(host.v, ref.v, "v");
        for (size_t i = 0; i < n; ++i) ASSERT_EQ(bf16[i], Bf16Bits(host.master[i])) << i;
        // And the step moved the weights (the check above is not of untouched values).
        EXPECT_NE(host.master, Random(n, 11).master);
      }
    }
  }
}

// The two halves (the momentum sparse sync's) give HostAdamW's bits when the first moment
// used is their own and v is HostAdamW's new one; with another m they step by it.
TEST(HostAdamWTest, ItsTwoHalvesGiveItsBits) {
  const size_t n = 4099;
  for (bool decay : {true, false}) {
    State whole = Random(n, 21), halves = whole;
    HostAdamWParams p;
    p.lr = 3e-3f;
    p.step = 5;
    p.grad_scale = 0.37f;
    p.decay = decay;
    HostAdamW(whole.master.data(), whole.m.data(), whole.v.data(), nullptr, whole.grads.data(), n, p);
    HostMomentum(halves.m.data(), halves.grads.data(), n, p);
    EXPECT_EQ(halves.m, whole.m);
    HostAdamWFromMoments(halves.master.data(), halves.m.data(), whole.v.data(), n, p);
    EXPECT_EQ(halves.master, whole.master);
    // A first moment of zeros leaves only the decay.
    const std::vector<float> zeros(n, 0.f), before = halves.master;
    HostAdamWFromMoments(halves.master.data(), zeros.data(), whole.v.data(), n, p);
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(halves.master[i], decay ? before[i] - p.lr * p.weight_decay * before[i] : before[i]) << i;
    }
  }
}

TEST(HostAdamWTest, ThreadCountDoesNotChangeABit) {
  const size_t n = (size_t{1} << 20) + 3;  // large enough to be split, not a multiple
  State one = Random(n, 5), many = one;
  HostAdamWParams p;
  p.step = 3;
  HostAdamW(one.master.data(), one.m.data(), one.v.data(), nullptr, one.grads.data(), n, p, /*threads=*/1);
  HostAdamW(many.master.data(), many.m.data(), many.v.data(), nullptr, many.grads.data(), n, p, /*threads=*/7);
  EXPECT_EQ(one.master, many.master);
  EXPECT_EQ(one.m, many.m);
  EXPECT_EQ(one.v, many.v);
}

TEST(HostAdamWTest, Bf16RoundsToNearestEven) {
  auto bits = [](uint32_t b) {
    float x;
    std::memcpy(&x, &b, sizeof(x));
    return x;
  };
  EXPECT_EQ(Bf16Bits(1.0f), 0x3F80);
  EXPECT_EQ(Bf16Bits(-2.0f), 0xC000);
  EXPECT_EQ(Bf16Bits(bits(0x3F808000u)), 0x3F80) << "a tie rounds to the even neighbour (down)";
  EXPECT_EQ(Bf16Bits(bits(0x3F818000u)), 0x3F82) << "a tie rounds to the even neighbour (up)";
  EXPECT_EQ(Bf16Bits(bits(0x3F808001u)), 0x3F81) << "above the tie rounds up";
  const uint16_t nan = Bf16Bits(std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(nan & 0x7F80, 0x7F80);
  EXPECT_NE(nan & 0x007F, 0) << "NaN stays NaN";
  EXPECT_EQ(Bf16Bits(std::numeric_limits<float>::infinity()), 0x7F80);
}

}  // namespace
}  // namespace tierd::trainer
