#include "base/units.h"

#include <gtest/gtest.h>

namespace tierd {
namespace {

TEST(UnitsTest, FormatsBinarySizes) {
  EXPECT_EQ(FormatBytes(17), "17 B");
  EXPECT_EQ(FormatBytes(4 * kKiB), "4.00 KiB");
  EXPECT_EQ(FormatBytes(3 * kGiB / 2), "1.50 GiB");
  EXPECT_EQ(FormatBytes(24 * kGiB), "24.0 GiB");
  EXPECT_EQ(FormatBytes(512 * kGiB), "512 GiB");
}

TEST(UnitsTest, ParsesSizesWithUnits) {
  EXPECT_EQ(*ParseBytes("4096"), 4096u);
  EXPECT_EQ(*ParseBytes("64KiB"), 64 * kKiB);
  EXPECT_EQ(*ParseBytes("1.5GiB"), 3 * kGiB / 2);
  EXPECT_EQ(*ParseBytes(" 2G "), 2 * kGiB);
  EXPECT_EQ(*ParseBytes("512m"), 512 * kMiB);
  EXPECT_EQ(*ParseBytes("1TB"), 1024 * kGiB);
}

TEST(UnitsTest, RejectsGarbageWithTheText) {
  for (const char* bad : {"", "GiB", "12 parsecs", "1.2.3G", "99999999999T"}) {
    auto parsed = ParseBytes(bad);
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  EXPECT_NE(ParseBytes("12 parsecs").status().message().find("parsecs"), absl::string_view::npos);
}

}  // namespace
}  // namespace tierd
