// OffsetAllocator: a TLSF-style (two-level segregated fit) allocator of offsets in
// one contiguous region. It hands out [offset, offset + bytes) ranges and never
// touches the region's memory: the same allocator serves GPU memory, a shared-memory
// segment and an NVMe file.
//
// Invariants (checked by Validate()):
//   1. Blocks tile the region: walking next_physical from offset 0 visits blocks
//      whose offsets are contiguous and whose sizes sum to region_bytes().
//   2. No two physically adjacent blocks are both free (frees coalesce at once).
//   3. Every free block is on exactly the free list of the bin its size maps to, and
//      a bin's bit is set in the bitmaps iff its list is non-empty.
//   4. Offsets and sizes are multiples of alignment_bytes().
//
// Cost: Allocate and Free are O(1): two bitmap scans and list splices.
// Allocate is a good fit, not a best fit: it rounds the request up to the next bin
// boundary so any block of the chosen bin fits. Only when no such bin has a block (near
// full) does it walk the request's own bin for a block that is big enough, so a block
// of exactly the requested size is found whenever one exists.
//
// Thread-safety: none; callers serialise (the tier owning it holds a lock).
#ifndef TIERD_ALLOCATOR_OFFSET_ALLOCATOR_H_
#define TIERD_ALLOCATOR_OFFSET_ALLOCATOR_H_

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tierd {

// One allocation. `handle` identifies it to Free() in O(1); `bytes` is the reserved
// size (the request rounded up to alignment).
struct Allocation {
  uint64_t offset = 0;
  uint64_t bytes = 0;
  uint32_t handle = 0;
};

struct AllocatorStats {
  uint64_t region_bytes = 0;
  uint64_t used_bytes = 0;
  uint64_t free_bytes = 0;
  uint64_t largest_free_block_bytes = 0;
  uint64_t allocation_count = 0;
  // 1 - largest_free / free: 0 when all free space is one block (or none is free).
  double fragmentation = 0.0;
};

class OffsetAllocator {
 public:
  // `region_bytes` is rounded down to `alignment_bytes` (a power of two).
  // `max_allocations` bounds live allocations; the node pool is sized from it now.
  OffsetAllocator(uint64_t region_bytes, uint64_t alignment_bytes, uint32_t max_allocations);

  OffsetAllocator(const OffsetAllocator&) = delete;
  OffsetAllocator& operator=(const OffsetAllocator&) = delete;
  OffsetAllocator(OffsetAllocator&&) = default;
  OffsetAllocator& operator=(OffsetAllocator&&) = default;

  // RESOURCE_EXHAUSTED when no free block fits (the message gives the request, the
  // free bytes and the largest free block) or max_allocations are live;
  // INVALID_ARGUMENT for 0 bytes.
  absl::StatusOr<Allocation> Allocate(uint64_t bytes);

  // The range [offset, offset + bytes rounded up to alignment) exactly, for a planner that
  // fixed the offsets ahead (allocator/static_assigner.h). O(blocks): it walks the
  // physical chain to the block holding `offset`, so it is for planned placements, not a
  // hot path. FAILED_PRECONDITION when any of the range is in use (the message says what
  // holds it), INVALID_ARGUMENT for 0 bytes, a misaligned offset or a range past the
  // region, RESOURCE_EXHAUSTED when max_allocations are live.
  absl::StatusOr<Allocation> AllocateAt(uint64_t offset, uint64_t bytes);

  // The highest range that fits: the end of the free block nearest the region's end that
  // holds `bytes`. For copies placed off a planner's layout (which packs from offset 0), so
  // they gather at the top instead of splitting the ranges planned tensors need. O(blocks);
  // the same errors as Allocate.
  absl::StatusOr<Allocation> AllocateHighest(uint64_t bytes);

  // INVALID_ARGUMENT if `allocation` is not live (double free, forged handle).
  absl::Status Free(const Allocation& allocation);

  AllocatorStats Stats() const;
  uint64_t region_bytes() const { return region_bytes_; }
  uint64_t alignment_bytes() const { return alignment_bytes_; }

  // The smallest request size for which Allocate() is guaranteed to find a block
  // of `free_block_bytes` usable: requests up to this size never fail while such
  // a block exists. Exposed for tests of the good-fit contract.
  uint64_t GuaranteedFitBytes(uint64_t free_block_bytes) const;

  // Whole-structure check of the invariants above; O(blocks). For tests.
  absl::Status Validate() const;

 private:
  static constexpr int kSecondLevelBits = 5;
  static constexpr int kSecondLevelCount = 1 << kSecondLevelBits;
  static constexpr int kFirstLevelCount = 64 - kSecondLevelBits + 1;
  static constexpr uint32_t kNone = UINT32_MAX;

  // 32 bytes, aligned: one block never straddles two cache lines (the O(1) paths are
  // bound by the latency of touching a handful of random blocks).
  struct alignas(32) Block {
    uint64_t offset = 0;
    uint64_t units : 62 = 0;  // size in alignment units
    uint64_t in_use : 1 = 0;
    uint64_t is_free_block : 1 = 0;
    uint32_t prev_physical = kNone;
    uint32_t next_physical = kNone;
    uint32_t prev_free = kNone;
    uint32_t next_free = kNone;
  };
  static_assert(sizeof(Block) == 32);
  struct Bin {
    int first = 0;
    int second = 0;
  };

  static Bin BinFor(uint64_t units) {
    if (units < kSecondLevelCount) return Bin{0, static_cast<int>(units)};
    const int msb = 63 - __builtin_clzll(units);
    return Bin{msb - kSecondLevelBits + 1,
               static_cast<int>((units >> (msb - kSecondLevelBits)) - kSecondLevelCount)};
  }
  static uint64_t RoundUpToBin(uint64_t units) {
    if (units < kSecondLevelCount) return units;
    const int msb = 63 - __builtin_clzll(units);
    const uint64_t step = uint64_t{1} << (msb - kSecondLevelBits);
    return (units + step - 1) & ~(step - 1);
  }
  bool FindFreeBin(Bin* bin) const;
  void InsertFree(uint32_t index);
  void RemoveFree(uint32_t index);
  uint32_t NewNode();
  // Takes `units` from the front of free block `index` (off its free list already): the
  // rest, if any, becomes a free block after it. Marks it used.
  Allocation TakeFront(uint32_t index, uint64_t units);
  void ReleaseNode(uint32_t index);
  uint64_t LargestFreeUnits() const;

  uint64_t region_bytes_ = 0;
  uint64_t alignment_bytes_ = 1;
  int alignment_shift_ = 0;
  uint32_t max_allocations_ = 0;
  uint64_t used_units_ = 0;
  uint64_t allocation_count_ = 0;

  std::vector<Block> nodes_;
  std::vector<uint32_t> spare_nodes_;  // indices of unused nodes (a stack)
  uint64_t first_level_bitmap_ = 0;
  std::array<uint32_t, kFirstLevelCount> second_level_bitmaps_{};
  std::array<std::array<uint32_t, kSecondLevelCount>, kFirstLevelCount> free_heads_;
};

}  // namespace tierd

#endif  // TIERD_ALLOCATOR_OFFSET_ALLOCATOR_H_
