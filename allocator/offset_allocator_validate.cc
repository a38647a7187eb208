// OffsetAllocator::Validate(): the whole-structure check of the invariants listed in
// offset_allocator.h. Kept apart from the O(1) paths it audits.
#include "absl/strings/str_format.h"
#include "allocator/offset_allocator.h"

namespace tierd {

absl::Status OffsetAllocator::Validate() const {
  auto fail = [](auto&&... args) {
    return absl::InternalError(absl::StrFormat(args...));
  };
  if (region_bytes_ == 0) return absl::OkStatus();
  // 1, 2, 4: the physical chain tiles the region; no two adjacent free blocks.
  uint64_t expected_offset = 0, used = 0, live = 0, free_blocks = 0;
  uint32_t previous = kNone;
  for (uint32_t i = 0; i != kNone; i = nodes_[i].next_physical) {
    const Block& block = nodes_[i];
    if (block.offset != expected_offset)
      return fail("block %d at offset %d, expected %d", i, block.offset, expected_offset);
    if (block.units == 0) return fail("block %d is empty", i);
    if (block.offset % alignment_bytes_ != 0) return fail("block %d misaligned", i);
    if (block.prev_physical != previous) return fail("block %d: broken prev link", i);
    if (block.in_use == block.is_free_block) return fail("block %d: used xor free violated", i);
    if (block.is_free_block && previous != kNone && nodes_[previous].is_free_block)
      return fail("blocks %d and %d are adjacent and both free", previous, i);
    expected_offset += block.units << alignment_shift_;
    if (block.in_use) {
      used += block.units;
      ++live;
    } else {
      ++free_blocks;
    }
    previous = i;
  }
  if (expected_offset != region_bytes_)
    return fail("blocks cover %d bytes of a %d-byte region", expected_offset, region_bytes_);
  if (used != used_units_) return fail("used units %d, counter says %d", used, used_units_);
  if (live != allocation_count_) return fail("%d live blocks, counter says %d", live, allocation_count_);
  // 3: free lists and bitmaps agree with the blocks.
  uint64_t listed = 0;
  for (int first = 0; first < kFirstLevelCount; ++first) {
    for (int second = 0; second < kSecondLevelCount; ++second) {
      const uint32_t head = free_heads_[first][second];
      const bool bit = (second_level_bitmaps_[first] >> second) & 1u;
      if (bit != (head != kNone)) return fail("bin (%d,%d): bitmap disagrees with list", first, second);
      uint32_t prev = kNone;
      for (uint32_t i = head; i != kNone; i = nodes_[i].next_free) {
        const Bin bin = BinFor(nodes_[i].units);
        if (!nodes_[i].is_free_block) return fail("used block %d on a free list", i);
        if (bin.first != first || bin.second != second) return fail("block %d in the wrong bin", i);
        if (nodes_[i].prev_free != prev) return fail("block %d: broken free-list link", i);
        if (++listed > free_blocks) return fail("free lists longer than the free blocks");
        prev = i;
      }
    }
    const bool first_bit = (first_level_bitmap_ >> first) & 1u;
    if (first_bit != (second_level_bitmaps_[first] != 0)) return fail("first-level bit %d wrong", first);
  }
  if (listed != free_blocks) return fail("%d free blocks, %d on lists", free_blocks, listed);
  return absl::OkStatus();
}

}  // namespace tierd
