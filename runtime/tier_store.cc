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
  instance_name_ = options.instance_name;
  // Check every budget the machine cannot give before taking anything.
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
  if (options.gpu_bytes > 0) {
    auto free_bytes = gpu_.FreeBytes();
    if (!free_bytes.ok()) return free_bytes.status();
    if (options.gpu_bytes > *free_bytes) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "gpu tier: budget %s exceeds the free GPU memory (%s free on %s)",
          FormatBytes(options.gpu_bytes), FormatBytes(*free_bytes), gpu_.Describe()));
    }
  }
  budgets_[Index(Tier::kGpu)] = options.gpu_bytes;
  budgets_[Index(Tier::kDram)] = AlignUp(options.dram_bytes, limits::kDirectIoAlignmentBytes);
  if (options.nvme_bytes > 0) {
    if (options.nvme_directory.empty()) {
      return absl::InvalidArgumentError("nvme tier: a budget was given but no directory");
    }
    const uint64_t bytes = AlignUp(options.nvme_bytes, limits::kDirectIoAlignmentBytes);
    auto file = NvmeFile::Create(options.nvme_directory, options.instance_name + "-nvme", bytes);
    if (!file.ok()) return file.status();
    nvme_ = std::move(*file);
    budgets_[Index(Tier::kNvme)] = bytes;
    auto arena = std::make_unique<Arena>();
    arena->tier = Tier::kNvme;
    arena->bytes = bytes;
    auto id = AddArena(std::move(arena));
    if (!id.ok()) return id.status();
    default_arenas_[Index(Tier::kNvme)] = *id;
  }
  if (!options.default_arenas) return absl::OkStatus();
  for (Tier tier : {Tier::kGpu, Tier::kDram}) {
    if (budgets_[Index(tier)] == 0) continue;
    auto id = CreateArena(tier, budgets_[Index(tier)], TierName(tier));
    if (!id.ok()) return id.status();
    default_arenas_[Index(tier)] = *id;
  }
  return absl::OkStatus();
}

TierStore::~TierStore() = default;

absl::StatusOr<ArenaId> TierStore::AddArena(std::unique_ptr<Arena> arena) {
  arena->allocator = std::make_unique<OffsetAllocator>(arena->bytes, AlignmentOf(arena->tier),
                                                       limits::kAllocationsPerTierMax);
  absl::MutexLock lock(&arenas_mutex_);
  const ArenaId id = next_arena_++;
  arenas_[id] = std::move(arena);
  return id;
}

absl::StatusOr<ArenaId> TierStore::CreateArena(Tier tier, uint64_t bytes, const std::string& label) {
  if (tier == Tier::kNvme) return absl::InvalidArgumentError("the NVMe tier has one arena");
  if (bytes == 0) return absl::InvalidArgumentError(absl::StrFormat("%s arena of 0 bytes", TierName(tier)));
  if (tier == Tier::kDram) bytes = AlignUp(bytes, limits::kDirectIoAlignmentBytes);
  {
    // Reserve first, so concurrent creations cannot overshoot the budget together.
    absl::MutexLock lock(&arenas_mutex_);
    const uint64_t budget = budgets_[Index(tier)];
    if (bytes > budget - reserved_[Index(tier)]) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "%s tier: an arena of %s does not fit the node budget (%s, of which %s is already "
          "reserved by other sessions)",
          TierName(tier), FormatBytes(bytes), FormatBytes(budget), FormatBytes(reserved_[Index(tier)])));
    }
    reserved_[Index(tier)] += bytes;
  }
  auto arena = std::make_unique<Arena>();
  arena->tier = tier;
  arena->bytes = bytes;
  absl::Status status;
  if (tier == Tier::kGpu) {
    auto region = gpu_.AllocateRegion(bytes);
    if (region.ok()) {
      arena->base = static_cast<uint8_t*>((*region)->base());
      arena->gpu_region = std::move(*region);
    } else {
      status = region.status();
    }
  } else {
    auto segment = DramSegment::Create(instance_name_ + "-" + label, bytes, &gpu_);
    if (segment.ok()) {
      arena->base = (*segment)->base();
      arena->dram_segment = std::move(*segment);
    } else {
      status = segment.status();
    }
  }
  if (!status.ok()) {
    absl::MutexLock lock(&arenas_mutex_);
    reserved_[Index(tier)] -= bytes;
    return status;
  }
  return AddArena(std::move(arena));
}

absl::Status TierStore::DestroyArena(ArenaId id) {
  std::unique_ptr<Arena> arena;
  {
    absl::MutexLock lock(&arenas_mutex_);
    auto it = arenas_.find(id);
    if (it == arenas_.end() || it->second->tier == Tier::kNvme) {
      return absl::NotFoundError(absl::StrFormat("no GPU or DRAM arena %d", id));
    }
    arena = std::move(it->second);
    arenas_.erase(it);
    reserved_[Index(arena->tier)] -= arena->bytes;
  }
  {
    // What the arena still held leaves the tier with it (or the tier's use, and its peak,
    // would count every closed session's bytes on top of the next one's).
    absl::MutexLock lock(&arena->mutex);
    used_bytes_[Index(arena->tier)].fetch_sub(arena->allocator->Stats().used_bytes);
  }
  for (ArenaId& default_arena : default_arenas_) {
    if (default_arena == id) default_arena = kNoArena;
  }
  return absl::OkStatus();  // the region or segment goes with `arena`
}

