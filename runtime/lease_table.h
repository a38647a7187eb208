// LeaseTable: the daemon's record of every leased tensor and where its bytes are.
//
// Model (numbered invariants, checked by Validate()):
//   1. A tensor has at most one copy per tier; every copy it has holds the same bytes.
//      A write acquire frees the other copies (they would be stale), so "dirty" is
//      simply "the only copy": such a copy is written back before it may be dropped.
//   2. A leased tensor always has at least one copy (space is taken at Lease, so a lease
//      that succeeded can always be acquired, given room to fetch into) — unless the plan
//      discarded it as dead (Demote with dead=true): then only an overwrite may have it.
//   3. GPU and DRAM copies live in the owning session's arenas (each session maps only
//      its own memory); NVMe copies in the node's NVMe arena, within the session quota.
//   4. An acquired tensor's copy at the acquired place is never moved or freed until
//      the matching release; a pinned tensor's copy in its pinned tier never leaves it.
//
// Acquire with the bytes elsewhere is a demand fetch (DRAM->GPU, or NVMe->DRAM->GPU):
// counted as a stall with its time. Room is made by evicting the session's own
// unacquired, unpinned tensors: clean copies (duplicated below) first, then the least
// recently used, written back to the next tier down. (A session with a registered graph
// replaces this policy with the planner's, which moves bytes before they are needed.)
//
// Thread-safety: thread-safe. Operations of one session are serialised by that session's
// lock, except that a copy between tiers lets the lock go while the bytes move (the tensor
// is marked busy: others wait for it, and it is no eviction victim), so the planner's
// prefetches overlap the client's acquires. Sessions do not block one another.
#ifndef TIERD_RUNTIME_LEASE_TABLE_H_
#define TIERD_RUNTIME_LEASE_TABLE_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "base/clock.h"
#include "runtime/mover.h"
#include "runtime/session.h"
#include "runtime/session_planner.h"
#include "runtime/tensor.h"
#include "runtime/tier_store.h"

