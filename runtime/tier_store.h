// TierStore: the storage engine's three tiers, as arenas carved from node budgets.
//   gpu  - arenas are IPC-exportable GPU regions (GpuDevice::AllocateRegion), one pool each
//   dram - arenas are shared-memory segments, pinned for the GPU (DramSegment)
//   nvme - one arena: an O_DIRECT file, space reserved at start (NvmeFile)
// Each arena hands out Extents from its own OffsetAllocator. Budgets are hard: Open
// refuses budgets the machine cannot give; CreateArena refuses arenas beyond the node
// budget; Allocate refuses what does not fit; all with RESOURCE_EXHAUSTED and a message
// naming the tier and the numbers.
//
// With options.default_arenas, Open also creates one GPU and one DRAM arena spanning
// each budget (benchmarks, tools); the daemon instead creates an arena per session.
//
// It also keeps the checksums of NVMe extents (ZFS-style, in the parent rather than
// next to the data, so a misdirected or lost write is caught too): set by the mover
// after a write, checked after every read, dropped when the extent is freed.
//
// Thread-safety: all methods are thread-safe. An arena must not be destroyed while
// moves into or out of it are in flight (the caller drains them first).
#ifndef TIERD_RUNTIME_TIER_STORE_H_
#define TIERD_RUNTIME_TIER_STORE_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "allocator/offset_allocator.h"
#include "runtime/dram_segment.h"
#include "runtime/gpu_device.h"
#include "runtime/host_memory.h"
#include "runtime/nvme_file.h"
#include "runtime/tier.h"

namespace tierd {

struct TierStoreOptions {
  uint64_t gpu_bytes = 0;   // GPU budget; 0: no GPU tier
  uint64_t dram_bytes = 0;  // DRAM budget; 0: no DRAM tier
  // MemAvailable kept for the system and the trainers' own memory.
  uint64_t dram_headroom_bytes = uint64_t{1} << 30;
  std::string nvme_directory;  // empty: no NVMe tier
  uint64_t nvme_bytes = 0;
  // Names shm segments and the NVMe file; unique per daemon ("tierd-<pid>").
  std::string instance_name;
  // One GPU and one DRAM arena spanning the budgets, created at Open.
  bool default_arenas = true;
  // Tests pretend to be a smaller host.
  std::optional<HostMemoryInfo> host_memory;
};

struct TierStats {
  uint64_t budget_bytes = 0;
  uint64_t reserved_bytes = 0;  // by arenas
  uint64_t arena_count = 0;
  AllocatorStats allocator;     // summed over arenas; largest free block is the max
  uint64_t peak_used_bytes = 0;  // the most this tier has held at once since start
};

class TierStore {
 public:
  // `gpu` must outlive the store.
  static absl::StatusOr<std::unique_ptr<TierStore>> Open(const TierStoreOptions& options,
                                                         GpuDevice& gpu);
  ~TierStore();

  bool HasTier(Tier tier) const { return budgets_[Index(tier)] > 0; }

  // A new GPU or DRAM arena of `bytes` (DRAM: rounded up to 4 KiB). `label` names the
  // shm segment ("<instance>-<label>"). RESOURCE_EXHAUSTED beyond the node budget.
  absl::StatusOr<ArenaId> CreateArena(Tier tier, uint64_t bytes, const std::string& label);
  // Frees the arena and everything in it (the caller has no moves in flight there).
  absl::Status DestroyArena(ArenaId arena);
  // The default arena of a tier (the NVMe arena for kNvme), or kNoArena.
  ArenaId DefaultArena(Tier tier) const { return default_arenas_[Index(tier)]; }

