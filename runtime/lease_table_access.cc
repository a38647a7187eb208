// LeaseTable: acquire/release (with demand fetch), pins, listing, stats, validation.
#include "absl/strings/str_format.h"
#include "base/check.h"
#include "base/units.h"
#include "runtime/lease_table.h"
#include "runtime/lease_table_internal.h"

namespace tierd {

absl::StatusOr<Placement> LeaseTable::Acquire(SessionId session_id, TensorId id, Access access,
                                              Place place) {
  HoldScope hold(HoldKind::kAcquire);
  const Tier tier = place == Place::kGpu ? Tier::kGpu : Tier::kDram;
  std::shared_ptr<SessionPlanner> planner;
  auto first = OnTensor<absl::StatusOr<Placement>>(session_id, id, [&](Session& s, Tensor& t) {
    if (s.planner != nullptr && !t.Has(tier) && t.acquired == 0 && !t.pinned) {
      planner = s.planner;  // not here yet: the plan may be moving it (waited for below, unlocked)
      return absl::StatusOr<Placement>(Placement{});
    }
    return AcquireLocked(s, t, access, place);
  });
  if (planner == nullptr) return first;
  planner->AwaitPlannedMove(id, tier);
  return OnTensor<absl::StatusOr<Placement>>(session_id, id, [&](Session& s, Tensor& t) {
    return AcquireLocked(s, t, access, place);
  });
}

absl::StatusOr<Placement> LeaseTable::AcquireLocked(Session& s, Tensor& t, Access access, Place place) {
  const Tier tier = place == Place::kGpu ? Tier::kGpu : Tier::kDram;
  if (access != Access::kRead && tier != Tier::kGpu && t.acquired == 0 && t.gpu_fence != nullptr) {
    // A host write drops the GPU copy, which kernels the client queued may still read (an
    // optimizer writing new weights while the backward still uses the old): wait for them
    // without the session's lock, as a move does, so the session's other requests (the
    // forward's acquires of the next layer) go on meanwhile. The drop below finds the fence
    // passed. (Its failure is the client's to hear of; the copy is dropped all the same.)
    ++t.busy;
    SettleGpuCopyUnlocked(s, t).IgnoreError();
    --t.busy;
  }
  if (t.acquired > 0 && t.acquired_tier != tier) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "'%s' is acquired on the %s; release it before acquiring it on the %s", t.spec.name,
        TierName(t.acquired_tier), TierName(tier)));
  }
  if (t.discarded && access != Access::kOverwrite) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "'%s' holds no value: the registered graph says its next use overwrites it, so the plan dropped it; "
        "acquire it with ACCESS_OVERWRITE, or fix the graph",
        t.spec.name));
  }
  if (tier == Tier::kGpu && t.acquired == 0) {
    if (absl::Status rehomed = Rehome(s, t); !rehomed.ok()) return rehomed;
  }
  Placement placement;
  if (access == Access::kOverwrite && t.written && !t.Has(tier)) {
    // Every byte will be written: the old ones need not come here.
    t.written = false;
  }
  if (!t.Has(tier)) {
    ++t.busy;
    const int64_t start = clock_.NowNanos();
    absl::Status status;
    bool refetch = false;  // its copy here was evicted for room: a demand fetch brings it back
    if (!t.written) {
      // Nothing to fetch: take room here and drop the empty copies elsewhere.
      auto extent = AllocateIn(s, tier, t.bytes, /*evict=*/true, t.id);
      if (extent.ok()) {
        for (Tier other : {Tier::kGpu, Tier::kDram, Tier::kNvme}) DropCopy(s, t, other);
        t.copies[static_cast<int>(tier)] = *extent;
      }
      status = extent.status();
    } else {
      refetch = t.evicted_for_room[static_cast<int>(tier)];  // CopyTo clears it
      status = CopyTo(s, t, tier);
      placement.fetched = status.ok();
    }
    --t.busy;
    if (!status.ok()) return status;
    if (placement.fetched) {
      {
        absl::MutexLock stats_lock(&stats_mutex_);
        ++stats_.stalls;
        stats_.stall_nanos += clock_.NowNanos() - start;
      }
      if (refetch) NoteRefetch(s, t, tier);
    }
  }
  ++s.acquires;
  if (!placement.fetched) {
    absl::MutexLock stats_lock(&stats_mutex_);
    ++stats_.acquire_hits;
  }
  t.discarded = false;
  if (access != Access::kRead) t.last_write_nanos = clock_.NowNanos();
  if (access != Access::kRead) {
    for (Tier other : {Tier::kGpu, Tier::kDram, Tier::kNvme}) {
      if (other != tier) DropCopy(s, t, other);  // stale from now on (invariant 1)
    }
    t.written = true;
  }
  ++t.acquired;
  t.acquired_tier = tier;
  t.last_use = ++s.tick;
  const Extent& copy = *t.copies[static_cast<int>(tier)];
  placement.tier = tier;
  placement.arena = copy.arena;
  placement.offset = copy.offset();
  placement.bytes = t.bytes;
  return placement;
}

