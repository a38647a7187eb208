#include "allocator/offset_allocator.h"

#include <algorithm>

#include "absl/strings/str_format.h"
#include "base/check.h"
#include "base/units.h"

// The O(1) paths are a handful of list splices; keep them in the callers.
#define TIERD_ALWAYS_INLINE inline __attribute__((always_inline))

namespace tierd {

OffsetAllocator::OffsetAllocator(uint64_t region_bytes, uint64_t alignment_bytes,
                                 uint32_t max_allocations)
    : alignment_bytes_(alignment_bytes), max_allocations_(max_allocations) {
  TIERD_CHECK(IsPowerOfTwo(alignment_bytes));
  TIERD_CHECK(max_allocations >= 1);
  alignment_shift_ = __builtin_ctzll(alignment_bytes);
  region_bytes_ = region_bytes / alignment_bytes * alignment_bytes;
  TIERD_CHECK((region_bytes_ >> alignment_shift_) < (uint64_t{1} << 62));
  for (auto& row : free_heads_) row.fill(kNone);
  // No two free blocks are adjacent, so there are at most 2 x allocations + 1 blocks.
  nodes_.resize(2 * static_cast<size_t>(max_allocations) + 2);
  spare_nodes_.reserve(nodes_.size());
  for (uint32_t i = static_cast<uint32_t>(nodes_.size()); i-- > 1;) spare_nodes_.push_back(i);
  // Node 0 is the block at offset 0 for the allocator's whole life (merges keep the
  // lower block), which lets Validate() walk the physical chain from it.
  nodes_[0].units = region_bytes_ >> alignment_shift_;
  if (nodes_[0].units > 0) InsertFree(0);
}

uint64_t OffsetAllocator::GuaranteedFitBytes(uint64_t free_block_bytes) const {
  // A request is served from the bin of its size rounded up to a bin boundary or
  // any bin above; so it surely fits a block whose bin lower bound is >= it.
  const uint64_t units = free_block_bytes >> alignment_shift_;
  if (units < kSecondLevelCount) return units << alignment_shift_;
  const int msb = 63 - __builtin_clzll(units);
  const uint64_t step = uint64_t{1} << (msb - kSecondLevelBits);
  return (units & ~(step - 1)) << alignment_shift_;
}

TIERD_ALWAYS_INLINE bool OffsetAllocator::FindFreeBin(Bin* bin) const {
  uint32_t second_map = second_level_bitmaps_[bin->first] & (~0u << bin->second);
  if (second_map == 0) {
    if (bin->first + 1 >= kFirstLevelCount) return false;
    const uint64_t first_map = first_level_bitmap_ & (~uint64_t{0} << (bin->first + 1));
    if (first_map == 0) return false;
    bin->first = __builtin_ctzll(first_map);
    second_map = second_level_bitmaps_[bin->first];
  }
  TIERD_DCHECK(second_map != 0);
  bin->second = __builtin_ctz(second_map);
  return true;
}

TIERD_ALWAYS_INLINE void OffsetAllocator::InsertFree(uint32_t index) {
  Block& block = nodes_[index];
  const Bin bin = BinFor(block.units);
  uint32_t& head = free_heads_[bin.first][bin.second];
  block.is_free_block = true;
  block.in_use = false;
  block.prev_free = kNone;
  block.next_free = head;
  if (head != kNone) nodes_[head].prev_free = index;
  head = index;
  first_level_bitmap_ |= uint64_t{1} << bin.first;
  second_level_bitmaps_[bin.first] |= 1u << bin.second;
}

TIERD_ALWAYS_INLINE void OffsetAllocator::RemoveFree(uint32_t index) {
  Block& block = nodes_[index];
  TIERD_DCHECK(block.is_free_block);
  if (block.prev_free != kNone) __builtin_prefetch(&nodes_[block.prev_free]);
  if (block.next_free != kNone) __builtin_prefetch(&nodes_[block.next_free]);
  const Bin bin = BinFor(block.units);
  if (block.prev_free != kNone) nodes_[block.prev_free].next_free = block.next_free;
  else free_heads_[bin.first][bin.second] = block.next_free;
  if (block.next_free != kNone) nodes_[block.next_free].prev_free = block.prev_free;
  if (free_heads_[bin.first][bin.second] == kNone) {
    second_level_bitmaps_[bin.first] &= ~(1u << bin.second);
    if (second_level_bitmaps_[bin.first] == 0) first_level_bitmap_ &= ~(uint64_t{1} << bin.first);
  }
  block.is_free_block = false;
  block.prev_free = block.next_free = kNone;
}

TIERD_ALWAYS_INLINE uint32_t OffsetAllocator::NewNode() {
  TIERD_CHECK(!spare_nodes_.empty());
  const uint32_t index = spare_nodes_.back();
  spare_nodes_.pop_back();
  nodes_[index] = Block{};
  return index;
}

TIERD_ALWAYS_INLINE void OffsetAllocator::ReleaseNode(uint32_t index) {
  nodes_[index] = Block{};
  spare_nodes_.push_back(index);
}

absl::StatusOr<Allocation> OffsetAllocator::Allocate(uint64_t bytes) {
  if (bytes == 0) return absl::InvalidArgumentError("allocation of 0 bytes");
  if (bytes > region_bytes_) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "cannot allocate %s: larger than the whole region (%s)", FormatBytes(bytes),
        FormatBytes(region_bytes_)));
  }
  if (allocation_count_ >= max_allocations_) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "cannot allocate %s: %d allocations are live, the limit", FormatBytes(bytes),
        max_allocations_));
  }
  const uint64_t units = (bytes + alignment_bytes_ - 1) >> alignment_shift_;
  Bin bin = BinFor(RoundUpToBin(units));
  uint32_t index = kNone;
  if (FindFreeBin(&bin)) {
    index = free_heads_[bin.first][bin.second];
  } else {
    // Near full: no block of a bin wholly above the request, but one in the request's own
    // bin may still be big enough. A first-fit walk of that one list, off the fast path.
    const Bin own = BinFor(units);
    for (uint32_t i = free_heads_[own.first][own.second]; i != kNone; i = nodes_[i].next_free) {
      if (nodes_[i].units >= units) {
        index = i;
        break;
      }
    }
  }
  if (index == kNone) {
    const uint64_t free_bytes = region_bytes_ - (used_units_ << alignment_shift_);
    return absl::ResourceExhaustedError(absl::StrFormat(
        "cannot allocate %s: %s free of %s, largest free block %s", FormatBytes(bytes),
        FormatBytes(free_bytes), FormatBytes(region_bytes_),
        FormatBytes(LargestFreeUnits() << alignment_shift_)));
  }
  RemoveFree(index);
  return TakeFront(index, units);
}

