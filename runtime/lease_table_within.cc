// LeaseTable's moves within a tier: joining free space in a fragmented arena (copies moved
// within the GPU, or within and slid down in DRAM), a copy moved to its layout offset when
// acquired, and settling the GPU into a plan's layout.
#include <cstring>
#include <optional>
#include <vector>

#include "absl/strings/str_format.h"
#include "base/check.h"
#include "runtime/lease_table.h"
#include "runtime/lease_table_internal.h"
#include "runtime/room_policy.h"

namespace tierd {

bool LeaseTable::Busy(Session& s, TensorId id) {
  auto it = s.tensors.find(id);
  return it != s.tensors.end() && it->second->busy > 0;
}

absl::StatusOr<uint64_t> LeaseTable::Relocate(Session& s, Tier tier, uint64_t bytes, bool unlocked) {
  const ArenaId arena = s.ArenaOf(tier);
  const AllocatorStats stats = store_.ArenaStats(arena);
  if (stats.free_bytes < bytes) return absl::ResourceExhaustedError("not fragmented: too little free");
  // The arena's copies by offset and the gaps between them. A move in flight may hold a
  // range no copy records yet: AllocateAt checks every range before it is taken.
  const std::vector<HeldCopy> held = CopiesByOffset(s, tier);
  std::vector<HeldRange> ranges;
  ranges.reserve(held.size());
  for (const HeldCopy& h : held) {
    const Tensor& t = *h.tensor;
    // Idle: not in use, and on the GPU not touched by queued kernels either (moving it would
    // wait for them with the session's lock held).
    const bool settled = tier != Tier::kGpu || t.gpu_fence == nullptr || t.gpu_fence->Passed();
    ranges.push_back({h.begin, h.end, t.busy == 0 && t.acquired == 0 && !t.pinned.has_value() && settled});
  }
  const std::optional<JoinPlan> join = PlanJoin(ranges, stats.region_bytes, bytes, /*may_slide=*/tier == Tier::kDram);
  if (!join) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("no move of up to %d idle copies side by side joins enough free space", kMaxJoinMoves));
  }
  if (join->slide) {
    uint64_t cursor = join->first == 0 ? 0 : held[join->first - 1].end;
    for (size_t k = join->first; k <= join->last; ++k) {
      Tensor& t = *held[k].tensor;
      if (held[k].begin != cursor) {
        if (absl::Status slid = SlideWithin(s, t, tier, cursor); !slid.ok()) return slid;
      }
      cursor += held[k].end - held[k].begin;
    }
    return cursor;  // the joined block: from the last slid copy's end to the window's end
  }
  if (tier == Tier::kGpu) {
    // The join's copies move together (one wait beside the client's kernels, not one each).
    std::vector<WithinMove> batch;
    for (const JoinPlan::Move& m : join->moves) {
      Tensor* t = held[m.copy].tensor;
      auto to = store_.AllocateAt(arena, m.to, t->bytes);
      if (!to.ok()) {  // taken by a move in flight: nothing moves
        for (const WithinMove& b : batch) store_.Free(b.to).IgnoreError();
        return to.status();
      }
      batch.push_back({t, *to});
    }
    if (absl::Status moved = MoveWithinGpu(s, batch, unlocked); !moved.ok()) return moved;
    return join->begin;
  }
  for (const JoinPlan::Move& m : join->moves) {
    Tensor& t = *held[m.copy].tensor;
    auto to = store_.AllocateAt(arena, m.to, t.bytes);
    if (!to.ok()) return to.status();  // taken by a move in flight: the moves so far stand
    if (absl::Status moved = MoveWithin(s, t, tier, *to); !moved.ok()) return moved;
  }
  return join->begin;  // the joined block's start
}

absl::Status LeaseTable::SlideWithin([[maybe_unused]] Session& s, Tensor& t, Tier tier, uint64_t to_offset) {
  TIERD_CHECK(tier == Tier::kDram);
  const Extent from = *t.copies[static_cast<int>(tier)];
  // The new range overlaps the old one: free it first, take the new one, then move the
  // bytes. The new range can be taken by a move in flight (its destination is no copy's
  // yet, so the gap looked free): then the copy takes its old range back, which nobody else
  // can have taken (only this session allocates in its arena, under the lock held here).
  TIERD_CHECK_OK(store_.Free(from));
  auto to = store_.AllocateAt(from.arena, to_offset, t.bytes);
  if (!to.ok()) {
    auto back = store_.AllocateAt(from.arena, from.offset(), t.bytes);
    TIERD_CHECK_OK(back.status());
    t.copies[static_cast<int>(tier)] = *back;
    return to.status();
  }
  std::memmove(store_.Address(*to), store_.Address(from), t.bytes);
  t.copies[static_cast<int>(tier)] = *to;
  absl::MutexLock stats_lock(&stats_mutex_);
  ++stats_.relocations;
  return absl::OkStatus();
}

