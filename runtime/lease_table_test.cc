#include "runtime/lease_table.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <random>
#include <thread>

#include "runtime/mover_test_util.h"

namespace tierd {
namespace {

using testing::MakeDaemonEngine;

TensorSpec Spec(const std::string& name, uint64_t floats, TensorClass c = TensorClass::kParam) {
  return TensorSpec{name, c, DType::kF32, {static_cast<int64_t>(floats)}};
}

class LeaseTableTest : public ::testing::Test {
 public:
  void SetUp() override {
    engine_ = MakeDaemonEngine(::testing::UnitTest::GetInstance()->current_test_info()->name(),
                               16 * kMiB, 16 * kMiB, 64 * kMiB);
  }
  std::unique_ptr<LeaseTable> Table(std::vector<PinRule> pins = {}) {
    auto table = LeaseTable::Create(*engine_.store, *engine_.mover, RealClock(), std::move(pins));
    EXPECT_TRUE(table.ok()) << table.status();
    return std::move(*table);
  }
  uint8_t* Pointer(const Placement& p) {
    const Extent e{p.tier, p.arena, Allocation{p.offset, p.bytes, 0}};
    return engine_.store->Address(e);
  }
  // Writes `seed`'s bytes into the tensor through a write acquire (on the GPU unless said).
  void Write(LeaseTable& table, SessionId s, TensorId t, uint32_t seed, Place place = Place::kGpu) {
    auto p = table.Acquire(s, t, Access::kWrite, place);
    ASSERT_TRUE(p.ok()) << p.status();
    std::mt19937_64 rng(seed);
    uint8_t* bytes = Pointer(*p);
    for (uint64_t i = 0; i < p->bytes; i += 8) {  // sizes are multiples of 4: copy whole words
      const uint64_t word = rng();
      std::memcpy(bytes + i, &word, std::min<uint64_t>(8, p->bytes - i));
    }
    ASSERT_TRUE(table.Release(s, t).ok());
  }
  // Reads the tensor at `place` and checks it holds `seed`'s bytes.
  bool Holds(LeaseTable& table, SessionId s, TensorId t, uint32_t seed, Place place) {
    auto p = table.Acquire(s, t, Access::kRead, place);
    EXPECT_TRUE(p.ok()) << p.status();
    if (!p.ok()) return false;
    std::mt19937_64 rng(seed);
    const uint8_t* bytes = Pointer(*p);
    bool same = true;
    for (uint64_t i = 0; i < p->bytes && same; i += 8) {
      const uint64_t word = rng();
      same = std::memcmp(bytes + i, &word, std::min<uint64_t>(8, p->bytes - i)) == 0;
    }
    EXPECT_TRUE(table.Release(s, t).ok());
    return same;
  }
  testing::Engine engine_;
};

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
// (A client's split of the GPU by tensors it holds is what failed a 450 MiB workspace on the
// H200 once, docs/BENCHMARKS.md session 7.)
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
  auto holds = [&](TensorId id, uint32_t seed) {
    auto q = table->Acquire(s, id, Access::kRead, Place::kHost);
    EXPECT_TRUE(q.ok()) << q.status();
    if (!q.ok()) return false;
    std::mt19937_64 rng(seed);
    bool same = true;
    for (uint64_t i = 0; i < q->bytes && same; i += 8) {
      const uint64_t word = rng();
      same = std::memcmp(Pointer(*q) + i, &word, 8) == 0;
    }
    EXPECT_TRUE(table->Release(s, id).ok());
    return same;
  };
  EXPECT_TRUE(holds(a, 1));
  EXPECT_TRUE(holds(b, 2));
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

// A session's use of each tier: allocated bytes now, and the most since it opened or since
// the last reset (a trainer's peak per step).
TEST_F(LeaseTableTest, UsageHasPeaksThatReset) {
  auto table = Table();
  auto s = *table->OpenSession("usage", {2 * kMiB, 4 * kMiB, 8 * kMiB});
  const TensorId a = *table->Lease(s, Spec("a", 256 * 1024));  // 1 MiB each
  const TensorId b = *table->Lease(s, Spec("b", 256 * 1024));
  const TensorId c = *table->Lease(s, Spec("c", 256 * 1024));
  for (TensorId id : {a, b, c}) Write(*table, s, id, 7);  // on the GPU in turn: 2 MiB at most
  auto usage = table->Usage(s, /*reset_peaks=*/false);
  ASSERT_TRUE(usage.ok()) << usage.status();
  const auto& gpu = (*usage)[static_cast<int>(Tier::kGpu)];
  EXPECT_EQ(gpu.quota, 2 * kMiB);
  EXPECT_EQ(gpu.peak, 2 * kMiB) << "two of the three fit at once";
  EXPECT_LE(gpu.used, gpu.peak);
  // Unlease all: nothing held; the peak stays until a reset.
  for (TensorId id : {a, b, c}) ASSERT_TRUE(table->Unlease(s, id).ok());
  usage = table->Usage(s, /*reset_peaks=*/true);
  ASSERT_TRUE(usage.ok());
  EXPECT_EQ((*usage)[static_cast<int>(Tier::kGpu)].used, 0u);
  EXPECT_EQ((*usage)[static_cast<int>(Tier::kGpu)].peak, 2 * kMiB);
  usage = table->Usage(s, /*reset_peaks=*/false);
  ASSERT_TRUE(usage.ok());
  EXPECT_EQ((*usage)[static_cast<int>(Tier::kGpu)].peak, 0u) << "restarted from what is held";
  EXPECT_FALSE(table->Usage(s + 100, false).ok()) << "an unknown session";
}

TEST_F(LeaseTableTest, TensorsSurviveEvictionThroughEveryTier) {
  auto table = Table();
  // 4 MiB of GPU and of DRAM for eight 1.5 MiB tensors: most must live on NVMe.
  auto s = *table->OpenSession("train", {4 * kMiB, 4 * kMiB, 32 * kMiB});
  std::vector<TensorId> ids;
  for (int i = 0; i < 8; ++i) {
    auto id = table->Lease(s, Spec("layers." + std::to_string(i) + ".w", 384 * 1024));
    ASSERT_TRUE(id.ok()) << id.status();
    ids.push_back(*id);
    ASSERT_TRUE(table->Validate().ok()) << table->Validate();
  }
  for (int i = 0; i < 8; ++i) {
    Write(*table, s, ids[i], 100 + i);
    ASSERT_TRUE(table->Validate().ok()) << table->Validate();
  }
  for (int round = 0; round < 2; ++round) {
    for (int i = 7; i >= 0; --i) {
      EXPECT_TRUE(Holds(*table, s, ids[i], 100 + i, i % 2 ? Place::kGpu : Place::kHost)) << i;
      ASSERT_TRUE(table->Validate().ok()) << table->Validate();
    }
  }
  const LeaseStats stats = table->Stats();
  EXPECT_GT(stats.stalls, 8u);
  EXPECT_GT(stats.writebacks, 4u);
  EXPECT_EQ(stats.leases, 8u);
  EXPECT_GT(engine_.mover->Stats(Link::kDramToNvme).moves, 0u);
  EXPECT_GT(engine_.mover->Stats(Link::kNvmeToDram).moves, 0u);
}

TEST_F(LeaseTableTest, BadRequestsGetClearErrors) {
  auto table = Table();
  auto s = *table->OpenSession("bad", {2 * kMiB, 2 * kMiB, 4 * kMiB});
  EXPECT_EQ(table->Lease(s, Spec("", 4)).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(table->Lease(s, Spec("has space", 4)).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(table->Lease(s, TensorSpec{"zero", TensorClass::kParam, DType::kF32, {4, 0}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(table->Lease(s, TensorSpec{"huge", TensorClass::kParam, DType::kF32, {1 << 30, 1 << 30}})
                .status().code(),
            absl::StatusCode::kInvalidArgument);
  auto too_big = table->Lease(s, Spec("too.big", 3 * kMiB));  // 12 MiB > every quota
  ASSERT_EQ(too_big.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(too_big.status().message().find("no tier of session 'bad' has room"), absl::string_view::npos)
      << too_big.status().message();
  auto a = *table->Lease(s, Spec("a", 1024));
  EXPECT_EQ(table->Lease(s, Spec("a", 1024)).status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(table->Release(s, a).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(table->Acquire(s, 999, Access::kRead, Place::kGpu).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(table->Acquire(999, a, Access::kRead, Place::kGpu).status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(table->Acquire(s, a, Access::kWrite, Place::kGpu).ok());
  EXPECT_EQ(table->Acquire(s, a, Access::kRead, Place::kHost).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(table->Unlease(s, a).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(table->Release(s, a).ok());
  EXPECT_EQ(table->Release(s, a).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(table->Unlease(s, a).ok());
  EXPECT_EQ(table->Acquire(s, a, Access::kRead, Place::kGpu).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(table->Validate().ok());
}

TEST_F(LeaseTableTest, AcquiredTensorsAreNeverEvictedAndFullIsExplained) {
  auto table = Table();
  auto s = *table->OpenSession("full", {2 * kMiB, 4 * kMiB, 8 * kMiB});
  auto x = *table->Lease(s, Spec("x", 256 * 1024));  // 1 MiB each
  auto y = *table->Lease(s, Spec("y", 256 * 1024));
  auto z = *table->Lease(s, Spec("z", 256 * 1024));
  ASSERT_TRUE(table->Acquire(s, x, Access::kWrite, Place::kGpu).ok());
  ASSERT_TRUE(table->Acquire(s, y, Access::kWrite, Place::kGpu).ok());
  auto no_room = table->Acquire(s, z, Access::kWrite, Place::kGpu);
  ASSERT_EQ(no_room.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(no_room.status().message().find("held by 2 acquired, 0 pinned and 0 other"),
            absl::string_view::npos)
      << no_room.status().message();
  ASSERT_TRUE(table->Release(s, y).ok());
  EXPECT_TRUE(table->Acquire(s, z, Access::kWrite, Place::kGpu).ok());  // y makes room now
  EXPECT_TRUE(table->Validate().ok()) << table->Validate();
}

// A fence that stands for the client's kernels still running: it records when it was
// waited for, and the bytes it "writes" land only then (as a late kernel's would).
class LateKernelFence : public GpuFence {
 public:
  LateKernelFence(uint8_t* gpu_bytes, uint64_t size, std::atomic<int>* waits)
      : bytes_(gpu_bytes), size_(size), waits_(waits) {}
  absl::Status Wait() override {
    std::memset(bytes_, 0x77, size_);  // the kernel finishes now
    ++*waits_;
    return absl::OkStatus();
  }

 private:
  uint8_t* bytes_;
  uint64_t size_;
  std::atomic<int>* waits_;
};

TEST_F(LeaseTableTest, ReleaseWithAFenceIsWaitedForBeforeTheGpuCopyIsMovedOrReused) {
  auto table = Table();
  auto s = *table->OpenSession("fenced", {2 * kMiB, 8 * kMiB, 0});
  auto a = *table->Lease(s, Spec("a", 256 * 1024));  // 1 MiB each
  auto b = *table->Lease(s, Spec("b", 256 * 1024));
  auto c = *table->Lease(s, Spec("c", 256 * 1024));
  auto p = *table->Acquire(s, a, Access::kWrite, Place::kGpu);
  std::memset(Pointer(p), 0x11, p.bytes);  // what the host wrote; the "kernel" overwrites it later
  std::atomic<int> waits{0};
  ASSERT_TRUE(table->Release(s, a, std::make_unique<LateKernelFence>(Pointer(p), p.bytes, &waits)).ok());
  EXPECT_EQ(waits.load(), 0);  // release does not wait
  Write(*table, s, b, 2);
  Write(*table, s, c, 3);      // the GPU quota is full: `a` is written back to DRAM
  EXPECT_EQ(waits.load(), 1);
  auto back = *table->Acquire(s, a, Access::kRead, Place::kHost);
  EXPECT_EQ(Pointer(back)[0], 0x77) << "the write-back copied the bytes before the kernel finished";
  EXPECT_EQ(Pointer(back)[back.bytes - 1], 0x77);
  ASSERT_TRUE(table->Release(s, a).ok());
  EXPECT_TRUE(table->Validate().ok()) << table->Validate();
}

TEST_F(LeaseTableTest, PinnedTensorsStayInTheirTier) {
  EXPECT_EQ(LeaseTable::Create(*engine_.store, *engine_.mover, RealClock(), {{"embed[", Tier::kGpu}})
                .status().code(),
            absl::StatusCode::kInvalidArgument);
  auto table = Table({{"embed\\..*", Tier::kGpu}});
  auto s = *table->OpenSession("pins", {3 * kMiB, 8 * kMiB, 16 * kMiB});
  auto embed = *table->Lease(s, Spec("embed.tokens", 256 * 1024));
  Write(*table, s, embed, 7);
  std::vector<TensorId> others;
  for (int i = 0; i < 6; ++i) {
    others.push_back(*table->Lease(s, Spec("layers." + std::to_string(i), 256 * 1024)));
    Write(*table, s, others.back(), 20 + i);
  }
  for (const LeaseView& view : table->List(s)) {
    if (view.spec.name == "embed.tokens") {
      EXPECT_TRUE(view.copies[static_cast<int>(Tier::kGpu)]);
      EXPECT_EQ(view.pinned, Tier::kGpu);
    }
  }
  EXPECT_TRUE(Holds(*table, s, embed, 7, Place::kGpu));
  // Pin at run time moves a tensor and keeps it; unpin lets it go again.
  ASSERT_TRUE(table->Pin(s, others[0], Tier::kGpu).ok());
  for (int i = 1; i < 6; ++i) EXPECT_TRUE(Holds(*table, s, others[i], 20 + i, Place::kGpu));
  EXPECT_TRUE(table->List(s)[1].copies[static_cast<int>(Tier::kGpu)]);
  EXPECT_TRUE(Holds(*table, s, others[0], 20, Place::kGpu));
  ASSERT_TRUE(table->Unpin(s, others[0]).ok());
  EXPECT_TRUE(table->Validate().ok()) << table->Validate();
}

TEST_F(LeaseTableTest, SessionsAreIsolatedAndGiveTheirBudgetBack) {
  auto table = Table();
  auto a = *table->OpenSession("a", {8 * kMiB, 8 * kMiB, 16 * kMiB});
  auto b = *table->OpenSession("b", {8 * kMiB, 8 * kMiB, 16 * kMiB});
  auto c = table->OpenSession("c", {1 * kMiB, 1 * kMiB, 0});  // the node budget is spent
  EXPECT_EQ(c.status().code(), absl::StatusCode::kResourceExhausted);
  auto ta = *table->Lease(a, Spec("w", 1024));
  auto tb = *table->Lease(b, Spec("w", 1024));  // same name, other session: fine
  Write(*table, a, ta, 1);
  Write(*table, b, tb, 2);
  EXPECT_NE(table->SessionArena(a, Tier::kGpu), table->SessionArena(b, Tier::kGpu));
  EXPECT_TRUE(Holds(*table, a, ta, 1, Place::kGpu));
  EXPECT_TRUE(Holds(*table, b, tb, 2, Place::kGpu));
  ASSERT_TRUE(table->CloseSession(a).ok());
  EXPECT_EQ(table->Acquire(a, ta, Access::kRead, Place::kGpu).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(engine_.store->Stats(Tier::kGpu).reserved_bytes, 8 * kMiB);
  EXPECT_TRUE(table->OpenSession("c", {1 * kMiB, 1 * kMiB, 0}).ok());
  EXPECT_TRUE(Holds(*table, b, tb, 2, Place::kGpu));
  EXPECT_EQ(table->Stats().sessions, 2u);
}

// Four sessions at once, each from its own thread, while a monitor samples the tiers:
// no tier's allocations or reservations ever exceed its budget, and no bytes get mixed up.
TEST_F(LeaseTableTest, ConcurrentSessionsNeverExceedTheBudgets) {
  auto table = Table();
  std::atomic<bool> done{false};
  std::array<std::atomic<uint64_t>, kTierCount> peak_used{}, peak_reserved{};
  std::thread monitor([&] {
    while (!done) {
      for (Tier tier : {Tier::kGpu, Tier::kDram, Tier::kNvme}) {
        const TierStats stats = engine_.store->Stats(tier);
        auto& used = peak_used[static_cast<int>(tier)];
        auto& reserved = peak_reserved[static_cast<int>(tier)];
        used = std::max<uint64_t>(used, stats.allocator.used_bytes);
        reserved = std::max<uint64_t>(reserved, stats.reserved_bytes);
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  });
  std::vector<std::thread> workers;
  for (int w = 0; w < 4; ++w) {
    workers.emplace_back([&, w] {
      auto s = table->OpenSession("w" + std::to_string(w), {4 * kMiB, 4 * kMiB, 16 * kMiB});
      ASSERT_TRUE(s.ok()) << s.status();
      std::mt19937 rng(w);
      std::vector<std::pair<TensorId, uint32_t>> mine;
      for (int step = 0; step < 120; ++step) {
        if (mine.size() < 10 && rng() % 3 == 0) {
          auto id = table->Lease(*s, Spec("t" + std::to_string(step), 1024 * (64 + rng() % 256)));
          if (id.ok()) mine.push_back({*id, 0});
          continue;
        }
        if (mine.empty()) continue;
        auto& [id, seed] = mine[rng() % mine.size()];
        if (seed == 0 || rng() % 2) {
          seed = static_cast<uint32_t>(w * 1000 + step + 1);
          Write(*table, *s, id, seed);
        } else {
          EXPECT_TRUE(Holds(*table, *s, id, seed, rng() % 2 ? Place::kGpu : Place::kHost));
        }
      }
    });
  }
  for (auto& worker : workers) worker.join();
  done = true;
  monitor.join();
  EXPECT_TRUE(table->Validate().ok()) << table->Validate();
  for (Tier tier : {Tier::kGpu, Tier::kDram, Tier::kNvme}) {
    const uint64_t budget = engine_.store->Stats(tier).budget_bytes;
    EXPECT_LE(peak_used[static_cast<int>(tier)].load(), budget) << TierName(tier);
    EXPECT_LE(peak_reserved[static_cast<int>(tier)].load(), budget) << TierName(tier);
  }
  EXPECT_GT(peak_used[static_cast<int>(Tier::kNvme)].load(), 0u);  // the pressure was real
  EXPECT_GT(table->Stats().writebacks, 0u);
}

// Random leases, writes, reads at both places, unleases and pins over two sessions with
// small quotas; the model knows each tensor's bytes. Validate() after every step.
TEST_F(LeaseTableTest, RandomOperationsNeverLoseOrMixUpBytes) {
  auto table = Table();
  std::mt19937_64 rng(2024);
  struct Model {
    TensorId id;
    uint32_t seed;  // 0: never written
  };
  std::vector<SessionId> sessions = {*table->OpenSession("s0", {3 * kMiB, 3 * kMiB, 24 * kMiB}),
                                     *table->OpenSession("s1", {2 * kMiB, 4 * kMiB, 24 * kMiB})};
  std::vector<std::map<std::string, Model>> models(2);
  int next_name = 0;
  for (int step = 0; step < 400; ++step) {
    const int si = rng() % 2;
    const SessionId s = sessions[si];
    auto& model = models[si];
    const int op = rng() % 10;
    if (op < 2 || model.empty()) {
      const std::string name = "t" + std::to_string(next_name++);
      auto id = table->Lease(s, Spec(name, 1024 * (1 + rng() % 256)));
      if (id.ok()) model[name] = {*id, 0};
      else ASSERT_EQ(id.status().code(), absl::StatusCode::kResourceExhausted) << id.status();
    } else {
      auto it = std::next(model.begin(), rng() % model.size());
      Model& m = it->second;
      if (op < 5) {
        m.seed = static_cast<uint32_t>(step + 1);
        Write(*table, s, m.id, m.seed);
      } else if (op < 9) {
        if (m.seed != 0) {
          ASSERT_TRUE(Holds(*table, s, m.id, m.seed, op % 2 ? Place::kGpu : Place::kHost)) << step;
        }
      } else {
        ASSERT_TRUE(table->Unlease(s, m.id).ok());
        model.erase(it);
      }
    }
    ASSERT_TRUE(table->Validate().ok()) << table->Validate() << " at step " << step;
  }
  for (int si = 0; si < 2; ++si) {
    for (auto& [name, m] : models[si]) {
      if (m.seed != 0) {
        EXPECT_TRUE(Holds(*table, sessions[si], m.id, m.seed, Place::kGpu)) << name;
      }
    }
  }
  EXPECT_GT(table->Stats().writebacks, 10u);
  // The joins of fragmented free space (moves elsewhere, slides) ran too, every byte checked.
  EXPECT_GT(table->Stats().relocations, 10u);
  EXPECT_GT(table->Stats().gpu_relocations, 0u);
}

}  // namespace
}  // namespace tierd