TierStore::Arena* TierStore::Find(ArenaId id) const {
  absl::MutexLock lock(&arenas_mutex_);
  auto it = arenas_.find(id);
  return it == arenas_.end() ? nullptr : it->second.get();
}

absl::StatusOr<Extent> TierStore::Allocate(ArenaId id, uint64_t bytes) {
  return AllocateWith(id, [bytes](OffsetAllocator& a) { return a.Allocate(bytes); });
}

absl::StatusOr<Extent> TierStore::AllocateAt(ArenaId id, uint64_t offset, uint64_t bytes) {
  return AllocateWith(id, [offset, bytes](OffsetAllocator& a) { return a.AllocateAt(offset, bytes); });
}

absl::StatusOr<Extent> TierStore::AllocateHighest(ArenaId id, uint64_t bytes) {
  return AllocateWith(id, [bytes](OffsetAllocator& a) { return a.AllocateHighest(bytes); });
}

absl::StatusOr<Extent> TierStore::AllocateWith(ArenaId id,
                                               absl::FunctionRef<absl::StatusOr<Allocation>(OffsetAllocator&)> take) {
  Arena* arena = Find(id);
  if (arena == nullptr) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "arena %d does not exist (a tier whose budget is 0 has none)", id));
  }
  absl::MutexLock lock(&arena->mutex);
  auto allocation = take(*arena->allocator);
  if (!allocation.ok()) {
    return absl::Status(allocation.status().code(),
                        absl::StrFormat("%s tier (arena %d of %s): %s", TierName(arena->tier), id,
                                        FormatBytes(arena->bytes), allocation.status().message()));
  }
  const int t = Index(arena->tier);
  const uint64_t now = used_bytes_[t].fetch_add(allocation->bytes) + allocation->bytes;
  uint64_t peak = peak_used_bytes_[t].load();
  while (now > peak && !peak_used_bytes_[t].compare_exchange_weak(peak, now)) {
  }
  return Extent{arena->tier, id, *allocation};
}

absl::Status TierStore::Free(const Extent& extent) {
  Arena* arena = Find(extent.arena);
  if (arena == nullptr || arena->tier != extent.tier) {
    return absl::InvalidArgumentError(
        absl::StrFormat("free in %s arena %d, which does not exist", TierName(extent.tier), extent.arena));
  }
  {
    absl::MutexLock lock(&arena->mutex);
    if (absl::Status status = arena->allocator->Free(extent.allocation); !status.ok()) {
      return absl::Status(status.code(),
                          absl::StrFormat("%s tier: %s", TierName(extent.tier), status.message()));
    }
  }
  used_bytes_[Index(extent.tier)].fetch_sub(extent.allocation.bytes);
  if (extent.tier == Tier::kNvme) {
    absl::MutexLock lock(&checksum_mutex_);
    nvme_checksums_.erase(extent.offset());
  }
  return absl::OkStatus();
}

AllocatorStats TierStore::ArenaStats(ArenaId id) const {
  Arena* arena = Find(id);
  if (arena == nullptr) return AllocatorStats{};
  absl::MutexLock lock(&arena->mutex);
  return arena->allocator->Stats();
}

TierStats TierStore::Stats(Tier tier) const {
  TierStats stats;
  stats.budget_bytes = budgets_[Index(tier)];
  absl::MutexLock lock(&arenas_mutex_);
  stats.reserved_bytes = tier == Tier::kNvme ? stats.budget_bytes : reserved_[Index(tier)];
  uint64_t free_bytes = 0;
  for (const auto& [id, arena] : arenas_) {
    if (arena->tier != tier) continue;
    ++stats.arena_count;
    absl::MutexLock arena_lock(&arena->mutex);
    const AllocatorStats one = arena->allocator->Stats();
    stats.allocator.region_bytes += one.region_bytes;
    stats.allocator.used_bytes += one.used_bytes;
    stats.allocator.allocation_count += one.allocation_count;
    stats.allocator.largest_free_block_bytes =
        std::max(stats.allocator.largest_free_block_bytes, one.largest_free_block_bytes);
    free_bytes += one.free_bytes;
  }
  stats.allocator.free_bytes = free_bytes;
  stats.peak_used_bytes = peak_used_bytes_[Index(tier)].load();
  stats.allocator.fragmentation =
      free_bytes == 0 ? 0.0
                      : 1.0 - static_cast<double>(stats.allocator.largest_free_block_bytes) / free_bytes;
  return stats;
}

uint8_t* TierStore::Address(const Extent& extent) const {
  TIERD_CHECK(extent.tier != Tier::kNvme);
  Arena* arena = Find(extent.arena);
  TIERD_CHECK(arena != nullptr && arena->tier == extent.tier);
  TIERD_CHECK(extent.offset() + extent.bytes() <= arena->bytes);
  return arena->base + extent.offset();
}

const GpuRegion* TierStore::gpu_region(ArenaId id) const {
  Arena* arena = Find(id);
  return arena == nullptr ? nullptr : arena->gpu_region.get();
}

const DramSegment* TierStore::dram_segment(ArenaId id) const {
  Arena* arena = Find(id);
  return arena == nullptr ? nullptr : arena->dram_segment.get();
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