absl::Status LeaseTable::MoveWithin(Session& s, Tensor& t, Tier tier, const Extent& to, bool unlocked) {
  if (tier == Tier::kGpu) return MoveWithinGpu(s, {{&t, to}}, unlocked);
  const Extent from = *t.copies[static_cast<int>(tier)];
  std::memcpy(store_.Address(to), store_.Address(from), t.bytes);
  t.copies[static_cast<int>(tier)] = to;
  if (absl::Status freed = store_.Free(from); !freed.ok()) return freed;
  absl::MutexLock stats_lock(&stats_mutex_);
  ++stats_.relocations;
  return absl::OkStatus();
}

absl::Status LeaseTable::MoveWithinGpu(Session& s, const std::vector<WithinMove>& moves, bool unlocked,
                                       size_t* moved_count) {
  constexpr int kGpu = static_cast<int>(Tier::kGpu);
  for (const WithinMove& m : moves) ++m.tensor->busy;
  // The client's kernels may still touch the old ranges: done first.
  std::vector<absl::Status> status(moves.size());
  for (size_t i = 0; i < moves.size(); ++i) {
    Tensor& t = *moves[i].tensor;
    status[i] = unlocked ? SettleGpuCopyUnlocked(s, t) : SettleGpuCopy(t);
    if (!status[i].ok()) {
      status[i] = absl::Status(status[i].code(), absl::StrFormat("the client's GPU work on '%s' failed: %s",
                                                                 t.spec.name, status[i].message()));
    }
  }
  // Then the copies on the device, without the host links, all submitted at once. Beside a
  // busy trainer such a copy waits for a time slice (about 2.4 ms on an H100, whatever its
  // size): `unlocked`, the session's other requests go on meanwhile, as during a copy between
  // tiers (the tensors are busy: hands off; both ranges of each are ours).
  std::vector<Mover::Request> requests;
  std::vector<size_t> submitted;
  for (size_t i = 0; i < moves.size(); ++i) {
    if (!status[i].ok()) continue;
    requests.push_back({*moves[i].tensor->copies[kGpu], moves[i].to, moves[i].tensor->bytes});
    submitted.push_back(i);
  }
  if (!requests.empty()) {
    if (unlocked) {
      ++s.moving;
      NoteHeld(s);
      s.mutex.Unlock();
    }
    const std::vector<absl::Status> copied = mover_.MoveAllAndWait(requests);
    if (unlocked) {
      s.mutex.Lock();
      s.held_since = clock_.NowNanos();
      --s.moving;
      ++s.moves_done;
    }
    for (size_t k = 0; k < submitted.size(); ++k) {
      if (copied[k].ok()) continue;
      const size_t i = submitted[k];
      status[i] = absl::Status(copied[k].code(), absl::StrFormat("moving '%s' within the GPU: %s",
                                                                 moves[i].tensor->spec.name, copied[k].message()));
    }
  }
  absl::Status first;
  for (size_t i = 0; i < moves.size(); ++i) {
    Tensor& t = *moves[i].tensor;
    --t.busy;
    if (!status[i].ok()) {  // stays where it was
      store_.Free(moves[i].to).IgnoreError();
      if (first.ok()) first = status[i];
      continue;
    }
    const Extent from = *t.copies[kGpu];
    t.copies[kGpu] = moves[i].to;
    if (absl::Status freed = store_.Free(from); !freed.ok() && first.ok()) first = freed;
    if (moved_count != nullptr) ++*moved_count;
    absl::MutexLock stats_lock(&stats_mutex_);
    ++stats_.gpu_relocations;
  }
  return first;
}