Allocation OffsetAllocator::TakeFront(uint32_t index, uint64_t units) {
  if (nodes_[index].units > units) {
    const uint32_t rest = NewNode();
    Block& block = nodes_[index];
    nodes_[rest].offset = block.offset + (units << alignment_shift_);
    nodes_[rest].units = block.units - units;
    nodes_[rest].prev_physical = index;
    nodes_[rest].next_physical = block.next_physical;
    if (block.next_physical != kNone) nodes_[block.next_physical].prev_physical = rest;
    block.next_physical = rest;
    block.units = units;
    InsertFree(rest);
  }
  Block& block = nodes_[index];
  block.in_use = true;
  used_units_ += block.units;
  ++allocation_count_;
  return Allocation{block.offset, block.units << alignment_shift_, index};
}

absl::StatusOr<Allocation> OffsetAllocator::AllocateAt(uint64_t offset, uint64_t bytes) {
  if (bytes == 0) return absl::InvalidArgumentError("allocation of 0 bytes");
  const uint64_t units = (bytes + alignment_bytes_ - 1) >> alignment_shift_;
  if (offset % alignment_bytes_ != 0 || offset > region_bytes_ || units > (region_bytes_ - offset) >> alignment_shift_) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "cannot allocate %s at offset %d: the region is %s in %d-byte units", FormatBytes(bytes), offset,
        FormatBytes(region_bytes_), alignment_bytes_));
  }
  if (allocation_count_ >= max_allocations_) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "cannot allocate %s: %d allocations are live, the limit", FormatBytes(bytes), max_allocations_));
  }
  uint32_t index = 0;  // node 0 is the block at offset 0
  while (nodes_[index].offset + (nodes_[index].units << alignment_shift_) <= offset) index = nodes_[index].next_physical;
  const Block& holder = nodes_[index];
  const uint64_t end = holder.offset + (holder.units << alignment_shift_);
  if (!holder.is_free_block || end < offset + (units << alignment_shift_)) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "cannot allocate %s at offset %d: %s block [%d, %d) is %s", FormatBytes(bytes), offset,
        holder.is_free_block ? "the free" : "the", holder.offset, end,
        holder.is_free_block ? "too short" : "in use"));
  }
  RemoveFree(index);
  if (holder.offset < offset) {  // the part before stays free, in the lower node
    const uint32_t at = NewNode();
    Block& block = nodes_[index];
    const uint64_t before = (offset - block.offset) >> alignment_shift_;
    nodes_[at].offset = offset;
    nodes_[at].units = block.units - before;
    nodes_[at].prev_physical = index;
    nodes_[at].next_physical = block.next_physical;
    if (block.next_physical != kNone) nodes_[block.next_physical].prev_physical = at;
    block.next_physical = at;
    block.units = before;
    InsertFree(index);
    index = at;
  }
  return TakeFront(index, units);
}