namespace tierd {

// A config pin: tensors whose name matches `pattern` (std::regex, full match) stay in
// `tier` once there.
struct PinRule {
  std::string pattern;
  Tier tier = Tier::kGpu;
};

// A config eviction priority: tensors whose name matches `pattern` (the first rule that
// matches) have `priority` (others 0). When tierd itself must pick a copy to make room, a lower
// priority goes first, whatever else ranks the copies (the planner's next use, clean before
// dirty, the least recently used), so a layer of priority 1 leaves a tier only when nothing of
// priority 0 can. Softer than a pin: nothing is held where it cannot fit.
struct PriorityRule {
  std::string pattern;
  int priority = 0;
};

// Thrashing: a tensor whose copy tierd evicted from a tier to make room and that an acquire then
// fetched back into that tier has been refetched (counted per tensor and tier, shown by
// tierctl leases). With `lock`, during a session's warm-up (its first `warmup_acquires`
// acquires) a tensor refetched `refetches` times into the GPU or DRAM tier is locked there (a
// pin, for the rest of the session) while the session's locked bytes in that tier stay within
// `max_locked_fraction` of its quota there: what thrashes in the warm-up stops moving. Not for
// sessions with a plan (the planner orders their moves; a pin of its own would contradict it).
// Softer than a client's pin: when a placement finds nothing else to evict, a lock is let go
// (the largest first) rather than the placement failing, and that tensor is not locked again.
struct ThrashOptions {
  bool lock = false;
  uint64_t warmup_acquires = 2000;
  uint32_t refetches = 3;
  double max_locked_fraction = 0.5;
};

// Where an acquired tensor's bytes are: the arena is the session's own (its GPU region or
// its DRAM segment), so the client's pointer is its mapping of that arena + offset.
struct Placement {
  Tier tier = Tier::kGpu;
  ArenaId arena = kNoArena;
  uint64_t offset = 0;
  uint64_t bytes = 0;
  bool fetched = false;  // a demand fetch was needed (a stall)
};

struct LeaseView {
  SessionId session = 0;
  TensorId id = 0;
  TensorSpec spec;
  uint64_t bytes = 0;
  std::array<bool, kTierCount> copies{};
  std::optional<Tier> pinned;
  int priority = 0;  // its eviction priority (PriorityRule)
  uint32_t acquired = 0;
  // Where each copy starts in its tier (the session's GPU or DRAM arena; NVMe: the file),
  // and its size there (rounded up to the allocator's alignment); 0 where there is none.
  std::array<uint64_t, kTierCount> offsets{}, extents{};
  std::array<uint32_t, kTierCount> refetches{};  // ThrashOptions: fetched back after eviction for room
  bool thrash_locked = false;                    // pinned by the thrash lock
};

struct LeaseStats {
  uint64_t sessions = 0;
  uint64_t leases = 0;
  uint64_t stalls = 0;
  int64_t stall_nanos = 0;
  uint64_t evictions_capacity = 0;   // to make room
  uint64_t evictions_explicit = 0;   // pins, moves asked for
  uint64_t writebacks = 0;           // evictions that had to copy the only copy down
  uint64_t prefetches = 0;           // planned copies into a tier ahead of use
  uint64_t prefetch_bytes = 0;
  uint64_t planned_evictions = 0;    // planned copies away (Demote), dead discards included
  uint64_t discards = 0;             // dead values dropped without a write-back
  uint64_t acquire_hits = 0;         // acquires that found the bytes already in place
  uint64_t planned_placements = 0;   // placed at the offset the planner's layout fixed
  uint64_t off_plan_placements = 0;  // the layout had an offset, but the range was taken
  // Planned loads that found their layout range still held by the tensors planned there
  // before them, and waited (the plan's lane tried again later) instead of going elsewhere.
  uint64_t layout_waits = 0;
  // The off-plan placements by what held the range (the first such copy): one placed off the
  // layout, one at its layout offset ahead of its planned time, the tensor planned there now
  // (for a placement that does not wait: an acquire's, a lease's), or nothing yet (a move in
  // flight into it).
  std::array<uint64_t, 4> off_plan_by = {};
  uint64_t relocations = 0;          // copies moved within DRAM to join free space (no spill)
  // Copies moved within the GPU: to join free space there, or off the online allocator's
  // place to the layout's offset when a client acquires them and that range is free.
  uint64_t gpu_relocations = 0;
  uint64_t rehomed = 0;              // ... of them, the moves to the layout's offset
  // SettleIntoLayout (a plan's start, a replan): copies moved to their layout offsets, and
  // copies sent out of the GPU because the range they are laid out in was taken.
  uint64_t settle_moves = 0, settle_demotes = 0;
  // NVMe copies dropped to make room there on demand (a tier above held the same bytes).
  uint64_t nvme_duplicates_dropped = 0;
  uint64_t refetches = 0;     // fetches back into a tier a copy was evicted from for room
  uint64_t thrash_locks = 0;  // tensors the thrash lock pinned
  uint64_t thrash_unlocks = 0;  // of them, let go because a placement needed their room
  // Where a release's time goes: waiting for the session's lock (and for a move of the
  // tensor to land), and waiting for an older GPU fence its new one does not cover.
  uint64_t releases = 0, fence_waits = 0;
  int64_t release_lock_nanos = 0, release_fence_wait_nanos = 0, release_nanos = 0;
  // How long each kind of request held a session's lock (acquire, release, a planned load, a
  // planned move away, other), in all and at most at once.
  std::array<int64_t, 5> held_nanos = {}, held_max_nanos = {};
  std::array<int64_t, 3> relocate_nanos = {};  // joining free space within a tier, by tier (lock held)
};

class LeaseTable {
 public:
  // `store`, `mover` and `clock` must outlive the table. Invalid pin or priority patterns are
  // an error.
  static absl::StatusOr<std::unique_ptr<LeaseTable>> Create(TierStore& store, Mover& mover, Clock& clock,
                                                            std::vector<PinRule> pins,
                                                            std::vector<PriorityRule> priorities = {});
  ~LeaseTable();
  // Before the first session opens.
  void SetThrashOptions(const ThrashOptions& options) { thrash_ = options; }
  // Before the first session opens. On: a planned load (Prefetch without eviction) whose layout
  // range the tensors planned there before it still hold fails with RESOURCE_EXHAUSTED (the
  // plan's lane retries once they have left) instead of going elsewhere, where it may take the
  // range of a tensor planned there later. Off (the default): elsewhere. In the planner's
  // replay of a 1.3B step it placed more copies at the layout's offsets and moved fewer within
  // the GPU, but more loads came just in time (tools/planreplay); on the lent GPUs the
  // trainer's loads never met the case (docs/runs/2026-12-05-s38).
  void SetLayoutWait(bool on) { layout_wait_ = on; }

