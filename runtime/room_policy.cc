#include "runtime/room_policy.h"

#include <algorithm>
#include <cstdint>
#include <map>

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
    const bool better = c.priority != v.priority ? c.priority < v.priority
                        : ranked ? c.next_use > v.next_use || (c.next_use == v.next_use && c.clean && !v.clean)
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

std::optional<JoinPlan> PlanJoin(const std::vector<HeldRange>& held, uint64_t region, uint64_t bytes, bool may_slide) {
  // Gap k lies before held[k] (k == held.size(): after the last copy).
  auto gap_begin = [&](size_t k) { return k == 0 ? uint64_t{0} : held[k - 1].end; };
  auto gap_end = [&](size_t k) { return k < held.size() ? held[k].begin : region; };
  std::optional<JoinPlan> best;
  uint64_t best_moved = UINT64_MAX;
  for (size_t i = 0; i < held.size(); ++i) {
    for (size_t j = i; j < held.size() && j < i + 2 * kMaxJoinMoves && held[j].evictable; ++j) {
      const uint64_t span = gap_end(j + 1) - gap_begin(i);
      if (span < bytes) continue;  // widen the window
      uint64_t moved = 0;
      std::vector<size_t> copies;
      for (size_t k = i; k <= j; ++k) {
        copies.push_back(k);
        moved += held[k].end - held[k].begin;
      }
      if (moved >= best_moved) break;
      if (may_slide && span - moved >= bytes) {
        best = JoinPlan{};
        best->slide = true;
        best->first = i;
        best->last = j;
        best_moved = moved;
        break;
      }
      if (j >= i + kMaxJoinMoves) continue;  // (wider windows only slide)
      std::sort(copies.begin(), copies.end(),
                [&](size_t a, size_t b) { return held[a].end - held[a].begin > held[b].end - held[b].begin; });
      std::map<size_t, uint64_t> next_free;  // gaps outside the window used so far: where the next copy goes
      std::vector<JoinPlan::Move> moves;
      for (size_t c : copies) {
        const uint64_t size = held[c].end - held[c].begin;
        size_t pick = SIZE_MAX;
        uint64_t pick_room = UINT64_MAX;
        for (size_t k = 0; k <= held.size(); ++k) {
          if (k >= i && k <= j + 1) continue;  // inside the window
          const auto used = next_free.find(k);
          const uint64_t from = used == next_free.end() ? gap_begin(k) : used->second;
          const uint64_t room = gap_end(k) - from;
          if (room >= size && room < pick_room) {
            pick = k;
            pick_room = room;
          }
        }
        if (pick == SIZE_MAX) break;
        const auto used = next_free.find(pick);
        const uint64_t to = used == next_free.end() ? gap_begin(pick) : used->second;
        moves.push_back({c, to});
        next_free[pick] = to + size;
      }
      if (moves.size() == copies.size()) {
        best = JoinPlan{};
        best->moves = std::move(moves);
        best->begin = gap_begin(i);
        best_moved = moved;
        break;  // a wider window from i only moves more
      }
      if (!may_slide) break;  // (where copies may slide, a wider window still may)
    }
  }
  return best;
}

}  // namespace tierd
