#include "trainer_ref/adamw8bit.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

namespace tierd::trainer {
namespace {

TEST(AdamW8bitTest, TheMapsAreAscendingAndHoldZeroAndOne) {
  for (bool is_signed : {true, false}) {
    const auto& map = DynamicMap(is_signed);
    for (int i = 1; i < q8::kCodes; ++i) ASSERT_LT(map[i - 1], map[i]) << i;
    EXPECT_EQ(map.back(), 1.f);
    EXPECT_NE(std::find(map.begin(), map.end(), 0.f), map.end());
    if (is_signed) {
      EXPECT_LT(map.front(), -0.99f);
    } else {
      EXPECT_EQ(map.front(), 0.f);
    }
    // Codes per decade below 1: 1, 2, 4, ... 64 (signed, each also negative) or 2, 4, ... 128
    // (unsigned) for the decades from 1e-6 up: the larger values, the finer.
    for (int i = 0; i < 7; ++i) {
      const float lo = 0.1f * std::pow(10.f, i - 6), hi = std::pow(10.f, i - 6);
      const int count = static_cast<int>(std::count_if(map.begin(), map.end(), [&](float x) { return x > lo && x < hi; }));
      EXPECT_EQ(count, is_signed ? 1 << i : 1 << (i + 1)) << "decade " << i;
    }
    float smallest = 1;
    for (float x : map) {
      if (x > 0) smallest = std::min(smallest, x);
    }
    EXPECT_LT(smallest, 2e-6f);
  }
}

// Each value gets the nearest code of its block's scale, and zero bytes are zeros.
TEST(AdamW8bitTest, QuantizationPicksTheNearestCode) {
  std::mt19937 rng(3);
  const uint64_t n = 3 * q8::kQuantBlock + 77;
  std::vector<float> x(n);
  for (uint64_t i = 0; i < n; ++i) {
    const float scale = std::pow(10.f, -static_cast<float>(i / q8::kQuantBlock));  // a scale per block
    x[i] = scale * std::normal_distribution<float>(0, 1)(rng);
  }
  for (bool is_signed : {true, false}) {
    std::vector<float> values = x;
    if (!is_signed) {
      for (float& v : values) v = v * v;
    }
    std::vector<uint8_t> bytes(Moment8bitBytes(n), 0xAA);
    Quantize8bit(values.data(), n, is_signed, bytes.data());
    std::vector<float> back(n);
    Dequantize8bit(bytes.data(), n, is_signed, back.data());
    const Moment8bit m = MomentAt(bytes.data(), n);
    const auto& map = DynamicMap(is_signed);
    for (uint64_t i = 0; i < n; i += 7) {
      const float absmax = m.absmax[i / q8::kQuantBlock], normalized = values[i] / absmax;
      const float chosen = std::fabs(normalized - map[m.codes[i]]);
      // Nearest up to the rounding of the thresholds (midpoints computed in double, kept in fp32).
      for (float code : map) ASSERT_LE(chosen, std::fabs(normalized - code) + 1e-7f) << "value " << i;
      ASSERT_EQ(back[i], map[m.codes[i]] * absmax);
    }
  }
  std::vector<uint8_t> zeros(Moment8bitBytes(n), 0);
  std::vector<float> out(n, 1.f);
  Dequantize8bit(zeros.data(), n, true, out.data());
  for (float v : out) ASSERT_EQ(v, 0.f);
}

// The host's table lookup gives the search's code for every kind of value: the thresholds
// themselves and their neighbours, zeros of both signs, the ends, and random values across
// every decade.
TEST(AdamW8bitTest, TheTableLookupGivesTheSearchsCode) {
  EXPECT_EQ(q8::kTableKeys, 1u << 17);
  for (bool is_signed : {true, false}) {
    const auto& t = Thresholds(is_signed);
    std::vector<float> probes = {0.f, -0.f, 1.f, -1.f, 1e-9f, -1e-9f, 0.5f, -0.5f};
    for (float x : t) {
      probes.push_back(x);
      probes.push_back(std::nextafter(x, 2.f));
      probes.push_back(std::nextafter(x, -2.f));
    }
    std::mt19937 rng(4);
    std::uniform_real_distribution<float> exponent(-8.f, 0.f), sign(-1.f, 1.f);
    for (int i = 0; i < 200000; ++i) probes.push_back(std::copysign(std::pow(10.f, exponent(rng)), sign(rng)));
    for (float x : probes) {
      if (!is_signed && x < 0) continue;
      ASSERT_EQ(CodeOf(is_signed, x), q8::CodeBySearch(t.data(), x)) << x;
      // The table the GPU's table path copies to the device, read as its kernel reads it.
      ASSERT_EQ(q8::CodeByTable(CodeTable(is_signed), x), q8::CodeBySearch(t.data(), x)) << x;
    }
  }
}

// Quantizing and dequantizing whole tensors go through the vectorised lookups (AVX2, AVX-512's
// gathers, AVX-512 VBMI's byte permutes, each where the CPU has it): on every path every code is
// the search's, every value map x scale, also in the tails shorter than a vector and across block
// boundaries.
TEST(AdamW8bitTest, EveryLookupPathGivesTheSearchsCodesAndTheMapsValues) {
  std::printf("host lookups by default: %s\n", HostLookupPath());
  for (const char* want : {"plain", "avx2", "avx512", "avx512vbmi"}) {
    const std::string path = UseHostLookupPath(want);
    SCOPED_TRACE(path);
    if (path != want) std::printf("this CPU has no %s path (runs %s)\n", want, path.c_str());
    for (bool is_signed : {true, false}) {
      const auto& t = Thresholds(is_signed);
      const auto& map = DynamicMap(is_signed);
      std::mt19937 rng(8);
      std::uniform_real_distribution<float> exponent(-9.f, 0.f), sign(-1.f, 1.f);
      const uint64_t n = 2 * q8::kQuantBlock + 37;
      std::vector<float> values(n);
      for (uint64_t i = 0; i < n; ++i) {
        const float magnitude = std::pow(10.f, exponent(rng));
        values[i] = is_signed ? std::copysign(magnitude, sign(rng)) : magnitude;
      }
      values[5] = 0.f;
      values[6] = is_signed ? -0.f : 0.f;
      values[q8::kQuantBlock + 3] = t[100];  // a threshold itself (a tie goes to the lower code)
      values[q8::kQuantBlock + 4] = is_signed ? -1.f : 1.f;  // codes 0 and 255: the planes' ends
      values[q8::kQuantBlock + 70] = is_signed ? 1.f : 0.f;
      std::vector<uint8_t> bytes(Moment8bitBytes(n));
      Quantize8bit(values.data(), n, is_signed, bytes.data());
      const Moment8bit q = MomentAt(bytes.data(), n);
      for (uint64_t i = 0; i < n; ++i) {
        const float inverse = q8::InverseScale(q.absmax[i / q8::kQuantBlock]);
        ASSERT_EQ(q.codes[i], q8::CodeBySearch(t.data(), q8::Mul(values[i], inverse))) << i << " " << values[i];
      }
      // Every code in every position of a 64-code vector, dequantized.
      for (uint64_t i = 0; i < n; ++i) q.codes[i] = static_cast<uint8_t>((i * 37 + i / 64) % 256);
      std::vector<float> back(n);
      Dequantize8bit(bytes.data(), n, is_signed, back.data());
      for (uint64_t i = 0; i < n; ++i) ASSERT_EQ(back[i], q8::Mul(map[q.codes[i]], q.absmax[i / q8::kQuantBlock])) << i;
    }
  }
  UseHostLookupPath("");
}

struct Problem {
  std::vector<float> master, grads;
};
Problem RandomProblem(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0, 1);
  Problem p;
  for (int64_t i = 0; i < n; ++i) {
    p.master.push_back(0.02f * normal(rng));
    p.grads.push_back(1e-3f * normal(rng) * (1 + (i % 97)));  // magnitudes that differ across a block
  }
  return p;
}

// From zero moments the first step is the fp32 AdamW's to the bit (the update uses the fresh
// fp32 moments); later steps stay close to it; the bf16 weights are the master's rounding.
TEST(AdamW8bitTest, TracksTheFp32OptimizerAndItsFirstStepIsExact) {
  const int64_t n = 2 * q8::kQuantBlock + 333;
  Problem a = RandomProblem(n, 5);
  std::vector<float> master8 = a.master, master32 = a.master, m32(n, 0.f), v32(n, 0.f);
  std::vector<uint8_t> m8(Moment8bitBytes(n), 0), v8(Moment8bitBytes(n), 0);
  std::vector<uint16_t> weights(n);
  HostAdamWParams p;
  p.lr = 1e-3f;
  std::mt19937 rng(6);
  std::normal_distribution<float> normal(0, 1);
  for (int step = 1; step <= 100; ++step) {
    p.step = step;
    HostAdamW8bit(master8.data(), m8.data(), v8.data(), weights.data(), a.grads.data(), n, p);
    HostAdamW(master32.data(), m32.data(), v32.data(), nullptr, a.grads.data(), n, p);
    if (step == 1) {
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(master8[i], master32[i]) << i;
    }
    for (int64_t i = 0; i < n; ++i) a.grads[i] = 0.8f * a.grads[i] + 2e-4f * normal(rng) * (1 + (i % 97));
  }
  double diff = 0, moved = 0;
  for (int64_t i = 0; i < n; ++i) {
    diff += std::pow(double(master8[i]) - master32[i], 2);
    moved += std::pow(double(master32[i]) - a.master[i], 2);
    ASSERT_EQ(weights[i], Bf16Bits(master8[i]));
  }
  // The 8-bit run's distance from the fp32 run, against how far the fp32 run moved: a few
  // percent, with gradients whose magnitudes differ ~100x within a block (the small ones
  // fall to the map's coarse low decades). Training fidelity is checked end to end
  // (trainer_test: the tiny model's loss after 300 steps).
  EXPECT_LT(std::sqrt(diff / moved), 0.1) << "relative to the update";
  std::vector<float> m_back(n);
  Dequantize8bit(m8.data(), n, true, m_back.data());
  double m_diff = 0, m_norm = 0;
  for (int64_t i = 0; i < n; ++i) {
    m_diff += std::pow(double(m_back[i]) - m32[i], 2);
    m_norm += double(m32[i]) * m32[i];
  }
  EXPECT_LT(std::sqrt(m_diff / m_norm), 0.05) << "first moment";
}

// Gradients whose magnitudes span four decades within each block: v = g^2 spans eight, and
// stored directly the small elements' v fell into the map's coarsest decades or to zero,
// their updates several times too large. Stored as its root, v keeps the gradients' range:
// the smallest elements move within 30% of where the fp32 optimizer moves them (18% here:
// their m and r fall in the maps' 4- and 8-value decades; v stored directly: 780%).
TEST(AdamW8bitTest, ElementsFourDecadesBelowTheirBlocksLargestMoveAsInFp32) {
  const int64_t n = 4 * q8::kQuantBlock;
  std::vector<float> scale(n);
  for (int64_t i = 0; i < n; ++i) scale[i] = std::pow(10.f, -4.f * static_cast<float>(i % 8) / 7.f);
  std::vector<float> start(n, 0.01f), master8 = start, master32 = start, m32(n, 0.f), v32(n, 0.f), grads(n);
  std::vector<uint8_t> m8(Moment8bitBytes(n), 0), v8(Moment8bitBytes(n), 0);
  std::mt19937 rng(12);
  std::normal_distribution<float> normal(0, 1);
  HostAdamWParams p;
  p.lr = 1e-3f;
  p.weight_decay = 0.f;
  for (int step = 1; step <= 40; ++step) {
    p.step = step;
    for (int64_t i = 0; i < n; ++i) grads[i] = 1e-2f * scale[i] * (normal(rng) + 0.5f);
    HostAdamW8bit(master8.data(), m8.data(), v8.data(), nullptr, grads.data(), n, p);
    HostAdamW(master32.data(), m32.data(), v32.data(), nullptr, grads.data(), n, p);
  }
  double diff = 0, moved = 0;
  for (int64_t i = 7; i < n; i += 8) {  // the smallest: 1e-4 of the block's largest
    diff += std::pow(double(master8[i]) - master32[i], 2);
    moved += std::pow(double(master32[i]) - start[i], 2);
  }
  EXPECT_LT(std::sqrt(diff / moved), 0.3) << "the small elements' displacement, relative to fp32's";
}

TEST(AdamW8bitTest, ResultsDoNotDependOnTheThreadCount) {
  const int64_t n = 7 * q8::kQuantBlock + 5;
  Problem a = RandomProblem(n, 9);
  std::vector<float> one = a.master, many = a.master;
  std::vector<uint8_t> m1(Moment8bitBytes(n), 0), v1(Moment8bitBytes(n), 0), m4 = m1, v4 = v1;
  HostAdamWParams p;
  for (int step = 1; step <= 3; ++step) {
    p.step = step;
    HostAdamW8bit(one.data(), m1.data(), v1.data(), nullptr, a.grads.data(), n, p, 1);
    HostAdamW8bit(many.data(), m4.data(), v4.data(), nullptr, a.grads.data(), n, p, 4);
  }
  EXPECT_EQ(one, many);
  EXPECT_EQ(m1, m4);
  EXPECT_EQ(v1, v4);
}

TEST(AdamW8bitTest, EveryLookupPathStepsToThePlainLoopsBits) {
  const int64_t n = 5 * q8::kQuantBlock + 101;
  const Problem a = RandomProblem(n, 13);
  struct Run {
    std::vector<float> master;
    std::vector<uint8_t> m, v;
    std::vector<uint16_t> weights;
  };
  auto run = [&](const char* path) {
    UseHostLookupPath(path);
    Run r{a.master, std::vector<uint8_t>(Moment8bitBytes(n), 0), std::vector<uint8_t>(Moment8bitBytes(n), 0),
          std::vector<uint16_t>(static_cast<size_t>(n))};
    HostAdamWParams p;
    for (int step = 1; step <= 4; ++step) {
      p.step = step;
      HostAdamW8bit(r.master.data(), r.m.data(), r.v.data(), r.weights.data(), a.grads.data(), n, p, 2);
    }
    return r;
  };
  const Run plain = run("plain");
  for (const char* path : {"avx2", "avx512", "avx512vbmi"}) {
    SCOPED_TRACE(path);
    const Run r = run(path);
    EXPECT_EQ(r.master, plain.master);
    EXPECT_EQ(r.m, plain.m);
    EXPECT_EQ(r.v, plain.v);
    EXPECT_EQ(r.weights, plain.weights);
  }
  UseHostLookupPath("");
  EXPECT_NE(plain.master, a.master);
}

TEST(AdamW8bitTest, Bf16GradientsGiveTheBitsOfTheirFp32Widening) {
  const int64_t n = 9 * q8::kQuantBlock + 77;  // a ragged last block
  Problem a = RandomProblem(n, 11);
  std::vector<uint16_t> bf16(static_cast<size_t>(n));
  std::vector<float> widened(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    bf16[i] = Bf16Bits(a.grads[i]);
    widened[i] = Bf16Float(bf16[i]);
  }
  std::vector<float> from32 = a.master, from16 = a.master;
  std::vector<uint8_t> m32(Moment8bitBytes(n), 0), v32(Moment8bitBytes(n), 0), m16 = m32, v16 = v32;
  std::vector<uint16_t> w32(static_cast<size_t>(n)), w16(static_cast<size_t>(n));
  HostAdamWParams p;
  for (int step = 1; step <= 3; ++step) {
    p.step = step;
    HostAdamW8bit(from32.data(), m32.data(), v32.data(), w32.data(), widened.data(), n, p, 3);
    HostAdamW8bitFromBf16(from16.data(), m16.data(), v16.data(), w16.data(), bf16.data(), n, p, 2);
  }
  EXPECT_EQ(from32, from16);
  EXPECT_EQ(m32, m16);
  EXPECT_EQ(v32, v16);
  EXPECT_EQ(w32, w16);
  EXPECT_NE(from16, a.master);
}

}  // namespace
}  // namespace tierd::trainer