  // Creates the session's GPU and DRAM arenas (quota bytes each; 0 = none).
  // RESOURCE_EXHAUSTED when the node budget cannot give the quota.
  absl::StatusOr<SessionId> OpenSession(const std::string& label, const SessionQuota& quota);
  // Frees every lease and the arenas. The client must no longer touch its mappings.
  absl::Status CloseSession(SessionId session);
  ArenaId SessionArena(SessionId session, Tier tier) const;
  absl::StatusOr<SessionQuota> Quota(SessionId session) const;
  // What the session holds in each tier now (allocated bytes: every copy, acquired or not)
  // and the most it held since it opened or since the last call with `reset_peaks` (then
  // the peaks restart from what is held now): a trainer's peak per step.
  struct TierUsage {
    uint64_t quota = 0, used = 0, peak = 0;
  };
  absl::StatusOr<std::array<TierUsage, kTierCount>> Usage(SessionId session, bool reset_peaks);

  // ALREADY_EXISTS if the session has a tensor of that name; RESOURCE_EXHAUSTED (naming
  // the quotas and what holds them) when no tier has room.
  absl::StatusOr<TensorId> Lease(SessionId session, const TensorSpec& spec);
  absl::Status Unlease(SessionId session, TensorId tensor);
  absl::StatusOr<TensorId> Find(SessionId session, const std::string& name) const;

  absl::StatusOr<Placement> Acquire(SessionId session, TensorId tensor, Access access, Place place);
  // FAILED_PRECONDITION when the tensor is not acquired. With `gpu_fence`, the client's
  // GPU work on the tensor may still be running: the daemon waits for the fence before it
  // reads the GPU copy or frees its memory (release without synchronising the stream).
  absl::Status Release(SessionId session, TensorId tensor, std::unique_ptr<GpuFence> gpu_fence = nullptr);

  // The planner's moves. Prefetch makes a copy in `tier` ahead of use (into the GPU or
  // DRAM; into NVMe it is a copy down that keeps the others); a tensor holding no value
  // (never written, or discarded) gets room reserved there instead. With evict=false it
  // takes only free room (RESOURCE_EXHAUSTED otherwise, at once), in DRAM too when it stages
  // through it. Demote drops the copy in `from`, writing it down a tier first if it is the
  // only one, into free room only (RESOURCE_EXHAUSTED otherwise: the planner's push-downs
  // make that room, not the tiers' choice); with dead=true the value is
  // dead (the graph said its next use overwrites it): every copy goes, nothing is written —
  // unless the tensor was written at or after `unless_written_since` (clock nanos), which
  // means the client got to that next use first: then FAILED_PRECONDITION. Both:
  // FAILED_PRECONDITION for an acquired or pinned tensor (the plan is out of step with the
  // client), OK when there is nothing to do.
  absl::Status Prefetch(SessionId session, TensorId tensor, Tier tier, bool evict);
  absl::Status Demote(SessionId session, TensorId tensor, Tier from, bool dead,
                      int64_t unless_written_since = INT64_MAX);

