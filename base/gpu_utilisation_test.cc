#include "base/gpu_utilisation.h"

#include <gtest/gtest.h>

namespace tierd {
namespace {

// The mean covers only the samples whose periods ended after the last one seen, in any order,
// and moves the mark to the newest; with none newer it says nothing and keeps the mark.
TEST(GpuUtilisationTest, TheMeanCoversOnlyTheSamplesSinceTheLastOneSeen) {
  uint64_t since = 1000;
  std::vector<UtilisationSample> samples = {{900, 10}, {1200, 90}, {1000, 50}, {1100, 70}};
  auto mean = MeanUtilisationSince(samples, &since);
  ASSERT_TRUE(mean.has_value());
  EXPECT_DOUBLE_EQ(*mean, 80.0);  // 90 and 70; 900 and 1000 were seen before
  EXPECT_EQ(since, 1200u);
  EXPECT_FALSE(MeanUtilisationSince(samples, &since).has_value()) << "nothing newer than 1200";
  EXPECT_EQ(since, 1200u);
  EXPECT_FALSE(MeanUtilisationSince({}, &since).has_value());
  samples.push_back({1400, 0});
  mean = MeanUtilisationSince(samples, &since);
  ASSERT_TRUE(mean.has_value());
  EXPECT_DOUBLE_EQ(*mean, 0.0);
  EXPECT_EQ(since, 1400u);
}

// The recent mean: the samples within the window of the newest, the newest itself always.
TEST(GpuUtilisationTest, TheRecentMeanIsOverTheWindowBeforeTheNewestSample) {
  const std::vector<UtilisationSample> samples = {{1'000'000, 10}, {1'900'000, 50}, {2'000'000, 90}, {1'500'000, 30}};
  auto last_second = MeanUtilisationWithin(samples, 1'000'000);
  ASSERT_TRUE(last_second.has_value());
  EXPECT_DOUBLE_EQ(*last_second, 45.0);  // all four: 1.0 s is exactly a second before 2.0 s
  auto last_half = MeanUtilisationWithin(samples, 500'000);
  ASSERT_TRUE(last_half.has_value());
  EXPECT_DOUBLE_EQ(*last_half, 170.0 / 3);  // 1.5, 1.9, 2.0 s
  auto newest = MeanUtilisationWithin(samples, 0);
  ASSERT_TRUE(newest.has_value());
  EXPECT_DOUBLE_EQ(*newest, 90.0);
  EXPECT_FALSE(MeanUtilisationWithin({}, 1'000'000).has_value());
}

// No GPU at this bus id: without NVML (no driver) or with it, UNAVAILABLE and the reason.
TEST(GpuUtilisationTest, AGpuNvmlCannotSeeIsUnavailableWithTheReason) {
  auto util = GpuUtilisation::Open("0000:FE:1F.7");
  ASSERT_FALSE(util.ok());
  EXPECT_EQ(util.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(util.status().message().find("NVML"), std::string::npos) << util.status();
}

}  // namespace
}  // namespace tierd
