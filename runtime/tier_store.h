// TierStore: the storage engine's three tiers and their allocators.
//   gpu  - one IPC-exportable GPU region (GpuDevice::AllocateRegion)
//   dram - one shared-memory segment, pinned for the GPU (DramSegment)
//   nvme - one O_DIRECT file, space reserved at start (NvmeFile)
// Each tier hands out Extents from its own OffsetAllocator. Budgets are hard: Open
// refuses budgets the machine cannot give, Allocate refuses what does not fit, both
// with RESOURCE_EXHAUSTED and a message naming the tier and the numbers.
//
// It also keeps the checksums of NVMe extents (ZFS-style, in the parent rather than
// next to the data, so a misdirected or lost write is caught too): set by the mover
// after a write, checked after every read, dropped when the extent is freed.
//
// Thread-safety: all methods are thread-safe (a lock per tier).
#ifndef TIERD_RUNTIME_TIER_STORE_H_
#define TIERD_RUNTIME_TIER_STORE_H_

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/base/thread_annotations.h"
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
  uint64_t gpu_bytes = 0;   // 0: no GPU tier
  uint64_t dram_bytes = 0;  // 0: no DRAM tier
  // MemAvailable kept for the system and the trainers' own memory.
  uint64_t dram_headroom_bytes = uint64_t{1} << 30;
  std::string nvme_directory;  // empty: no NVMe tier
  uint64_t nvme_bytes = 0;
  // Names the shm segment and NVMe file; unique per daemon ("tierd-<pid>").
  std::string instance_name;
  // Tests pretend to be a smaller host.
  std::optional<HostMemoryInfo> host_memory;
};

struct TierStats {
  uint64_t budget_bytes = 0;
  AllocatorStats allocator;
};

class TierStore {
 public:
  // `gpu` must outlive the store.
  static absl::StatusOr<std::unique_ptr<TierStore>> Open(const TierStoreOptions& options,
                                                         GpuDevice& gpu);
  ~TierStore();

  bool HasTier(Tier tier) const { return tiers_[Index(tier)].allocator != nullptr; }
  absl::StatusOr<Extent> Allocate(Tier tier, uint64_t bytes);
  absl::Status Free(const Extent& extent);
  TierStats Stats(Tier tier) const;

  // Address of an extent's first byte: a device address for the GPU tier, a host
  // address (in the shared segment) for DRAM. Not for NVMe.
  uint8_t* Address(const Extent& extent) const;

  GpuDevice& gpu() const { return gpu_; }
  const GpuRegion* gpu_region() const { return gpu_region_.get(); }
  const DramSegment* dram() const { return dram_.get(); }
  const NvmeFile* nvme() const { return nvme_.get(); }

  // NVMe checksums, one CRC32C per NVMe chunk of the extent.
  void SetNvmeChecksums(uint64_t nvme_offset, std::vector<uint32_t> checksums);
  // NOT_FOUND if the extent at `nvme_offset` holds no written data.
  absl::StatusOr<std::vector<uint32_t>> NvmeChecksums(uint64_t nvme_offset) const;

 private:
  struct TierState {
    mutable absl::Mutex mutex;
    std::unique_ptr<OffsetAllocator> allocator ABSL_PT_GUARDED_BY(mutex);
    uint64_t budget_bytes = 0;
  };
  static int Index(Tier tier) { return static_cast<int>(tier); }
  explicit TierStore(GpuDevice& gpu) : gpu_(gpu) {}
  absl::Status OpenTiers(const TierStoreOptions& options);

  GpuDevice& gpu_;
  std::unique_ptr<GpuRegion> gpu_region_;
  std::unique_ptr<DramSegment> dram_;
  std::unique_ptr<NvmeFile> nvme_;
  std::array<TierState, kTierCount> tiers_;
  mutable absl::Mutex checksum_mutex_;
  std::unordered_map<uint64_t, std::vector<uint32_t>> nvme_checksums_
      ABSL_GUARDED_BY(checksum_mutex_);
};

}  // namespace tierd

#endif  // TIERD_RUNTIME_TIER_STORE_H_