  // The session's planner (session_planner.h), when a graph is registered: room made on
  // demand goes to the tensor it uses furthest ahead (not the least recently used), copies
  // go where its layout puts them, an acquire of a tensor the plan is moving waits for that
  // move, and the moves the tiers make on their own for room are told to it. It is told of
  // the session's tensors at once and of each one leased or unleased later. nullptr: none.
  absl::Status SetPlanner(SessionId session, std::shared_ptr<SessionPlanner> planner);

  // Once a plan takes effect: the session's idle GPU copies that its planner's layout puts
  // at another offset go there where that range is free, and the rest leave the GPU (written
  // back when they are the only copy), so the plan's loads find their ranges. Why: a session
  // that ran online first (a trainer's first step, its weights made on the GPU) holds copies
  // where the layout puts others, each load that finds its range taken goes elsewhere in
  // turn, and the layout never recovers (the planner's replay of a 1.3B trainer's own graph:
  // 6% of copies at the layout's offsets, against 84% from an empty GPU). Copies the layout
  // has no offset for, or that are acquired, busy or pinned, stay. No planner: nothing.
  struct Settled {
    uint64_t moved = 0;        // to their layout offsets, within the GPU
    uint64_t demoted = 0;      // out of the GPU
    uint64_t demoted_bytes = 0;
  };
  absl::StatusOr<Settled> SettleIntoLayout(SessionId session);

  // Moves the tensor into `tier` (if not there) and keeps it there.
  absl::Status Pin(SessionId session, TensorId tensor, Tier tier);
  absl::Status Unpin(SessionId session, TensorId tensor);

  std::vector<LeaseView> List(std::optional<SessionId> session) const;
  LeaseStats Stats() const;
  // Checks invariants 1-4 for every session. For tests.
  absl::Status Validate() const;

 private:
  struct Tensor;
  struct Session;
  LeaseTable(TierStore& store, Mover& mover, Clock& clock) : store_(store), mover_(mover), clock_(clock) {}

