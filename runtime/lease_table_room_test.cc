// LeaseTable's side of the planner, where copies go: the static GPU layout's offsets, copies
// rehomed within the GPU (after the client's kernels on them), and room made on demand —
// what the tiers tell of it, and one block of the copies used furthest in a fragmented GPU.
#include <gtest/gtest.h>

#include <cstring>
#include <map>
#include <vector>

#include "runtime/lease_table_plan_test_util.h"

namespace tierd {
namespace {

using testing::Spec;

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
  ASSERT_TRUE(table_->SetPlanner(session_, nullptr).ok());
}

// Copies made online before the plan sit where its layout puts others. Settling: each goes
// to its layout offset where that range is free; the rest leave the GPU with their bytes, so
// the plan's loads find their ranges. Copies without an offset, or acquired, stay put.
TEST_F(PlanMovesTest, SettlingIntoTheLayoutMovesOrDemotesTheCopiesMadeBeforeThePlan) {
  auto none = table_->SettleIntoLayout(session_);
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(none->moved + none->demoted, 0u) << "no planner: nothing to settle into";
  const TensorId a = LeaseWritten("a", 64 * 1024, 0x11);
  const TensorId b = LeaseWritten("b", 64 * 1024, 0x22);
  const TensorId c = LeaseWritten("c", 64 * 1024, 0x33);
  const TensorId d = LeaseWritten("d", 64 * 1024, 0x44);  // not in the layout
  const TensorId e = LeaseWritten("e", 64 * 1024, 0x55);
  auto gpu_offset = [&](TensorId id) {
    for (const LeaseView& v : table_->List(session_)) {
      if (v.id == id && v.copies[static_cast<int>(Tier::kGpu)]) return v.offsets[static_cast<int>(Tier::kGpu)];
    }
    return UINT64_MAX;
  };
  const uint64_t at_a = gpu_offset(a), at_b = gpu_offset(b), at_d = gpu_offset(d), at_e = gpu_offset(e);
  // a and b laid out in each other's ranges, c in a free one, e in d's (which stays).
  UseLayout({{"a", at_b}, {"b", at_a}, {"c", 2 * kMiB}, {"e", at_d}});
  auto held = table_->Acquire(session_, e, Access::kRead, Place::kGpu);  // the client holds e
  ASSERT_TRUE(held.ok()) << held.status();
  auto settled = table_->SettleIntoLayout(session_);
  ASSERT_TRUE(settled.ok()) << settled.status();
  EXPECT_EQ(settled->moved, 1u) << "c, to its free range";
  EXPECT_EQ(settled->demoted, 2u) << "a and b, each in the other's range";
  EXPECT_EQ(settled->demoted_bytes, 2 * 256 * 1024u);
  EXPECT_EQ(table_->Stats().settle_moves, 1u);
  EXPECT_EQ(table_->Stats().settle_demotes, 2u);
  EXPECT_EQ(gpu_offset(c), 2 * kMiB);
  EXPECT_FALSE(OnGpu(a));
  EXPECT_FALSE(OnGpu(b));
  EXPECT_EQ(gpu_offset(d), at_d) << "no layout offset: it stays";
  EXPECT_EQ(gpu_offset(e), at_e) << "acquired: it stays (unsettled, it would have left: its range is d's)";
  ASSERT_TRUE(table_->Release(session_, e).ok());
  // Their ranges free now, the next copies of a and b go where the layout puts them, intact.
  EXPECT_TRUE(Holds(a, 0x11));
  EXPECT_TRUE(Holds(b, 0x22));
  EXPECT_EQ(gpu_offset(a), at_b);
  EXPECT_EQ(gpu_offset(b), at_a);
  EXPECT_TRUE(Holds(c, 0x33));
  EXPECT_TRUE(Holds(d, 0x44));
  EXPECT_TRUE(Holds(e, 0x55));
  EXPECT_TRUE(table_->Validate().ok()) << table_->Validate();
  ASSERT_TRUE(table_->SetPlanner(session_, nullptr).ok());
}

// Settling goes in passes: the copies whose ranges are free move first (submitted together),
// which frees the range of one laid out where another sat; that one moves in the next pass.
TEST_F(PlanMovesTest, SettlingMovesInPassesUntilNoRangeFrees) {
  const TensorId a = LeaseWritten("a", 64 * 1024, 0x11);
  const TensorId b = LeaseWritten("b", 64 * 1024, 0x22);
  const TensorId c = LeaseWritten("c", 64 * 1024, 0x33);
  auto gpu_offset = [&](TensorId id) {
    for (const LeaseView& v : table_->List(session_)) {
      if (v.id == id && v.copies[static_cast<int>(Tier::kGpu)]) return v.offsets[static_cast<int>(Tier::kGpu)];
    }
    return UINT64_MAX;
  };
  const uint64_t at_b = gpu_offset(b);
  UseLayout({{"a", at_b}, {"b", 2 * kMiB}, {"c", 3 * kMiB}});
  const uint64_t moved_before = table_->Stats().gpu_relocations;
  auto settled = table_->SettleIntoLayout(session_);
  ASSERT_TRUE(settled.ok()) << settled.status();
  EXPECT_EQ(settled->moved, 3u) << "b and c, then a into b's old range";
  EXPECT_EQ(settled->demoted, 0u);
  EXPECT_EQ(table_->Stats().gpu_relocations, moved_before + 3);
  EXPECT_EQ(gpu_offset(a), at_b);
  EXPECT_EQ(gpu_offset(b), 2 * kMiB);
  EXPECT_EQ(gpu_offset(c), 3 * kMiB);
  EXPECT_TRUE(Holds(a, 0x11));
  EXPECT_TRUE(Holds(b, 0x22));
  EXPECT_TRUE(Holds(c, 0x33));
  EXPECT_TRUE(table_->Validate().ok()) << table_->Validate();
  ASSERT_TRUE(table_->SetPlanner(session_, nullptr).ok());
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
  ASSERT_TRUE(table_->SetPlanner(session_, nullptr).ok());
}

// With SetLayoutWait, a planned load (free room only) whose layout range the tensor planned
// there before it still holds waits for it to leave (RESOURCE_EXHAUSTED: the plan's lane tries
// again), rather than
// taking room elsewhere that another tensor's layout range may need next. Held by a copy placed
// off the layout, the range may stay taken long: the load goes elsewhere. The tiers' own
// placements (an acquire's) never wait.
TEST_F(PlanMovesTest, APlannedLoadWaitsForItsLayoutRangeWhileItsPlannedTenantHoldsIt) {
  table_->SetLayoutWait(true);  // (the fixture's session is open, but nothing runs beside this thread)
  UseLayout({{"a", 0}, {"b", 0}});
  const TensorId a = LeaseWritten("a", 64 * 1024, 0x11);  // at 0, as laid out
  const TensorId b = LeaseWritten("b", 64 * 1024, 0x22);  // an acquire's: a holds 0, so elsewhere
  ASSERT_EQ(OffsetOf(a), 0u);
  EXPECT_NE(OffsetOf(b), 0u) << "an acquire does not wait for the layout's range";
  EXPECT_EQ(table_->Stats().off_plan_by[2], 1u) << "held by a, planned there now";
  ASSERT_TRUE(table_->Demote(session_, b, Tier::kGpu, /*dead=*/false).ok());
  const LeaseStats before = table_->Stats();
  const absl::Status waited = table_->Prefetch(session_, b, Tier::kGpu, /*evict=*/false);
  EXPECT_EQ(waited.code(), absl::StatusCode::kResourceExhausted) << waited;
  EXPECT_NE(waited.message().find("held by the tensors planned there before it"), absl::string_view::npos) << waited;
  EXPECT_FALSE(OnGpu(b));
  EXPECT_EQ(table_->Stats().layout_waits, before.layout_waits + 1);
  // a leaves as planned: b's load takes its range.
  ASSERT_TRUE(table_->Demote(session_, a, Tier::kGpu, /*dead=*/false).ok());
  ASSERT_TRUE(table_->Prefetch(session_, b, Tier::kGpu, /*evict=*/false).ok());
  EXPECT_EQ(OffsetOf(b), 0u);
  EXPECT_TRUE(Holds(b, 0x22));
  // A tensor the layout does not know squats at 0; a's load does not wait for it.
  ASSERT_TRUE(table_->Demote(session_, b, Tier::kGpu, /*dead=*/false).ok());
  const TensorId squatter = LeaseWritten("squatter", 64 * 1024, 0x33);
  ASSERT_EQ(OffsetOf(squatter), 0u) << "the premise: the online allocator's first fit";
  const uint64_t waits = table_->Stats().layout_waits;
  ASSERT_TRUE(table_->Prefetch(session_, a, Tier::kGpu, /*evict=*/false).ok());
  EXPECT_NE(OffsetOf(a), 0u);
  EXPECT_TRUE(Holds(a, 0x11));
  EXPECT_EQ(table_->Stats().layout_waits, waits);
  EXPECT_EQ(table_->Stats().off_plan_by[0], 1u) << "held by a copy the layout does not place there";
  EXPECT_TRUE(table_->Validate().ok()) << table_->Validate();
  ASSERT_TRUE(table_->SetPlanner(session_, nullptr).ok());
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
  ASSERT_TRUE(table_->SetPlanner(session_, nullptr).ok());
}

// Settling moves a copy only after the client's kernels on it; if they failed it says so,
// naming the tensor, and the copy stays (the failure is reported once: the next settle moves it).
TEST_F(PlanMovesTest, SettlingReportsTheClientsFailedKernelOnceAndLosesNothing) {
  const TensorId b = LeaseWritten("b", 64 * 1024, 0x22);
  auto p = table_->Acquire(session_, b, Access::kWrite, Place::kGpu);
  ASSERT_TRUE(p.ok()) << p.status();
  const uint64_t at = p->offset;
  ASSERT_NE(at, 2 * kMiB);
  ASSERT_TRUE(table_->Release(session_, b, std::make_unique<KernelFence>(Pointer(*p), p->bytes, 0x66,
                                                                          absl::InternalError("illegal address")))
                  .ok());
  UseLayout({{"b", 2 * kMiB}});
  auto failed = table_->SettleIntoLayout(session_);
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kInternal) << failed.status();
  EXPECT_NE(failed.status().message().find("the client's GPU work on 'b' failed"), absl::string_view::npos)
      << failed.status();
  EXPECT_EQ(table_->Stats().settle_moves, 0u);
  auto settled = table_->SettleIntoLayout(session_);
  ASSERT_TRUE(settled.ok()) << settled.status();
  EXPECT_EQ(settled->moved, 1u);
  EXPECT_EQ(table_->Stats().settle_moves, 1u);
  EXPECT_EQ(OffsetOf(b), 2 * kMiB);
  EXPECT_TRUE(Holds(b, 0x66)) << "the kernel's bytes moved with the copy";
  EXPECT_TRUE(table_->Validate().ok()) << table_->Validate();
  ASSERT_TRUE(table_->SetPlanner(session_, nullptr).ok());
}

