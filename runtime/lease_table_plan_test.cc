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

#include "runtime/lease_table.h"
#include "runtime/lease_table_test_util.h"
#include "runtime/mover_test_util.h"

namespace tierd {
namespace {

// A clock whose sleeps (the fake GPU's modelled link time) block while the gate is shut:
// a copy in flight stays in flight until the test opens it. Deterministic, no timing.
class GateClock final : public Clock {
 public:
  int64_t NowNanos() override { return RealClock().NowNanos(); }
  void SleepNanos(int64_t) override {
    std::unique_lock<std::mutex> lock(mutex_);
    ++sleepers_;
    changed_.notify_all();
    changed_.wait(lock, [this] { return open_; });
    --sleepers_;
  }
  void Shut() {
    std::lock_guard<std::mutex> lock(mutex_);
    open_ = false;
  }
  void Open() {
    std::lock_guard<std::mutex> lock(mutex_);
    open_ = true;
    changed_.notify_all();
  }
  void WaitForSleeper() {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [this] { return sleepers_ > 0; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  bool open_ = true;
  int sleepers_ = 0;
};

using testing::Spec;

class PlanMovesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    FakeGpuOptions gpu;
    gpu.link_bytes_per_second = 1e12;  // each copy "sleeps" on the gate clock
    gpu.clock = &gate_;
    engine_ = testing::MakeDaemonEngine(::testing::UnitTest::GetInstance()->current_test_info()->name(),
                                        8 * kMiB, 16 * kMiB, 32 * kMiB, gpu);
    auto table = LeaseTable::Create(*engine_.store, *engine_.mover, RealClock(), {});
    ASSERT_TRUE(table.ok()) << table.status();
    table_ = std::move(*table);
    auto s = table_->OpenSession("plan", {4 * kMiB, 8 * kMiB, 16 * kMiB});
    ASSERT_TRUE(s.ok()) << s.status();
    session_ = *s;
  }
  void TearDown() override { gate_.Open(); }
  uint8_t* Pointer(const Placement& p) {
    return engine_.store->Address(Extent{p.tier, p.arena, Allocation{p.offset, p.bytes, 0}});
  }
  TensorId LeaseWritten(const std::string& name, uint64_t floats, uint8_t fill) {
    auto id = table_->Lease(session_, Spec(name, floats));
    EXPECT_TRUE(id.ok()) << id.status();
    auto p = table_->Acquire(session_, *id, Access::kOverwrite, Place::kGpu);
    EXPECT_TRUE(p.ok()) << p.status();
    std::memset(Pointer(*p), fill, p->bytes);
    EXPECT_TRUE(table_->Release(session_, *id).ok());
    return *id;
  }
  bool Holds(TensorId id, uint8_t fill, bool* fetched = nullptr) {
    auto p = table_->Acquire(session_, id, Access::kRead, Place::kGpu);
    EXPECT_TRUE(p.ok()) << p.status();
    if (!p.ok()) return false;
    if (fetched) *fetched = p->fetched;
    bool same = true;
    for (uint64_t i = 0; i < p->bytes; ++i) same &= Pointer(*p)[i] == fill;
    EXPECT_TRUE(table_->Release(session_, id).ok());
    return same;
  }
  // Where a read acquire on the GPU finds the tensor (released again).
  uint64_t OffsetOf(TensorId id) {
    auto p = table_->Acquire(session_, id, Access::kRead, Place::kGpu);
    EXPECT_TRUE(p.ok()) << p.status();
    const uint64_t offset = p.ok() ? p->offset : UINT64_MAX;
    EXPECT_TRUE(table_->Release(session_, id).ok());
    return offset;
  }
  // The planner's static layout, as the placement advisor: GPU offsets by name.
  void UseLayout(std::map<std::string, uint64_t> layout) {
    layout_ = std::move(layout);
    ASSERT_TRUE(table_
                    ->SetPlacementAdvisor(session_,
                                          [this](const std::string& name, Tier tier) -> std::optional<uint64_t> {
                                            auto it = layout_.find(name);
                                            if (tier != Tier::kGpu || it == layout_.end()) return std::nullopt;
                                            return it->second;
                                          })
                    .ok());
  }
  bool OnGpu(TensorId id) {
    for (const LeaseView& v : table_->List(session_)) {
      if (v.id == id) return v.copies[static_cast<int>(Tier::kGpu)];
    }
    return false;
  }