  absl::StatusOr<std::shared_ptr<Session>> GetSession(SessionId id) const;
  // Finds the session and runs fn(session) with its lock held (the planner's hooks).
  absl::Status WithSessionLocked(SessionId id, absl::FunctionRef<void(Session&)> fn);
  // Finds the session and the tensor, holds the session's lock, runs fn(session, tensor).
  template <typename Result, typename Fn>
  Result OnTensor(SessionId session, TensorId tensor, Fn&& fn);
  absl::StatusOr<Tensor*> GetTensor(Session& s, TensorId id) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mutex);
  // What a placement does when the planner's layout has an offset for its tensor and that
  // range is taken: go elsewhere (the online allocator), or — a planned load, with
  // SetLayoutWait — fail with RESOURCE_EXHAUSTED while the tensors planned there before it
  // still hold it (the plan's lane retries once they have left).
  enum class LayoutRange { kOrElsewhere, kOrWait };
  // `tensor`: the one the room is for, when the planner's layout may have an offset for it.
  // While that tensor is busy (its caller's hands-off mark), a join within the GPU lets the
  // session's lock go as its copies move; a write-back made for room always does.
  absl::StatusOr<Extent> AllocateIn(Session& s, Tier tier, uint64_t bytes, bool evict,
                                    std::optional<TensorId> tensor = std::nullopt,
                                    LayoutRange when_taken = LayoutRange::kOrElsewhere)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mutex);
  // What holds [at, at + bytes) in `tier`, as LeaseStats::off_plan_by counts it (0-3): 2 or 3
  // when every copy there sits where the layout has it for the op the client is on (planned
  // tenants, which leave as the plan has it), so a planned load may wait for them.
  int RangeHolder(Session& s, Tier tier, uint64_t at, uint64_t bytes) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mutex);
  uint64_t UsedIn(Session& s, Tier tier) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mutex);
  void NotePeak(Session& s, Tier tier) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mutex);
  // Moves one copy out of `tier` (the planner's furthest next use, else clean first, then
  // least recently used), skipping `refused`: tensors whose write-back found no room below
  // (a full or fragmented lower tier) this time. Such a refusal adds the victim to `refused`
  // and returns OK, so the caller tries another.
  absl::Status EvictOne(Session& s, Tier tier, std::set<const Tensor*>& refused)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mutex);
  // With the planner's order of uses, room for `bytes` in a GPU or DRAM arena that has the free
  // bytes but no block for them (and no join made one): of the runs of evictable copies side
  // by side whose range, with the free space on either side, holds `bytes`, the one whose
  // soonest next use is furthest (then the fewest dirty bytes) loses its furthest-used copy
  // (as EvictOne moves it). Called again, it goes on with what is left of that run: the room
  // made is one block, where evicting by next use alone frees scattered blocks none of which
  // may hold `bytes`. NOT_FOUND with too few free bytes (EvictOne's case) or when no run
  // holds `bytes`.
  absl::Status EvictForBlock(Session& s, Tier tier, uint64_t bytes, std::set<const Tensor*>& refused)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mutex);
  // Writes back (dirty) or drops (clean) the copy of `victim` in `tier` and tells the room
  // observer; no room below for it: adds it to `refused` and returns OK (as EvictOne).
  absl::Status EvictCopy(Session& s, Tier tier, Tensor& victim, bool clean, std::set<const Tensor*>& refused)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mutex);
  // The copies in `tier`'s arena by offset (only this session's tensors live in it).
  struct HeldCopy {
    uint64_t begin, end;
    Tensor* tensor;
  };
  std::vector<HeldCopy> CopiesByOffset(Session& s, Tier tier) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mutex);
  // NVMe full (or too fragmented) for a copy made on demand: drops one NVMe copy of a
  // tensor that a tier above holds the same bytes of (the planner's furthest next use,
  // else the least recently used; none in flight). False when there is none.
  bool DropNvmeDuplicate(Session& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mutex);
  // Room goes by the planner's next uses (else clean first, then least recently used).
  static bool RanksUses(Session& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mutex);
  // A fragmented GPU or DRAM arena (the free bytes suffice, no free block does): moves the
  // fewest bytes of idle copies side by side (up to 4) whose free neighbours and themselves
  // make `bytes`, into free blocks elsewhere in the arena (within the session's segment or
  // region, instead of writing anything to the tier below); in DRAM, up to 8 such copies
  // may instead slide together to the window's low end when the gaps inside it make
  // `bytes`. Returns the offset of the joined block; RESOURCE_EXHAUSTED when no such move
  // joins enough.
  // `unlocked`: a move within the GPU lets the session's lock go while its bytes travel (the
  // caller holds the tensor it places busy, so nothing else places it meanwhile).
  absl::StatusOr<uint64_t> Relocate(Session& s, Tier tier, uint64_t bytes, bool unlocked)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mutex);
  // Whether tensor `id` is being moved or placed by a caller that let the lock go.
  static bool Busy(Session& s, TensorId id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mutex);
  // Moves t's copy in `tier` to `to` (a fresh extent of the same arena) and frees the old
  // range: DRAM by memcpy, the GPU over the Mover once the client's work on it is done.
  // `unlocked` (the GPU only): the session's lock is let go while the copy runs, t busy meanwhile;
  // the caller finds anything it holds by pointer again afterwards.
  absl::Status MoveWithin(Session& s, Tensor& t, Tier tier, const Extent& to, bool unlocked = false)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mutex);
  // Copies within the GPU, each tensor's to its `to` (a fresh extent of its arena), submitted
  // together (Mover::MoveAllAndWait) once the client's kernels on each are done; each that
  // moved leaves its old range free, each that did not stays. `unlocked`: as MoveWithin.
  // The first error, after all of them; `moved_count` (if given) += how many moved.
  struct WithinMove {
    Tensor* tensor;
    Extent to;
  };
  absl::Status MoveWithinGpu(Session& s, const std::vector<WithinMove>& moves, bool unlocked,
                             size_t* moved_count = nullptr) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mutex);
  // Moves t's DRAM copy down to `to_offset` in its arena, a range that may overlap its own
  // (the gap before it and part of itself): a memmove.
  absl::Status SlideWithin(Session& s, Tensor& t, Tier tier, uint64_t to_offset) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mutex);
  // A GPU copy the online allocator placed (its layout range was taken then) goes to the
  // layout's offset for the op the client is on, if that range is free now: the tensors one
  // op acquires together then sit where the layout keeps them apart, and cannot split the
  // room the op's largest tensor needs. Nothing happens when t is in use or moving, or while
  // the client's kernels on it may still run (its acquire would wait for them). The copy runs
  // with the session's lock let go (t busy), as a join's moves do. An error
  // only when the client's last GPU work on t failed (or the device copy did): the copy
  // stays where it was.
  absl::Status Rehome(Session& s, Tensor& t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mutex);
  absl::StatusOr<Placement> AcquireLocked(Session& s, Tensor& t, Access access, Place place)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mutex);
  absl::Status ReleaseLocked(Session& s, Tensor& t, std::unique_ptr<GpuFence> gpu_fence)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mutex);
  // Counts the stretch s.mutex was held since s.held_since (before letting it go).
  void NoteHeld(Session& s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mutex);
  // Waits for the client's pending GPU work on t's GPU copy, if any.
  absl::Status SettleGpuCopy(Tensor& t);
  // The same with s.mutex let go while the GPU works (the caller holds t.busy, so nobody else
  // touches t): the session's other acquires and releases go on meanwhile. A planned move
  // of a tensor whose kernels are still queued would otherwise hold every request of the
  // session until the GPU caught up with the host.
  absl::Status SettleGpuCopyUnlocked(Session& s, Tensor& t) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mutex);
  // Lets s.mutex go while the bytes move; the caller holds t.busy.
  absl::Status CopyTo(Session& s, Tensor& t, Tier tier, bool evict = true,
                      LayoutRange when_taken = LayoutRange::kOrElsewhere) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mutex);
  void DropCopy(Session& s, Tensor& t, Tier tier) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mutex);
  std::string Occupancy(Session& s, Tier tier) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(s.mutex);
  std::optional<Tier> PinFor(const std::string& name) const;

  TierStore& store_;
  Mover& mover_;
  Clock& clock_;
  std::vector<std::pair<std::regex, Tier>> pins_;
  std::vector<std::pair<std::regex, int>> priorities_;
  ThrashOptions thrash_;
  bool layout_wait_ = false;
  // After a demand fetch back into `tier` of a copy evicted from it for room: counts the
  // refetch, and (ThrashOptions::lock) locks a thrashing tensor in the warm-up.
  void NoteRefetch(Session& s, Tensor& t, Tier tier);
  int PriorityFor(const std::string& name) const;

  mutable absl::Mutex mutex_;
  // shared_ptr: an operation in flight keeps its session alive while CloseSession runs.
  std::map<SessionId, std::shared_ptr<Session>> sessions_ ABSL_GUARDED_BY(mutex_);
  SessionId next_session_ ABSL_GUARDED_BY(mutex_) = 1;
  mutable absl::Mutex stats_mutex_;
  LeaseStats stats_ ABSL_GUARDED_BY(stats_mutex_);
  // The hot path's timings (LeaseStats' release_*, held_*, relocate_nanos): relaxed atomics,
  // so counting them adds no lock shared by every session to each request.
  struct Timings {
    std::atomic<uint64_t> releases{0}, fence_waits{0};
    std::atomic<int64_t> release_nanos{0}, release_lock_nanos{0}, release_fence_wait_nanos{0};
    std::array<std::atomic<int64_t>, 5> held_nanos{}, held_max_nanos{};
    std::array<std::atomic<int64_t>, 3> relocate_nanos{};
  };
  mutable Timings timings_;
};

}  // namespace tierd

#endif  // TIERD_RUNTIME_LEASE_TABLE_H_
