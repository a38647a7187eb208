#include "runtime/tier_store.h"

#include "absl/strings/str_format.h"
#include "base/check.h"
#include "base/limits.h"
#include "base/units.h"

namespace tierd {
namespace {

uint64_t AlignmentOf(Tier tier) {
  return tier == Tier::kGpu ? limits::kGpuAlignmentBytes : limits::kDirectIoAlignmentBytes;
}

}  // namespace

absl::StatusOr<std::unique_ptr<TierStore>> TierStore::Open(const TierStoreOptions& options,
                                                           GpuDevice& gpu) {
  if (options.instance_name.empty()) return absl::InvalidArgumentError("instance_name is empty");
  std::unique_ptr<TierStore> store(new TierStore(gpu));
  if (absl::Status status = store->OpenTiers(options); !status.ok()) return status;
  return store;
}

absl::Status TierStore::OpenTiers(const TierStoreOptions& options) {
  // Check every budget the host cannot give before taking anything.
  if (options.dram_bytes > 0) {
    HostMemoryInfo info;
    if (options.host_memory) {
      info = *options.host_memory;
    } else {
      auto read = ReadHostMemoryInfo();
      if (!read.ok()) return read.status();
      info = *read;
    }
    if (absl::Status s = CheckDramBudget(options.dram_bytes, options.dram_headroom_bytes, info);
        !s.ok()) {
      return s;
    }
  }
  if (options.nvme_bytes > 0) {
    if (options.nvme_directory.empty()) {
      return absl::InvalidArgumentError("nvme tier: a budget was given but no directory");
    }
    const uint64_t bytes = AlignUp(options.nvme_bytes, limits::kDirectIoAlignmentBytes);
    auto file = NvmeFile::Create(options.nvme_directory, options.instance_name + "-nvme", bytes);
    if (!file.ok()) return file.status();
    nvme_ = std::move(*file);
  }
  if (options.gpu_bytes > 0) {
    auto region = gpu_.AllocateRegion(options.gpu_bytes);
    if (!region.ok()) return region.status();
    gpu_region_ = std::move(*region);
  }
  if (options.dram_bytes > 0) {
    const uint64_t bytes = AlignUp(options.dram_bytes, limits::kDirectIoAlignmentBytes);
    auto segment = DramSegment::Create(options.instance_name + "-dram", bytes, &gpu_);
    if (!segment.ok()) return segment.status();
    dram_ = std::move(*segment);
  }
  auto make = [this](Tier tier, uint64_t bytes) {
    TierState& state = tiers_[Index(tier)];
    absl::MutexLock lock(&state.mutex);
    state.budget_bytes = bytes;
    state.allocator = std::make_unique<OffsetAllocator>(bytes, AlignmentOf(tier),
                                                        limits::kAllocationsPerTierMax);
  };
  if (gpu_region_) make(Tier::kGpu, gpu_region_->bytes());
  if (dram_) make(Tier::kDram, dram_->bytes());
  if (nvme_) make(Tier::kNvme, nvme_->bytes());
  return absl::OkStatus();
}

TierStore::~TierStore() = default;

absl::StatusOr<Extent> TierStore::Allocate(Tier tier, uint64_t bytes) {
  TierState& state = tiers_[Index(tier)];
  absl::MutexLock lock(&state.mutex);
  if (state.allocator == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrFormat("%s tier: not configured (its budget is 0)", TierName(tier)));
  }
  auto allocation = state.allocator->Allocate(bytes);
  if (!allocation.ok()) {
    return absl::Status(allocation.status().code(),
                        absl::StrFormat("%s tier (budget %s): %s", TierName(tier),
                                        FormatBytes(state.budget_bytes),
                                        allocation.status().message()));
  }
  return Extent{tier, *allocation};
}

absl::Status TierStore::Free(const Extent& extent) {
  TierState& state = tiers_[Index(extent.tier)];
  {
    absl::MutexLock lock(&state.mutex);
    if (state.allocator == nullptr) {
      return absl::FailedPreconditionError(
          absl::StrFormat("%s tier: not configured", TierName(extent.tier)));
    }
    if (absl::Status status = state.allocator->Free(extent.allocation); !status.ok()) {
      return absl::Status(status.code(),
                          absl::StrFormat("%s tier: %s", TierName(extent.tier), status.message()));
    }
  }
  if (extent.tier == Tier::kNvme) {
    absl::MutexLock lock(&checksum_mutex_);
    nvme_checksums_.erase(extent.offset());
  }
  return absl::OkStatus();
}

TierStats TierStore::Stats(Tier tier) const {
  const TierState& state = tiers_[Index(tier)];
  absl::MutexLock lock(&state.mutex);
  TierStats stats;
  stats.budget_bytes = state.budget_bytes;
  if (state.allocator != nullptr) stats.allocator = state.allocator->Stats();
  return stats;
}

uint8_t* TierStore::Address(const Extent& extent) const {
  TIERD_CHECK(extent.tier != Tier::kNvme);
  if (extent.tier == Tier::kGpu) {
    TIERD_CHECK(gpu_region_ != nullptr && extent.offset() + extent.bytes() <= gpu_region_->bytes());
    return static_cast<uint8_t*>(gpu_region_->base()) + extent.offset();
  }
  TIERD_CHECK(dram_ != nullptr && extent.offset() + extent.bytes() <= dram_->bytes());
  return dram_->base() + extent.offset();
}

void TierStore::SetNvmeChecksums(uint64_t nvme_offset, std::vector<uint32_t> checksums) {
  absl::MutexLock lock(&checksum_mutex_);
  nvme_checksums_[nvme_offset] = std::move(checksums);
}

absl::StatusOr<std::vector<uint32_t>> TierStore::NvmeChecksums(uint64_t nvme_offset) const {
  absl::MutexLock lock(&checksum_mutex_);
  auto it = nvme_checksums_.find(nvme_offset);
  if (it == nvme_checksums_.end()) {
    return absl::NotFoundError(absl::StrFormat(
        "nvme tier: the extent at offset %d holds no written data", nvme_offset));
  }
  return it->second;
}

}  // namespace tierd