void LeaseTable::NoteRefetch(Session& s, Tensor& t, Tier tier) {
  const int k = static_cast<int>(tier);
  ++t.refetches[k];
  bool locked = false;
  if (thrash_.lock && tier != Tier::kNvme && !t.pinned && !t.lock_given_up && s.acquires < thrash_.warmup_acquires &&
      t.refetches[k] >= thrash_.refetches && !RanksUses(s)) {
    const uint64_t quota = tier == Tier::kGpu ? s.quota.gpu_bytes : s.quota.dram_bytes;
    if (static_cast<double>(s.thrash_locked_bytes[k] + t.bytes) <= thrash_.max_locked_fraction * quota) {
      t.pinned = tier;
      t.thrash_locked = true;
      s.thrash_locked_bytes[k] += t.bytes;
      locked = true;
    }
  }
  absl::MutexLock stats_lock(&stats_mutex_);
  ++stats_.refetches;
  if (locked) ++stats_.thrash_locks;
}

absl::Status LeaseTable::Release(SessionId session_id, TensorId id, std::unique_ptr<GpuFence> gpu_fence) {
  HoldScope hold(HoldKind::kRelease);
  const int64_t start = clock_.NowNanos();
  int64_t locked = 0;
  absl::Status released = OnTensor<absl::Status>(session_id, id, [&](Session& s, Tensor& t) {
    locked = clock_.NowNanos();
    return ReleaseLocked(s, t, std::move(gpu_fence));
  });
  const int64_t end = clock_.NowNanos();
  timings_.releases.fetch_add(1, std::memory_order_relaxed);
  timings_.release_nanos.fetch_add(end - start, std::memory_order_relaxed);
  if (locked > 0) timings_.release_lock_nanos.fetch_add(locked - start, std::memory_order_relaxed);
  return released;
}

absl::Status LeaseTable::SettleGpuCopy(Tensor& t) {
  if (t.gpu_fence == nullptr) return absl::OkStatus();
  absl::Status status = t.gpu_fence->Wait();
  t.gpu_fence.reset();
  return status;
}

absl::Status LeaseTable::SettleGpuCopyUnlocked(Session& s, Tensor& t) {
  if (t.gpu_fence == nullptr) return absl::OkStatus();
  std::unique_ptr<GpuFence> fence = std::move(t.gpu_fence);
  if (fence->Passed()) return fence->Wait();  // at once: how the client's work ended
  NoteHeld(s);
  s.mutex.Unlock();
  absl::Status status = fence->Wait();
  s.mutex.Lock();
  s.held_since = clock_.NowNanos();
  return status;
}

