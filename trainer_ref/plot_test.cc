#include "trainer_ref/plot.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <cmath>
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

// Reads the PNG back: chunk structure and CRCs, then the zlib stream to pixels (filter 0 rows).
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
  std::string raw(static_cast<size_t>(*height) * (*width * 3 + 1), '\0');
  uLongf raw_bytes = raw.size();
  EXPECT_EQ(uncompress(reinterpret_cast<Bytef*>(raw.data()), &raw_bytes, reinterpret_cast<const Bytef*>(idat.data()),
                       idat.size()),
            Z_OK);
  raw.resize(raw_bytes);
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

// Another run's loss (--compare_metrics) is drawn in grey over this run's steps only.
TEST(PlotTest, AReferenceRunIsDrawnInGrey) {
  RunCurves curves;
  for (int i = 0; i < 100; ++i) curves.loss.push_back(5.0 - i * 0.02);
  const std::string dir = std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp";
  auto grey_pixels = [&](const RunCurves& c) {
    EXPECT_TRUE(WritePlot(dir + "/ref.png", c, 320, 240).ok());
    std::ifstream in(dir + "/ref.png", std::ios::binary);
    std::stringstream bytes;
    bytes << in.rdbuf();
    int width = 0, height = 0;
    const std::vector<unsigned char> rgb = Decode(bytes.str(), &width, &height);
    int grey = 0;
    for (size_t i = 0; i < rgb.size(); i += 3) grey += rgb[i] == 150 && rgb[i + 1] == 150 && rgb[i + 2] == 150;
    return grey;
  };
  EXPECT_EQ(grey_pixels(curves), 0);
  for (int i = 0; i < 300; ++i) curves.reference.push_back(4.0 - i * 0.01);  // longer than this run
  curves.reference_name = "dense";
  EXPECT_GT(grey_pixels(curves), 200) << "the reference curve and its legend";
}

int BlackIn(const std::vector<unsigned char>& rgb, int width, int x0, int y0, int x1, int y1) {
  int n = 0;
  for (int y = y0; y < y1; ++y) {
    for (int x = x0; x < x1; ++x) {
      const unsigned char* p = &rgb[(size_t(y) * width + x) * 3];
      n += p[0] == 0 && p[1] == 0 && p[2] == 0;
    }
  }
  return n;
}

// The plot can be read: a title, tick numbers left of the loss axis and under it, axis
// labels, a legend; nothing but the frame where there is no text.
TEST(PlotTest, AxesTicksLabelsLegendAndTitleAreDrawn) {
  RunCurves curves;
  curves.title = "tierd-train, model tiny";
  curves.first_step = 101;  // a resumed run
  for (int i = 0; i < 100; ++i) curves.loss.push_back(3.0 - i * 0.01);
  curves.validation = {{50, 2.6}};
  const std::string path = std::string(std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp") + "/axes.png";
  ASSERT_TRUE(WritePlot(path, curves, 640, 400).ok());
  std::ifstream in(path, std::ios::binary);
  std::stringstream bytes;
  bytes << in.rdbuf();
  int width = 0, height = 0;
  const std::vector<unsigned char> rgb = Decode(bytes.str(), &width, &height);
  EXPECT_GT(BlackIn(rgb, width, 0, 0, width, 30), 100) << "a title";
  EXPECT_GT(BlackIn(rgb, width, 0, 50, 64, 355), 40) << "tick numbers left of the y axis";
  EXPECT_GT(BlackIn(rgb, width, 70, 360, width, 400), 60) << "tick numbers and 'step' under the x axis";
  EXPECT_GT(BlackIn(rgb, width, 70, 34, 400, 48), 60) << "the y axis label";
  EXPECT_GT(BlackIn(rgb, width, 400, 50, 620, 110), 100) << "the legend's words";
}

TEST(PlotTest, TicksAreRoundAndCoverTheRange) {
  for (auto [lo, hi] : {std::pair{1.1, 5.7}, {0.0, 1.0}, {101.0, 200.0}, {2.0, 2.0}, {1e6, 3.5e9}, {-0.3, 0.02}}) {
    const std::vector<double> ticks = NiceTicks(lo, hi, 6);
    ASSERT_GE(ticks.size(), 2u) << lo << " " << hi;
    EXPECT_LE(ticks.front(), lo);
    EXPECT_GE(ticks.back(), hi);
    EXPECT_LE(ticks.size(), 13u);
    const double spacing = ticks[1] - ticks[0];
    const double mantissa = spacing / std::pow(10.0, std::floor(std::log10(spacing)));
    EXPECT_TRUE(std::abs(mantissa - 1) < 1e-9 || std::abs(mantissa - 2) < 1e-9 || std::abs(mantissa - 5) < 1e-9)
        << spacing;
  }
  EXPECT_EQ(TickLabel(2.5, 0.5), "2.5");
  EXPECT_EQ(TickLabel(150, 50), "150");
  EXPECT_EQ(TickLabel(0.25, 0.05), "0.25");
  EXPECT_EQ(TickLabel(2e9, 1e9), "2e+09");
}

}  // namespace
}  // namespace tierd::trainer
