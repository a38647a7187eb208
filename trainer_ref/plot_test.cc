#include "trainer_ref/plot.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace tierd::trainer {
namespace {

uint32_t Be32(const std::string& s, size_t at) {
  return (uint32_t(uint8_t(s[at])) << 24) | (uint32_t(uint8_t(s[at + 1])) << 16) | (uint32_t(uint8_t(s[at + 2])) << 8) |
         uint32_t(uint8_t(s[at + 3]));
}

// Reads the PNG back: chunk structure and CRCs, then the stored deflate blocks to pixels.
std::vector<unsigned char> Decode(const std::string& png, int* width, int* height) {
  EXPECT_EQ(png.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
  std::string idat;
  for (size_t at = 8; at < png.size();) {
    const uint32_t len = Be32(png, at);
    const std::string type = png.substr(at + 4, 4);
    const std::string body = png.substr(at + 4, 4 + len);
    uint32_t crc = ~0u;  // recompute the IEEE CRC
    for (unsigned char c : body) {
      crc ^= c;
      for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
    }
    EXPECT_EQ(~crc, Be32(png, at + 8 + len)) << type;
    if (type == "IHDR") {
      *width = static_cast<int>(Be32(png, at + 8));
      *height = static_cast<int>(Be32(png, at + 12));
    }
    if (type == "IDAT") idat += png.substr(at + 8, len);
    at += 12 + len;
  }
  std::string raw;
  for (size_t at = 2; at + 4 < idat.size();) {  // stored blocks after the zlib header
    const bool final = idat[at] & 1;
    const size_t len = uint8_t(idat[at + 1]) | (uint8_t(idat[at + 2]) << 8);
    raw += idat.substr(at + 5, len);
    at += 5 + len;
    if (final) break;
  }
  EXPECT_EQ(raw.size(), static_cast<size_t>(*height) * (*width * 3 + 1));
  std::vector<unsigned char> rgb;
  for (int y = 0; y < *height; ++y) {
    rgb.insert(rgb.end(), raw.begin() + y * (*width * 3 + 1) + 1, raw.begin() + (y + 1) * (*width * 3 + 1));
  }
  return rgb;
}

TEST(PlotTest, APlotIsAValidPngWithTheCurvesDrawn) {
  RunCurves curves;
  for (int i = 0; i < 200; ++i) curves.loss.push_back(5.5 * std::exp(-i / 50.0) + 1);
  curves.validation = {{100, 2.0}, {200, 1.2}};
  for (int i = 0; i < 200; ++i) curves.moved_bytes.push_back(1e6 * (1 + i % 7));
  const std::string path = std::string(std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp") + "/run.png";
  ASSERT_TRUE(WritePlot(path, curves, 320, 240).ok());
  std::ifstream in(path, std::ios::binary);
  std::stringstream bytes;
  bytes << in.rdbuf();
  int width = 0, height = 0;
  const std::vector<unsigned char> rgb = Decode(bytes.str(), &width, &height);
  ASSERT_EQ(width, 320);
  ASSERT_EQ(height, 240);
  int blue = 0, red = 0, green = 0;
  for (size_t i = 0; i < rgb.size(); i += 3) {
    blue += rgb[i] == 30 && rgb[i + 1] == 80 && rgb[i + 2] == 220;
    red += rgb[i] == 220 && rgb[i + 1] == 40 && rgb[i + 2] == 40;
    green += rgb[i] == 40 && rgb[i + 1] == 160 && rgb[i + 2] == 60;
  }
  EXPECT_GT(blue, 200) << "the loss curve";
  EXPECT_GE(red, 25) << "two validation dots";
  EXPECT_GT(green, 200) << "the traffic panel";
  EXPECT_FALSE(WritePlot("/nonexistent/dir/run.png", curves).ok());
}

}  // namespace
}  // namespace tierd::trainer
