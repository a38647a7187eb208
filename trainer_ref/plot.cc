#include "trainer_ref/plot.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>

#include <zlib.h>

#include "absl/strings/str_format.h"
#include "trainer_ref/plot_font.h"

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
  uLongf z_bytes = compressBound(raw.size());
  std::string z(z_bytes, '\0');
  if (compress2(reinterpret_cast<Bytef*>(z.data()), &z_bytes, reinterpret_cast<const Bytef*>(raw.data()), raw.size(),
                Z_BEST_COMPRESSION) != Z_OK) {
    return "";
  }
  z.resize(z_bytes);
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

std::vector<double> NiceTicks(double lo, double hi, int target) {
  if (!(hi > lo)) hi = lo + (lo == 0 ? 1 : std::abs(lo) * 0.1);
  const double raw = (hi - lo) / std::max(1, target);
  const double power = std::pow(10.0, std::floor(std::log10(raw)));
  double spacing = power;
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    spacing = m * power;
    if (spacing >= raw) break;
  }
  std::vector<double> ticks;
  for (double t = std::floor(lo / spacing) * spacing; t < hi + spacing * 0.999; t += spacing) {
    ticks.push_back(std::abs(t) < spacing * 1e-9 ? 0.0 : t);
  }
  return ticks;
}

std::string TickLabel(double value, double spacing) {
  if (std::abs(value) >= 1e6 || (value != 0 && std::abs(value) < 1e-3)) return absl::StrFormat("%.3g", value);
  const int decimals = spacing >= 1 ? 0 : std::min(6, static_cast<int>(std::ceil(-std::log10(spacing) - 1e-9)));
  return absl::StrFormat("%.*f", decimals, value);
}

namespace {

struct Color {
  unsigned char r, g, b;
};
constexpr Color kBlack{0, 0, 0}, kAxis{96, 96, 96}, kGrid{225, 225, 225};
constexpr Color kLossColor{30, 80, 220}, kValidationColor{220, 40, 40}, kTrafficColor{40, 160, 60},
    kReferenceColor{150, 150, 150};

class Canvas {
 public:
  Canvas(int width, int height) : width_(width), height_(height), rgb_(size_t(width) * height * 3, 255) {}
  void Set(int x, int y, Color c) {
    if (x < 0 || y < 0 || x >= width_ || y >= height_) return;
    unsigned char* p = &rgb_[(size_t(y) * width_ + x) * 3];
    p[0] = c.r;
    p[1] = c.g;
    p[2] = c.b;
  }
  void Line(int x0, int y0, int x1, int y1, Color c, int thickness = 1) {
    const int steps = std::max(std::abs(x1 - x0), std::abs(y1 - y0));
    for (int i = 0; i <= steps; ++i) {
      const int x = steps == 0 ? x0 : x0 + (x1 - x0) * i / steps, y = steps == 0 ? y0 : y0 + (y1 - y0) * i / steps;
      for (int t = 0; t < thickness; ++t) Set(x, y + t, c);
    }
  }
  void Box(int x0, int y0, int x1, int y1, Color c) {
    for (int y = y0; y <= y1; ++y) {
      for (int x = x0; x <= x1; ++x) Set(x, y, c);
    }
  }
  static int TextWidth(const std::string& text, int scale = 1) { return int(text.size()) * kGlyphWidth * scale; }
  // Text with its top-left corner at (x, y).
  void Text(int x, int y, const std::string& text, Color c, int scale = 1) {
    for (char ch : text) {
      if (ch >= kFirstGlyph && ch <= kLastGlyph) {
        const uint8_t* rows = kFont6x10[ch - kFirstGlyph];
        for (int r = 0; r < kGlyphHeight; ++r) {
          for (int col = 0; col < kGlyphWidth; ++col) {
            if ((rows[r] >> (kGlyphWidth - 1 - col)) & 1)
              Box(x + col * scale, y + r * scale, x + col * scale + scale - 1, y + r * scale + scale - 1, c);
          }
        }
      }
      x += kGlyphWidth * scale;
    }
  }
  const std::vector<unsigned char>& rgb() const { return rgb_; }

