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
  int priority = 0;       // its eviction priority (PriorityRule): a lower one goes first
};

// The victim among `candidates` (its index; nullopt when there is none): the lowest eviction
// priority first; among those, `ranked` (the planner knows next uses, MIN): the furthest next
// use, clean first on ties; unranked: clean copies first, then the least recently used. Ties
// keep the earliest candidate.
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

// A fragmented arena (the free bytes suffice, no free block does): how to join free space by
// moving copies within the arena instead of writing anything to the tier below. `held`: the
// arena's copies by offset (`evictable` read as "idle": free to move). A window of up to
// kMaxJoinMoves idle copies side by side whose range, with the gaps on either side, holds
// `bytes` has its copies moved into the gaps outside it (largest first, each into the
// smallest gap that holds it); with `may_slide` (DRAM: a memmove, the ranges may overlap) a
// window of up to twice as many may instead slide together to its low end, joining the gaps
// inside it. The window that moves the fewest bytes wins. nullopt when no window joins enough.
inline constexpr size_t kMaxJoinMoves = 4;
struct JoinPlan {
  bool slide = false;
  size_t first = 0, last = 0;  // slide: the window's copies [first, last], slid from its low end
  struct Move {
    size_t copy;  // its index in `held`
    uint64_t to;  // its new offset
  };
  std::vector<Move> moves;  // not sliding: each copy's new place
  uint64_t begin = 0;       // not sliding: where the joined block starts
};
std::optional<JoinPlan> PlanJoin(const std::vector<HeldRange>& held, uint64_t region, uint64_t bytes, bool may_slide);

}  // namespace tierd

#endif  // TIERD_RUNTIME_ROOM_POLICY_H_