absl::Status LeaseTable::Rehome(Session& s, Tensor& t) {
  if (s.planner == nullptr || !t.Has(Tier::kGpu) || t.acquired > 0 || t.busy > 0) return absl::OkStatus();
  // The client's kernels on it still running: not worth blocking its acquire for.
  if (t.gpu_fence != nullptr && !t.gpu_fence->Passed()) return absl::OkStatus();
  const std::optional<uint64_t> at = s.planner->LayoutOffset(t.id, Tier::kGpu);
  if (!at || *at == t.copies[static_cast<int>(Tier::kGpu)]->offset()) return absl::OkStatus();
  auto to = store_.AllocateAt(s.ArenaOf(Tier::kGpu), *at, t.bytes);
  if (!to.ok()) return absl::OkStatus();  // still taken (or overlapping its own range): it stays
  if (absl::Status moved = MoveWithin(s, t, Tier::kGpu, *to, /*unlocked=*/true); !moved.ok()) return moved;
  absl::MutexLock stats_lock(&stats_mutex_);
  ++stats_.rehomed;
  return absl::OkStatus();
}

absl::StatusOr<LeaseTable::Settled> LeaseTable::SettleIntoLayout(SessionId session_id) {
  auto session = GetSession(session_id);
  if (!session.ok()) return session.status();
  Session& s = **session;
  Settled settled;
  struct Misplaced {
    TensorId id;
    uint64_t at;  // its layout offset
  };
  std::vector<std::pair<TensorId, uint64_t>> blocked;  // laid out where another copy is; its bytes
  {
    absl::MutexLock lock(&s.mutex);
    if (s.planner == nullptr || s.ArenaOf(Tier::kGpu) == kNoArena) return settled;
    // Idle, on the GPU, and not where the layout has it: the tensor, or null.
    auto misplaced_now = [&](const Misplaced& m) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mutex) -> Tensor* {
      auto it = s.tensors.find(m.id);
      if (it == s.tensors.end()) return nullptr;
      Tensor& t = *it->second;
      if (!t.Has(Tier::kGpu) || t.acquired > 0 || t.busy > 0 || t.pinned.has_value()) return nullptr;
      return t.copies[static_cast<int>(Tier::kGpu)]->offset() != m.at ? &t : nullptr;
    };
    std::vector<Misplaced> misplaced;
    for (const auto& [id, t] : s.tensors) {
      const std::optional<uint64_t> at = s.planner->LayoutOffset(t->id, Tier::kGpu);
      if (at && misplaced_now({id, *at}) != nullptr) misplaced.push_back({id, *at});
    }
    // A move frees a range another one may be laid out in: again until none moves. Each move
    // lets the lock go while its bytes travel, so every copy is looked at anew before its own.
    for (bool progress = true; progress && !misplaced.empty();) {
      progress = false;
      // This pass: every copy whose layout range is free now, their copies submitted together.
      std::vector<WithinMove> batch;
      for (auto it = misplaced.begin(); it != misplaced.end();) {
        Tensor* t = misplaced_now(*it);
        if (t == nullptr) {  // acquired, moved or gone meanwhile: the client has it in hand
          it = misplaced.erase(it);
          continue;
        }
        auto to = store_.AllocateAt(s.ArenaOf(Tier::kGpu), it->at, t->bytes);
        if (!to.ok()) {
          ++it;
          continue;
        }
        batch.push_back({t, *to});
        it = misplaced.erase(it);
      }
      size_t moved = 0;
      const absl::Status status = MoveWithinGpu(s, batch, /*unlocked=*/true, &moved);
      settled.moved += moved;
      {
        absl::MutexLock stats_lock(&stats_mutex_);
        stats_.settle_moves += moved;
      }
      if (!status.ok()) return status;
      progress = !batch.empty();
    }
    for (const Misplaced& m : misplaced) {
      if (Tensor* t = misplaced_now(m)) blocked.emplace_back(m.id, t->bytes);
    }
  }
  for (const auto& [id, bytes] : blocked) {
    const absl::Status demoted = Demote(session_id, id, Tier::kGpu, /*dead=*/false);
    // Acquired since, pinned or unleased: it stays, as any copy the client holds; so does one
    // that finds no room below (the plan's own moves make that room, later).
    if (absl::IsFailedPrecondition(demoted) || absl::IsNotFound(demoted) || absl::IsResourceExhausted(demoted)) {
      continue;
    }
    if (!demoted.ok()) return demoted;
    ++settled.demoted;
    settled.demoted_bytes += bytes;
    absl::MutexLock stats_lock(&stats_mutex_);
    ++stats_.settle_demotes;
  }
  return settled;
}

}  // namespace tierd
