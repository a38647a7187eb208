// The records behind LeaseTable (lease_table.h). Private to the runtime package.
#ifndef TIERD_RUNTIME_LEASE_TABLE_INTERNAL_H_
#define TIERD_RUNTIME_LEASE_TABLE_INTERNAL_H_

#include <array>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "runtime/lease_table.h"

namespace tierd {

struct LeaseTable::Tensor {
  TensorId id = 0;
  TensorSpec spec;
  uint64_t bytes = 0;
  std::array<std::optional<Extent>, kTierCount> copies;  // invariant 1
  std::optional<Tier> pinned;
  int priority = 0;  // eviction priority (PriorityRule): a lower one goes first
  // ThrashOptions: per tier, whether its copy there was evicted for room and has not come back
  // since, and how often a demand fetch brought it back after such an eviction.
  std::array<bool, kTierCount> evicted_for_room{};
  std::array<uint32_t, kTierCount> refetches{};
  bool thrash_locked = false;
  bool lock_given_up = false;  // its thrash lock was let go for room: never locked again
  uint32_t acquired = 0;
  Tier acquired_tier = Tier::kGpu;
  bool written = false;   // some copy holds bytes the client wrote
  int busy = 0;           // being moved (the session lock is let go meanwhile): hands off
  // The plan declared its value dead (its next use overwrites it) and dropped every copy:
  // only an ACCESS_OVERWRITE acquire may have it back.
  bool discarded = false;
  int64_t last_write_nanos = -1;  // the clock at its latest write or overwrite acquire
  uint64_t last_use = 0;  // session tick of the last acquire or release
  // The client's GPU work on the GPU copy, still maybe running after its release: waited
  // for before the daemon reads that copy or frees its memory.
  std::unique_ptr<GpuFence> gpu_fence;

  bool Has(Tier tier) const { return copies[static_cast<int>(tier)].has_value(); }
  int CopyCount() const {
    int n = 0;
    for (const auto& c : copies) n += c.has_value();
    return n;
  }
};

// Which request holds a session's lock (for LeaseStats::held_nanos): each entry point names
// itself for the calls it makes on its thread.
enum class HoldKind { kAcquire = 0, kRelease = 1, kPrefetch = 2, kDemote = 3, kOther = 4 };
inline thread_local HoldKind current_hold = HoldKind::kOther;
struct HoldScope {
  explicit HoldScope(HoldKind kind) : saved(current_hold) { current_hold = kind; }
  ~HoldScope() { current_hold = saved; }
  HoldKind saved;
};

struct LeaseTable::Session {
  absl::Mutex mutex;
  int64_t held_since ABSL_GUARDED_BY(mutex) = 0;  // when this hold of the lock began
  SessionId id = 0;
  std::string label;
  SessionQuota quota;
  ArenaId gpu_arena = kNoArena;
  ArenaId dram_arena = kNoArena;
  uint64_t nvme_used ABSL_GUARDED_BY(mutex) = 0;
  std::array<uint64_t, kTierCount> peak ABSL_GUARDED_BY(mutex) = {};  // since open or the last reset
  std::map<TensorId, std::unique_ptr<Tensor>> tensors ABSL_GUARDED_BY(mutex);
  std::map<std::string, TensorId> by_name ABSL_GUARDED_BY(mutex);
  TensorId next_tensor ABSL_GUARDED_BY(mutex) = 1;
  uint64_t tick ABSL_GUARDED_BY(mutex) = 0;
  uint64_t acquires ABSL_GUARDED_BY(mutex) = 0;  // ThrashOptions' warm-up
  std::array<uint64_t, kTierCount> thrash_locked_bytes ABSL_GUARDED_BY(mutex) = {};
  bool closed ABSL_GUARDED_BY(mutex) = false;
  int moving ABSL_GUARDED_BY(mutex) = 0;             // copies in flight (lock let go)
  uint64_t moves_done ABSL_GUARDED_BY(mutex) = 0;    // copies finished, to wake waiters
  // The planner, when a graph is registered (shared: an acquire waiting for a planned move
  // keeps it while the lock is let go).
  std::shared_ptr<SessionPlanner> planner ABSL_GUARDED_BY(mutex);

  ArenaId ArenaOf(Tier tier) const { return tier == Tier::kGpu ? gpu_arena : dram_arena; }
};

template <typename Result, typename Fn>
Result LeaseTable::OnTensor(SessionId session_id, TensorId tensor_id, Fn&& fn) {
  auto session = GetSession(session_id);
  if (!session.ok()) return session.status();
  Session& s = **session;
  absl::MutexLock lock(&s.mutex);
  auto tensor = GetTensor(s, tensor_id);
  if (!tensor.ok()) return tensor.status();
  // Another thread may be moving this tensor with the lock let go: wait for it to land.
  Tensor* t = *tensor;
  s.mutex.Await(absl::Condition(+[](Tensor* x) { return x->busy == 0; }, t));
  if (s.closed) return absl::NotFoundError("the session closed");
  s.held_since = clock_.NowNanos();
  Result result = fn(s, *t);
  NoteHeld(s);
  return result;
}

}  // namespace tierd

#endif  // TIERD_RUNTIME_LEASE_TABLE_INTERNAL_H_
