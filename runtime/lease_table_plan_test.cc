// LeaseTable's side of the planner: prefetch, demote, dead discards, overwrite acquires,
// and copies that let the session lock go so the planner's moves overlap the client.
#include <gtest/gtest.h>

#include <condition_variable>
#include <cstring>
#include <future>
#include <map>
#include <mutex>
#include <random>
#include <set>

#include "runtime/lease_table_plan_test_util.h"

namespace tierd {
namespace {

using testing::Spec;

// The planner's write-back takes free DRAM room only: with DRAM full of copies the plan keeps
// there, Demote says RESOURCE_EXHAUSTED (the executor waits for its push-downs) instead of
// pushing one of them to NVMe by the tiers' choice; nothing moves and nothing is lost, and
// once room is free it goes through.
TEST_F(PlanMovesTest, APlannedWriteBackTakesFreeRoomOnlyAndLosesNothing) {
  const TensorId g = LeaseWritten("g", 256 * 1024, 0x77);  // 1 MiB, its only copy on the GPU
  std::vector<TensorId> kept;
  for (int i = 0; i < 8; ++i) {  // 8 x 1 MiB: the DRAM quota, full
    auto id = table_->Lease(session_, Spec("kept" + std::to_string(i), 256 * 1024));
    ASSERT_TRUE(id.ok()) << id.status();
    auto p = table_->Acquire(session_, *id, Access::kOverwrite, Place::kHost);
    ASSERT_TRUE(p.ok()) << p.status();
    std::memset(Pointer(*p), 0x10 + i, p->bytes);
    ASSERT_TRUE(table_->Release(session_, *id).ok());
    kept.push_back(*id);
  }
  const LeaseStats before = table_->Stats();
  const absl::Status full = table_->Demote(session_, g, Tier::kGpu, /*dead=*/false);
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted) << full;
  EXPECT_TRUE(OnGpu(g));
  EXPECT_EQ(table_->Stats().writebacks, before.writebacks);
  for (const LeaseView& v : table_->List(session_)) {
    EXPECT_FALSE(v.copies[static_cast<int>(Tier::kNvme)]) << v.spec.name << " was pushed down by the tiers' choice";
  }
  ASSERT_TRUE(table_->Unlease(session_, kept.back()).ok());  // room
  kept.pop_back();
  EXPECT_TRUE(table_->Demote(session_, g, Tier::kGpu, /*dead=*/false).ok());
  EXPECT_FALSE(OnGpu(g));
  EXPECT_TRUE(Holds(g, 0x77));
  for (size_t i = 0; i < kept.size(); ++i) {
    auto p = table_->Acquire(session_, kept[i], Access::kRead, Place::kHost);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(Pointer(*p)[0], 0x10 + i);
    ASSERT_TRUE(table_->Release(session_, kept[i]).ok());
  }
  EXPECT_TRUE(table_->Validate().ok()) << table_->Validate();
}

TEST_F(PlanMovesTest, DemotedThenPrefetchedTensorsAreHitsWithTheirBytes) {
  const TensorId w = LeaseWritten("w", 256 * 1024, 0x5a);  // 1 MiB
  ASSERT_TRUE(table_->Demote(session_, w, Tier::kGpu, /*dead=*/false).ok());
  EXPECT_FALSE(OnGpu(w));
  EXPECT_EQ(table_->Stats().writebacks, 1u);  // the only copy went down first
  ASSERT_TRUE(table_->Prefetch(session_, w, Tier::kGpu, /*evict=*/false).ok());
  EXPECT_TRUE(OnGpu(w));
  bool fetched = true;
  EXPECT_TRUE(Holds(w, 0x5a, &fetched));
  EXPECT_FALSE(fetched) << "the prefetch made the acquire a hit";
  const LeaseStats stats = table_->Stats();
  EXPECT_EQ(stats.prefetches, 1u);
  EXPECT_EQ(stats.stalls, 0u);
  EXPECT_TRUE(table_->Validate().ok()) << table_->Validate();
}

TEST_F(PlanMovesTest, PrefetchWithoutEvictionTakesOnlyFreeRoom) {
  // Four 1 MiB tensors fill the 4 MiB GPU quota; a fifth lives below.
  std::vector<TensorId> on_gpu;
  for (int i = 0; i < 4; ++i) on_gpu.push_back(LeaseWritten("g" + std::to_string(i), 256 * 1024, i));
  const TensorId below = LeaseWritten("below", 256 * 1024, 9);  // evicted someone to get in
  ASSERT_TRUE(table_->Demote(session_, below, Tier::kGpu, false).ok());
  // Leasing `below` on the GPU pushed one of the four out; the room it left takes it back.
  for (TensorId id : on_gpu) {
    if (!OnGpu(id)) {
      ASSERT_TRUE(table_->Prefetch(session_, id, Tier::kGpu, /*evict=*/false).ok());
    }
  }
  for (TensorId id : on_gpu) ASSERT_TRUE(OnGpu(id));
  auto refused = table_->Prefetch(session_, below, Tier::kGpu, /*evict=*/false);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  for (TensorId id : on_gpu) EXPECT_TRUE(OnGpu(id)) << "a prefetch without eviction must not evict";
  ASSERT_TRUE(table_->Prefetch(session_, below, Tier::kGpu, /*evict=*/true).ok());
  EXPECT_TRUE(Holds(below, 9));
}

TEST_F(PlanMovesTest, DeadValuesAreDiscardedAndOnlyAnOverwriteMayHaveThemBack) {
  const TensorId act = LeaseWritten("act.3", 256 * 1024, 0x11);
  ASSERT_TRUE(table_->Demote(session_, act, Tier::kGpu, /*dead=*/true).ok());
  EXPECT_TRUE(table_->Validate().ok()) << table_->Validate();
  EXPECT_EQ(table_->Stats().discards, 1u);
  EXPECT_EQ(table_->Stats().writebacks, 0u) << "a dead value is never written back";
  auto read = table_->Acquire(session_, act, Access::kRead, Place::kGpu);
  ASSERT_EQ(read.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(read.status().message().find("ACCESS_OVERWRITE"), absl::string_view::npos) << read.status();
  EXPECT_EQ(table_->Acquire(session_, act, Access::kWrite, Place::kGpu).status().code(),
            absl::StatusCode::kFailedPrecondition);
  auto again = table_->Acquire(session_, act, Access::kOverwrite, Place::kGpu);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_FALSE(again->fetched);
  std::memset(Pointer(*again), 0x22, again->bytes);
  ASSERT_TRUE(table_->Release(session_, act).ok());
  EXPECT_TRUE(Holds(act, 0x22));
  EXPECT_TRUE(table_->Validate().ok());
}

TEST_F(PlanMovesTest, ADeadDiscardLosesToAWriteThatGotThereFirst) {
  const TensorId act = LeaseWritten("act.1", 1024, 0x66);
  const int64_t decided = RealClock().NowNanos();
  // The client overwrites it after the executor decided it was dead...
  auto p = table_->Acquire(session_, act, Access::kOverwrite, Place::kGpu);
  ASSERT_TRUE(p.ok());
  std::memset(Pointer(*p), 0x77, p->bytes);
  ASSERT_TRUE(table_->Release(session_, act).ok());
  // ...so the discard is refused and the new value stays.
  auto refused = table_->Demote(session_, act, Tier::kGpu, /*dead=*/true, decided);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_TRUE(Holds(act, 0x77));
  EXPECT_EQ(table_->Stats().discards, 0u);
}

TEST_F(PlanMovesTest, PrefetchOfAValuelessTensorReservesRoomForItsOverwrite) {
  const TensorId act = LeaseWritten("act.2", 256 * 1024, 0x12);
  ASSERT_TRUE(table_->Demote(session_, act, Tier::kGpu, /*dead=*/true).ok());
  EXPECT_FALSE(OnGpu(act));
  ASSERT_TRUE(table_->Prefetch(session_, act, Tier::kGpu, /*evict=*/false).ok());
  EXPECT_TRUE(OnGpu(act)) << "room is held on the GPU";
  EXPECT_EQ(table_->Stats().prefetches, 0u) << "nothing was copied";
  auto p = table_->Acquire(session_, act, Access::kOverwrite, Place::kGpu);
  ASSERT_TRUE(p.ok());
  EXPECT_FALSE(p->fetched);
  ASSERT_TRUE(table_->Release(session_, act).ok());
  EXPECT_TRUE(table_->Validate().ok()) << table_->Validate();
}

TEST_F(PlanMovesTest, PrefetchIntoNvmeCopiesDownAndKeepsTheRest) {
  const TensorId w = LeaseWritten("w", 256 * 1024, 0x21);
  ASSERT_TRUE(table_->Demote(session_, w, Tier::kGpu, false).ok());  // now in DRAM only
  ASSERT_TRUE(table_->Prefetch(session_, w, Tier::kNvme, false).ok());
  ASSERT_TRUE(table_->Demote(session_, w, Tier::kDram, false).ok());  // a push-down
  for (const LeaseView& v : table_->List(session_)) {
    if (v.id != w) continue;
    EXPECT_TRUE(v.copies[static_cast<int>(Tier::kNvme)]);
    EXPECT_FALSE(v.copies[static_cast<int>(Tier::kDram)]);
  }
  EXPECT_TRUE(Holds(w, 0x21));
}

TEST_F(PlanMovesTest, AnOverwriteNeverFetches) {
  const TensorId g = LeaseWritten("grad", 256 * 1024, 0x33);
  ASSERT_TRUE(table_->Demote(session_, g, Tier::kGpu, false).ok());
  auto p = table_->Acquire(session_, g, Access::kOverwrite, Place::kGpu);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_FALSE(p->fetched);
  EXPECT_EQ(table_->Stats().stalls, 0u);
  ASSERT_TRUE(table_->Release(session_, g).ok());
  for (const LeaseView& v : table_->List(session_)) {
    if (v.id == g) {
      EXPECT_FALSE(v.copies[static_cast<int>(Tier::kDram)]) << "the stale DRAM copy is dropped";
    }
  }
}

TEST_F(PlanMovesTest, PlannedMovesRefuseAcquiredTensors) {
  const TensorId w = LeaseWritten("w", 1024, 1);
  ASSERT_TRUE(table_->Acquire(session_, w, Access::kRead, Place::kGpu).ok());
  EXPECT_EQ(table_->Demote(session_, w, Tier::kGpu, false).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(table_->Demote(session_, w, Tier::kGpu, true).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(table_->Release(session_, w).ok());
}

// A gap in DRAM that a move in flight has taken (its destination is not any copy's yet)
// looks free to the joining of fragmented space: sliding a copy into it fails, the copy
// stays where it was with its bytes, and the stage that needed the room waits; once the
// move lands, a copy moves and the stage fits.
TEST_F(PlanMovesTest, ASlideIntoRoomAMoveInFlightTookPutsTheCopyBack) {
  // `big` (2 MiB) lives on NVMe only.
  const TensorId big = LeaseWritten("big", 512 * 1024, 0x70);
  ASSERT_TRUE(table_->Prefetch(session_, big, Tier::kNvme, /*evict=*/false).ok());
  ASSERT_TRUE(table_->Demote(session_, big, Tier::kDram, /*dead=*/false).ok());
  ASSERT_TRUE(table_->Demote(session_, big, Tier::kGpu, /*dead=*/false).ok());
  // DRAM (8 MiB) full: a 2, x1 1, b 2, x2 1, c 1, x3 1 MiB, side by side.
  const char* names[] = {"a", "x1", "b", "x2", "c", "x3"};
  const uint64_t mib[] = {2, 1, 2, 1, 1, 1};
  std::map<std::string, TensorId> ids;
  uint64_t expected = 0;
  for (int k = 0; k < 6; ++k) {
    auto id = table_->Lease(session_, Spec(names[k], mib[k] * 256 * 1024));
    ASSERT_TRUE(id.ok()) << id.status();
    ids[names[k]] = *id;
    auto p = table_->Acquire(session_, *id, Access::kOverwrite, Place::kHost);
    ASSERT_TRUE(p.ok()) << p.status();
    ASSERT_EQ(p->tier, Tier::kDram);
    ASSERT_EQ(p->offset, expected * kMiB) << "the premise: " << names[k] << " in lease order";
    std::memset(Pointer(*p), 0x40 + k, p->bytes);
    ASSERT_TRUE(table_->Release(session_, *id).ok());
    expected += mib[k];
  }
  // g's write-back takes x2's room and stays in flight on the gate.
  const TensorId g = LeaseWritten("g", 256 * 1024, 0x77);
  ASSERT_TRUE(table_->Unlease(session_, ids["x2"]).ok());
  gate_.Shut();
  auto write_back = std::async(std::launch::async, [&] { return table_->Demote(session_, g, Tier::kGpu, false); });
  gate_.WaitForSleeper();
  ASSERT_TRUE(table_->Unlease(session_, ids["x1"]).ok());
  ASSERT_TRUE(table_->Unlease(session_, ids["x3"]).ok());
  // 2 MiB free (x1's and x3's room); the cheapest join slides c into x2's, which g holds.
  const LeaseStats before = table_->Stats();
  const absl::Status refused = table_->Prefetch(session_, big, Tier::kDram, /*evict=*/false);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted) << refused;
  EXPECT_EQ(table_->Stats().relocations, before.relocations) << "nothing slid";
  gate_.Open();
  ASSERT_TRUE(write_back.get().ok());
  // g has landed: c moves into x1's room and big's 2 MiB are joined at the top.
  ASSERT_TRUE(table_->Prefetch(session_, big, Tier::kDram, /*evict=*/false).ok());
  EXPECT_EQ(table_->Stats().relocations, before.relocations + 1);
  for (const LeaseView& v : table_->List(session_)) {
    if (v.id == big) {
      EXPECT_EQ(v.offsets[static_cast<int>(Tier::kDram)], 6 * kMiB);
    }
  }
  EXPECT_TRUE(Holds(big, 0x70));
  EXPECT_TRUE(Holds(g, 0x77));
  for (int k : {0, 2, 4}) {
    auto p = table_->Acquire(session_, ids[names[k]], Access::kRead, Place::kHost);
    ASSERT_TRUE(p.ok()) << p.status();
    for (uint64_t i = 0; i < p->bytes; i += 4096) ASSERT_EQ(Pointer(*p)[i], 0x40 + k) << names[k] << " at " << i;
    ASSERT_TRUE(table_->Release(session_, ids[names[k]]).ok());
  }
  EXPECT_TRUE(table_->Validate().ok()) << table_->Validate();
}

TEST_F(PlanMovesTest, AMoveInFlightDoesNotBlockTheRestOfTheSession) {
  const TensorId moving = LeaseWritten("moving", 256 * 1024, 0x44);
  const TensorId resident = LeaseWritten("resident", 1024, 0x55);
  ASSERT_TRUE(table_->Demote(session_, moving, Tier::kGpu, false).ok());
  gate_.Shut();
  auto prefetch = std::async(std::launch::async, [&] { return table_->Prefetch(session_, moving, Tier::kGpu, false); });
  gate_.WaitForSleeper();  // the copy is in flight, stuck on the gate
  // The session lock is not held by the copy: another tensor is served meanwhile.
  auto other = std::async(std::launch::async, [&] { return Holds(resident, 0x55); });
  ASSERT_EQ(other.wait_for(std::chrono::seconds(20)), std::future_status::ready)
      << "an acquire of another tensor waited for a copy in flight";
  EXPECT_TRUE(other.get());
  // The moving tensor itself waits for its copy to land, then is a hit.
  auto same = std::async(std::launch::async, [&] {
    bool fetched = true;
    const bool ok = Holds(moving, 0x44, &fetched);
    return ok && !fetched;
  });
  EXPECT_EQ(same.wait_for(std::chrono::milliseconds(50)), std::future_status::timeout);
  gate_.Open();
  EXPECT_TRUE(prefetch.get().ok());
  EXPECT_TRUE(same.get());
  EXPECT_TRUE(table_->Validate().ok()) << table_->Validate();
}

// A join within the GPU (a copy moved aside so the free space is one block) lets the
// session's lock go while the copy runs: the session's other requests are served meanwhile,
// the moved tensor waits for its copy, and every byte lands.
TEST_F(PlanMovesTest, AJoinWithinTheGpuDoesNotBlockTheRestOfTheSession) {
  // e (2 MiB) waits in DRAM; a, b (1 MiB each), c (0.5 MiB) and d (1.5 MiB) fill the 4 MiB
  // GPU; b and d go down, leaving 2.5 MiB free in two holes apart. Moving a into d's old
  // range joins a's and b's (c has no free block to go to but its own neighbours).
  auto e = table_->Lease(session_, testing::Spec("e", 512 * 1024));
  ASSERT_TRUE(e.ok()) << e.status();
  auto host = table_->Acquire(session_, *e, Access::kOverwrite, Place::kHost);
  ASSERT_TRUE(host.ok()) << host.status();
  std::memset(Pointer(*host), 0x1e, host->bytes);
  ASSERT_TRUE(table_->Release(session_, *e).ok());
  const TensorId a = LeaseWritten("a", 256 * 1024, 0x1a);
  const TensorId b = LeaseWritten("b", 256 * 1024, 0x1b);
  const TensorId c = LeaseWritten("c", 128 * 1024, 0x1c);
  const TensorId d = LeaseWritten("d", 384 * 1024, 0x1d);
  ASSERT_FALSE(OnGpu(*e));
  ASSERT_TRUE(table_->Demote(session_, b, Tier::kGpu, false).ok());
  ASSERT_TRUE(table_->Demote(session_, d, Tier::kGpu, false).ok());
  const uint64_t joins_before = table_->Stats().gpu_relocations;
  gate_.Shut();
  // The plan's load of e (free room only) must join: a's copy is stuck on the gate.
  auto load = std::async(std::launch::async, [&] { return table_->Prefetch(session_, *e, Tier::kGpu, false); });
  gate_.WaitForSleeper();
  auto other = std::async(std::launch::async, [&] { return Holds(c, 0x1c); });
  ASSERT_EQ(other.wait_for(std::chrono::seconds(20)), std::future_status::ready)
      << "an acquire of another tensor waited for a join's copy within the GPU";
  EXPECT_TRUE(other.get());
  auto moved = std::async(std::launch::async, [&] { return Holds(a, 0x1a); });
  EXPECT_EQ(moved.wait_for(std::chrono::milliseconds(50)), std::future_status::timeout)
      << "the copy being moved was served before its bytes landed";
  gate_.Open();
  ASSERT_TRUE(load.get().ok());
  EXPECT_TRUE(moved.get());
  EXPECT_EQ(table_->Stats().gpu_relocations, joins_before + 1);
  EXPECT_TRUE(OnGpu(*e));
  EXPECT_TRUE(Holds(*e, 0x1e));
  for (auto [id, fill] : {std::pair{b, 0x1b}, {d, 0x1d}}) {
    auto p = table_->Acquire(session_, id, Access::kRead, Place::kHost);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(Pointer(*p)[p->bytes - 1], fill);
    ASSERT_TRUE(table_->Release(session_, id).ok());
  }
  EXPECT_TRUE(table_->Validate().ok()) << table_->Validate();
}

}  // namespace
}  // namespace tierd
