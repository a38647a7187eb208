// LeaseTable and the client's GPU fences: a release's fence is waited for before the GPU copy
// is moved or reused, a newer fence covers an older one of its order, and waits for the GPU
// (planned moves, host writes, evictions) let the session's lock go meanwhile.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#include "runtime/lease_table.h"
#include "runtime/lease_table_test_util.h"

namespace tierd {
namespace {

using testing::LeaseTableTest;
using testing::Spec;

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

// Fences passed in the order they were made (as the daemon's CUDA fences on its gate stream):
// the later covers the earlier.
class OrderedFence : public GpuFence {
 public:
  OrderedFence(int sequence, std::atomic<int>* waits) : sequence_(sequence), waits_(waits) {}
  absl::Status Wait() override {
    ++*waits_;
    return absl::OkStatus();
  }
  bool Covers(const GpuFence& older) const override {
    const auto* o = dynamic_cast<const OrderedFence*>(&older);
    return o != nullptr && o->sequence_ < sequence_;
  }

 private:
  int sequence_;
  std::atomic<int>* waits_;
};

// A tensor released twice with work in flight: a fence that covers the older one replaces it
// and the release does not block; one that does not waits for the older one first.
TEST_F(LeaseTableTest, ASecondReleaseWaitsForTheFirstFenceOnlyWhenTheNewOneDoesNotCoverIt) {
  auto table = Table();
  auto s = *table->OpenSession("fences", {2 * kMiB, 8 * kMiB, 0});
  auto a = *table->Lease(s, Spec("a", 256 * 1024));
  std::atomic<int> first{0}, second{0}, late{0};
  ASSERT_TRUE(table->Acquire(s, a, Access::kWrite, Place::kGpu).ok());
  ASSERT_TRUE(table->Release(s, a, std::make_unique<OrderedFence>(1, &first)).ok());
  auto p = table->Acquire(s, a, Access::kRead, Place::kGpu);
  ASSERT_TRUE(p.ok());
  ASSERT_TRUE(table->Release(s, a, std::make_unique<OrderedFence>(2, &second)).ok());
  EXPECT_EQ(first.load(), 0) << "the second release waited for a fence the new one covers";
  ASSERT_TRUE(table->Acquire(s, a, Access::kRead, Place::kGpu).ok());
  ASSERT_TRUE(table->Release(s, a, std::make_unique<LateKernelFence>(Pointer(*p), p->bytes, &late)).ok());
  EXPECT_EQ(second.load(), 1) << "a fence of another order: the older one is waited for first";
  EXPECT_EQ(late.load(), 0);
  // The fence kept is the newest: moving the tensor away waits for it.
  ASSERT_TRUE(table->Acquire(s, a, Access::kRead, Place::kHost).ok());
  EXPECT_EQ(late.load(), 1);
  ASSERT_TRUE(table->Release(s, a).ok());
  const LeaseStats stats = table->Stats();
  EXPECT_EQ(stats.releases, 4u);
  EXPECT_EQ(stats.fence_waits, 1u) << "only the release whose fence did not cover the older one waited";
  EXPECT_GE(stats.release_nanos, stats.release_lock_nanos);
  EXPECT_TRUE(table->Validate().ok()) << table->Validate();
}

// A fence whose kernels finish only when the test says so.
class GatedFence : public GpuFence {
 public:
  explicit GatedFence(std::atomic<bool>* open) : open_(open) {}
  absl::Status Wait() override {
    while (!open_->load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    return absl::OkStatus();
  }
  bool Passed() override { return open_->load(); }

 private:
  std::atomic<bool>* open_;
};

// A planned discard or write-back of a tensor whose kernels are still queued waits for them
// without the session's lock: the session's other requests go on meanwhile (they would
// otherwise wait for the GPU to catch up with the host at every planned move).
TEST_F(LeaseTableTest, APlannedMoveWaitingForTheGpuDoesNotHoldTheSessionsOtherRequests) {
  auto table = Table();
  auto s = *table->OpenSession("gated", {4 * kMiB, 8 * kMiB, 0});  // a, b and c fit the GPU
  auto a = *table->Lease(s, Spec("a", 256 * 1024));
  auto b = *table->Lease(s, Spec("b", 256 * 1024));
  auto c = *table->Lease(s, Spec("c", 256 * 1024));
  Write(*table, s, b, 2);
  for (TensorId t : {a, c}) {
    ASSERT_TRUE(table->Acquire(s, t, Access::kWrite, Place::kGpu).ok());
  }
  std::atomic<bool> a_done{false}, c_done{false};
  ASSERT_TRUE(table->Release(s, a, std::make_unique<GatedFence>(&a_done)).ok());
  ASSERT_TRUE(table->Release(s, c, std::make_unique<GatedFence>(&c_done)).ok());
  std::atomic<bool> discarded{false}, written_back{false};
  std::thread planner([&] {
    EXPECT_TRUE(table->Demote(s, a, Tier::kGpu, /*dead=*/true).ok());
    discarded = true;
  });
  std::thread writer([&] {
    EXPECT_TRUE(table->Demote(s, c, Tier::kGpu, /*dead=*/false).ok());
    written_back = true;
  });
  // Meanwhile another tensor of the session is acquired and released, while a's and c's
  // kernels have not finished (a watchdog opens the gates if that blocks, so a failure ends).
  std::atomic<bool> served{false};
  std::thread watchdog([&] {
    for (int i = 0; i < 5000 && !served.load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    a_done = true;
    c_done = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the planner's threads are waiting
  EXPECT_TRUE(table->Acquire(s, b, Access::kRead, Place::kGpu).ok());
  EXPECT_TRUE(table->Release(s, b).ok());
  const bool before_the_gpu = !a_done.load() && !c_done.load();
  served = true;
  EXPECT_TRUE(before_the_gpu) << "b's acquire waited for a's and c's kernels";
  EXPECT_FALSE(discarded.load()) << "a's copy was dropped before its kernels finished";
  EXPECT_FALSE(written_back.load()) << "c was written back before its kernels finished";
  watchdog.join();
  planner.join();
  writer.join();
  EXPECT_TRUE(discarded.load());
  EXPECT_TRUE(written_back.load());
  EXPECT_TRUE(table->Validate().ok()) << table->Validate();
}

// A host write of a tensor whose GPU kernels are still queued (an optimizer writing the new
// weights of a layer the backward still reads) waits for them without the session's lock: the
// session's other requests (the forward's acquires) go on meanwhile, and the old GPU copy is not
// dropped before its kernels finish.
// A GatedFence that says when somebody started waiting for it.
class WatchedGate : public GatedFence {
 public:
  WatchedGate(std::atomic<bool>* open, std::atomic<bool>* waited) : GatedFence(open), waited_(waited) {}
  absl::Status Wait() override {
    *waited_ = true;
    return GatedFence::Wait();
  }

 private:
  std::atomic<bool>* waited_;
};

// With `waiter` blocked on a closed gate (its fence's Wait entered: `waited`), b of the same
// session is acquired and released; then the gate opens. Whether b was served while the gate
// was closed, and whether the waiter had gone on (`done`) before it opened. A watchdog opens
// the gate after 5 s, so a request that blocks on it fails the test instead of hanging it.
struct GateOutcome {
  bool served_before_the_gate = false;
  bool done_before_the_gate = false;
};
GateOutcome ServeBesideAClosedGate(LeaseTable& table, SessionId s, TensorId b, std::atomic<bool>& gate,
                                   std::atomic<bool>& waited, const std::atomic<bool>& done) {
  std::atomic<bool> served{false};
  std::thread watchdog([&] {
    for (int i = 0; i < 5000 && !served.load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    gate = true;
  });
  for (int i = 0; i < 5000 && !waited.load(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_TRUE(waited.load()) << "nobody waited for the gate";
  EXPECT_TRUE(table.Acquire(s, b, Access::kRead, Place::kGpu).ok());
  EXPECT_TRUE(table.Release(s, b).ok());
  GateOutcome outcome;
  outcome.served_before_the_gate = !gate.load();
  outcome.done_before_the_gate = done.load();  // read before the gate may open
  served = true;
  watchdog.join();
  return outcome;
}

TEST_F(LeaseTableTest, AHostWriteWaitingForTheGpuDoesNotHoldTheSessionsOtherRequests) {
  auto table = Table();
  auto s = *table->OpenSession("host-write", {4 * kMiB, 8 * kMiB, 0});
  auto a = *table->Lease(s, Spec("a", 256 * 1024));
  auto b = *table->Lease(s, Spec("b", 256 * 1024));
  Write(*table, s, b, 2);
  ASSERT_TRUE(table->Acquire(s, a, Access::kWrite, Place::kGpu).ok());
  std::atomic<bool> a_done{false}, waited{false};
  ASSERT_TRUE(table->Release(s, a, std::make_unique<WatchedGate>(&a_done, &waited)).ok());
  for (Access access : {Access::kOverwrite, Access::kWrite}) {
    std::atomic<bool> written{false};
    std::thread writer([&] {
      auto p = table->Acquire(s, a, access, Place::kHost);
      EXPECT_TRUE(p.ok()) << p.status();
      written = true;
      if (p.ok()) {
        EXPECT_TRUE(table->Release(s, a).ok());
      }
    });
    const GateOutcome outcome = ServeBesideAClosedGate(*table, s, b, a_done, waited, written);
    EXPECT_TRUE(outcome.served_before_the_gate) << "b's acquire waited for a's kernels";
    EXPECT_FALSE(outcome.done_before_the_gate) << "a's GPU copy was dropped before its kernels finished";
    writer.join();
    EXPECT_TRUE(written.load());
    // Again with the kernels of a second use of a on the GPU still queued.
    a_done = false;
    waited = false;
    ASSERT_TRUE(table->Acquire(s, a, Access::kRead, Place::kGpu).ok());
    ASSERT_TRUE(table->Release(s, a, std::make_unique<WatchedGate>(&a_done, &waited)).ok());
  }
  a_done = true;
  EXPECT_TRUE(table->Validate().ok()) << table->Validate();
}

// Room made on the GPU by dropping a clean copy whose kernels are still queued waits for them
// without the session's lock, as the host write above.
TEST_F(LeaseTableTest, AnEvictionWaitingForTheGpuDoesNotHoldTheSessionsOtherRequests) {
  auto table = Table();
  auto s = *table->OpenSession("evict", {2 * kMiB, 8 * kMiB, 0});  // two of a, b, c on the GPU
  auto a = *table->Lease(s, Spec("a", 256 * 1024));
  auto b = *table->Lease(s, Spec("b", 256 * 1024));
  auto c = *table->Lease(s, Spec("c", 256 * 1024));
  Write(*table, s, a, 1, Place::kHost);
  ASSERT_TRUE(table->Acquire(s, a, Access::kRead, Place::kGpu).ok());  // a clean copy there
  std::atomic<bool> a_done{false}, waited{false};
  ASSERT_TRUE(table->Release(s, a, std::make_unique<WatchedGate>(&a_done, &waited)).ok());
  Write(*table, s, b, 2);  // the GPU quota is full
  std::atomic<bool> placed{false};
  std::thread acquirer([&] {  // room for c: a's clean copy goes, once its kernels are done
    EXPECT_TRUE(table->Acquire(s, c, Access::kOverwrite, Place::kGpu).ok());
    placed = true;
    EXPECT_TRUE(table->Release(s, c).ok());
  });
  const GateOutcome outcome = ServeBesideAClosedGate(*table, s, b, a_done, waited, placed);
  EXPECT_TRUE(outcome.served_before_the_gate) << "b's acquire waited for a's kernels";
  EXPECT_FALSE(outcome.done_before_the_gate) << "a's GPU copy was reused before its kernels finished";
  acquirer.join();
  EXPECT_TRUE(placed.load());
  EXPECT_TRUE(Holds(*table, s, a, 1, Place::kHost));
  EXPECT_TRUE(table->Validate().ok()) << table->Validate();
}

}  // namespace
}  // namespace tierd
