#include "base/crc32c.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

namespace tierd {
namespace {

TEST(Crc32cTest, MatchesTheStandardCheckValue) {
  const char* digits = "123456789";
  EXPECT_EQ(Crc32c(0, digits, 9), 0xE3069283u);
  EXPECT_EQ(Crc32cPortable(0, digits, 9), 0xE3069283u);
}

TEST(Crc32cTest, FastPathEqualsTheTableOnRandomData) {
  std::mt19937 rng(7);
  for (size_t length : {0u, 1u, 7u, 8u, 9u, 4095u, 4096u, 1u << 20}) {
    std::vector<uint8_t> data(length);
    for (auto& byte : data) byte = static_cast<uint8_t>(rng());
    EXPECT_EQ(Crc32c(0, data.data(), length), Crc32cPortable(0, data.data(), length)) << length;
    // Extending in two parts equals one pass.
    const size_t half = length / 3;
    EXPECT_EQ(Crc32c(Crc32c(0, data.data(), half), data.data() + half, length - half),
              Crc32c(0, data.data(), length));
  }
}

TEST(Crc32cTest, DetectsASingleFlippedBit) {
  std::vector<uint8_t> data(4096, 0x5A);
  const uint32_t before = Crc32c(0, data.data(), data.size());
  data[1234] ^= 0x10;
  EXPECT_NE(Crc32c(0, data.data(), data.size()), before);
}

}  // namespace
}  // namespace tierd