void LeaseTable::NoteHeld(Session& s) {
  const int64_t held = clock_.NowNanos() - s.held_since;
  const int kind = static_cast<int>(current_hold);
  timings_.held_nanos[kind].fetch_add(held, std::memory_order_relaxed);
  std::atomic<int64_t>& most = timings_.held_max_nanos[kind];
  for (int64_t seen = most.load(std::memory_order_relaxed);
       held > seen && !most.compare_exchange_weak(seen, held, std::memory_order_relaxed);) {
  }
}

absl::Status LeaseTable::ReleaseLocked(Session& s, Tensor& t, std::unique_ptr<GpuFence> gpu_fence) {
  if (t.acquired == 0) {
    return absl::FailedPreconditionError(
        absl::StrFormat("release of '%s', which is not acquired (double release?)", t.spec.name));
  }
  --t.acquired;
  t.last_use = ++s.tick;
  if (gpu_fence != nullptr) {
    // Two releases with work in flight (a layer's weights after its forward, then after its
    // backward): the newer fence stands for both when it passes only after the older one
    // (Covers); otherwise the older one is waited for now.
    if (t.gpu_fence != nullptr && !gpu_fence->Covers(*t.gpu_fence)) {
      const int64_t start = clock_.NowNanos();
      absl::Status settled = SettleGpuCopy(t);
      timings_.fence_waits.fetch_add(1, std::memory_order_relaxed);
      timings_.release_fence_wait_nanos.fetch_add(clock_.NowNanos() - start, std::memory_order_relaxed);
      if (!settled.ok()) return settled;
    }
    t.gpu_fence = std::move(gpu_fence);
  }
  // A pinned tensor written elsewhere goes back to its pinned tier once free.
  if (t.acquired == 0 && t.pinned && !t.Has(*t.pinned)) {
    ++t.busy;
    absl::Status status = CopyTo(s, t, *t.pinned);
    --t.busy;
    return status;
  }
  return absl::OkStatus();
}

absl::Status LeaseTable::Prefetch(SessionId session_id, TensorId id, Tier tier, bool evict) {
  HoldScope hold(HoldKind::kPrefetch);
  return OnTensor<absl::Status>(session_id, id, [&](Session& s, Tensor& t) -> absl::Status {
    // Brought in for a use soon: the least-recently-used fallback must not pick it first.
    t.last_use = ++s.tick;
    if (t.Has(tier)) return absl::OkStatus();
    if (t.acquired > 0) {
      return absl::FailedPreconditionError(absl::StrFormat("'%s' is acquired elsewhere", t.spec.name));
    }
    // The plan's load (free room only) keeps to its layout range; one that may evict is the
    // tiers' own, placed wherever room is.
    const LayoutRange planned = evict ? LayoutRange::kOrElsewhere : LayoutRange::kOrWait;
    if (!t.written) {
      if (tier == Tier::kNvme) return absl::OkStatus();  // nothing to keep a copy of
      // Holds no value: reserve room here for the overwrite to come; the empty copies go.
      // Busy meanwhile: a join on the GPU lets the lock go while its copies move.
      ++t.busy;
      auto extent = AllocateIn(s, tier, t.bytes, evict, t.id, planned);
      --t.busy;
      if (!extent.ok()) return extent.status();
      for (Tier other : {Tier::kGpu, Tier::kDram, Tier::kNvme}) DropCopy(s, t, other);
      t.copies[static_cast<int>(tier)] = *extent;
      return absl::OkStatus();
    }
    ++t.busy;
    absl::Status status = CopyTo(s, t, tier, evict, planned);
    --t.busy;
    if (status.ok() && t.written) {
      absl::MutexLock stats_lock(&stats_mutex_);
      ++stats_.prefetches;
      stats_.prefetch_bytes += t.bytes;
    }
    return status;
  });
}