 private:
  int width_, height_;
  std::vector<unsigned char> rgb_;
};

// One panel: a data rectangle with its axes, grid, ticks and labels; maps values to pixels.
struct Panel {
  int left, top, right, bottom;  // the data rectangle
  double x_lo, x_hi, y_lo, y_hi;
  int X(double x) const { return left + int(std::lround((right - left) * (x - x_lo) / (x_hi - x_lo))); }
  int Y(double y) const { return bottom - int(std::lround((bottom - top) * (y - y_lo) / (y_hi - y_lo))); }
};

// Axes over the values' range with round ticks; labels in `unit` (value / divisor).
Panel DrawAxes(Canvas& canvas, int left, int top, int right, int bottom, double x_lo, double x_hi, double y_lo,
               double y_hi, double divisor, const std::string& y_label, const std::string& x_label) {
  const std::vector<double> xt = NiceTicks(x_lo, x_hi, 8), yt = NiceTicks(y_lo / divisor, y_hi / divisor, 5);
  Panel p{left, top, right, bottom, x_lo, x_hi, yt.front() * divisor, yt.back() * divisor};
  const double x_spacing = xt.size() > 1 ? xt[1] - xt[0] : 1, y_spacing = yt.size() > 1 ? yt[1] - yt[0] : 1;
  for (double t : yt) {
    const int y = p.Y(t * divisor);
    canvas.Line(left, y, right, y, kGrid);
    canvas.Line(left - 4, y, left, y, kAxis);
    const std::string label = TickLabel(t, y_spacing);
    canvas.Text(left - 7 - Canvas::TextWidth(label), y - 4, label, kBlack);
  }
  for (double t : xt) {
    if (t < x_lo - 1e-9 || t > x_hi + 1e-9) continue;
    const int x = p.X(t);
    canvas.Line(x, top, x, bottom, kGrid);
    canvas.Line(x, bottom, x, bottom + 4, kAxis);
    const std::string label = TickLabel(t, x_spacing);
    canvas.Text(x - Canvas::TextWidth(label) / 2, bottom + 7, label, kBlack);
  }
  canvas.Line(left, top, left, bottom, kAxis);
  canvas.Line(left, bottom, right, bottom, kAxis);
  canvas.Text(left, top - 14, y_label, kBlack);
  if (!x_label.empty()) canvas.Text((left + right - Canvas::TextWidth(x_label)) / 2, bottom + 20, x_label, kBlack);
  return p;
}

// A legend box in the panel's top-right corner: a sample of each series and its name.
void DrawLegend(Canvas& canvas, const Panel& p, const std::vector<std::pair<std::string, Color>>& lines,
                const std::vector<std::pair<std::string, Color>>& dots) {
  int widest = 0;
  for (const auto& [name, c] : lines) widest = std::max(widest, Canvas::TextWidth(name));
  for (const auto& [name, c] : dots) widest = std::max(widest, Canvas::TextWidth(name));
  const int rows = int(lines.size() + dots.size());
  const int x0 = p.right - widest - 46, y0 = p.top + 8, x1 = p.right - 8, y1 = y0 + rows * 16 + 8;
  canvas.Box(x0, y0, x1, y1, Color{255, 255, 255});
  canvas.Line(x0, y0, x1, y0, kAxis);
  canvas.Line(x0, y1, x1, y1, kAxis);
  canvas.Line(x0, y0, x0, y1, kAxis);
  canvas.Line(x1, y0, x1, y1, kAxis);
  int y = y0 + 8;
  for (const auto& [name, c] : lines) {
    canvas.Line(x0 + 8, y + 4, x0 + 30, y + 4, c, 2);
    canvas.Text(x0 + 38, y, name, kBlack);
    y += 16;
  }
  for (const auto& [name, c] : dots) {
    canvas.Box(x0 + 16, y + 2, x0 + 21, y + 7, c);
    canvas.Text(x0 + 38, y, name, kBlack);
    y += 16;
  }
}

void DrawSeries(Canvas& canvas, const Panel& p, const std::vector<double>& v, int64_t first_step, Color c) {
  for (size_t i = 0; i < v.size(); ++i) {
    const int x = p.X(double(first_step + int64_t(i))), y = p.Y(v[i]);
    if (i == 0) {
      canvas.Box(x, y, x + 1, y + 1, c);
    } else {
      canvas.Line(p.X(double(first_step + int64_t(i) - 1)), p.Y(v[i - 1]), x, y, c, 2);
    }
  }
}

}  // namespace

