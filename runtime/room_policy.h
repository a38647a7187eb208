// Which copy goes when a tier must make room: the policy, apart from the LeaseTable that
// keeps the records and moves the bytes. Pure functions over the candidates the table lists
// (its own tensors, in its order), tested alone (room_policy_test.cc).
#ifndef TIERD_RUNTIME_ROOM_POLICY_H_
#define TIERD_RUNTIME_ROOM_POLICY_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

namespace tierd {

// A copy that may go.
struct RoomCandidate {
  bool clean = false;     // another tier holds its bytes, or it holds none: dropping it costs nothing
  int64_t next_use = 0;   // ops to its next use (the planner's), when ranked
  uint64_t last_use = 0;  // the session's tick of its last acquire or release
};

// The victim among `candidates` (its index; nullopt when there is none). `ranked` (the
// planner knows next uses, MIN): the furthest next use, clean first on ties. Unranked: clean
// copies first, then the least recently used. Ties keep the earliest candidate.
std::optional<size_t> PickVictim(const std::vector<RoomCandidate>& candidates, bool ranked);

// A copy in an arena, by offset (the arena's copies sorted by `begin`).
struct HeldRange {
  uint64_t begin = 0, end = 0;
  bool evictable = false;  // not acquired there, pinned there, in flight or refused
  bool clean = false;
  int64_t next_use = 0;  // ops to its next use (the planner's; any value when not evictable)
};

// Room for `bytes` as one block in an arena of `region` bytes whose free bytes suffice but
// no free block does: of the runs of evictable copies side by side whose range, with the free
// space on either side, holds `bytes`, the one whose soonest next use is furthest (then the
// fewest dirty bytes) loses its furthest-used copy (clean first on ties). The index of that
// copy in `held`; nullopt when no run holds `bytes`. Called again after that copy went, it
// goes on with what is left of the run.
std::optional<size_t> PickForBlock(const std::vector<HeldRange>& held, uint64_t region, uint64_t bytes);

}  // namespace tierd

#endif  // TIERD_RUNTIME_ROOM_POLICY_H_