absl::Status LeaseTable::Demote(SessionId session_id, TensorId id, Tier from, bool dead,
                               int64_t unless_written_since) {
  HoldScope hold(HoldKind::kDemote);
  return OnTensor<absl::Status>(session_id, id, [&](Session& s, Tensor& t) -> absl::Status {
    if (t.acquired > 0) {
      return absl::FailedPreconditionError(absl::StrFormat("'%s' is acquired", t.spec.name));
    }
    if (t.pinned) return absl::FailedPreconditionError(absl::StrFormat("'%s' is pinned", t.spec.name));
    if (dead) {
      if (t.discarded || t.CopyCount() == 0) return absl::OkStatus();
      if (t.last_write_nanos >= unless_written_since) {
        return absl::FailedPreconditionError(absl::StrFormat(
            "'%s' was written after the plan found its value dead: the client is past that point", t.spec.name));
      }
      // The client's kernels may still use the GPU copy: wait for them without the lock (the
      // memory is reused only after; their failure is the client's to hear of).
      ++t.busy;
      SettleGpuCopyUnlocked(s, t).IgnoreError();
      --t.busy;
      for (Tier tier : {Tier::kGpu, Tier::kDram, Tier::kNvme}) DropCopy(s, t, tier);
      t.discarded = true;
      t.written = false;
      absl::MutexLock stats_lock(&stats_mutex_);
      ++stats_.discards;
      ++stats_.planned_evictions;
      return absl::OkStatus();
    }
    if (!t.Has(from)) return absl::OkStatus();
    if (t.CopyCount() == 1) {
      const Tier below = from == Tier::kGpu ? Tier::kDram : Tier::kNvme;
      if (from == Tier::kNvme) return absl::InvalidArgumentError("NVMe is the bottom tier");
      // The planner's own moves make its room below (push-downs before write-backs): taking
      // it here by the tiers' choice would push down a copy the plan keeps, and cost the
      // plan that copy's trip to NVMe and back.
      if (!t.written) {
        // Holds nothing yet: re-home it below without moving bytes (invariant 2).
        auto extent = AllocateIn(s, below, t.bytes, /*evict=*/false, t.id);
        if (!extent.ok()) return extent.status();
        t.copies[static_cast<int>(below)] = *extent;
      } else {
        ++t.busy;
        absl::Status status = CopyTo(s, t, below, /*evict=*/false);
        --t.busy;
        if (!status.ok()) return status;
        absl::MutexLock stats_lock(&stats_mutex_);
        ++stats_.writebacks;
      }
    }
    DropCopy(s, t, from);
    absl::MutexLock stats_lock(&stats_mutex_);
    ++stats_.planned_evictions;
    return absl::OkStatus();
  });
}

absl::Status LeaseTable::WithSessionLocked(SessionId session_id, absl::FunctionRef<void(Session&)> fn) {
  auto session = GetSession(session_id);
  if (!session.ok()) return session.status();
  absl::MutexLock lock(&(*session)->mutex);
  fn(**session);
  return absl::OkStatus();
}

absl::Status LeaseTable::SetPlanner(SessionId session_id, std::shared_ptr<SessionPlanner> planner) {
  return WithSessionLocked(session_id, [&](Session& s) {
    s.planner = std::move(planner);
    if (s.planner == nullptr) return;
    for (const auto& [id, t] : s.tensors) s.planner->Leased(id, t->spec.name);
  });
}

absl::Status LeaseTable::Pin(SessionId session_id, TensorId id, Tier tier) {
  return OnTensor<absl::Status>(session_id, id, [&](Session& s, Tensor& t) {
    if (!t.Has(tier)) {
      ++t.busy;
      absl::Status status = CopyTo(s, t, tier);
      --t.busy;
      if (!status.ok()) return status;
      absl::MutexLock stats_lock(&stats_mutex_);
      ++stats_.evictions_explicit;
    }
    t.pinned = tier;
    return absl::OkStatus();
  });
}