  absl::StatusOr<Extent> Allocate(ArenaId arena, uint64_t bytes);
  // At a fixed offset in the arena (a planned placement): OffsetAllocator::AllocateAt.
  absl::StatusOr<Extent> AllocateAt(ArenaId arena, uint64_t offset, uint64_t bytes);
  // As high in the arena as it fits (a copy off the planned layout): AllocateHighest.
  absl::StatusOr<Extent> AllocateHighest(ArenaId arena, uint64_t bytes);
  absl::StatusOr<Extent> Allocate(Tier tier, uint64_t bytes) {
    return Allocate(DefaultArena(tier), bytes);
  }
  absl::Status Free(const Extent& extent);
  TierStats Stats(Tier tier) const;
  AllocatorStats ArenaStats(ArenaId arena) const;

  // Address of an extent's first byte: a device address for the GPU tier, a host
  // address (in the arena's shared segment) for DRAM. Not for NVMe.
  uint8_t* Address(const Extent& extent) const;

  GpuDevice& gpu() const { return gpu_; }
  // The region / segment behind an arena (null if the arena is not of that tier).
  const GpuRegion* gpu_region(ArenaId arena) const;
  const DramSegment* dram_segment(ArenaId arena) const;
  // Of the default arenas.
  const GpuRegion* gpu_region() const { return gpu_region(DefaultArena(Tier::kGpu)); }
  const DramSegment* dram() const { return dram_segment(DefaultArena(Tier::kDram)); }
  const NvmeFile* nvme() const { return nvme_.get(); }

  // NVMe checksums, one CRC32C per NVMe chunk of the extent.
  void SetNvmeChecksums(uint64_t nvme_offset, std::vector<uint32_t> checksums);
  // NOT_FOUND if the extent at `nvme_offset` holds no written data.
  absl::StatusOr<std::vector<uint32_t>> NvmeChecksums(uint64_t nvme_offset) const;

 private:
  struct Arena {
    Tier tier;
    uint64_t bytes = 0;
    uint8_t* base = nullptr;  // null for NVMe
    std::unique_ptr<GpuRegion> gpu_region;
    std::unique_ptr<DramSegment> dram_segment;
    mutable absl::Mutex mutex;
    std::unique_ptr<OffsetAllocator> allocator ABSL_PT_GUARDED_BY(mutex);
  };
  static int Index(Tier tier) { return static_cast<int>(tier); }
  explicit TierStore(GpuDevice& gpu) : gpu_(gpu) {}
  absl::Status OpenTiers(const TierStoreOptions& options);
  absl::StatusOr<ArenaId> AddArena(std::unique_ptr<Arena> arena);
  Arena* Find(ArenaId id) const;
  absl::StatusOr<Extent> AllocateWith(ArenaId id,
                                      absl::FunctionRef<absl::StatusOr<Allocation>(OffsetAllocator&)> take);

  GpuDevice& gpu_;
  std::string instance_name_;
  std::array<uint64_t, kTierCount> budgets_{};
  std::array<ArenaId, kTierCount> default_arenas_{};
  std::unique_ptr<NvmeFile> nvme_;

  mutable absl::Mutex arenas_mutex_;
  // Arenas live in unique_ptrs: a pointer from Find stays valid until DestroyArena.
  std::map<ArenaId, std::unique_ptr<Arena>> arenas_ ABSL_GUARDED_BY(arenas_mutex_);
  std::array<uint64_t, kTierCount> reserved_ ABSL_GUARDED_BY(arenas_mutex_){};
  ArenaId next_arena_ ABSL_GUARDED_BY(arenas_mutex_) = 1;
  // Per tier: bytes held now and at most, across arenas (atomics: allocate and free
  // take only their arena's lock).
  std::atomic<uint64_t> used_bytes_[kTierCount] = {0, 0, 0};
  std::atomic<uint64_t> peak_used_bytes_[kTierCount] = {0, 0, 0};


  mutable absl::Mutex checksum_mutex_;
  std::unordered_map<uint64_t, std::vector<uint32_t>> nvme_checksums_
      ABSL_GUARDED_BY(checksum_mutex_);
};

}  // namespace tierd

#endif  // TIERD_RUNTIME_TIER_STORE_H_