// One settle pass moves its copies together: one whose client kernel failed stays where it
// was and is named, the others land all the same.
TEST_F(PlanMovesTest, ASettlePassWithAFailedKernelStillMovesTheOthers) {
  const TensorId b = LeaseWritten("b", 64 * 1024, 0x22);
  const TensorId c = LeaseWritten("c", 64 * 1024, 0x33);
  auto p = table_->Acquire(session_, b, Access::kWrite, Place::kGpu);
  ASSERT_TRUE(p.ok()) << p.status();
  const uint64_t at = p->offset;
  ASSERT_TRUE(table_->Release(session_, b, std::make_unique<KernelFence>(Pointer(*p), p->bytes, 0x66,
                                                                          absl::InternalError("illegal address")))
                  .ok());
  UseLayout({{"b", 2 * kMiB}, {"c", 3 * kMiB}});
  auto failed = table_->SettleIntoLayout(session_);
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kInternal) << failed.status();
  EXPECT_NE(failed.status().message().find("the client's GPU work on 'b' failed"), absl::string_view::npos)
      << failed.status();
  EXPECT_EQ(table_->Stats().settle_moves, 1u) << "c moved beside b's failure";
  std::map<TensorId, uint64_t> gpu_offsets;  // as listed: an acquire would move b (reported once)
  for (const LeaseView& v : table_->List(session_)) gpu_offsets[v.id] = v.offsets[static_cast<int>(Tier::kGpu)];
  EXPECT_EQ(gpu_offsets[b], at) << "b stays";
  EXPECT_EQ(gpu_offsets[c], 3 * kMiB);
  EXPECT_TRUE(Holds(b, 0x66)) << "the kernel's bytes, where they were";
  EXPECT_TRUE(Holds(c, 0x33));
  EXPECT_TRUE(table_->Validate().ok()) << table_->Validate();
  ASSERT_TRUE(table_->SetPlanner(session_, nullptr).ok());
}

