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

namespace {

// Places ranges in `order`, each in the lowest gap (or, best_fit, the smallest gap) among the
// placed ranges it overlaps in time.
StaticAssignment Pack(uint32_t steps, const std::vector<LiveRange>& ranges, const std::vector<size_t>& order,
                      uint64_t alignment, bool best_fit) {
  StaticAssignment out;
  out.offsets.assign(ranges.size(), 0);
  std::vector<size_t> placed;
  std::vector<std::pair<uint64_t, uint64_t>> busy;  // [begin, end) of overlapping placed ranges
  auto align = [alignment](uint64_t x) { return (x + alignment - 1) & ~(alignment - 1); };
  for (size_t i : order) {
    busy.clear();
    for (size_t j : placed) {
      if (Overlaps(steps, ranges[i], ranges[j])) busy.push_back({out.offsets[j], out.offsets[j] + ranges[j].bytes});
    }
    std::sort(busy.begin(), busy.end());
    const uint64_t bytes = ranges[i].bytes;
    uint64_t offset = 0, cursor = 0, chosen = UINT64_MAX, chosen_gap = UINT64_MAX;
    for (const auto& [begin, end] : busy) {
      if (cursor + bytes <= begin) {  // a gap that fits
        if (!best_fit) break;
        if (begin - cursor < chosen_gap) {
          chosen_gap = begin - cursor;
          chosen = cursor;
        }
      }
      cursor = std::max(cursor, align(end));
    }
    offset = best_fit && chosen != UINT64_MAX ? chosen : cursor;
    if (!best_fit) {  // the first gap that fits, or after everything
      cursor = 0;
      for (const auto& [begin, end] : busy) {
        if (cursor + bytes <= begin) break;
        cursor = std::max(cursor, align(end));
      }
      offset = cursor;
    }
    out.offsets[i] = offset;
    out.size_bytes = std::max(out.size_bytes, offset + bytes);
    placed.push_back(i);
  }
  return out;
}

}  // namespace

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
  StaticAssignment best;
  bool have = false;
  // A few orders and two gap rules; the smallest packing wins. Each is O(n^2): beyond a few
  // thousand ranges only the first (greedy by size, lowest gap) runs.
  auto by = [&](auto key) {
    std::vector<size_t> order(ranges.size());
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return key(ranges[a]) > key(ranges[b]); });
    return order;
  };
  const std::vector<std::vector<size_t>> orders = {
      by([](const LiveRange& r) { return std::make_pair(r.bytes, uint64_t{r.length}); }),          // size
      by([](const LiveRange& r) { return std::make_pair(r.bytes * r.length, r.bytes); }),          // area
      by([](const LiveRange& r) { return std::make_pair(uint64_t{r.length}, r.bytes); }),          // lifetime
  };
  const bool all = ranges.size() <= 4000;
  for (const std::vector<size_t>& order : orders) {
    if (!all && &order != &orders.front()) break;
    for (bool best_fit : {false, true}) {
      if (!all && best_fit) break;
      StaticAssignment out = Pack(steps, ranges, order, alignment, best_fit);
      if (!have || out.size_bytes < best.size_bytes) best = std::move(out);
      have = true;
    }
  }
  best.peak_live_bytes = *std::max_element(live.begin(), live.end());
  return best;
}

}  // namespace tierd
