// LeaseTable's placement machinery: allocating in a session's tiers, evicting to make
// room, copying a tensor between tiers through the Mover.
#include <algorithm>
#include <climits>
#include <cstring>
#include <map>
#include <set>
#include <vector>

#include "absl/strings/str_format.h"
#include "base/check.h"
#include "base/units.h"
#include "runtime/lease_table.h"
#include "runtime/lease_table_internal.h"
#include "runtime/room_policy.h"

namespace tierd {
namespace {

std::optional<Tier> Below(Tier tier) {
  if (tier == Tier::kGpu) return Tier::kDram;
  if (tier == Tier::kDram) return Tier::kNvme;
  return std::nullopt;
}

}  // namespace

std::string LeaseTable::Occupancy(Session& s, Tier tier) const {
  uint64_t acquired = 0, pinned = 0, other = 0, held = 0;
  for (const auto& [id, t] : s.tensors) {
    if (!t->Has(tier)) continue;
    held += t->copies[static_cast<int>(tier)]->bytes();
    if (t->acquired > 0 && t->acquired_tier == tier) ++acquired;
    else if (t->pinned == tier) ++pinned;
    else ++other;
  }
  const uint64_t quota = tier == Tier::kGpu ? s.quota.gpu_bytes
                         : tier == Tier::kDram ? s.quota.dram_bytes : s.quota.nvme_bytes;
  std::string free_part;
  if (tier != Tier::kNvme && s.ArenaOf(tier) != kNoArena) {
    const AllocatorStats stats = store_.ArenaStats(s.ArenaOf(tier));
    free_part = absl::StrFormat(", %s free (largest block %s)", FormatBytes(stats.free_bytes),
                                FormatBytes(stats.largest_free_block_bytes));
  }
  return absl::StrFormat(
      "session '%s' %s quota %s: %s held by %d acquired, %d pinned and %d other tensor(s)%s",
      s.label, TierName(tier), FormatBytes(quota), FormatBytes(held), acquired, pinned, other,
      free_part);
}

int LeaseTable::RangeHolder(Session& s, Tier tier, uint64_t at, uint64_t bytes) {
  // Runs for every placement that found its layout range taken (thousands a run): one pass
  // over the session's copies, unsorted, and the planner asked only about those in the range.
  const ArenaId arena = s.ArenaOf(tier);
  int holder = 3;  // no copy there: a move in flight into it (it lands and leaves as planned)
  for (const auto& [id, t] : s.tensors) {
    const auto& copy = t->copies[static_cast<int>(tier)];
    if (!copy.has_value() || copy->arena != arena) continue;
    const uint64_t begin = copy->offset();
    if (begin + copy->bytes() <= at || begin >= at + bytes) continue;
    if (s.planner->LaidOutThereNow(id, tier, begin)) {
      holder = std::min(holder, 2);
    } else {
      return s.planner->LayoutOffset(id, tier) == begin ? 1 : 0;
    }
  }
  return holder;
}

absl::StatusOr<Extent> LeaseTable::AllocateIn(Session& s, Tier tier, uint64_t bytes, bool evict,
                                              std::optional<TensorId> tensor, LayoutRange when_taken) {
  bool off_plan = false;
  if (tensor && s.planner != nullptr && tier != Tier::kNvme && s.ArenaOf(tier) != kNoArena) {
    if (const std::optional<uint64_t> at = s.planner->LayoutOffset(*tensor, tier)) {
      auto placed = store_.AllocateAt(s.ArenaOf(tier), *at, bytes);
      // With SetLayoutWait, a planned load whose range its planned tenants still hold (their
      // last use is not over: the plan's lane runs up to a lap ahead of the client, taking free
      // room) waits for them to leave, as the plan has it. Placed elsewhere it may take the room
      // of a tensor planned there later, which then goes elsewhere in turn.
      const int holder = placed.ok() ? -1 : RangeHolder(s, tier, *at, bytes);
      const bool wait = holder >= 2 && when_taken == LayoutRange::kOrWait && layout_wait_;
      absl::MutexLock stats_lock(&stats_mutex_);
      if (wait) {
        ++stats_.layout_waits;
        return absl::ResourceExhaustedError(absl::StrFormat(
            "its layout range (%s at %d) is still held by the tensors planned there before it", FormatBytes(bytes),
            *at));
      }
      // Taken (and not waited for): the online allocator, from the top of the arena down, away
      // from the layout (it packs from offset 0), so a small copy does not split the range a
      // large planned tensor needs next.
      ++(placed.ok() ? stats_.planned_placements : stats_.off_plan_placements);
      if (holder >= 0) ++stats_.off_plan_by[holder];
      if (placed.ok()) {
        NotePeak(s, tier);
        return placed;
      }
      off_plan = true;
    }
  }
  std::set<const Tensor*> refused;  // victims whose write-back found no room below
  int relocations_left = 4;         // moves within the tier tried before spilling
  for (;;) {
    absl::StatusOr<Extent> extent;
    if (tier == Tier::kNvme) {
      if (!store_.HasTier(Tier::kNvme) || s.quota.nvme_bytes == 0) {
        return absl::ResourceExhaustedError(absl::StrFormat(
            "session '%s' has no NVMe quota to put %s in", s.label, FormatBytes(bytes)));
      }
      // The bottom tier: nothing to evict to, but on demand it drops its copies of tensors
      // a tier above holds the same bytes of (nothing is written; the copy above becomes
      // the only one) until the new one fits.
      for (;;) {
        const bool fits = s.nvme_used + bytes <= s.quota.nvme_bytes;
        if (fits) {
          extent = store_.Allocate(Tier::kNvme, bytes);
          if (extent.ok()) {
            s.nvme_used += extent->bytes();
            NotePeak(s, tier);
            return extent;
          }
          if (!absl::IsResourceExhausted(extent.status())) return extent;
        }
        if (evict && DropNvmeDuplicate(s)) continue;
        if (fits) return extent;
        return absl::ResourceExhaustedError(absl::StrFormat(
            "%s; %s more does not fit", Occupancy(s, tier), FormatBytes(bytes)));
      }
    }
    if (s.ArenaOf(tier) == kNoArena) {
      return absl::ResourceExhaustedError(
          absl::StrFormat("session '%s' has no %s quota", s.label, TierName(tier)));
    }
    extent = off_plan ? store_.AllocateHighest(s.ArenaOf(tier), bytes) : store_.Allocate(s.ArenaOf(tier), bytes);
    if (extent.ok()) NotePeak(s, tier);
    if (extent.ok() || extent.status().code() != absl::StatusCode::kResourceExhausted) return extent;
    if (relocations_left-- > 0) {
      // Fragmented: join free space by moving one copy within the tier, not by spilling.
      const int64_t relocating = clock_.NowNanos();
      auto joined = Relocate(s, tier, bytes, /*unlocked=*/tensor && Busy(s, *tensor));
      timings_.relocate_nanos[static_cast<int>(tier)].fetch_add(clock_.NowNanos() - relocating,
                                                                std::memory_order_relaxed);
      if (joined.ok()) {
        extent = store_.AllocateAt(s.ArenaOf(tier), *joined, bytes);
        if (extent.ok()) {
          NotePeak(s, tier);
          return extent;
        }
      }
    }
    if (!evict) return extent;
    // With the planner and enough free bytes that no join could gather, the room
    // is made as one block (the copies side by side used furthest); otherwise, or when no
    // such run holds it, one victim at a time.
    absl::Status evicted = EvictForBlock(s, tier, bytes, refused);
    if (absl::IsNotFound(evicted)) evicted = EvictOne(s, tier, refused);
    if (!evicted.ok()) {
      const std::optional<Tier> below = Below(tier);
      return absl::ResourceExhaustedError(absl::StrFormat(
          "cannot place %s in %s: %s (%s%s)", FormatBytes(bytes), TierName(tier), Occupancy(s, tier),
          evicted.message(),
          refused.empty() || !below
              ? ""
              : absl::StrFormat("; %d tensor(s) there found no room below to be written back to: %s",
                                refused.size(), Occupancy(s, *below))));
    }
  }
}

bool LeaseTable::RanksUses(Session& s) { return s.planner != nullptr && s.planner->RanksUses(); }

bool LeaseTable::DropNvmeDuplicate(Session& s) {
  Tensor* victim = nullptr;
  int64_t victim_next = 0;
  for (const auto& [id, t] : s.tensors) {
    if (!t->Has(Tier::kNvme) || t->CopyCount() < 2 || t->busy > 0) continue;
    // The lowest eviction priority, then the planner's furthest next use (its copy above is
    // the last to need a write-back), else the least recently used.
    const int64_t next = RanksUses(s) ? s.planner->NextUse(t->id) : -static_cast<int64_t>(t->last_use);
    if (victim == nullptr || t->priority < victim->priority ||
        (t->priority == victim->priority && next > victim_next)) {
      victim = t.get();
      victim_next = next;
    }
  }
  if (victim == nullptr) return false;
  DropCopy(s, *victim, Tier::kNvme);
  if (s.planner != nullptr) {
    const int64_t now = clock_.NowNanos();
    s.planner->ObserveRoomMove({victim->id, victim->spec.name, Tier::kNvme, std::nullopt, 0, now, now});
  }
  absl::MutexLock stats_lock(&stats_mutex_);
  ++stats_.nvme_duplicates_dropped;
  return true;
}

std::vector<LeaseTable::HeldCopy> LeaseTable::CopiesByOffset(Session& s, Tier tier) const {
  const ArenaId arena = s.ArenaOf(tier);
  std::vector<HeldCopy> held;
  for (const auto& [id, t] : s.tensors) {
    const auto& copy = t->copies[static_cast<int>(tier)];
    if (copy.has_value() && copy->arena == arena) {
      held.push_back({copy->offset(), copy->offset() + copy->bytes(), t.get()});
    }
  }
  std::sort(held.begin(), held.end(), [](const HeldCopy& a, const HeldCopy& b) { return a.begin < b.begin; });
  return held;
}

absl::Status LeaseTable::EvictForBlock(Session& s, Tier tier, uint64_t bytes, std::set<const Tensor*>& refused) {
  if (!RanksUses(s) || tier == Tier::kNvme || s.ArenaOf(tier) == kNoArena) {
    return absl::NotFoundError("no order of uses");
  }
  const AllocatorStats arena = store_.ArenaStats(s.ArenaOf(tier));
  // Too few free bytes: the furthest next use goes first (EvictOne), as MIN says; a run
  // would take copies used sooner for room the joins may still make.
  if (arena.free_bytes < bytes) return absl::NotFoundError("too few free bytes");
  const std::vector<HeldCopy> held = CopiesByOffset(s, tier);
  auto may_go = [&](const Tensor& t) {
    return t.busy == 0 && t.pinned != tier && refused.count(&t) == 0 && !(t.acquired > 0 && t.acquired_tier == tier);
  };
  // Eviction priorities: a run is made of copies of the lowest priority that may go (if none
  // holds the block, EvictOne takes them one by one, lowest priority first).
  int lowest = INT_MAX;
  for (const HeldCopy& h : held) {
    if (may_go(*h.tensor)) lowest = std::min(lowest, h.tensor->priority);
  }
  std::vector<HeldRange> ranges;
  ranges.reserve(held.size());
  for (const HeldCopy& h : held) {
    const Tensor& t = *h.tensor;
    const bool evictable = may_go(t) && t.priority == lowest;
    ranges.push_back(
        {h.begin, h.end, evictable, t.CopyCount() > 1 || !t.written, evictable ? s.planner->NextUse(t.id) : 0});
  }
  const std::optional<size_t> victim = PickForBlock(ranges, arena.region_bytes, bytes);
  if (!victim) return absl::NotFoundError("no run of evictable copies side by side holds it");
  return EvictCopy(s, tier, *held[*victim].tensor, ranges[*victim].clean, refused);
}

absl::Status LeaseTable::EvictOne(Session& s, Tier tier, std::set<const Tensor*>& refused) {
  std::vector<Tensor*> tensors;
  std::vector<RoomCandidate> candidates;
  const bool ranked = RanksUses(s);
  for (const auto& [id, t] : s.tensors) {
    if (!t->Has(tier) || t->busy > 0 || t->pinned == tier || refused.count(t.get()) > 0) continue;
    if (t->acquired > 0 && t->acquired_tier == tier) continue;
    tensors.push_back(t.get());
    candidates.push_back(
        {t->CopyCount() > 1 || !t->written, ranked ? s.planner->NextUse(t->id) : 0, t->last_use, t->priority});
  }
  const std::optional<size_t> picked = PickVictim(candidates, ranked);
  Tensor* victim = picked ? tensors[*picked] : nullptr;
  const bool victim_clean = picked && candidates[*picked].clean;
  if (victim == nullptr) {
    // Copies in flight will land (or fail) and free their hold: wait for one, then retry.
    if (s.moving > 0) {
      const uint64_t seen = s.moves_done;
      struct Wait {
        Session* s;
        uint64_t seen;
      } wait{&s, seen};
      s.mutex.Await(absl::Condition(
          +[](Wait* w) ABSL_NO_THREAD_SAFETY_ANALYSIS { return w->s->moves_done != w->seen || w->s->closed; }, &wait));
      return absl::OkStatus();  // the caller tries to allocate again
    }
    // A thrash lock is the daemon's own guess, softer than the client's pin: it never makes
    // a placement fail. Let one go (the largest, for the most room), then retry.
    Tensor* locked = nullptr;
    for (const auto& [id, t] : s.tensors) {
      if (!t->thrash_locked || t->pinned != tier || t->busy > 0 || refused.count(t.get()) > 0) continue;
      if (t->acquired > 0 && t->acquired_tier == tier) continue;
      if (locked == nullptr || t->bytes > locked->bytes) locked = t.get();
    }
    if (locked != nullptr) {
      s.thrash_locked_bytes[static_cast<int>(tier)] -= locked->bytes;
      locked->thrash_locked = false;
      locked->lock_given_up = true;
      locked->pinned.reset();
      absl::MutexLock stats_lock(&stats_mutex_);
      ++stats_.thrash_unlocks;
      return absl::OkStatus();
    }
    return absl::ResourceExhaustedError("nothing there may be evicted");
  }
  return EvictCopy(s, tier, *victim, victim_clean, refused);
}

absl::Status LeaseTable::EvictCopy(Session& s, Tier tier, Tensor& t, bool clean, std::set<const Tensor*>& refused) {
  Tensor* const victim = &t;
  const bool victim_clean = clean;
  const int64_t start = clock_.NowNanos();
  std::optional<Tier> went;  // where the victim's bytes went, for the room observer
  if (!victim_clean) {
    const std::optional<Tier> below = Below(tier);
    if (!below) return absl::ResourceExhaustedError("no tier below to write back to");
    went = below;
    ++victim->busy;
    absl::Status copied = CopyTo(s, *victim, *below);
    --victim->busy;
    if (absl::IsResourceExhausted(copied)) {  // no room below for this one: another may fit
      refused.insert(victim);
      return absl::OkStatus();
    }
    if (!copied.ok()) return copied;
  } else if (victim->CopyCount() == 1) {
    // Never written: its only copy holds nothing, but a lease keeps a copy somewhere
    // (invariant 2): re-home it in a lower tier without moving bytes.
    const std::optional<Tier> below = Below(tier);
    if (!below) return absl::ResourceExhaustedError("no tier below");
    auto extent = AllocateIn(s, *below, victim->bytes, /*evict=*/true, victim->id);
    if (absl::IsResourceExhausted(extent.status())) {
      refused.insert(victim);
      return absl::OkStatus();
    }
    if (!extent.ok()) return extent.status();
    victim->copies[static_cast<int>(*below)] = *extent;
  }
  if (s.planner != nullptr) {
    s.planner->ObserveRoomMove(
        {victim->id, victim->spec.name, tier, went, went ? victim->bytes : 0, start, clock_.NowNanos()});
  }
  {
    absl::MutexLock lock(&stats_mutex_);
    ++stats_.evictions_capacity;
    if (!victim_clean) ++stats_.writebacks;
  }
  if (tier == Tier::kGpu) {
    // A clean copy's kernels may still be queued: waited for with the lock let go (as a write-back's
    // copy does), so the session's other requests go on; the drop below finds the fence passed.
    ++victim->busy;
    SettleGpuCopyUnlocked(s, *victim).IgnoreError();
    --victim->busy;
  }
  DropCopy(s, *victim, tier);
  victim->evicted_for_room[static_cast<int>(tier)] = true;
  return absl::OkStatus();
}

absl::Status LeaseTable::CopyTo(Session& s, Tensor& t, Tier tier, bool evict, LayoutRange when_taken) {
  TIERD_CHECK(!t.Has(tier));
  // The source: the adjacent tier holding the bytes, staging through DRAM if needed.
  std::optional<Tier> source;
  if (tier == Tier::kDram) {
    source = t.Has(Tier::kGpu) ? Tier::kGpu : Tier::kNvme;
  } else {
    if (!t.Has(Tier::kDram)) {
      // Staging through DRAM makes room there as `evict` says (a demand fetch: the planner's
      // planner, if any, picks what goes; a planned load: free room only, the plan stages).
      if (absl::Status staged = CopyTo(s, t, Tier::kDram, evict); !staged.ok()) return staged;
    }
    source = Tier::kDram;
  }
  TIERD_CHECK(t.Has(*source));
  if (*source == Tier::kGpu) {
    if (absl::Status settled = SettleGpuCopyUnlocked(s, t); !settled.ok()) {
      return absl::Status(settled.code(), "the client's GPU work on '" + t.spec.name + "' failed: " +
                                              std::string(settled.message()));
    }
  }
  auto destination = AllocateIn(s, tier, t.bytes, evict, t.id, when_taken);
  if (!destination.ok()) return destination.status();
  // The bytes move without the session lock: t is busy, so nobody frees its source or
  // picks it as a victim, and the destination is ours.
  const Extent source_extent = *t.copies[static_cast<int>(*source)];
  ++s.moving;
  NoteHeld(s);
  s.mutex.Unlock();
  absl::Status moved = mover_.MoveAndWait(source_extent, *destination, t.bytes);
  s.mutex.Lock();
  s.held_since = clock_.NowNanos();
  --s.moving;
  ++s.moves_done;
  if (!moved.ok()) {
    if (tier == Tier::kNvme) s.nvme_used -= destination->bytes();
    store_.Free(*destination).IgnoreError();
    return absl::Status(moved.code(), absl::StrFormat("moving '%s' (%s) from %s to %s: %s",
                                                      t.spec.name, FormatBytes(t.bytes),
                                                      TierName(*source), TierName(tier), moved.message()));
  }
  t.copies[static_cast<int>(tier)] = *destination;
  t.evicted_for_room[static_cast<int>(tier)] = false;  // back, whoever brought it (NoteRefetch counts demand)
  return absl::OkStatus();
}

void LeaseTable::DropCopy(Session& s, Tensor& t, Tier tier) {
  std::optional<Extent>& copy = t.copies[static_cast<int>(tier)];
  if (!copy) return;
  // The memory is about to be reused: the client's kernels must be done with it. (If they
  // failed, that is the client's error; the memory is dropped all the same.)
  if (tier == Tier::kGpu) SettleGpuCopy(t).IgnoreError();
  if (tier == Tier::kNvme) s.nvme_used -= copy->bytes();
  TIERD_CHECK_OK(store_.Free(*copy));
  copy.reset();
}

}  // namespace tierd