  GateClock gate_;
  testing::Engine engine_;
  std::unique_ptr<LeaseTable> table_;
  SessionId session_ = 0;
  std::map<std::string, uint64_t> layout_;
};

// The planner's static layout: copies made in the GPU go to the offset it names when that
// range is free; when it is taken they go as high in the arena as they fit (the layout packs
// from offset 0), and the tiers count both. Names the layout does not know are placed
// online, uncounted.
TEST_F(PlanMovesTest, CopiesGoToTheLayoutsOffsetsWhenTheRangeIsFree) {
  UseLayout({{"a", 2 * kMiB}, {"b", 2 * kMiB}});
  const TensorId a = LeaseWritten("a", 64 * 1024, 0x11);  // 256 KiB, overwritten at its planned place
  EXPECT_EQ(OffsetOf(a), 2 * kMiB);
  const TensorId b = LeaseWritten("b", 64 * 1024, 0x22);  // same range, taken by a: off plan, at the top
  EXPECT_EQ(OffsetOf(b), 4 * kMiB - 256 * 1024);
  const TensorId c = LeaseWritten("c", 64 * 1024, 0x33);  // not in the layout
  LeaseStats stats = table_->Stats();
  EXPECT_EQ(stats.planned_placements, 1u);
  EXPECT_EQ(stats.off_plan_placements, 1u);
  // a leaves; b's next copy in the GPU takes the planned range.
  ASSERT_TRUE(table_->Demote(session_, a, Tier::kGpu, /*dead=*/false).ok());
  ASSERT_TRUE(table_->Demote(session_, b, Tier::kGpu, /*dead=*/false).ok());
  ASSERT_TRUE(table_->Prefetch(session_, b, Tier::kGpu, /*evict=*/false).ok());
  EXPECT_EQ(OffsetOf(b), 2 * kMiB);
  EXPECT_TRUE(Holds(b, 0x22));
  EXPECT_TRUE(Holds(a, 0x11));  // fetched back, online: its range is b's now
  EXPECT_TRUE(Holds(c, 0x33));
  stats = table_->Stats();
  EXPECT_EQ(stats.planned_placements, 2u);
  EXPECT_EQ(stats.off_plan_placements, 2u);
  EXPECT_TRUE(table_->Validate().ok()) << table_->Validate();
  ASSERT_TRUE(table_->SetPlacementAdvisor(session_, nullptr).ok());
}

// A copy placed off the layout (its range was taken when it came) moves to its layout offset
// when a client acquires it and that range is free: within the GPU, no host link used, the
// bytes intact. Not while the range is taken, and never while the copy is acquired.
TEST_F(PlanMovesTest, AnOffLayoutCopyMovesToItsOffsetWhenAcquiredIfTheRangeIsFree) {
  UseLayout({{"a", 2 * kMiB}, {"b", 2 * kMiB}});
  const TensorId a = LeaseWritten("a", 64 * 1024, 0x11);  // at 2 MiB
  const TensorId b = LeaseWritten("b", 64 * 1024, 0x22);  // a holds the range: at the top
  EXPECT_EQ(OffsetOf(b), 4 * kMiB - 256 * 1024) << "the range is a's: b stays";
  EXPECT_EQ(table_->Stats().rehomed, 0u);
  // Held by the client when the range comes free: it must not move under it.
  auto held = table_->Acquire(session_, b, Access::kRead, Place::kGpu);
  ASSERT_TRUE(held.ok()) << held.status();
  ASSERT_TRUE(table_->Demote(session_, a, Tier::kGpu, /*dead=*/false).ok());
  const uint64_t h2d_before = engine_.mover->Stats(Link::kDramToGpu).bytes;
  auto again = table_->Acquire(session_, b, Access::kRead, Place::kGpu);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->offset, held->offset);
  ASSERT_TRUE(table_->Release(session_, b).ok());
  ASSERT_TRUE(table_->Release(session_, b).ok());
  EXPECT_EQ(table_->Stats().rehomed, 0u);
  // Idle and the range free: the next acquire finds it at 2 MiB.
  EXPECT_EQ(OffsetOf(b), 2 * kMiB);
  EXPECT_TRUE(Holds(b, 0x22));
  const LeaseStats stats = table_->Stats();
  EXPECT_EQ(stats.rehomed, 1u);
  EXPECT_EQ(stats.gpu_relocations, 1u);
  EXPECT_EQ(engine_.mover->Stats(Link::kDramToGpu).bytes, h2d_before) << "moved within the GPU, not fetched";
  EXPECT_TRUE(Holds(a, 0x11));  // fetched back, online: its range is b's now
  EXPECT_TRUE(table_->Validate().ok()) << table_->Validate();
  ASSERT_TRUE(table_->SetPlacementAdvisor(session_, nullptr).ok());
}

// The client's kernel on a released tensor: its bytes land when the fence is waited for,
// and the wait reports `status` (a kernel that faulted).
class KernelFence : public GpuFence {
 public:
  KernelFence(uint8_t* bytes, uint64_t size, uint8_t fill, absl::Status status)
      : bytes_(bytes), size_(size), fill_(fill), status_(std::move(status)) {}
  absl::Status Wait() override {
    std::memset(bytes_, fill_, size_);
    return status_;
  }
  bool Passed() override { return passed_; }
  void set_passed(bool passed) { passed_ = passed; }

