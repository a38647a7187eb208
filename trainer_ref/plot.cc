#include "trainer_ref/plot.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>

#include "absl/strings/str_format.h"

namespace tierd::trainer {
namespace {

uint32_t Crc32(const unsigned char* p, size_t n, uint32_t crc = 0) {  // PNG's (IEEE) CRC
  crc = ~crc;
  for (size_t i = 0; i < n; ++i) {
    crc ^= p[i];
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
  }
  return ~crc;
}

void Be32(std::string& out, uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) out.push_back(static_cast<char>((v >> s) & 0xff));
}

void Chunk(std::string& out, const char* type, const std::string& data) {
  Be32(out, static_cast<uint32_t>(data.size()));
  std::string body(type, 4);
  body += data;
  out += body;
  Be32(out, Crc32(reinterpret_cast<const unsigned char*>(body.data()), body.size()));
}

}  // namespace

std::string EncodePng(const std::vector<unsigned char>& rgb, int width, int height) {
  std::string raw;  // each row: filter 0, then RGB
  for (int y = 0; y < height; ++y) {
    raw.push_back(0);
    raw.append(reinterpret_cast<const char*>(rgb.data()) + static_cast<size_t>(y) * width * 3,
               static_cast<size_t>(width) * 3);
  }
  std::string z = "\x78\x01";  // zlib header: deflate, no dictionary
  uint32_t a = 1, b = 0;       // Adler-32
  for (unsigned char c : raw) {
    a = (a + c) % 65521;
    b = (b + a) % 65521;
  }
  for (size_t at = 0; at < raw.size() || at == 0; at += 65535) {
    const size_t len = std::min<size_t>(65535, raw.size() - at);
    z.push_back(at + len >= raw.size() ? 1 : 0);  // BFINAL, BTYPE 00 (stored)
    z.push_back(static_cast<char>(len & 0xff));
    z.push_back(static_cast<char>(len >> 8));
    z.push_back(static_cast<char>(~len & 0xff));
    z.push_back(static_cast<char>((~len >> 8) & 0xff));
    z.append(raw, at, len);
    if (raw.empty()) break;
  }
  Be32(z, (b << 16) | a);
  std::string png = "\x89PNG\r\n\x1a\n";
  std::string ihdr;
  Be32(ihdr, width);
  Be32(ihdr, height);
  ihdr += std::string("\x08\x02\x00\x00\x00", 5);  // 8-bit RGB, no interlace
  Chunk(png, "IHDR", ihdr);
  Chunk(png, "IDAT", z);
  Chunk(png, "IEND", "");
  return png;
}

absl::Status WritePlot(const std::string& path, const RunCurves& curves, int width, int height) {
  std::vector<unsigned char> rgb(static_cast<size_t>(width) * height * 3, 255);
  auto set = [&](int x, int y, unsigned char r, unsigned char g, unsigned char b) {
    if (x < 0 || y < 0 || x >= width || y >= height) return;
    unsigned char* p = &rgb[(static_cast<size_t>(y) * width + x) * 3];
    p[0] = r;
    p[1] = g;
    p[2] = b;
  };
  const bool traffic = !curves.moved_bytes.empty();
  const int margin = 30, top_h = traffic ? height * 2 / 3 : height;
  // Panels: [margin, width - margin] x [margin, top_h - margin] and below.
  auto frame = [&](int y0, int y1) {
    for (int x = margin; x <= width - margin; ++x) set(x, y1, 128, 128, 128);
    for (int y = y0; y <= y1; ++y) set(margin, y, 128, 128, 128);
  };
  auto line = [&](int x0, int y0, int x1, int y1, unsigned char r, unsigned char g, unsigned char b) {
    const int steps = std::max(std::abs(x1 - x0), std::abs(y1 - y0)) + 1;
    for (int i = 0; i <= steps; ++i) {
      set(x0 + (x1 - x0) * i / steps, y0 + (y1 - y0) * i / steps, r, g, b);
    }
  };
  auto curve = [&](const std::vector<double>& v, int y0, int y1, unsigned char r, unsigned char g, unsigned char b) {
    if (v.empty()) return;
    const double lo = std::min(0.0, *std::min_element(v.begin(), v.end()));
    const double hi = std::max(lo + 1e-12, *std::max_element(v.begin(), v.end()));
    auto px = [&](size_t i) { return margin + static_cast<int>((width - 2 * margin) * (i + 0.5) / v.size()); };
    auto py = [&](double x) { return y1 - static_cast<int>((y1 - y0) * (x - lo) / (hi - lo)); };
    for (size_t i = 1; i < v.size(); ++i) line(px(i - 1), py(v[i - 1]), px(i), py(v[i]), r, g, b);
    if (v.size() == 1) set(px(0), py(v[0]), r, g, b);
  };
  frame(margin, top_h - margin);
  curve(curves.loss, margin, top_h - margin, 30, 80, 220);
  if (!curves.loss.empty()) {
    const double hi = std::max(1e-12, *std::max_element(curves.loss.begin(), curves.loss.end()));
    for (const auto& [step, loss] : curves.validation) {
      const int x = margin + static_cast<int>((width - 2 * margin) * (step - 0.5) / curves.loss.size());
      const int y = (top_h - margin) - static_cast<int>((top_h - 2 * margin) * std::min(loss, hi) / hi);
      for (int dx = -2; dx <= 2; ++dx) {
        for (int dy = -2; dy <= 2; ++dy) set(x + dx, y + dy, 220, 40, 40);
      }
    }
  }
  if (traffic) {
    frame(top_h + margin / 2, height - margin);
    curve(curves.moved_bytes, top_h + margin / 2, height - margin, 40, 160, 60);
  }
  std::ofstream out(path, std::ios::binary);
  const std::string png = EncodePng(rgb, width, height);
  out.write(png.data(), static_cast<std::streamsize>(png.size()));
  if (!out.flush()) return absl::InternalError(absl::StrFormat("cannot write the plot '%s'", path));
  return absl::OkStatus();
}

}  // namespace tierd::trainer
