// LeaseTable under pressure: fragmented arenas join their free space by moving copies within
// the tier, victims whose write-back finds no room below are passed over, and a full NVMe
// drops its copies of tensors a tier above holds. Nothing is lost on any of these paths.
#include <gtest/gtest.h>

#include <array>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "runtime/lease_table.h"
#include "runtime/lease_table_test_util.h"

namespace tierd {
namespace {

using testing::LeaseTableTest;
using testing::Spec;

// A fragmented arena: 2 MiB free in two 1 MiB holes and a 2 MiB tensor to place. One idle
// 1 MiB copy moves within the tier into the far hole, joining the near one with its own old
// range: nothing is written to the tier below, and every value stays. An acquired copy is
// never moved.
void ExpectAFragmentedArenaJoinsFreeSpaceByMovingACopy(LeaseTableTest& test, LeaseTable& table, Place place,
                                                       const SessionQuota& quota) {
  const Tier tier = place == Place::kGpu ? Tier::kGpu : Tier::kDram;
  auto moved = [&](const LeaseStats& s) { return tier == Tier::kGpu ? s.gpu_relocations : s.relocations; };
  auto s = *table.OpenSession("fragmented", quota);
  TensorId ids[4];
  uint64_t offsets[4];
  for (int k = 0; k < 4; ++k) {
    ids[k] = *table.Lease(s, Spec("t" + std::to_string(k), 256 * 1024));  // 1 MiB each
    test.Write(table, s, ids[k], 10 + k, place);
    auto p = table.Acquire(s, ids[k], Access::kRead, place);
    ASSERT_TRUE(p.ok()) << p.status();
    ASSERT_EQ(p->tier, tier);
    offsets[k] = p->offset;
    ASSERT_TRUE(table.Release(s, ids[k]).ok());
  }
  ASSERT_TRUE(table.Unlease(s, ids[1]).ok());
  ASSERT_TRUE(table.Unlease(s, ids[3]).ok());
  const uint64_t hole_gap = offsets[1] > offsets[3] ? offsets[1] - offsets[3] : offsets[3] - offsets[1];
  ASSERT_NE(hole_gap, 1 * kMiB) << "the premise: the two holes are not side by side";
  const LeaseStats before = table.Stats();
  // Held: neither t0 nor t2 may move, and nothing may be evicted.
  for (int k : {0, 2}) ASSERT_TRUE(table.Acquire(s, ids[k], Access::kRead, place).ok());
  const TensorId big = *table.Lease(s, Spec("big", 512 * 1024));  // 2 MiB
  auto refused = table.Acquire(s, big, Access::kOverwrite, place);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
  EXPECT_EQ(moved(table.Stats()), moved(before)) << "an acquired copy moved";
  for (int k : {0, 2}) ASSERT_TRUE(table.Release(s, ids[k]).ok());
  // Idle: one of them moves.
  auto placed = table.Acquire(s, big, Access::kOverwrite, place);
  ASSERT_TRUE(placed.ok()) << placed.status();
  EXPECT_EQ(placed->tier, tier);
  ASSERT_TRUE(table.Release(s, big).ok());
  const LeaseStats after = table.Stats();
  EXPECT_EQ(moved(after), moved(before) + 1);
  EXPECT_EQ(after.writebacks, before.writebacks) << "nothing went to the tier below";
  EXPECT_EQ(after.evictions_capacity, before.evictions_capacity);
  EXPECT_TRUE(test.Holds(table, s, ids[0], 10, place));
  EXPECT_TRUE(test.Holds(table, s, ids[2], 12, place));
  EXPECT_TRUE(table.Validate().ok()) << table.Validate();
}

TEST_F(LeaseTableTest, AFragmentedDramJoinsFreeSpaceByMovingACopyNotBySpilling) {
  auto table = Table();
  ExpectAFragmentedArenaJoinsFreeSpaceByMovingACopy(*this, *table, Place::kHost, {1 * kMiB, 4 * kMiB, 8 * kMiB});
}

// The same on the GPU: the copy moves within the region (device to device), not to DRAM.
// (A GPU split into pieces by tensors a client holds is how a 450 MiB workspace acquire
// failed on the H200 with 1.44 GiB free in pieces of at most 410 MiB.)
TEST_F(LeaseTableTest, AFragmentedGpuJoinsFreeSpaceByMovingACopyNotByEvicting) {
  auto table = Table();
  ExpectAFragmentedArenaJoinsFreeSpaceByMovingACopy(*this, *table, Place::kGpu, {4 * kMiB, 8 * kMiB, 8 * kMiB});
}

// DRAM fragmented so that no single move joins enough: 4 MiB free as 1 + 1 + 2 MiB holes
// with two copies between the 1 MiB ones. Moving both into the 2 MiB hole makes a 4 MiB
// block, and the new lease takes it instead of going to NVMe; every value stays.
TEST_F(LeaseTableTest, AFragmentedDramMovesTwoCopiesWhenNoSingleMoveJoinsEnough) {
  auto table = Table();
  auto s = *table->OpenSession("fragmented", {1 * kMiB, 10 * kMiB, 16 * kMiB});
  std::vector<std::pair<uint64_t, TensorId>> by_offset;
  std::map<TensorId, uint32_t> seeds;
  for (int k = 0; k < 10; ++k) {
    const TensorId id = *table->Lease(s, Spec("t" + std::to_string(k), 256 * 1024));  // 1 MiB each
    seeds[id] = 20 + k;
    Write(*table, s, id, seeds[id], Place::kHost);
    auto p = table->Acquire(s, id, Access::kRead, Place::kHost);
    ASSERT_TRUE(p.ok()) << p.status();
    ASSERT_EQ(p->tier, Tier::kDram);
    by_offset.push_back({p->offset, id});
    ASSERT_TRUE(table->Release(s, id).ok());
  }
  std::sort(by_offset.begin(), by_offset.end());
  ASSERT_EQ(by_offset.back().first, 9 * kMiB) << "the premise: DRAM full, 1 MiB each, side by side";
  std::map<TensorId, uint32_t> kept;  // id -> seed
  for (int k = 0; k < 10; ++k) {
    const TensorId id = by_offset[k].second;
    if (k == 1 || k == 4 || k == 8 || k == 9) {
      ASSERT_TRUE(table->Unlease(s, id).ok());
    } else {
      kept[id] = seeds[id];
    }
  }
  const LeaseStats before = table->Stats();
  const TensorId big = *table->Lease(s, Spec("big", 1024 * 1024));  // 4 MiB: only DRAM or NVMe hold it
  std::array<bool, kTierCount> copies{};
  for (const LeaseView& v : table->List(s)) {
    if (v.id == big) copies = v.copies;
  }
  EXPECT_TRUE(copies[static_cast<int>(Tier::kDram)]) << "big went past a DRAM with 4 MiB free";
  const LeaseStats after = table->Stats();
  EXPECT_EQ(after.relocations, before.relocations + 2);
  EXPECT_EQ(after.writebacks, before.writebacks);
  for (const auto& [id, seed] : kept) EXPECT_TRUE(Holds(*table, s, id, seed, Place::kHost)) << id;
  EXPECT_TRUE(table->Validate().ok()) << table->Validate();
}

// DRAM fragmented with no free block elsewhere that holds a copy: 3 MiB free as three 1 MiB
// holes between 2 MiB copies (the last 1 MiB copy held by the client). A copy slides down
// into the hole before it (the ranges overlap: a memmove), joining two holes into the
// 2 MiB a new lease needs; its bytes are intact.
TEST_F(LeaseTableTest, AFragmentedDramSlidesACopyIntoTheHoleBeforeIt) {
  auto table = Table();
  auto s = *table->OpenSession("slide", {1 * kMiB, 10 * kMiB, 16 * kMiB});
  const char* names[] = {"a", "x1", "b", "x2", "c", "x3", "x4"};
  const uint64_t mib[] = {2, 1, 2, 1, 2, 1, 1};
  std::map<std::string, TensorId> ids;
  for (int k = 0; k < 7; ++k) {
    ids[names[k]] = *table->Lease(s, Spec(names[k], mib[k] * 256 * 1024));
    Write(*table, s, ids[names[k]], 40 + k, Place::kHost);
  }
  uint64_t expected = 0;
  for (int k = 0; k < 7; ++k) {
    auto p = table->Acquire(s, ids[names[k]], Access::kRead, Place::kHost);
    ASSERT_TRUE(p.ok()) << p.status();
    ASSERT_EQ(p->offset, expected * kMiB) << "the premise: " << names[k] << " in lease order";
    ASSERT_TRUE(table->Release(s, ids[names[k]]).ok());
    expected += mib[k];
  }
  for (const char* hole : {"x1", "x2", "x3"}) ASSERT_TRUE(table->Unlease(s, ids[hole]).ok());
  ASSERT_TRUE(table->Acquire(s, ids["x4"], Access::kRead, Place::kHost).ok());  // held: it may not move
  const LeaseStats before = table->Stats();
  const TensorId big = *table->Lease(s, Spec("big", 512 * 1024));  // 2 MiB
  std::array<bool, kTierCount> copies{};
  for (const LeaseView& v : table->List(s)) {
    if (v.id == big) copies = v.copies;
  }
  EXPECT_TRUE(copies[static_cast<int>(Tier::kDram)]) << "big went past a DRAM with 3 MiB free";
  EXPECT_EQ(table->Stats().relocations, before.relocations + 1);
  EXPECT_EQ(table->Stats().writebacks, before.writebacks);
  // Where List (and tierctl map) says the copies are now: b slid down into x1's hole.
  for (const LeaseView& v : table->List(s)) {
    if (v.id != ids["b"]) continue;
    EXPECT_EQ(v.offsets[static_cast<int>(Tier::kDram)], 2 * kMiB);
    EXPECT_EQ(v.extents[static_cast<int>(Tier::kDram)], 2 * kMiB);
  }
  ASSERT_TRUE(table->Release(s, ids["x4"]).ok());
  for (int k : {0, 2, 4, 6}) EXPECT_TRUE(Holds(*table, s, ids[names[k]], 40 + k, Place::kHost)) << names[k];
  EXPECT_TRUE(table->Validate().ok()) << table->Validate();
}

// A victim whose write-back finds no room below (here the NVMe quota has 1.5 MiB left and the
// least recently used DRAM tensor is 2 MiB) is passed over for one that fits, instead of
// failing the acquire that needed the room. Nothing is lost on the way.
TEST_F(LeaseTableTest, AVictimWithNoRoomBelowIsPassedOver) {
  auto table = Table();
  auto s = *table->OpenSession("tight", {1 * kMiB, 3 * kMiB, 3 * kMiB + 512 * 1024});
  auto where = [&](TensorId id) {
    for (const LeaseView& v : table->List(s)) {
      if (v.id == id) return v.copies;
    }
    return std::array<bool, kTierCount>{};
  };
  const TensorId x = *table->Lease(s, Spec("x", 256 * 1024));   // 1 MiB
  const TensorId a = *table->Lease(s, Spec("a", 512 * 1024));   // 2 MiB
  const TensorId b = *table->Lease(s, Spec("b", 256 * 1024));   // 1 MiB
  const TensorId c = *table->Lease(s, Spec("c", 512 * 1024));   // 2 MiB
  // Written on the host, a then b: both dirty, in DRAM only; a the least recently used.
  // (c, never written, keeps 2 MiB of the NVMe quota.)
  for (auto [id, seed] : {std::pair{a, 1u}, std::pair{b, 2u}}) {
    auto p = table->Acquire(s, id, Access::kOverwrite, Place::kHost);
    ASSERT_TRUE(p.ok()) << p.status();
    std::mt19937_64 rng(seed);
    for (uint64_t i = 0; i < p->bytes; i += 8) {
      const uint64_t word = rng();
      std::memcpy(Pointer(*p) + i, &word, 8);
    }
    ASSERT_TRUE(table->Release(s, id).ok());
  }
  ASSERT_TRUE(where(a)[static_cast<int>(Tier::kDram)] && where(b)[static_cast<int>(Tier::kDram)])
      << "the premise: a and b in DRAM";
  ASSERT_TRUE(where(c)[static_cast<int>(Tier::kNvme)] && !where(c)[static_cast<int>(Tier::kDram)])
      << "the premise: c on NVMe, 1.5 MiB of the NVMe quota left";
  // x to the host: DRAM (3 MiB) is full; a (2 MiB) cannot be written back to NVMe, b can.
  auto p = table->Acquire(s, x, Access::kRead, Place::kHost);
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_TRUE(table->Release(s, x).ok());
  EXPECT_TRUE(where(a)[static_cast<int>(Tier::kDram)]) << "a stayed";
  EXPECT_TRUE(where(b)[static_cast<int>(Tier::kNvme)]) << "b went down instead";
  ASSERT_TRUE(table->Validate().ok()) << table->Validate();
  ASSERT_TRUE(table->Unlease(s, x).ok());  // room in DRAM to read b back
  EXPECT_TRUE(Holds(*table, s, a, 1, Place::kHost));
  EXPECT_TRUE(Holds(*table, s, b, 2, Place::kHost));
}

// NVMe full, part of it copies of tensors the GPU holds the same bytes of: a write-back made
// on demand drops such a copy for room rather than failing (on the H200 at 7B a trainer's
// acquire failed with 74 dirty DRAM victims and no room below for any).
TEST_F(LeaseTableTest, AFullNvmeDropsItsCopiesOfTensorsAboveForAWriteBack) {
  auto table = Table();
  auto s = *table->OpenSession("full-below", {2 * kMiB, 2 * kMiB, 3 * kMiB});
  const TensorId u = *table->Lease(s, Spec("u", 256 * 1024));  // 1 MiB each, on the GPU
  const TensorId v = *table->Lease(s, Spec("v", 256 * 1024));
  Write(*table, s, u, 11);
  Write(*table, s, v, 12);
  for (TensorId id : {u, v}) {  // a copy on NVMe too (through DRAM, whose copy then goes)
    ASSERT_TRUE(table->Prefetch(s, id, Tier::kNvme, /*evict=*/false).ok());
    ASSERT_TRUE(table->Demote(s, id, Tier::kDram, /*dead=*/false).ok());
  }
  const TensorId a = *table->Lease(s, Spec("a", 256 * 1024));  // the GPU is full: DRAM
  const TensorId b = *table->Lease(s, Spec("b", 256 * 1024));
  Write(*table, s, a, 13, Place::kHost);  // dirty, DRAM only: DRAM full
  Write(*table, s, b, 14, Place::kHost);
  const TensorId x = *table->Lease(s, Spec("x", 256 * 1024));  // the last MiB of NVMe
  ASSERT_EQ(table->Usage(s, false)->at(static_cast<int>(Tier::kNvme)).used, 3 * kMiB) << "the premise: NVMe full";
  // x on the host: DRAM must write a or b back to NVMe, which has room only once it drops
  // its copy of u or v (the GPU holds the same bytes).
  auto p = table->Acquire(s, x, Access::kOverwrite, Place::kHost);
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_TRUE(table->Release(s, x).ok());
  EXPECT_EQ(table->Stats().nvme_duplicates_dropped, 1u);
  ASSERT_TRUE(table->Validate().ok()) << table->Validate();
  EXPECT_TRUE(Holds(*table, s, u, 11, Place::kGpu));
  EXPECT_TRUE(Holds(*table, s, v, 12, Place::kGpu));
  EXPECT_TRUE(Holds(*table, s, a, 13, Place::kHost));
  EXPECT_TRUE(Holds(*table, s, b, 14, Place::kHost));
}

// Nothing to drop and no room below: the acquire fails, and the error gives both tiers'
// numbers (the one asked for and the one its victims could not be written back to).
TEST_F(LeaseTableTest, NoRoomBelowForAnyVictimIsExplainedWithBothTiers) {
  auto table = Table();
  auto s = *table->OpenSession("stuck", {1 * kMiB, 1 * kMiB, 1 * kMiB});
  const TensorId p = *table->Lease(s, Spec("p", 256 * 1024));  // the GPU's 1 MiB
  Write(*table, s, p, 1);
  const TensorId q = *table->Lease(s, Spec("q", 256 * 1024));  // DRAM's
  Write(*table, s, q, 2, Place::kHost);
  const TensorId r = *table->Lease(s, Spec("r", 256 * 1024));  // NVMe's, never written
  auto stuck = table->Acquire(s, r, Access::kOverwrite, Place::kHost);
  ASSERT_EQ(stuck.status().code(), absl::StatusCode::kResourceExhausted) << stuck.status();
  const std::string why(stuck.status().message());
  EXPECT_NE(why.find("cannot place 1.00 MiB in dram: session 'stuck' dram quota 1.00 MiB"), std::string::npos) << why;
  EXPECT_NE(why.find("1 tensor(s) there found no room below to be written back to: session 'stuck' nvme quota 1.00 MiB"),
            std::string::npos)
      << why;
  EXPECT_EQ(table->Stats().nvme_duplicates_dropped, 0u);
  EXPECT_TRUE(Holds(*table, s, q, 2, Place::kHost));
  EXPECT_TRUE(Holds(*table, s, p, 1, Place::kGpu));
  EXPECT_TRUE(table->Validate().ok()) << table->Validate();
}

// Sizes mixed in one arena, as the 7B trainer leases them with its optimizer state in
// sub-groups (whole gradients of 16x a chunk's size): DRAM 16 MiB holds two 4 MiB tensors
// and fourteen 0.5 MiB ones (15 MiB); for 40 rounds a large one and three random small
// ones go and as many new ones come. The good fit keeps the large ones' room in blocks: no
// copy moves within the tier, none goes to NVMe, every value stays. (Written to test
// placing small copies from the top down; the good fit alone already passes it, so that
// change was not made. Kept: it fails if the allocator starts splitting blocks here.)
TEST_F(LeaseTableTest, MixedSizesChurnWithoutMovingOrSpilling) {
  auto table = Table();
  auto s = *table->OpenSession("segregated", {1 * kMiB, 16 * kMiB, 64 * kMiB});
  constexpr uint64_t kLarge = 1024 * 1024, kSmall = 128 * 1024;  // floats: 4 MiB, 0.5 MiB
  std::map<TensorId, uint32_t> seeds;
  uint32_t next = 1;
  auto lease_written = [&](uint64_t floats) {
    const TensorId id = *table->Lease(s, Spec("t" + std::to_string(next), floats));
    Write(*table, s, id, next, Place::kHost);
    seeds[id] = next++;
    return id;
  };
  std::vector<TensorId> large, small;
  large.push_back(lease_written(kLarge));
  for (int k = 0; k < 7; ++k) small.push_back(lease_written(kSmall));
  large.push_back(lease_written(kLarge));
  for (int k = 0; k < 7; ++k) small.push_back(lease_written(kSmall));
  const LeaseStats before = table->Stats();
  std::mt19937_64 rng(7);
  for (int round = 0; round < 40; ++round) {
    const size_t l = rng() % large.size();
    ASSERT_TRUE(table->Unlease(s, large[l]).ok());
    seeds.erase(large[l]);
    large.erase(large.begin() + l);
    for (int k = 0; k < 3; ++k) {
      const size_t i = rng() % small.size();
      ASSERT_TRUE(table->Unlease(s, small[i]).ok());
      seeds.erase(small[i]);
      small.erase(small.begin() + i);
    }
    for (int k = 0; k < 3; ++k) small.push_back(lease_written(kSmall));
    large.push_back(lease_written(kLarge));
    ASSERT_FALSE(HasFailure()) << "round " << round;
  }
  const LeaseStats after = table->Stats();
  EXPECT_EQ(after.relocations, before.relocations) << "copies moved to make a block";
  EXPECT_EQ(after.writebacks, before.writebacks) << "copies went to NVMe";
  EXPECT_EQ(after.evictions_capacity, before.evictions_capacity);
  for (const LeaseView& v : table->List(s)) {
    EXPECT_TRUE(v.copies[static_cast<int>(Tier::kDram)]) << v.spec.name << " is not in DRAM";
  }
  for (const auto& [id, seed] : seeds) EXPECT_TRUE(Holds(*table, s, id, seed, Place::kHost)) << id;
  EXPECT_TRUE(table->Validate().ok()) << table->Validate();
}

}  // namespace
}  // namespace tierd