 private:
  uint8_t* bytes_;
  uint64_t size_;
  uint8_t fill_;
  absl::Status status_;
  bool passed_ = true;
};

// Moving a copy within the GPU settles the client's kernels on it first (the bytes they
// write move with it); if they failed, the acquire says so and the copy stays where it was;
// the acquire after that moves it. While they may still run, the copy is not moved at all
// (the acquire would wait for them).
TEST_F(PlanMovesTest, ARehomeWaitsForTheClientsKernelsAndReportsTheirFailure) {
  UseLayout({{"a", 2 * kMiB}, {"b", 2 * kMiB}});
  const TensorId a = LeaseWritten("a", 64 * 1024, 0x11);
  const TensorId b = LeaseWritten("b", 64 * 1024, 0x22);  // off the layout, at the top
  for (const bool kernel_fails : {false, true}) {
    SCOPED_TRACE(kernel_fails ? "the kernel fails" : "the kernel succeeds");
    auto p = table_->Acquire(session_, b, Access::kWrite, Place::kGpu);
    ASSERT_TRUE(p.ok()) << p.status();
    const uint64_t at = p->offset;
    ASSERT_NE(at, 2 * kMiB);
    const uint8_t fill = kernel_fails ? 0x66 : 0x55;
    auto fence = std::make_unique<KernelFence>(Pointer(*p), p->bytes, fill,
                                               kernel_fails ? absl::InternalError("illegal address") : absl::OkStatus());
    KernelFence* kernel = fence.get();
    ASSERT_TRUE(table_->Release(session_, b, std::move(fence)).ok());
    ASSERT_TRUE(table_->Demote(session_, a, Tier::kGpu, /*dead=*/false).ok());  // b's range is free
    kernel->set_passed(false);  // still running: b stays where it is
    EXPECT_EQ(OffsetOf(b), at);
    kernel->set_passed(true);
    auto moved = table_->Acquire(session_, b, Access::kRead, Place::kGpu);
    if (kernel_fails) {
      EXPECT_EQ(moved.status().code(), absl::StatusCode::kInternal) << moved.status();
      EXPECT_NE(moved.status().message().find("the client's GPU work on 'b' failed"), absl::string_view::npos)
          << moved.status();
      EXPECT_EQ(table_->Stats().rehomed, 1u) << "nothing moved";
      moved = table_->Acquire(session_, b, Access::kRead, Place::kGpu);  // reported once; now it moves
    }
    ASSERT_TRUE(moved.ok()) << moved.status();
    EXPECT_EQ(moved->offset, 2 * kMiB);
    ASSERT_TRUE(table_->Release(session_, b).ok());
    EXPECT_TRUE(Holds(b, fill)) << "the kernel's bytes moved with the copy";
    EXPECT_EQ(table_->Stats().rehomed, kernel_fails ? 2u : 1u);
    // Back off the layout for the next round: a takes its range again, b is evicted and
    // comes back to the top.
    ASSERT_TRUE(table_->Demote(session_, b, Tier::kGpu, /*dead=*/false).ok());
    EXPECT_TRUE(Holds(a, 0x11));
    ASSERT_TRUE(table_->Prefetch(session_, b, Tier::kGpu, /*evict=*/false).ok());
  }
  EXPECT_TRUE(table_->Validate().ok()) << table_->Validate();
  ASSERT_TRUE(table_->SetPlacementAdvisor(session_, nullptr).ok());
}

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

// The tiers say what they move on their own to make room (for the planner's record of the
// session): a dirty victim written back from the GPU to DRAM with its bytes, a clean one
// dropped (no bytes), in the order they happen; nothing once the observer is gone.
TEST_F(PlanMovesTest, TheTiersTellTheMovesTheyMakeForRoom) {
  std::vector<LeaseTable::RoomMove> told;
  ASSERT_TRUE(table_->SetRoomObserver(session_, [&](const LeaseTable::RoomMove& m) { told.push_back(m); }).ok());
  std::map<TensorId, uint8_t> fills;
  for (int i = 0; i < 4; ++i) fills[LeaseWritten("g" + std::to_string(i), 256 * 1024, 10 + i)] = 10 + i;  // 4 MiB
  ASSERT_TRUE(told.empty()) << "the GPU had room for all four";
  const TensorId fifth = LeaseWritten("fifth", 256 * 1024, 9);
  fills[fifth] = 9;
  ASSERT_EQ(told.size(), 1u);
  EXPECT_EQ(told[0].from, Tier::kGpu);
  ASSERT_TRUE(told[0].to.has_value());
  EXPECT_EQ(*told[0].to, Tier::kDram);
  EXPECT_EQ(told[0].bytes, 1 * kMiB);
  EXPECT_LE(told[0].start_nanos, told[0].end_nanos);
  auto off_gpu = [&] {  // the one tensor not on the GPU (five of 1 MiB in 4 MiB)
    TensorId out = 0;
    for (const auto& [id, fill] : fills) {
      if (!OnGpu(id)) out = id;
    }
    return out;
  };
  const TensorId first_out = off_gpu();
  ASSERT_NE(first_out, 0u);
  // Read back, it pushes another dirty one out and keeps a clean copy in DRAM...
  EXPECT_TRUE(Holds(first_out, fills[first_out]));
  ASSERT_EQ(told.size(), 2u);
  EXPECT_EQ(told[1].to, std::optional<Tier>(Tier::kDram));
  const TensorId second_out = off_gpu();
  ASSERT_NE(second_out, 0u);
  // ...which, clean, is the next to go: dropped, not written.
  EXPECT_TRUE(Holds(second_out, fills[second_out]));
  ASSERT_EQ(told.size(), 3u);
  EXPECT_EQ(told[2].from, Tier::kGpu);
  EXPECT_FALSE(told[2].to.has_value());
  EXPECT_EQ(told[2].bytes, 0u);
  EXPECT_GE(told[2].start_nanos, told[1].end_nanos);
  ASSERT_TRUE(table_->SetRoomObserver(session_, nullptr).ok());
  EXPECT_TRUE(Holds(first_out, fills[first_out]));
  EXPECT_EQ(told.size(), 3u);
  for (const auto& [id, fill] : fills) EXPECT_TRUE(Holds(id, fill)) << id;
  EXPECT_TRUE(table_->Validate().ok()) << table_->Validate();
}

// Room made on demand in a fragmented GPU, when no join can gather it, is one block: of the
// runs of copies side by side that make it with the free space around them, the one used
// furthest goes. The GPU (4 MiB) holds [free 512K][A 1M][free 512K][B 1M][free 512K][C
// 512K]: 1.5 MiB free, no block over 512 KiB, and no gap elsewhere that could take A or B.
// By next use alone C (used last) would go first, joining only 1 MiB, then B; as one block
// B alone goes, and the new tensor takes its place with the gaps beside it.
TEST_F(PlanMovesTest, RoomInAFragmentedGpuIsMadeAsOneBlockOfTheCopiesUsedFurthest) {
  const TensorId x0 = LeaseWritten("x0", 128 * 1024, 1);  // 512 KiB
  const TensorId a = LeaseWritten("A", 256 * 1024, 2);    // 1 MiB
  const TensorId x1 = LeaseWritten("x1", 128 * 1024, 3);
  const TensorId b = LeaseWritten("B", 256 * 1024, 4);
  const TensorId x2 = LeaseWritten("x2", 128 * 1024, 5);
  const TensorId c = LeaseWritten("C", 128 * 1024, 6);
  ASSERT_EQ(OffsetOf(a), 512 * kKiB) << "the premise: copies side by side from offset 0";
  ASSERT_EQ(OffsetOf(b), 2 * kMiB);
  ASSERT_EQ(OffsetOf(c), 3 * kMiB + 512 * kKiB);
  for (TensorId x : {x0, x1, x2}) ASSERT_TRUE(table_->Demote(session_, x, Tier::kGpu, /*dead=*/false).ok());
  const std::map<std::string, int64_t> next{{"A", 10}, {"B", 50}, {"C", 100}};
  ASSERT_TRUE(table_
                  ->SetEvictionAdvisor(session_,
                                       [&next](const std::string& name) {
                                         auto it = next.find(name);
                                         return it == next.end() ? int64_t{0} : it->second;
                                       })
                  .ok());
  std::vector<LeaseTable::RoomMove> told;
  ASSERT_TRUE(table_->SetRoomObserver(session_, [&](const LeaseTable::RoomMove& m) { told.push_back(m); }).ok());
  const TensorId big = LeaseWritten("big", 384 * 1024, 7);  // 1.5 MiB
  ASSERT_EQ(told.size(), 1u) << "one copy makes the block";
  EXPECT_EQ(told[0].name, "B") << "the run used furthest that holds 1.5 MiB with its gaps";
  EXPECT_EQ(told[0].to, std::optional<Tier>(Tier::kDram));
  EXPECT_EQ(OffsetOf(big), 1 * kMiB + 512 * kKiB) << "in B's place and the gap before it";
  EXPECT_TRUE(OnGpu(a));
  EXPECT_TRUE(OnGpu(c));
  ASSERT_TRUE(table_->SetRoomObserver(session_, nullptr).ok());
  ASSERT_TRUE(table_->SetEvictionAdvisor(session_, nullptr).ok());
  const std::map<TensorId, uint8_t> fills{{x0, 1}, {a, 2}, {x1, 3}, {b, 4}, {x2, 5}, {c, 6}, {big, 7}};
  for (const auto& [id, fill] : fills) EXPECT_TRUE(Holds(id, fill)) << id;
  EXPECT_TRUE(table_->Validate().ok()) << table_->Validate();
}

// When the client holds the copies every such run needs, there is no block to make: the one
// evictable copy goes by next use, and the acquire is refused with the numbers; nothing is lost.
TEST_F(PlanMovesTest, AFragmentedGpuWhoseRunsTheClientHoldsRefusesWithTheNumbers) {
  const TensorId x0 = LeaseWritten("x0", 128 * 1024, 1);
  const TensorId a = LeaseWritten("A", 256 * 1024, 2);
  const TensorId x1 = LeaseWritten("x1", 128 * 1024, 3);
  const TensorId b = LeaseWritten("B", 256 * 1024, 4);
  const TensorId x2 = LeaseWritten("x2", 128 * 1024, 5);
  const TensorId c = LeaseWritten("C", 128 * 1024, 6);
  ASSERT_EQ(OffsetOf(c), 3 * kMiB + 512 * kKiB) << "the premise: copies side by side from offset 0";
  for (TensorId x : {x0, x1, x2}) ASSERT_TRUE(table_->Demote(session_, x, Tier::kGpu, /*dead=*/false).ok());
  ASSERT_TRUE(table_->SetEvictionAdvisor(session_, [](const std::string&) { return int64_t{1}; }).ok());
  ASSERT_TRUE(table_->Acquire(session_, a, Access::kRead, Place::kGpu).ok());
  ASSERT_TRUE(table_->Acquire(session_, b, Access::kRead, Place::kGpu).ok());
  auto big = table_->Lease(session_, Spec("big", 384 * 1024));  // 1.5 MiB
  ASSERT_TRUE(big.ok()) << big.status();
  auto placed = table_->Acquire(session_, *big, Access::kOverwrite, Place::kGpu);
  ASSERT_FALSE(placed.ok());
  EXPECT_TRUE(absl::IsResourceExhausted(placed.status())) << placed.status();
  EXPECT_NE(placed.status().message().find("cannot place 1.50 MiB in gpu"), std::string::npos) << placed.status();
  EXPECT_NE(placed.status().message().find("nothing there may be evicted"), std::string::npos) << placed.status();
  EXPECT_FALSE(OnGpu(c)) << "C, the one copy free to go, went by next use";
  ASSERT_TRUE(table_->Release(session_, a).ok());
  ASSERT_TRUE(table_->Release(session_, b).ok());
  ASSERT_TRUE(table_->SetEvictionAdvisor(session_, nullptr).ok());
  const std::map<TensorId, uint8_t> fills{{x0, 1}, {a, 2}, {x1, 3}, {b, 4}, {x2, 5}, {c, 6}};
  for (const auto& [id, fill] : fills) EXPECT_TRUE(Holds(id, fill)) << id;
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

}  // namespace
}  // namespace tierd
