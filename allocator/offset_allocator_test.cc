#include "allocator/offset_allocator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <vector>

namespace tierd {
namespace {

// The reference model: live allocations keyed by offset; the largest gap between
// them is the largest free block.
struct Model {
  uint64_t region_bytes;
  std::map<uint64_t, uint64_t> live;  // offset -> bytes

  uint64_t LargestGap() const {
    uint64_t cursor = 0, largest = 0;
    for (const auto& [offset, bytes] : live) {
      largest = std::max(largest, offset - cursor);
      cursor = offset + bytes;
    }
    return std::max(largest, region_bytes - cursor);
  }
  uint64_t Used() const {
    uint64_t used = 0;
    for (const auto& [offset, bytes] : live) used += bytes;
    return used;
  }
  // True if [offset, offset+bytes) is inside the region and overlaps nothing live.
  bool Fits(uint64_t offset, uint64_t bytes) const {
    if (offset + bytes > region_bytes) return false;
    auto next = live.lower_bound(offset);
    if (next != live.end() && next->first < offset + bytes) return false;
    if (next != live.begin() && std::prev(next)->first + std::prev(next)->second > offset) return false;
    return true;
  }
};

TEST(OffsetAllocatorTest, AllocatesAlignedAndFreesBackToOneBlock) {
  OffsetAllocator allocator(1 << 20, 256, 64);
  auto a = allocator.Allocate(100);
  auto b = allocator.Allocate(1000);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->bytes, 256u);
  EXPECT_EQ(b->bytes, 1024u);
  EXPECT_EQ(a->offset % 256, 0u);
  EXPECT_EQ(b->offset % 256, 0u);
  EXPECT_EQ(allocator.Stats().used_bytes, 1280u);
  EXPECT_EQ(allocator.Stats().allocation_count, 2u);
  ASSERT_TRUE(allocator.Validate().ok());
  ASSERT_TRUE(allocator.Free(*a).ok());
  ASSERT_TRUE(allocator.Free(*b).ok());
  const AllocatorStats stats = allocator.Stats();
  EXPECT_EQ(stats.free_bytes, 1u << 20);
  EXPECT_EQ(stats.largest_free_block_bytes, 1u << 20);
  EXPECT_EQ(stats.fragmentation, 0.0);
  EXPECT_TRUE(allocator.Validate().ok());
}

TEST(OffsetAllocatorTest, ExhaustionIsAClearErrorNotACrash) {
  OffsetAllocator allocator(64 * 4096, 4096, 1000);
  std::vector<Allocation> held;
  for (int i = 0; i < 64; ++i) held.push_back(*allocator.Allocate(4096));
  auto full = allocator.Allocate(1);
  ASSERT_EQ(full.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(full.status().message().find("0 B free of 256 KiB"), absl::string_view::npos)
      << full.status().message();
  auto huge = allocator.Allocate(1 << 30);
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(huge.status().message().find("larger than the whole region"), absl::string_view::npos);
  EXPECT_EQ(allocator.Allocate(0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(allocator.Validate().ok());
}

TEST(OffsetAllocatorTest, FragmentationIsReportedAndHealedByCoalescing) {
  OffsetAllocator allocator(8 * 4096, 4096, 100);
  std::vector<Allocation> blocks;
  for (int i = 0; i < 8; ++i) blocks.push_back(*allocator.Allocate(4096));
  for (int i = 0; i < 8; i += 2) ASSERT_TRUE(allocator.Free(blocks[i]).ok());
  AllocatorStats stats = allocator.Stats();
  EXPECT_EQ(stats.free_bytes, 4u * 4096);
  EXPECT_EQ(stats.largest_free_block_bytes, 4096u);
  EXPECT_DOUBLE_EQ(stats.fragmentation, 0.75);
  EXPECT_EQ(allocator.Allocate(2 * 4096).status().code(), absl::StatusCode::kResourceExhausted);
  for (int i = 1; i < 8; i += 2) ASSERT_TRUE(allocator.Free(blocks[i]).ok());
  ASSERT_TRUE(allocator.Validate().ok());
  EXPECT_EQ(allocator.Stats().largest_free_block_bytes, 8u * 4096);
}

TEST(OffsetAllocatorTest, DoubleFreeAndForgedHandlesAreRejected) {
  OffsetAllocator allocator(1 << 16, 64, 10);
  Allocation a = *allocator.Allocate(64);
  ASSERT_TRUE(allocator.Free(a).ok());
  EXPECT_EQ(allocator.Free(a).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(allocator.Free(Allocation{0, 64, 9999}).code(), absl::StatusCode::kInvalidArgument);
  Allocation b = *allocator.Allocate(128);
  EXPECT_EQ(allocator.Free(Allocation{b.offset + 64, b.bytes, b.handle}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(allocator.Free(b).ok());
  EXPECT_TRUE(allocator.Validate().ok());
}

TEST(OffsetAllocatorTest, AllocationCountLimitIsEnforced) {
  OffsetAllocator allocator(1 << 20, 64, 3);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(allocator.Allocate(64).ok());
  auto over = allocator.Allocate(64);
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(over.status().message().find("3 allocations are live"), absl::string_view::npos);
}

// Random alloc/free sequences against the reference model, Validate() after every step.
TEST(OffsetAllocatorTest, AllocateAtTakesExactlyTheRangeAsked) {
  OffsetAllocator allocator(4096, 256, 16);
  auto middle = allocator.AllocateAt(1024, 300);  // rounded to 512
  ASSERT_TRUE(middle.ok()) << middle.status();
  EXPECT_EQ(middle->offset, 1024u);
  EXPECT_EQ(middle->bytes, 512u);
  ASSERT_TRUE(allocator.Validate().ok()) << allocator.Validate();
  EXPECT_EQ(allocator.Stats().largest_free_block_bytes, 4096u - 1536u);  // the free part after it
  auto overlap = allocator.AllocateAt(1280, 256);
  EXPECT_EQ(overlap.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(overlap.status().message().find("in use"), absl::string_view::npos) << overlap.status();
  auto too_long = allocator.AllocateAt(768, 512);  // runs into the block at 1024
  EXPECT_EQ(too_long.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(too_long.status().message().find("too short"), absl::string_view::npos) << too_long.status();
  EXPECT_EQ(allocator.AllocateAt(100, 256).status().code(), absl::StatusCode::kInvalidArgument);   // misaligned
  EXPECT_EQ(allocator.AllocateAt(3840, 512).status().code(), absl::StatusCode::kInvalidArgument);  // past the end
  EXPECT_EQ(allocator.AllocateAt(0, 0).status().code(), absl::StatusCode::kInvalidArgument);
  auto front = allocator.AllocateAt(0, 1024);  // exactly the gap before it
  ASSERT_TRUE(front.ok()) << front.status();
  auto any = allocator.Allocate(256);  // the online path still works around them
  ASSERT_TRUE(any.ok());
  EXPECT_EQ(any->offset, 1536u);
  ASSERT_TRUE(allocator.Validate().ok()) << allocator.Validate();
  for (const Allocation& a : {*middle, *front, *any}) ASSERT_TRUE(allocator.Free(a).ok());
  ASSERT_TRUE(allocator.Validate().ok());
  EXPECT_EQ(allocator.Stats().largest_free_block_bytes, 4096u);  // coalesced back to one block
}

// Off-plan copies go to the top: the end of the highest free block that fits, on random
// arenas checked against the model (no free block above it holds the request).
TEST(OffsetAllocatorTest, AllocateHighestTakesTheTopOfTheHighestBlockThatFits) {
  OffsetAllocator small(4096, 256, 16);
  auto top = small.AllocateHighest(300);  // rounded to 512, at the region's end
  ASSERT_TRUE(top.ok()) << top.status();
  EXPECT_EQ(top->offset, 4096u - 512u);
  auto below = small.AllocateHighest(256);
  ASSERT_TRUE(below.ok());
  EXPECT_EQ(below->offset, 4096u - 768u);
  EXPECT_EQ(small.AllocateHighest(0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(small.AllocateHighest(8192).status().code(), absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(small.Validate().ok()) << small.Validate();

  std::mt19937_64 rng(5);
  for (int trial = 0; trial < 200; ++trial) {
    OffsetAllocator allocator(1 << 20, 256, 512);
    Model model{1 << 20, {}};
    std::vector<Allocation> live;
    for (int step = 0; step < 60; ++step) {
      if (!live.empty() && rng() % 3 == 0) {
        const size_t k = rng() % live.size();
        ASSERT_TRUE(allocator.Free(live[k]).ok());
        model.live.erase(live[k].offset);
        live.erase(live.begin() + k);
        continue;
      }
      const uint64_t bytes = 256 * (1 + rng() % 64);
      auto a = rng() % 2 ? allocator.AllocateHighest(bytes) : allocator.Allocate(bytes);
      if (!a.ok()) continue;
      ASSERT_TRUE(model.Fits(a->offset, a->bytes)) << trial << " " << step;
      model.live[a->offset] = a->bytes;
      live.push_back(*a);
    }
    ASSERT_TRUE(allocator.Validate().ok()) << allocator.Validate();
    // One more from the top: nothing above it fits.
    const uint64_t bytes = 256 * (1 + rng() % 64);
    auto a = allocator.AllocateHighest(bytes);
    if (!a.ok()) continue;
    for (uint64_t offset = a->offset + 256; offset + a->bytes <= model.region_bytes; offset += 256) {
      ASSERT_FALSE(model.Fits(offset, a->bytes)) << "a higher range fits: " << offset << " over " << a->offset;
    }
  }
}

TEST(OffsetAllocatorTest, RandomSequencesMatchTheReferenceModel) {
  for (uint32_t seed = 1; seed <= 8; ++seed) {
    std::mt19937_64 rng(seed);
    const uint64_t alignment = uint64_t{1} << (rng() % 13);  // 1 B .. 4 KiB
    const uint64_t region = (uint64_t{1} << 24) + rng() % 4096;
    OffsetAllocator allocator(region, alignment, 4096);
    Model model{region / alignment * alignment, {}};
    std::vector<Allocation> held;
    uint64_t failures = 0, placed = 0, refused_at = 0;
    for (int step = 0; step < 3000; ++step) {
      const bool allocate = held.empty() || rng() % 100 < 55;
      if (allocate && rng() % 4 == 0) {
        // At a chosen offset (a planner's): exactly there when nothing overlaps, else refused.
        const uint64_t bytes = 1 + rng() % 40000;
        const uint64_t aligned = (bytes + alignment - 1) / alignment * alignment;
        const uint64_t offset = rng() % model.region_bytes / alignment * alignment;
        auto result = allocator.AllocateAt(offset, bytes);
        if (offset + aligned > model.region_bytes) {
          ASSERT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument) << result.status();
        } else if (model.Fits(offset, aligned)) {
          ASSERT_TRUE(result.ok()) << result.status() << " at step " << step;
          ASSERT_EQ(result->offset, offset);
          ASSERT_EQ(result->bytes, aligned);
          model.live[offset] = aligned;
          held.push_back(*result);
          ++placed;
        } else {
          ASSERT_EQ(result.status().code(), absl::StatusCode::kFailedPrecondition) << result.status();
          ++refused_at;
        }
      } else if (allocate) {
        // Mostly small, sometimes large: sizes spanning many bins.
        const uint64_t bytes = 1 + (rng() % 4 == 0 ? rng() % (region / 8) : rng() % 20000);
        auto result = allocator.Allocate(bytes);
        if (result.ok()) {
          ASSERT_GE(result->bytes, bytes);
          ASSERT_LT(result->bytes - bytes, alignment);
          ASSERT_EQ(result->offset % alignment, 0u);
          ASSERT_TRUE(model.Fits(result->offset, result->bytes)) << "overlap at step " << step;
          model.live[result->offset] = result->bytes;
          held.push_back(*result);
        } else {
          ++failures;
          ASSERT_EQ(result.status().code(), absl::StatusCode::kResourceExhausted);
          // Refused only when no free block is big enough (good fit first, then the
          // request's own bin walked before giving up).
          const uint64_t aligned = (bytes + alignment - 1) / alignment * alignment;
          ASSERT_GT(aligned, model.LargestGap())
              << "refused " << bytes << " with a " << model.LargestGap() << "-byte gap";
        }
      } else {
        const size_t pick = rng() % held.size();
        ASSERT_TRUE(allocator.Free(held[pick]).ok());
        model.live.erase(held[pick].offset);
        held[pick] = held.back();
        held.pop_back();
      }
      ASSERT_TRUE(allocator.Validate().ok()) << allocator.Validate() << " seed " << seed;
      const AllocatorStats stats = allocator.Stats();
      ASSERT_EQ(stats.used_bytes, model.Used());
      ASSERT_EQ(stats.largest_free_block_bytes, model.LargestGap());
      ASSERT_EQ(stats.allocation_count, model.live.size());
    }
    EXPECT_GT(failures, 0u) << "the sequence never exercised exhaustion (seed " << seed << ")";
    EXPECT_GT(placed, 0u) << "seed " << seed;
    EXPECT_GT(refused_at, 0u) << "seed " << seed;
  }
}

}  // namespace
}  // namespace tierd
