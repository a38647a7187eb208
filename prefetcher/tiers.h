// Below the GPU: where evicted bytes go and where loads come from. DRAM first; NVMe when
// DRAM is full, choosing what to push down by furthest next use at the DRAM level (the
// same MIN rule, over the sequence of DRAM reads and write-backs the GPU plan implies).
//
// Model (one steady-state lap, like the GPU plan):
//   - a GPU write-back puts the tensor's bytes in DRAM (its NVMe copy, if any, is stale);
//   - a GPU load reads the tensor from DRAM; if DRAM does not hold it, it is first staged
//     from NVMe into DRAM; with exclusive loads (LowerTierOptions), a load the GPU keeps
//     until it changes the tensor drops the DRAM copy once it has landed;
//   - a write on the GPU (or a dead value dropped) makes the copies below stale: freed;
//   - an op on the host uses the DRAM copy (staged from NVMe first if DRAM lacks it); a
//     host write makes the NVMe copy stale;
//   - to make room in DRAM a copy is dropped if NVMe holds the same bytes (or the value is
//     dead), otherwise pushed down to NVMe first. Nothing is ever lost: checked by replay.
#ifndef TIERD_PREFETCHER_TIERS_H_
#define TIERD_PREFETCHER_TIERS_H_

#include <atomic>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "prefetcher/graph.h"
#include "prefetcher/residency.h"

namespace tierd::prefetcher {

enum class LowerKind : uint8_t {
  kWriteBack,   // GPU -> DRAM (the GPU eviction's write-back lands here)
  kRead,        // DRAM -> GPU (the GPU load reads from here)
  kStage,       // NVMe -> DRAM, before a kRead of a tensor DRAM does not hold
  kPushDown,    // DRAM -> NVMe, to make room (DRAM held the only copy below the GPU)
  kDrop,        // a DRAM copy freed: to make room (NVMe has the bytes, or they are dead), or
                // after an exclusive load (the GPU holds the bytes and will change them)
  kInvalidate,  // the GPU wrote the tensor: copies below are stale and freed
  kDropNvme,    // an NVMe copy freed (DRAM holds the same bytes); closing a lap only
  kHostRead,    // an op on the host reads the DRAM copy (staged first if DRAM lacks it)
  kHostWrite,   // an op on the host changes the DRAM copy: the NVMe copy is stale, freed
  kHostOverwrite,  // an op on the host writes a DRAM copy whole: room, nothing staged
  kDiscard,     // a value dead after its host use: its copies below freed once that op is
                // over (an event of the op after it), nothing written
};
const char* LowerKindName(LowerKind kind);

struct LowerEvent {
  uint32_t op = 0;  // the op whose GPU moves this serves (happens before the op runs)
  LowerKind kind = LowerKind::kRead;
  TensorIndex tensor = 0;
};

struct LowerTierPlan {
  std::vector<LowerEvent> events;  // one steady-state lap, in order
  std::vector<bool> dram_at_start, nvme_at_start;  // per tensor: valid copies entering op 0
  uint64_t nvme_read_bytes = 0;    // per iteration
  uint64_t nvme_write_bytes = 0;
  uint64_t peak_dram_bytes = 0;
  uint64_t peak_nvme_bytes = 0;
};

// RESOURCE_EXHAUSTED naming the tier and the numbers when a tensor cannot fit in DRAM even
// alone, or when the NVMe copies would exceed `nvme_budget_bytes`. MIN at the DRAM level
// usually settles into a one-lap cycle within a few laps; when it does not (it can
// oscillate), the last lap is closed by hand: moves appended at its end take the state it
// ends in back to the one it started from.
struct LowerTierOptions {
  // 0: MIN picks what to push down (furthest next use). Above 0: among the copies that need a
  // push-down too, are no smaller and are next used at least (1 - slack) as far ahead as
  // MIN's victim, the one whose latest use is oldest (victims chosen by time as well as by
  // next use: its NVMe write and the read that brings it back land in quieter parts of the
  // lap than MIN's just-written victim). PlanBest simulates both and keeps the faster.
  double victim_slack = 0;
  // A load the GPU keeps until it changes the tensor (optimizer state brought up for its
  // update) drops the DRAM copy once it has landed (a kDrop after its kRead): the room is
  // free for stages that much earlier, at no cost in traffic (the write would make the copy
  // stale anyway). Off: the copy stays until the write.
  bool exclusive_loads = false;
  // Once set (by another thread): stops at the next demand with CANCELLED.
  const std::atomic<bool>* cancel = nullptr;
};
absl::StatusOr<LowerTierPlan> PlanLowerTiers(const Graph& graph, const ResidencyPlan& gpu_plan,
                                             uint64_t dram_budget_bytes, uint64_t nvme_budget_bytes,
                                             const LowerTierOptions& options = {});

// Moves each stage (NVMe -> DRAM) as early in the lap as DRAM room allows without evicting
// anything more: to the earliest event after which, up to its old place, DRAM holds it and
// everything the plan keeps there within the budget, and never before another event of the
// same tensor. Bytes moved do not change; NVMe reads leave the phases where DRAM is full
// (the optimizer step) for earlier ones where room is free (the backward, as activations
// die). Returns how many stages moved. PlanLowerTiers applies it.
int HoistStages(const Graph& graph, LowerTierPlan& plan, uint64_t dram_budget_bytes);

// Replays both plans together and checks: every GPU load finds its bytes in DRAM, every
// clean GPU drop leaves a valid copy below, nothing pushed down or dropped is the only copy
// of a live value, and the DRAM and NVMe budgets hold after every event. For tests.
absl::Status ReplayLowerTiers(const Graph& graph, const ResidencyPlan& gpu_plan, const LowerTierPlan& plan,
                              uint64_t dram_budget_bytes, uint64_t nvme_budget_bytes);

}  // namespace tierd::prefetcher

#endif  // TIERD_PREFETCHER_TIERS_H_
