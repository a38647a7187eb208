// The three tiers and the extents that live in them.
#ifndef TIERD_RUNTIME_TIER_H_
#define TIERD_RUNTIME_TIER_H_

#include <cstdint>

#include "allocator/offset_allocator.h"

namespace tierd {

enum class Tier : uint8_t { kGpu = 0, kDram = 1, kNvme = 2 };
inline constexpr int kTierCount = 3;

inline const char* TierName(Tier tier) {
  switch (tier) {
    case Tier::kGpu: return "gpu";
    case Tier::kDram: return "dram";
    case Tier::kNvme: return "nvme";
  }
  return "?";
}

// A range of one tier's region, as handed out by that tier's allocator.
struct Extent {
  Tier tier = Tier::kDram;
  Allocation allocation;

  uint64_t offset() const { return allocation.offset; }
  uint64_t bytes() const { return allocation.bytes; }
};

}  // namespace tierd

#endif  // TIERD_RUNTIME_TIER_H_