absl::Status WritePlot(const std::string& path, const RunCurves& curves, int width, int height) {
  Canvas canvas(width, height);
  canvas.Text((width - Canvas::TextWidth(curves.title, 2)) / 2, 8, curves.title, kBlack, 2);
  const bool traffic = !curves.moved_bytes.empty();
  const int left = 70, right = width - 20, top = 50, bottom_margin = 45, gap = 75;
  const int panels = height - top - bottom_margin - (traffic ? gap : 0);  // the data rectangles' heights
  const int loss_bottom = top + (traffic ? panels * 3 / 5 : panels);
  const int64_t last_step = curves.first_step + std::max<int64_t>(1, int64_t(curves.loss.size())) - 1;
  const double x_lo = double(curves.first_step), x_hi = std::max(double(last_step), x_lo + 1);
  double lo = 1e300, hi = -1e300;
  for (double l : curves.loss) lo = std::min(lo, l), hi = std::max(hi, l);
  for (const auto& [step, l] : curves.validation) lo = std::min(lo, l), hi = std::max(hi, l);
  // The reference over this run's steps only.
  const std::vector<double> reference(
      curves.reference.begin() + std::min<int64_t>(int64_t(curves.reference.size()), curves.first_step - 1),
      curves.reference.begin() + std::min<int64_t>(int64_t(curves.reference.size()), last_step));
  for (double l : reference) lo = std::min(lo, l), hi = std::max(hi, l);
  if (lo > hi) lo = 0, hi = 1;
  const Panel loss = DrawAxes(canvas, left, top, right, loss_bottom, x_lo, x_hi, lo, hi, 1.0,
                              "loss (cross-entropy, nats per token)", "step");
  if (!reference.empty()) DrawSeries(canvas, loss, reference, curves.first_step, kReferenceColor);
  DrawSeries(canvas, loss, curves.loss, curves.first_step, kLossColor);
  for (const auto& [step, l] : curves.validation) {
    const int x = loss.X(double(curves.first_step + step - 1)), y = loss.Y(l);
    canvas.Box(x - 3, y - 3, x + 3, y + 3, kValidationColor);
  }
  std::vector<std::pair<std::string, Color>> dots;
  if (!curves.validation.empty()) dots.push_back({"validation loss", kValidationColor});
  std::vector<std::pair<std::string, Color>> lines = {{"training loss", kLossColor}};
  if (!reference.empty()) lines.push_back({curves.reference_name, kReferenceColor});
  DrawLegend(canvas, loss, lines, dots);
  if (traffic) {
    const double most = *std::max_element(curves.moved_bytes.begin(), curves.moved_bytes.end());
    const double divisor = most >= 1e9 ? 1e9 : most >= 1e6 ? 1e6 : most >= 1e3 ? 1e3 : 1;
    const char* unit = divisor == 1e9 ? "GB" : divisor == 1e6 ? "MB" : divisor == 1e3 ? "kB" : "bytes";
    const Panel moved =
        DrawAxes(canvas, left, loss_bottom + gap, right, height - bottom_margin, x_lo, x_hi, 0, std::max(most, 1.0),
                 divisor, absl::StrFormat("bytes the tiers moved per step (%s)", unit), "step");
    DrawSeries(canvas, moved, curves.moved_bytes, curves.first_step, kTrafficColor);
    DrawLegend(canvas, moved, {{"DRAM <-> NVMe, GPU <-> DRAM", kTrafficColor}}, {});
  }
  const std::string png = EncodePng(canvas.rgb(), width, height);
  if (png.empty()) return absl::InternalError("compressing the plot failed");
  std::ofstream out(path, std::ios::binary);
  out.write(png.data(), static_cast<std::streamsize>(png.size()));
  if (!out.flush()) return absl::InternalError(absl::StrFormat("cannot write the plot '%s'", path));
  return absl::OkStatus();
}

}  // namespace tierd::trainer
