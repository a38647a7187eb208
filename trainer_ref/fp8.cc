#include "trainer_ref/fp8.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_format.h"

namespace tierd::trainer::fp8 {
namespace {

struct Layout {
  int mantissa_bits, bias;
  float max_finite;
  bool has_infinity;
  uint8_t nan_code;  // positive
};

Layout LayoutOf(Format format) {
  return format == Format::kE4M3 ? Layout{3, 7, 448.0f, false, 0x7f} : Layout{2, 15, 57344.0f, true, 0x7f};
}

}  // namespace

float MaxFinite(Format format) { return LayoutOf(format).max_finite; }

float MinNormal(Format format) { return std::ldexp(1.0f, 1 - LayoutOf(format).bias); }

const char* FormatName(Format format) { return format == Format::kE4M3 ? "e4m3" : "e5m2"; }

uint8_t Encode(float x, Format format) {
  const Layout f = LayoutOf(format);
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  if (std::isnan(x)) return sign | f.nan_code;
  const float a = std::fabs(x);
  const int exp_bits = 7 - f.mantissa_bits;
  const uint8_t max_code =
      f.has_infinity ? static_cast<uint8_t>(((1 << exp_bits) - 2) << f.mantissa_bits | ((1 << f.mantissa_bits) - 1))
                     : static_cast<uint8_t>(0x7e);
  if (a >= f.max_finite) return sign | max_code;  // saturate (past the max, a tie rounds up, off the format)
  const int min_exponent = 1 - f.bias;            // of the normal numbers
  int exponent = 0;
  std::frexp(a, &exponent);  // a = m 2^exponent, m in [0.5, 1)
  --exponent;                // a = (1 + fraction) 2^exponent
  // Subnormals share the smallest normal exponent's spacing; the code is then the count of
  // that spacing, which also carries into the first normal code when it rounds up.
  if (a == 0 || exponent < min_exponent) {
    const float steps = std::nearbyint(std::ldexp(a, f.mantissa_bits - min_exponent));  // ties to even
    return sign | static_cast<uint8_t>(steps);
  }
  const float fraction = std::ldexp(a, -exponent) - 1.0f;  // exact
  int steps = static_cast<int>(std::nearbyint(std::ldexp(fraction, f.mantissa_bits)));
  if (steps == 1 << f.mantissa_bits) {
    steps = 0;
    ++exponent;
  }
  const int code = (exponent + f.bias) << f.mantissa_bits | steps;
  return sign | static_cast<uint8_t>(std::min<int>(code, max_code));
}

float Decode(uint8_t code, Format format) {
  const Layout f = LayoutOf(format);
  const float sign = code & 0x80 ? -1.0f : 1.0f;
  const int bits = code & 0x7f;
  const int exp_field = bits >> f.mantissa_bits, mantissa = bits & ((1 << f.mantissa_bits) - 1);
  const int exp_max = (1 << (7 - f.mantissa_bits)) - 1;
  if (f.has_infinity && exp_field == exp_max) {
    return mantissa == 0 ? sign * std::numeric_limits<float>::infinity() : std::numeric_limits<float>::quiet_NaN();
  }
  if (!f.has_infinity && bits == 0x7f) return std::numeric_limits<float>::quiet_NaN();
  if (exp_field == 0) return sign * std::ldexp(static_cast<float>(mantissa), 1 - f.bias - f.mantissa_bits);
  return sign * std::ldexp(1.0f + std::ldexp(static_cast<float>(mantissa), -f.mantissa_bits), exp_field - f.bias);
}

float CurrentScale(float amax, Format format) {
  if (!(amax > 0) || !std::isfinite(amax)) return 1.0f;
  const float scale = MaxFinite(format) / amax;
  return std::isfinite(scale) ? scale : 1.0f;
}

DelayedScaling::DelayedScaling(Format format, int window, int margin)
    : format_(format), window_(std::max(1, window)), margin_(std::max(0, margin)) {}

DelayedScaling DelayedScaling::Fixed(Format format, float scale) {
  DelayedScaling s(format, 1, 0);
  s.scale_ = scale;
  s.has_scale_ = true;
  s.fixed_ = true;
  return s;
}

void DelayedScaling::Record(float amax) {
  if (!std::isfinite(amax)) {
    ++non_finite_;
    return;  // the scale stays: one overflow must not wipe the history
  }
  // Would this step's values, at the scale they were stored with, have saturated, or has the
  // largest of them fallen below the smallest normal value?
  const float scaled = amax * scale_;
  saturated_in_a_row_ = has_scale_ && scaled > 2 * MaxFinite(format_) ? saturated_in_a_row_ + 1 : 0;
  underflow_in_a_row_ = has_scale_ && amax > 0 && scaled < MinNormal(format_) ? underflow_in_a_row_ + 1 : 0;
  history_.push_back(amax);
  if (static_cast<int>(history_.size()) > window_) history_.pop_front();
  const float most = *std::max_element(history_.begin(), history_.end());
  if (most > 0 && !fixed_) {
    scale_ = std::ldexp(MaxFinite(format_) / most, -margin_);
    has_scale_ = true;
  }
}

std::string DelayedScaling::Describe() const {
  float most = 0;
  for (float a : history_) most = std::max(most, a);
  if (fixed_) return absl::StrFormat("%s fixed scale %g (last amax %g)", FormatName(format_), scale_, most);
  return absl::StrFormat("%s scale %g (amax %g over %d step(s), window %d, margin %d)", FormatName(format_), scale_,
                         most, history_.size(), window_, margin_);
}

}  // namespace tierd::trainer::fp8