// The tiers say what they move on their own to make room (for the planner's record of the
// session): a dirty victim written back from the GPU to DRAM with its bytes, a clean one
// dropped (no bytes), in the order they happen; nothing once the observer is gone.
TEST_F(PlanMovesTest, TheTiersTellTheMovesTheyMakeForRoom) {
  std::vector<RoomMove> told;
  auto planner = std::make_shared<NamedPlanner>();
  planner->room = [&](const RoomMove& m) { told.push_back(m); };
  ASSERT_TRUE(table_->SetPlanner(session_, planner).ok());
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
  ASSERT_TRUE(table_->SetPlanner(session_, nullptr).ok());
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
  std::vector<RoomMove> told;
  auto planner = std::make_shared<NamedPlanner>();
  planner->next_use = [&next](const std::string& name) {
    auto it = next.find(name);
    return it == next.end() ? int64_t{0} : it->second;
  };
  planner->room = [&](const RoomMove& m) { told.push_back(m); };
  ASSERT_TRUE(table_->SetPlanner(session_, planner).ok());
  const TensorId big = LeaseWritten("big", 384 * 1024, 7);  // 1.5 MiB
  ASSERT_EQ(told.size(), 1u) << "one copy makes the block";
  EXPECT_EQ(told[0].name, "B") << "the run used furthest that holds 1.5 MiB with its gaps";
  EXPECT_EQ(told[0].to, std::optional<Tier>(Tier::kDram));
  EXPECT_EQ(OffsetOf(big), 1 * kMiB + 512 * kKiB) << "in B's place and the gap before it";
  EXPECT_TRUE(OnGpu(a));
  EXPECT_TRUE(OnGpu(c));
  ASSERT_TRUE(table_->SetPlanner(session_, nullptr).ok());
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
  auto planner = std::make_shared<NamedPlanner>();
  planner->next_use = [](const std::string&) { return int64_t{1}; };
  ASSERT_TRUE(table_->SetPlanner(session_, planner).ok());
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
  ASSERT_TRUE(table_->SetPlanner(session_, nullptr).ok());
  const std::map<TensorId, uint8_t> fills{{x0, 1}, {a, 2}, {x1, 3}, {b, 4}, {x2, 5}, {c, 6}};
  for (const auto& [id, fill] : fills) EXPECT_TRUE(Holds(id, fill)) << id;
  EXPECT_TRUE(table_->Validate().ok()) << table_->Validate();
}

}  // namespace
}  // namespace tierd
