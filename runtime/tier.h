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

// An arena is one region of one tier with its own allocator: a GPU pool allocation or
// a shared-memory segment (one per session, so a client maps only its own tensors), or
// the NVMe file. Ids are never reused within a TierStore's life.
using ArenaId = uint32_t;
inline constexpr ArenaId kNoArena = 0;

// A range of one arena, as handed out by that arena's allocator.
struct Extent {
  Tier tier = Tier::kDram;
  ArenaId arena = kNoArena;
  Allocation allocation;

  uint64_t offset() const { return allocation.offset; }
  uint64_t bytes() const { return allocation.bytes; }
};

}  // namespace tierd

#endif  // TIERD_RUNTIME_TIER_H_
