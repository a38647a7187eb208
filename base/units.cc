#include "base/units.h"

#include <cctype>
#include <cmath>
#include <cstdlib>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_format.h"

namespace tierd {

std::string FormatBytes(uint64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < kKiB) return absl::StrFormat("%d B", bytes);
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024.0 && unit < 6) {
    value /= 1024.0;
    ++unit;
  }
  return absl::StrFormat(value >= 100 ? "%.0f %s" : value >= 10 ? "%.1f %s" : "%.2f %s", value,
                         kUnits[unit]);
}

std::string FormatRate(double bytes_per_second) {
  if (bytes_per_second >= 1e9) return absl::StrFormat("%.1f GB/s", bytes_per_second / 1e9);
  return absl::StrFormat("%.1f MB/s", bytes_per_second / 1e6);
}

absl::StatusOr<uint64_t> ParseBytes(absl::string_view text) {
  const std::string original(text);
  std::string s = absl::AsciiStrToLower(absl::StripAsciiWhitespace(text));
  size_t number_end = 0;
  while (number_end < s.size() && (std::isdigit(static_cast<unsigned char>(s[number_end])) ||
                                   s[number_end] == '.')) {
    ++number_end;
  }
  if (number_end == 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("'%s' is not a byte size (examples: 4096, 64KiB, 1.5GiB)", original));
  }
  char* parse_end = nullptr;
  const std::string number = s.substr(0, number_end);
  const double value = std::strtod(number.c_str(), &parse_end);
  std::string unit(absl::StripAsciiWhitespace(absl::string_view(s).substr(number_end)));
  if (!unit.empty() && unit.back() == 'b') unit.pop_back();
  if (!unit.empty() && unit.back() == 'i') unit.pop_back();
  uint64_t multiple = 1;
  if (unit.empty()) multiple = 1;
  else if (unit == "k") multiple = kKiB;
  else if (unit == "m") multiple = kMiB;
  else if (unit == "g") multiple = kGiB;
  else if (unit == "t") multiple = kGiB * 1024;
  else {
    return absl::InvalidArgumentError(absl::StrFormat(
        "'%s': unknown unit '%s' (use B, KiB, MiB, GiB or TiB)", original, unit));
  }
  const double bytes = value * static_cast<double>(multiple);
  if (*parse_end != '\0' || !std::isfinite(bytes) || bytes >= 9.2e18) {
    return absl::InvalidArgumentError(absl::StrFormat("'%s' is not a valid byte size", original));
  }
  return static_cast<uint64_t>(std::llround(bytes));
}

}  // namespace tierd