absl::Status LeaseTable::Unpin(SessionId session_id, TensorId id) {
  return OnTensor<absl::Status>(session_id, id, [](Session& s, Tensor& t) {
    if (t.thrash_locked && t.pinned) s.thrash_locked_bytes[static_cast<int>(*t.pinned)] -= t.bytes;
    t.thrash_locked = false;
    t.pinned.reset();
    return absl::OkStatus();
  });
}

std::vector<LeaseView> LeaseTable::List(std::optional<SessionId> only) const {
  std::vector<std::shared_ptr<Session>> sessions;
  {
    absl::MutexLock lock(&mutex_);
    for (const auto& [id, session] : sessions_) {
      if (!only || *only == id) sessions.push_back(session);
    }
  }
  std::vector<LeaseView> views;
  for (const auto& session : sessions) {
    absl::MutexLock lock(&session->mutex);
    for (const auto& [id, t] : session->tensors) {
      LeaseView view{session->id, id, t->spec, t->bytes, {}, t->pinned, t->priority, t->acquired};
      view.refetches = t->refetches;
      view.thrash_locked = t->thrash_locked;
      for (int i = 0; i < kTierCount; ++i) {
        view.copies[i] = t->copies[i].has_value();
        if (view.copies[i]) {
          view.offsets[i] = t->copies[i]->offset();
          view.extents[i] = t->copies[i]->bytes();
        }
      }
      views.push_back(std::move(view));
    }
  }
  return views;
}

LeaseStats LeaseTable::Stats() const {
  LeaseStats out;
  {
    absl::MutexLock lock(&stats_mutex_);
    out = stats_;
  }
  const Timings& t = timings_;
  out.releases = t.releases.load();
  out.fence_waits = t.fence_waits.load();
  out.release_nanos = t.release_nanos.load();
  out.release_lock_nanos = t.release_lock_nanos.load();
  out.release_fence_wait_nanos = t.release_fence_wait_nanos.load();
  for (size_t k = 0; k < out.held_nanos.size(); ++k) {
    out.held_nanos[k] = t.held_nanos[k].load();
    out.held_max_nanos[k] = t.held_max_nanos[k].load();
  }
  for (size_t k = 0; k < out.relocate_nanos.size(); ++k) out.relocate_nanos[k] = t.relocate_nanos[k].load();
  return out;
}

absl::Status LeaseTable::Validate() const {
  std::vector<std::shared_ptr<Session>> sessions;
  {
    absl::MutexLock lock(&mutex_);
    for (const auto& [id, session] : sessions_) sessions.push_back(session);
  }
  for (const auto& session : sessions) {
    Session& s = *session;
    absl::MutexLock lock(&s.mutex);
    uint64_t nvme = 0;
    for (const auto& [id, t] : s.tensors) {
      auto fail = [&](const char* what) {
        return absl::InternalError(absl::StrFormat("session '%s', '%s': %s", s.label, t->spec.name, what));
      };
      if (t->CopyCount() == 0 && !t->discarded) return fail("no copy (invariant 2)");
      for (Tier tier : {Tier::kGpu, Tier::kDram}) {
        if (t->Has(tier) && t->copies[static_cast<int>(tier)]->arena != s.ArenaOf(tier)) {
          return fail("a copy outside the session's arena (invariant 3)");
        }
      }
      if (t->Has(Tier::kNvme)) nvme += t->copies[static_cast<int>(Tier::kNvme)]->bytes();
      if (t->acquired > 0 && !t->Has(t->acquired_tier)) return fail("acquired but absent (invariant 4)");
      if (t->pinned && !t->Has(*t->pinned) && t->acquired == 0) return fail("pinned but absent (invariant 4)");
      if (t->busy != 0) return fail("left busy");
      if (s.by_name.at(t->spec.name) != id) return fail("name index out of date");
    }
    if (nvme != s.nvme_used) return absl::InternalError("NVMe usage counter out of date");
    if (nvme > s.quota.nvme_bytes) return absl::InternalError("NVMe quota exceeded");
  }
  return absl::OkStatus();
}

}  // namespace tierd
