#include "allocator/static_assigner.h"

#include <algorithm>
#include <numeric>

#include "absl/strings/str_format.h"

namespace tierd {

bool Overlaps(uint32_t steps, const LiveRange& a, const LiveRange& b) {
  // Unroll the cycle: b's arc and its copy one lap later, against a's arc.
  auto linear = [](uint64_t s1, uint64_t l1, uint64_t s2, uint64_t l2) { return s1 < s2 + l2 && s2 < s1 + l1; };
  return linear(a.first, a.length, b.first, b.length) || linear(a.first, a.length, b.first + steps, b.length) ||
         linear(a.first + steps, a.length, b.first, b.length);
}

absl::StatusOr<StaticAssignment> AssignStaticOffsets(uint32_t steps, const std::vector<LiveRange>& ranges,
                                                     uint64_t alignment) {
  if (steps == 0) return absl::InvalidArgumentError("a cycle of 0 steps");
  if (alignment == 0 || (alignment & (alignment - 1)) != 0) {
    return absl::InvalidArgumentError(absl::StrFormat("alignment %d is not a power of two", alignment));
  }
  std::vector<uint64_t> live(steps, 0);
  for (size_t i = 0; i < ranges.size(); ++i) {
    const LiveRange& r = ranges[i];
    if (r.length == 0 || r.length > steps || r.first >= steps || r.bytes == 0) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "range %d (first %d, length %d, %d bytes) does not fit a cycle of %d steps", i, r.first, r.length, r.bytes,
          steps));
    }
    for (uint32_t k = 0; k < r.length; ++k) live[(r.first + k) % steps] += r.bytes;
  }
  StaticAssignment out;
  out.offsets.assign(ranges.size(), 0);
  out.peak_live_bytes = *std::max_element(live.begin(), live.end());
  std::vector<size_t> order(ranges.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return ranges[a].bytes != ranges[b].bytes ? ranges[a].bytes > ranges[b].bytes : ranges[a].length > ranges[b].length;
  });
  std::vector<size_t> placed;
  std::vector<std::pair<uint64_t, uint64_t>> busy;  // [begin, end) of overlapping placed ranges
  for (size_t i : order) {
    busy.clear();
    for (size_t j : placed) {
      if (Overlaps(steps, ranges[i], ranges[j])) busy.push_back({out.offsets[j], out.offsets[j] + ranges[j].bytes});
    }
    std::sort(busy.begin(), busy.end());
    uint64_t offset = 0;
    for (const auto& [begin, end] : busy) {
      if (offset + ranges[i].bytes <= begin) break;  // fits in the gap before this one
      offset = std::max(offset, (end + alignment - 1) & ~(alignment - 1));
    }
    out.offsets[i] = offset;
    out.size_bytes = std::max(out.size_bytes, offset + ranges[i].bytes);
    placed.push_back(i);
  }
  return out;
}

}  // namespace tierd
