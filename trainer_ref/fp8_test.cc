// The FP8 reference: every code round-trips, random values round to the nearest code (ties
// to the even one) by brute force over all codes, saturation and NaN as the GPU's
// __NV_SATFINITE conversion, and delayed scaling over its window.
#include "trainer_ref/fp8.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

namespace tierd::trainer::fp8 {
namespace {

class Fp8Test : public ::testing::TestWithParam<Format> {};

TEST_P(Fp8Test, EveryCodeRoundTripsAndTheFiniteOnesAreOrdered) {
  const Format f = GetParam();
  float previous = -1;
  int finite = 0;
  for (int c = 0; c < 128; ++c) {
    const float v = Decode(static_cast<uint8_t>(c), f);
    if (std::isnan(v) || std::isinf(v)) continue;
    ++finite;
    EXPECT_EQ(Encode(v, f), c) << FormatName(f) << " code " << c << " value " << v;
    EXPECT_EQ(Encode(-v, f), c | 0x80) << FormatName(f) << " code " << c;
    EXPECT_GT(v, previous) << FormatName(f) << " code " << c;
    previous = v;
  }
  EXPECT_EQ(previous, MaxFinite(f));
  EXPECT_EQ(finite, f == Format::kE4M3 ? 127 : 124);  // E4M3: one NaN; E5M2: inf and three NaNs
}

TEST_P(Fp8Test, ValuesRoundToTheNearestCodeTiesToEven) {
  const Format f = GetParam();
  std::vector<float> values;
  for (int c = 0; c < 128; ++c) {
    const float v = Decode(static_cast<uint8_t>(c), f);
    if (std::isfinite(v)) values.push_back(v);
  }
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> exponent(-20, std::log2(MaxFinite(f)));
  for (int i = 0; i < 20000; ++i) {
    float x = std::exp2(exponent(rng));
    if (i % 7 == 0) {  // a midpoint between two neighbours: the tie
      const size_t k = 1 + static_cast<size_t>(rng() % (values.size() - 2));
      x = (values[k] + values[k + 1]) / 2;
    }
    // Brute force: the closest value; on a tie the one with the even code.
    size_t best = 0;
    for (size_t k = 1; k < values.size(); ++k) {
      const float d = std::fabs(values[k] - x), b = std::fabs(values[best] - x);
      if (d < b || (d == b && k % 2 == 0)) best = k;
    }
    ASSERT_EQ(Encode(x, f), best) << FormatName(f) << " x " << x;
    ASSERT_EQ(Round(-x, f), -values[best]);
  }
}

TEST_P(Fp8Test, PastTheLargestSaturatesAndNanStaysNan) {
  const Format f = GetParam();
  const float max = MaxFinite(f);
  for (float x : {max, max * 1.03f, max * 1.5f, 1e30f, std::numeric_limits<float>::infinity()}) {
    EXPECT_EQ(Round(x, f), max) << FormatName(f) << " " << x;
    EXPECT_EQ(Round(-x, f), -max) << FormatName(f) << " " << -x;
  }
  EXPECT_TRUE(std::isnan(Round(std::numeric_limits<float>::quiet_NaN(), f)));
  EXPECT_EQ(Round(0.0f, f), 0.0f);
  EXPECT_EQ(Encode(-0.0f, f), 0x80);
  // Below half the smallest subnormal: zero; at it: a tie, to even (zero).
  const float smallest = Decode(1, f);
  EXPECT_EQ(Round(smallest * 0.49f, f), 0.0f);
  EXPECT_EQ(Round(smallest * 0.5f, f), 0.0f);
  EXPECT_EQ(Round(smallest * 0.51f, f), smallest);
}

INSTANTIATE_TEST_SUITE_P(Formats, Fp8Test, ::testing::Values(Format::kE4M3, Format::kE5M2),
                         [](const auto& info) { return std::string(FormatName(info.param)); });

TEST(Fp8Test, KnownValues) {
  EXPECT_EQ(MaxFinite(Format::kE4M3), 448.0f);
  EXPECT_EQ(MaxFinite(Format::kE5M2), 57344.0f);
  EXPECT_EQ(Decode(1, Format::kE4M3), std::ldexp(1.0f, -9));  // the smallest subnormal
  EXPECT_EQ(Decode(8, Format::kE4M3), std::ldexp(1.0f, -6));  // the smallest normal
  EXPECT_EQ(Decode(1, Format::kE5M2), std::ldexp(1.0f, -16));
  EXPECT_EQ(Decode(0x38, Format::kE4M3), 1.0f);
  EXPECT_EQ(Decode(0x3c, Format::kE5M2), 1.0f);
  EXPECT_TRUE(std::isinf(Decode(0x7c, Format::kE5M2)));
  EXPECT_EQ(Round(1.0625f, Format::kE4M3), 1.0f);   // the tie between 1 and 1.125: to even
  EXPECT_EQ(Round(1.1875f, Format::kE4M3), 1.25f);  // the tie between 1.125 and 1.25: to even
  EXPECT_EQ(Round(300.0f, Format::kE4M3), 288.0f);
}

TEST(DelayedScalingTest, TheScaleFollowsTheWindowsLargestAmax) {
  DelayedScaling s(Format::kE4M3, /*window=*/3);
  EXPECT_EQ(s.scale(), 1.0f);
  s.Record(0.0f);  // nothing seen yet: the scale stays
  EXPECT_EQ(s.scale(), 1.0f);
  s.Record(2.0f);
  EXPECT_EQ(s.scale(), 224.0f);  // 448 / 2
  s.Record(1.0f);
  s.Record(0.5f);
  EXPECT_EQ(s.scale(), 224.0f) << "2.0 is still in the window";
  s.Record(0.5f);
  EXPECT_EQ(s.scale(), 448.0f) << "the window is now 1, 0.5, 0.5";
  EXPECT_EQ(s.scale_inv(), 1.0f / 448);
  s.Record(std::numeric_limits<float>::infinity());
  EXPECT_EQ(s.scale(), 448.0f) << "an overflow keeps the scale";
  EXPECT_EQ(s.non_finite(), 1);
  // A tensor growing past what its window saw: its scaled amax would saturate.
  s.Record(4.0f);  // at scale 448: 1792 > 2 x 448
  EXPECT_EQ(s.saturated_in_a_row(), 1);
  EXPECT_EQ(s.scale(), 112.0f);
  s.Record(4.0f);  // at 112: exactly 448, fits
  EXPECT_EQ(s.saturated_in_a_row(), 0);
  s.Record(7.0f);  // at 112: 784, past 448 but less than twice: not counted
  EXPECT_EQ(s.saturated_in_a_row(), 0);
  DelayedScaling margin(Format::kE5M2, 16, /*margin=*/2);
  margin.Record(1.0f);
  EXPECT_EQ(margin.scale(), 57344.0f / 4);
  EXPECT_NE(margin.Describe().find("e5m2 scale 14336"), std::string::npos) << margin.Describe();
}

// --fp8_scaling=fixed: the scale is the one given from the first step to the last, whatever
// the tensor does, and what it does to that scale is counted from the first step.
TEST(DelayedScalingTest, AFixedScaleNeverMovesAndItsMisfitsAreCounted) {
  DelayedScaling s = DelayedScaling::Fixed(Format::kE4M3, 4.0f);
  EXPECT_TRUE(s.has_scale());
  EXPECT_EQ(s.scale(), 4.0f);
  EXPECT_EQ(s.scale_inv(), 0.25f);
  s.Record(500.0f);  // 2000 at scale 4: past twice 448, counted at once
  EXPECT_EQ(s.saturated_in_a_row(), 1);
  EXPECT_EQ(s.scale(), 4.0f) << "a delayed scale would have moved to 448 / 500";
  s.Record(500.0f);
  EXPECT_EQ(s.saturated_in_a_row(), 2);
  s.Record(1.0f);  // fits
  EXPECT_EQ(s.saturated_in_a_row(), 0);
  s.Record(0x1p-10f);  // 2^-8 at scale 4: below E4M3's smallest normal 2^-6
  EXPECT_EQ(s.underflow_in_a_row(), 1);
  s.Record(std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(s.non_finite(), 1);
  EXPECT_EQ(s.scale(), 4.0f);
  EXPECT_NE(s.Describe().find("e4m3 fixed scale 4"), std::string::npos) << s.Describe();
}

TEST(DelayedScalingTest, SaturationAndUnderflowCountOnlyOnceTheScaleMeansSomething) {
  DelayedScaling s(Format::kE4M3, /*window=*/2);
  EXPECT_FALSE(s.has_scale());
  s.Record(1000.0f);  // at the placeholder scale 1 it would saturate: not counted
  EXPECT_EQ(s.saturated_in_a_row(), 0);
  EXPECT_TRUE(s.has_scale());
  EXPECT_EQ(s.scale(), 0.448f);
  // The tensor shrinks 2^20-fold: at 0.448 its largest value is below E4M3's smallest normal.
  const float tiny = std::ldexp(1000.0f, -20);
  s.Record(tiny);
  EXPECT_EQ(s.underflow_in_a_row(), 1);
  EXPECT_EQ(s.scale(), 0.448f) << "1000 is still in the window of 2";
  s.Record(tiny);
  EXPECT_EQ(s.underflow_in_a_row(), 2);
  EXPECT_EQ(s.scale(), 448.0f / tiny) << "the window is now tiny, tiny";
  s.Record(tiny);
  EXPECT_EQ(s.underflow_in_a_row(), 0);
  s.Record(0.0f);  // an all-zero tensor neither underflows nor saturates
  EXPECT_EQ(s.underflow_in_a_row() + s.saturated_in_a_row(), 0);
  s.Record(3 * tiny);  // at 448 / tiny: 1344 > 2 x 448
  EXPECT_EQ(s.saturated_in_a_row(), 1);
  s.Record(9 * tiny);  // at 448 / (3 tiny): 1344 again
  EXPECT_EQ(s.saturated_in_a_row(), 2);
  EXPECT_EQ(MinNormal(Format::kE4M3), 1.0f / 64);
  EXPECT_EQ(MinNormal(Format::kE5M2), 1.0f / 16384);
}

TEST(CurrentScaleTest, TheLargestValueLandsOnTheFormatsLargestAndDegenerateAmaxesGiveOne) {
  EXPECT_EQ(CurrentScale(2.0f, Format::kE4M3), 224.0f);
  EXPECT_EQ(CurrentScale(0.5f, Format::kE5M2), 114688.0f);
  EXPECT_EQ(Round(3.0f * CurrentScale(3.0f, Format::kE4M3), Format::kE4M3), 448.0f) << "no saturation, no waste";
  EXPECT_EQ(CurrentScale(0.0f, Format::kE4M3), 1.0f);
  EXPECT_EQ(CurrentScale(std::numeric_limits<float>::infinity(), Format::kE4M3), 1.0f);
  EXPECT_EQ(CurrentScale(std::numeric_limits<float>::quiet_NaN(), Format::kE5M2), 1.0f);
  EXPECT_EQ(CurrentScale(std::numeric_limits<float>::denorm_min(), Format::kE4M3), 1.0f) << "448 / 1e-45 overflows";
}

}  // namespace
}  // namespace tierd::trainer::fp8
