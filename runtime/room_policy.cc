#include "runtime/room_policy.h"

#include <algorithm>

namespace tierd {

std::optional<size_t> PickVictim(const std::vector<RoomCandidate>& candidates, bool ranked) {
  std::optional<size_t> victim;
  for (size_t k = 0; k < candidates.size(); ++k) {
    const RoomCandidate& c = candidates[k];
    if (!victim) {
      victim = k;
      continue;
    }
    const RoomCandidate& v = candidates[*victim];
    const bool better = ranked ? c.next_use > v.next_use || (c.next_use == v.next_use && c.clean && !v.clean)
                               : (c.clean && !v.clean) || (c.clean == v.clean && c.last_use < v.last_use);
    if (better) victim = k;
  }
  return victim;
}

std::optional<size_t> PickForBlock(const std::vector<HeldRange>& held, uint64_t region, uint64_t bytes) {
  // The run i..j leaves free, when evicted, from the end of copy i-1 to the start of copy j+1.
  auto from = [&](size_t i) { return i == 0 ? uint64_t{0} : held[i - 1].end; };
  auto to = [&](size_t j) { return j + 1 < held.size() ? held[j + 1].begin : region; };
  bool found = false;
  int64_t best_soonest = 0;
  uint64_t best_dirty = 0;
  size_t best_i = 0, best_j = 0;
  for (size_t i = 0; i < held.size(); ++i) {
    int64_t soonest = INT64_MAX;
    uint64_t dirty = 0;
    for (size_t j = i; j < held.size() && held[j].evictable; ++j) {  // the shortest run from i that holds it
      soonest = std::min(soonest, held[j].next_use);
      if (!held[j].clean) dirty += held[j].end - held[j].begin;
      if (found && soonest < best_soonest) break;  // only worse from here
      if (to(j) - from(i) < bytes) continue;
      if (!found || soonest > best_soonest || (soonest == best_soonest && dirty < best_dirty)) {
        found = true;
        best_soonest = soonest;
        best_dirty = dirty;
        best_i = i;
        best_j = j;
      }
      break;
    }
  }
  if (!found) return std::nullopt;
  size_t victim = best_i;  // the run's furthest-used copy, clean first on ties
  for (size_t k = best_i; k <= best_j; ++k) {
    if (held[k].next_use > held[victim].next_use ||
        (held[k].next_use == held[victim].next_use && held[k].clean && !held[victim].clean)) {
      victim = k;
    }
  }
  return victim;
}

}  // namespace tierd