absl::StatusOr<Allocation> OffsetAllocator::AllocateHighest(uint64_t bytes) {
  if (bytes == 0) return absl::InvalidArgumentError("allocation of 0 bytes");
  const uint64_t units = (bytes + alignment_bytes_ - 1) >> alignment_shift_;
  uint32_t highest = kNone;
  for (uint32_t index = 0; index != kNone; index = nodes_[index].next_physical) {
    if (nodes_[index].is_free_block && nodes_[index].units >= units) highest = index;
  }
  if (highest == kNone) return Allocate(bytes);  // none fits: Allocate says so, with the numbers
  const Block& block = nodes_[highest];
  return AllocateAt(block.offset + ((block.units - units) << alignment_shift_), bytes);
}

absl::Status OffsetAllocator::Free(const Allocation& allocation) {
  const uint32_t index = allocation.handle;
  if (index >= nodes_.size() || !nodes_[index].in_use ||
      nodes_[index].offset != allocation.offset ||
      (nodes_[index].units << alignment_shift_) != allocation.bytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "free of an allocation that is not live (offset %d, %s, handle %d): double free?",
        allocation.offset, FormatBytes(allocation.bytes), allocation.handle));
  }
  // The neighbours (and their free-list links) are random cache lines: start all the
  // loads now so the misses overlap instead of queueing one after another.
  const uint32_t prev_index = nodes_[index].prev_physical, next_index = nodes_[index].next_physical;
  if (prev_index != kNone) __builtin_prefetch(&nodes_[prev_index]);
  if (next_index != kNone) __builtin_prefetch(&nodes_[next_index]);
  used_units_ -= nodes_[index].units;
  --allocation_count_;
  uint32_t merged = index;
  nodes_[merged].in_use = false;
  const uint32_t prev = nodes_[merged].prev_physical;
  if (prev != kNone && nodes_[prev].is_free_block) {
    RemoveFree(prev);
    nodes_[prev].units += nodes_[merged].units;
    nodes_[prev].next_physical = nodes_[merged].next_physical;
    if (nodes_[merged].next_physical != kNone) nodes_[nodes_[merged].next_physical].prev_physical = prev;
    ReleaseNode(merged);
    merged = prev;
  }
  const uint32_t next = nodes_[merged].next_physical;
  if (next != kNone && nodes_[next].is_free_block) {
    RemoveFree(next);
    nodes_[merged].units += nodes_[next].units;
    nodes_[merged].next_physical = nodes_[next].next_physical;
    if (nodes_[next].next_physical != kNone) nodes_[nodes_[next].next_physical].prev_physical = merged;
    ReleaseNode(next);
  }
  InsertFree(merged);
  return absl::OkStatus();
}

uint64_t OffsetAllocator::LargestFreeUnits() const {
  if (first_level_bitmap_ == 0) return 0;
  const int first = 63 - __builtin_clzll(first_level_bitmap_);
  const int second = 31 - __builtin_clz(second_level_bitmaps_[first]);
  uint64_t largest = 0;
  for (uint32_t i = free_heads_[first][second]; i != kNone; i = nodes_[i].next_free) {
    largest = std::max<uint64_t>(largest, nodes_[i].units);
  }
  return largest;
}

AllocatorStats OffsetAllocator::Stats() const {
  AllocatorStats stats;
  stats.region_bytes = region_bytes_;
  stats.used_bytes = used_units_ << alignment_shift_;
  stats.free_bytes = region_bytes_ - stats.used_bytes;
  stats.largest_free_block_bytes = LargestFreeUnits() << alignment_shift_;
  stats.allocation_count = allocation_count_;
  stats.fragmentation =
      stats.free_bytes == 0 ? 0.0
                            : 1.0 - static_cast<double>(stats.largest_free_block_bytes) /
                                        static_cast<double>(stats.free_bytes);
  return stats;
}

}  // namespace tierd
