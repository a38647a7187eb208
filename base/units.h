// Byte sizes: constants, parsing ("24GiB", "512m") and formatting for messages.
#ifndef TIERD_BASE_UNITS_H_
#define TIERD_BASE_UNITS_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tierd {

inline constexpr uint64_t kKiB = uint64_t{1} << 10;
inline constexpr uint64_t kMiB = uint64_t{1} << 20;
inline constexpr uint64_t kGiB = uint64_t{1} << 30;

// "1.50 GiB", "4.00 KiB", "17 B": three significant figures, binary units.
std::string FormatBytes(uint64_t bytes);

// Bytes per second as "55.3 GB/s" (decimal, as link speeds are quoted).
std::string FormatRate(double bytes_per_second);

// Parses "4096", "64KiB", "1.5GiB", "2G", "512m" (binary multiples; case-insensitive,
// optional "B"/"iB"). InvalidArgument with the offending text otherwise.
absl::StatusOr<uint64_t> ParseBytes(absl::string_view text);

inline constexpr uint64_t AlignUp(uint64_t value, uint64_t alignment) {
  return (value + alignment - 1) / alignment * alignment;
}
inline constexpr bool IsPowerOfTwo(uint64_t value) {
  return value != 0 && (value & (value - 1)) == 0;
}

}  // namespace tierd

#endif  // TIERD_BASE_UNITS_H_
