#include "trainer_ref/fp8_codes.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <random>
#include <utility>
#include <vector>

#include "trainer_ref/fp8.h"

namespace tierd::trainer::fp8 {
namespace {

float FromBf16(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }

TEST(Fp8CodesTest, EveryBf16ValueAtManyScalesEncodesAsTheReference) {
  // Every bf16 bit pattern (NaNs, infinities, subnormals, both zeros) times scales that put
  // values in every part of E4M3's range: the normal codes, the subnormal ones, saturation,
  // the ties between codes.
  std::mt19937 rng(7);
  std::vector<float> scales = {1.0f, 448.0f, 1.0f / 448, 0.5f, 3.0f, 1e-3f, 1e30f, 1e-30f};
  std::uniform_real_distribution<float> log2(-40.0f, 40.0f);
  for (int i = 0; i < 56; ++i) scales.push_back(std::exp2(log2(rng)));
  int64_t checked = 0;
  for (float scale : scales) {
    for (uint32_t b = 0; b < 65536; ++b) {
      const float y = FromBf16(static_cast<uint16_t>(b)) * scale;
      ASSERT_EQ(EncodeE4M3(y), Encode(y, Format::kE4M3)) << "bf16 0x" << std::hex << b << " scale " << scale;
      ++checked;
    }
  }
  EXPECT_EQ(checked, 64 * 65536);
}

TEST(Fp8CodesTest, RandomFloatsAndTiesEncodeAsTheReference) {
  std::mt19937 rng(11);
  for (int i = 0; i < 4000000; ++i) {
    const float y = std::bit_cast<float>(static_cast<uint32_t>(rng()));
    ASSERT_EQ(EncodeE4M3(y), Encode(y, Format::kE4M3)) << std::hexfloat << y;
  }
  // Exactly halfway between neighbouring codes, both parities, normal and subnormal, and the
  // largest value's neighbourhood.
  for (int code = 0; code < 0x7e; ++code) {
    const float lo = Decode(static_cast<uint8_t>(code), Format::kE4M3);
    const float hi = Decode(static_cast<uint8_t>(code + 1), Format::kE4M3);
    for (float y :
         {(lo + hi) / 2, -(lo + hi) / 2, std::nextafter((lo + hi) / 2, 0.0f), std::nextafter((lo + hi) / 2, 1e9f)}) {
      ASSERT_EQ(EncodeE4M3(y), Encode(y, Format::kE4M3)) << std::hexfloat << y;
    }
  }
  for (float y :
       {448.0f, 463.99f, 464.0f, 1e9f, std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
        std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN(), 0.0f, -0.0f}) {
    EXPECT_EQ(EncodeE4M3(y), Encode(y, Format::kE4M3)) << y;
  }
}

TEST(Fp8CodesTest, ATensorIsScaledFromItsLargestMagnitude) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  const int64_t n = 300001;  // slices of uneven length on several threads
  std::vector<uint16_t> w(n);
  for (auto& b : w) b = static_cast<uint16_t>(std::bit_cast<uint32_t>(normal(rng)) >> 16);
  w[12345] = static_cast<uint16_t>(std::bit_cast<uint32_t>(-0.5f) >> 16);  // the largest, negative
  std::vector<uint8_t> codes(n), one_thread(n);
  const Fp8Scaled s = EncodeE4M3CurrentScaled(w.data(), n, codes.data(), 4);
  EXPECT_EQ(s.amax, 0.5f);
  EXPECT_EQ(s.scale, CurrentScale(0.5f, Format::kE4M3));
  EXPECT_EQ(s.scale_inv, 1.0f / s.scale);
  EXPECT_EQ(codes[12345], 0xfe);  // -448
  for (int64_t i = 0; i < n; ++i) {
    ASSERT_EQ(codes[i], Encode(FromBf16(w[i]) * s.scale, Format::kE4M3)) << i;
  }
  const Fp8Scaled t = EncodeE4M3CurrentScaled(w.data(), n, one_thread.data(), 1);
  EXPECT_EQ(t.scale, s.scale);
  EXPECT_EQ(one_thread, codes);
}

TEST(Fp8CodesTest, DegenerateTensorsGetScaleOne) {
  std::vector<uint16_t> zeros(1000, 0);
  std::vector<uint8_t> codes(1000, 0xaa);
  Fp8Scaled s = EncodeE4M3CurrentScaled(zeros.data(), 1000, codes.data());
  EXPECT_EQ(s.amax, 0.0f);
  EXPECT_EQ(s.scale, 1.0f);
  EXPECT_EQ(codes, std::vector<uint8_t>(1000, 0));
  // A NaN (an overflow upstream): scale 1, the NaN kept so the loss shows it.
  std::vector<uint16_t> nan = {0x3f80, 0x7fc0, 0xbf80};
  std::vector<uint8_t> three(3);
  s = EncodeE4M3CurrentScaled(nan.data(), 3, three.data());
  EXPECT_TRUE(std::isnan(s.amax));
  EXPECT_EQ(s.scale, 1.0f);
  EXPECT_EQ(three[0], Encode(1.0f, Format::kE4M3));
  EXPECT_EQ(three[1], 0x7f);
  EXPECT_EQ(three[2], Encode(-1.0f, Format::kE4M3));
  EXPECT_EQ(EncodeE4M3CurrentScaled(nan.data(), 0, three.data()).scale, 1.0f);
}

// Shapes that are and are not whole tiles, one thread and several: each byte lands at (c, r).
TEST(Fp8CodesTest, TransposedCodesHoldEachByteAtItsMirroredPlace) {
  std::mt19937 rng(7);
  for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{64, 128}, {1, 1}, {3, 200}, {130, 67}, {1000, 700}}) {
    for (int threads : {1, 3}) {
      SCOPED_TRACE(testing::Message() << rows << " x " << cols << ", " << threads << " threads");
      std::vector<uint8_t> in(rows * cols), out(rows * cols, 0);
      for (uint8_t& b : in) b = static_cast<uint8_t>(rng());
      TransposeCodes(in.data(), rows, cols, out.data(), threads);
      int64_t wrong = 0;
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < cols; ++c) wrong += out[c * rows + r] != in[r * cols + c];
      }
      EXPECT_EQ(wrong, 0);
    }
  }
}

}  // namespace
}  // namespace tierd::trainer::fp8
