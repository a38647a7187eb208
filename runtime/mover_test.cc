#include "runtime/mover.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <thread>
#include <tuple>

#include "absl/synchronization/notification.h"
#include "runtime/mover_test_util.h"

namespace tierd {
namespace {

using testing::MakeEngine;

TEST(MoverTest, RoundTripThroughEveryTierKeepsTheBytes) {
  auto engine = MakeEngine("roundtrip");
  TierStore& store = *engine.store;
  // An odd size: not a multiple of the chunk, the 4 KiB block or even 8 bytes.
  const uint64_t bytes = 5 * kMiB + 12345;
  Extent gpu = *store.Allocate(Tier::kGpu, bytes);
  Extent dram = *store.Allocate(Tier::kDram, bytes);
  Extent nvme = *store.Allocate(Tier::kNvme, bytes);
  Extent dram_back = *store.Allocate(Tier::kDram, bytes);
  Extent gpu_back = *store.Allocate(Tier::kGpu, bytes);
  engine.Fill(gpu, bytes, 1);
  ASSERT_TRUE(engine.mover->MoveAndWait(gpu, dram, bytes).ok());
  ASSERT_TRUE(engine.mover->MoveAndWait(dram, nvme, bytes).ok());
  ASSERT_TRUE(engine.mover->MoveAndWait(nvme, dram_back, bytes).ok());
  ASSERT_TRUE(engine.mover->MoveAndWait(dram_back, gpu_back, bytes).ok());
  EXPECT_EQ(engine.Bytes(gpu, bytes), engine.Bytes(gpu_back, bytes));
  EXPECT_EQ(engine.mover->Stats(Link::kGpuToDram).bytes, bytes);
  EXPECT_EQ(engine.mover->Stats(Link::kDramToGpu).bytes, bytes);
  EXPECT_EQ(engine.mover->Stats(Link::kDramToNvme).bytes, AlignUp(bytes, 4096));
  EXPECT_EQ(engine.mover->Stats(Link::kNvmeToDram).moves, 1u);
}

// The GPU tier moves a copy within its region (to join free space): the bytes arrive, and
// the host links carry none of it.
TEST(MoverTest, AMoveWithinTheGpuKeepsTheBytes) {
  auto engine = MakeEngine("within");
  TierStore& store = *engine.store;
  const uint64_t bytes = 3 * kMiB + 4321;
  Extent from = *store.Allocate(Tier::kGpu, bytes);
  Extent to = *store.Allocate(Tier::kGpu, bytes);
  engine.Fill(from, bytes, 7);
  ASSERT_TRUE(engine.mover->MoveAndWait(from, to, bytes).ok());
  EXPECT_EQ(engine.Bytes(from, bytes), engine.Bytes(to, bytes));
  EXPECT_EQ(engine.mover->Stats(Link::kGpuToDram).bytes, 0u);
  EXPECT_EQ(engine.mover->Stats(Link::kDramToGpu).bytes, 0u);
}

// With a bounce buffer, a move within the GPU up to its size goes down to host memory and
// back up in chunks on the two PCIe links (a device copy from the daemon's context waits for
// the trainer's time slice); a larger one stays a device copy. Either way the bytes arrive.
TEST(MoverTest, AMoveWithinTheGpuUpToTheBounceSizeGoesThroughHostMemory) {
  auto engine = MakeEngine("bounce", {}, 64 * kMiB, false, /*gpu_bounce_bytes=*/12 * kMiB);
  TierStore& store = *engine.store;
  const uint64_t small = 9 * kMiB + 4321;  // three chunks, the last a short one
  Extent from = *store.Allocate(Tier::kGpu, small);
  Extent to = *store.Allocate(Tier::kGpu, small);
  engine.Fill(from, small, 11);
  ASSERT_TRUE(engine.mover->MoveAndWait(from, to, small).ok());
  EXPECT_EQ(engine.Bytes(from, small), engine.Bytes(to, small));
  EXPECT_EQ(engine.mover->Stats(Link::kGpuToDram).bytes, small);
  EXPECT_EQ(engine.mover->Stats(Link::kDramToGpu).bytes, small);
  EXPECT_EQ(engine.mover->Stats(Link::kGpuToDram).moves, 3u);
  EXPECT_EQ(engine.mover->Bounced().moves, 1u);
  EXPECT_EQ(engine.mover->Bounced().bytes, small);
  store.Free(from).IgnoreError();
  store.Free(to).IgnoreError();
  const uint64_t large = 13 * kMiB;
  from = *store.Allocate(Tier::kGpu, large);
  to = *store.Allocate(Tier::kGpu, large);
  engine.Fill(from, large, 12);
  ASSERT_TRUE(engine.mover->MoveAndWait(from, to, large).ok());
  EXPECT_EQ(engine.Bytes(from, large), engine.Bytes(to, large));
  EXPECT_EQ(engine.mover->Stats(Link::kDramToGpu).bytes, small) << "over the buffer: a device copy";
  EXPECT_EQ(engine.mover->Bounced().moves, 1u);
  // A bad move is refused as a device copy's would be.
  EXPECT_EQ(engine.mover->MoveAndWait(from, from, small).code(), absl::StatusCode::kInvalidArgument);
}

// A bounce waits behind what the host links already carry: while a link has more unfinished
// than fits the buffer beside the move, the move is a device copy.
TEST(MoverTest, AMoveWithinTheGpuIsADeviceCopyWhileTheHostLinksAreBusy) {
  auto engine = MakeEngine("bounce-busy", {}, 64 * kMiB, false, /*gpu_bounce_bytes=*/12 * kMiB);
  TierStore& store = *engine.store;
  const uint64_t first = 1 * kMiB, load = 8 * kMiB, bytes = 5 * kMiB;
  Extent first_staged = *store.Allocate(Tier::kDram, first), staged = *store.Allocate(Tier::kDram, load);
  Extent first_loaded = *store.Allocate(Tier::kGpu, first), loaded = *store.Allocate(Tier::kGpu, load);
  // The first copy's callback holds the link until the test lets it go, so the load queued
  // behind it stays unfinished.
  absl::Notification release;
  ASSERT_TRUE(engine.mover->Move(first_staged, first_loaded, first, [&](absl::Status) { release.WaitForNotification(); }).ok());
  ASSERT_TRUE(engine.mover->Move(staged, loaded, load, [](absl::Status) {}).ok());
  Extent from = *store.Allocate(Tier::kGpu, bytes);
  Extent to = *store.Allocate(Tier::kGpu, bytes);
  engine.Fill(from, bytes, 13);
  ASSERT_TRUE(engine.mover->MoveAndWait(from, to, bytes).ok());
  EXPECT_EQ(engine.Bytes(from, bytes), engine.Bytes(to, bytes));
  EXPECT_EQ(engine.mover->Bounced().moves, 0u) << "8 MiB queued + 5 MiB is more than the 12 MiB buffer";
  release.Notify();
  engine.mover->Drain();
  EXPECT_EQ(engine.mover->Stats(Link::kDramToGpu).bytes, first + load);
  ASSERT_TRUE(engine.mover->MoveAndWait(to, from, bytes).ok());  // the links idle again: it bounces
  EXPECT_EQ(engine.mover->Bounced().moves, 1u);
}

// Bounces from several threads share the one buffer one at a time: every copy lands intact.
TEST(MoverTest, ConcurrentBouncesAllLand) {
  auto engine = MakeEngine("bounce-threads", {}, 64 * kMiB, false, /*gpu_bounce_bytes=*/8 * kMiB);
  TierStore& store = *engine.store;
  constexpr int kThreads = 4;
  const uint64_t bytes = 3 * kMiB + 512;
  std::vector<Extent> from, to;
  for (int i = 0; i < kThreads; ++i) {
    from.push_back(*store.Allocate(Tier::kGpu, bytes));
    to.push_back(*store.Allocate(Tier::kGpu, bytes));
    engine.Fill(from[i], bytes, 300 + i);
  }
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&, i] {
      for (int round = 0; round < 3; ++round) {
        if (!engine.mover->MoveAndWait(round % 2 == 0 ? from[i] : to[i], round % 2 == 0 ? to[i] : from[i], bytes).ok()) {
          ++failures;
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  for (int i = 0; i < kThreads; ++i) EXPECT_EQ(engine.Bytes(from[i], bytes), engine.Bytes(to[i], bytes)) << i;
  // One bounce at a time holds at most 3 MiB on a link, and 3 + 3 MiB fit the 8 MiB buffer:
  // every move bounced.
  EXPECT_EQ(engine.mover->Bounced().moves, 3u * kThreads);
}

// Moves submitted together: each lands and reports in order; a refused one (overlapping
// ranges) stops none of the others; one that fits the bounce buffer still bounces.
TEST(MoverTest, MovesSubmittedTogetherAllLandAndReportInOrder) {
  auto engine = MakeEngine("all", {}, 64 * kMiB, false, /*gpu_bounce_bytes=*/4 * kMiB);
  TierStore& store = *engine.store;
  const uint64_t small = 1 * kMiB, large = 6 * kMiB;
  Extent a = *store.Allocate(Tier::kGpu, large), a_to = *store.Allocate(Tier::kGpu, large);
  Extent b = *store.Allocate(Tier::kGpu, small), b_to = *store.Allocate(Tier::kGpu, small);
  Extent c = *store.Allocate(Tier::kDram, small), c_to = *store.Allocate(Tier::kGpu, small);
  engine.Fill(a, large, 41);
  engine.Fill(b, small, 42);
  engine.Fill(c, small, 43);
  const std::vector<absl::Status> results =
      engine.mover->MoveAllAndWait({{a, a_to, large}, {b, b, small}, {b, b_to, small}, {c, c_to, small}});
  ASSERT_EQ(results.size(), 4u);
  EXPECT_TRUE(results[0].ok()) << results[0];
  EXPECT_EQ(results[1].code(), absl::StatusCode::kInvalidArgument) << "a copy onto itself";
  EXPECT_TRUE(results[2].ok()) << results[2];
  EXPECT_TRUE(results[3].ok()) << results[3];
  EXPECT_EQ(engine.Bytes(a, large), engine.Bytes(a_to, large));
  EXPECT_EQ(engine.Bytes(b, small), engine.Bytes(b_to, small));
  EXPECT_EQ(engine.Bytes(c, small), engine.Bytes(c_to, small));
  EXPECT_EQ(engine.mover->Bounced().moves, 1u) << "the 1 MiB move within the GPU, not the 6 MiB one";
  EXPECT_TRUE(engine.mover->MoveAllAndWait({}).empty());
}

// A 4 MiB DRAM tier fits the smallest common memlock limit (8 MiB): registration must
// work, and moves through fixed buffers must keep the bytes.
TEST(MoverTest, FixedBuffersCarryTheBytesWhenRegistered) {
  auto engine = MakeEngine("fixed", {}, 4 * kMiB, /*register_buffers=*/true);
  ASSERT_TRUE(engine.mover->NvmeBufferRegistration().ok()) << engine.mover->NvmeBufferRegistration();
  const uint64_t bytes = 1 * kMiB + 4096;
  Extent source = *engine.store->Allocate(Tier::kDram, bytes);
  Extent nvme = *engine.store->Allocate(Tier::kNvme, bytes);
  Extent back = *engine.store->Allocate(Tier::kDram, bytes);
  engine.Fill(source, bytes, 77);
  ASSERT_TRUE(engine.mover->MoveAndWait(source, nvme, bytes).ok());
  ASSERT_TRUE(engine.mover->MoveAndWait(nvme, back, bytes).ok());
  EXPECT_EQ(engine.Bytes(source, bytes), engine.Bytes(back, bytes));
}

TEST(MoverTest, RegistrationBeyondTheMemlockLimitSaysSoAndIoStillWorks) {
  auto engine = MakeEngine("nofixed", {}, 64 * kMiB, /*register_buffers=*/true);
  const absl::Status registration = engine.mover->NvmeBufferRegistration();
  if (registration.ok()) GTEST_SKIP() << "this host lets 64 MiB be pinned (CAP_IPC_LOCK)";
  EXPECT_NE(registration.message().find("memlock limit"), absl::string_view::npos) << registration;
  const uint64_t bytes = 2 * kMiB;
  Extent source = *engine.store->Allocate(Tier::kDram, bytes);
  Extent nvme = *engine.store->Allocate(Tier::kNvme, bytes);
  Extent back = *engine.store->Allocate(Tier::kDram, bytes);
  engine.Fill(source, bytes, 78);
  ASSERT_TRUE(engine.mover->MoveAndWait(source, nvme, bytes).ok());
  ASSERT_TRUE(engine.mover->MoveAndWait(nvme, back, bytes).ok());
  EXPECT_EQ(engine.Bytes(source, bytes), engine.Bytes(back, bytes));
}

TEST(MoverTest, ManyConcurrentMovesInEveryDirectionAllLand) {
  auto engine = MakeEngine("concurrent");
  TierStore& store = *engine.store;
  constexpr int kTensors = 24;
  const uint64_t bytes = 640 * kKiB + 4096;
  std::vector<Extent> gpu, dram, nvme, dram2;
  for (int i = 0; i < kTensors; ++i) {
    gpu.push_back(*store.Allocate(Tier::kGpu, bytes));
    dram.push_back(*store.Allocate(Tier::kDram, bytes));
    nvme.push_back(*store.Allocate(Tier::kNvme, bytes));
    dram2.push_back(*store.Allocate(Tier::kDram, bytes));
    engine.Fill(gpu[i], bytes, 100 + i);
    engine.Fill(dram2[i], bytes, 200 + i);
  }
  std::atomic<int> failures{0};
  auto expect_ok = [&](absl::Status status) {
    if (!status.ok()) ++failures;
  };
  // Phase 1: every link at once — GPU->DRAM, DRAM->GPU (of other tensors), DRAM->NVMe.
  for (int i = 0; i < kTensors; ++i) {
    ASSERT_TRUE(engine.mover->Move(gpu[i], dram[i], bytes, expect_ok).ok());
  }
  engine.mover->Drain();
  for (int i = 0; i < kTensors; ++i) {
    ASSERT_TRUE(engine.mover->Move(dram[i], nvme[i], bytes, expect_ok).ok());
    ASSERT_TRUE(engine.mover->Move(dram2[i], gpu[i], bytes, expect_ok).ok());
  }
  engine.mover->Drain();
  // Phase 2: NVMe reads back into dram2 (overwriting its own random bytes).
  for (int i = 0; i < kTensors; ++i) {
    ASSERT_TRUE(engine.mover->Move(nvme[i], dram2[i], bytes, expect_ok).ok());
  }
  engine.mover->Drain();
  EXPECT_EQ(failures.load(), 0);
  for (int i = 0; i < kTensors; ++i) {
    EXPECT_EQ(engine.Bytes(dram[i], bytes), engine.Bytes(dram2[i], bytes)) << i;
  }
  EXPECT_EQ(engine.mover->Stats(Link::kDramToNvme).moves, static_cast<uint64_t>(kTensors));
  EXPECT_EQ(engine.mover->Stats(Link::kNvmeToDram).moves, static_cast<uint64_t>(kTensors));
}

// The NVMe device's meter sees reads and writes together: their bytes, and a busy time no
// shorter than either direction's and no longer than both apart.
TEST(MoverTest, TheNvmeDeviceMeterCountsBothDirectionsOnce) {
  auto engine = MakeEngine("device");
  TierStore& store = *engine.store;
  constexpr int kTensors = 8;
  const uint64_t bytes = 1 * kMiB;
  std::vector<Extent> dram, nvme, back, written;
  for (int i = 0; i < kTensors; ++i) {
    dram.push_back(*store.Allocate(Tier::kDram, bytes));
    nvme.push_back(*store.Allocate(Tier::kNvme, bytes));
    back.push_back(*store.Allocate(Tier::kDram, bytes));
    written.push_back(*store.Allocate(Tier::kNvme, bytes));
    engine.Fill(dram[i], bytes, 300 + i);
    ASSERT_TRUE(engine.mover->MoveAndWait(dram[i], nvme[i], bytes).ok());
  }
  const LinkStats before = engine.mover->NvmeDeviceStats();
  EXPECT_EQ(before.bytes, kTensors * bytes);
  std::atomic<int> failures{0};
  for (int i = 0; i < kTensors; ++i) {  // reads and writes at once
    ASSERT_TRUE(engine.mover->Move(nvme[i], back[i], bytes, [&](absl::Status s) { failures += !s.ok(); }).ok());
    ASSERT_TRUE(engine.mover->Move(dram[i], written[i], bytes, [&](absl::Status s) { failures += !s.ok(); }).ok());
  }
  engine.mover->Drain();
  EXPECT_EQ(failures.load(), 0);
  const LinkStats read = engine.mover->Stats(Link::kNvmeToDram), write = engine.mover->Stats(Link::kDramToNvme);
  const LinkStats device = engine.mover->NvmeDeviceStats();
  EXPECT_EQ(device.bytes, read.bytes + write.bytes);
  EXPECT_EQ(device.moves, read.moves + write.moves);
  EXPECT_GE(device.busy_nanos, std::max(read.busy_nanos, write.busy_nanos));
  EXPECT_LE(device.busy_nanos, read.busy_nanos + write.busy_nanos);
}

// For the planner's one-at-a-time NVMe model: speeds measured while reads and writes
// overlapped are scaled so the model takes as long as the device did.
TEST(MoverTest, SerialDeviceSpeedsMakeTheModelTakeTheDevicesTime) {
  const LinkStats read{1'000'000'000, 10, 0, 1'000'000'000};   // 1 GB in 1 s busy
  const LinkStats write{1'000'000'000, 10, 0, 1'000'000'000};  // 1 GB in 1 s busy
  const LinkStats overlapped{2'000'000'000, 20, 0, 1'000'000'000};
  const LinkStats apart{2'000'000'000, 20, 0, 2'000'000'000};
  auto [r, w] = SerialDeviceSpeeds(read, write, overlapped);
  EXPECT_DOUBLE_EQ(r, 2e9);  // 1 GB / 2 + 1 GB / 2 = 1 s, as the device took
  EXPECT_DOUBLE_EQ(w, 2e9);
  std::tie(r, w) = SerialDeviceSpeeds(read, write, apart);
  EXPECT_DOUBLE_EQ(r, 1e9);
  EXPECT_DOUBLE_EQ(w, 1e9);
  std::tie(r, w) = SerialDeviceSpeeds(read, LinkStats{}, LinkStats{});
  EXPECT_DOUBLE_EQ(r, 1e9);  // nothing to scale by
  EXPECT_DOUBLE_EQ(w, 0);
}

TEST(MoverTest, InvalidMovesAreRefusedWithoutACallback) {
  auto engine = MakeEngine("invalid");
  TierStore& store = *engine.store;
  Extent gpu = *store.Allocate(Tier::kGpu, 64 * kKiB);
  Extent nvme = *store.Allocate(Tier::kNvme, 64 * kKiB);
  Extent dram = *store.Allocate(Tier::kDram, 8 * kKiB);
  bool called = false;
  auto mark = [&](absl::Status) { called = true; };
  EXPECT_EQ(engine.mover->Move(gpu, nvme, 4096, mark).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(engine.mover->Move(gpu, dram, 64 * kKiB, mark).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(engine.mover->Move(gpu, dram, 0, mark).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(engine.mover->Move(gpu, gpu, 4096, mark).code(), absl::StatusCode::kInvalidArgument);  // overlap
  Extent dram_other = *store.Allocate(Tier::kDram, 8 * kKiB);
  EXPECT_EQ(engine.mover->Move(dram, dram_other, 4096, mark).code(), absl::StatusCode::kInvalidArgument);
  engine.mover->Drain();
  EXPECT_FALSE(called);
}

TEST(MoverTest, ReadingAnNvmeExtentNeverWrittenIsAnError) {
  auto engine = MakeEngine("unwritten");
  Extent nvme = *engine.store->Allocate(Tier::kNvme, 64 * kKiB);
  Extent dram = *engine.store->Allocate(Tier::kDram, 64 * kKiB);
  EXPECT_EQ(engine.mover->MoveAndWait(nvme, dram, 64 * kKiB).code(), absl::StatusCode::kNotFound);
  // And after a free, the checksums (and so the data) are gone too.
  Extent source = *engine.store->Allocate(Tier::kDram, 64 * kKiB);
  engine.Fill(source, 64 * kKiB, 5);
  ASSERT_TRUE(engine.mover->MoveAndWait(source, nvme, 64 * kKiB).ok());
  ASSERT_TRUE(engine.store->Free(nvme).ok());
  Extent again = *engine.store->Allocate(Tier::kNvme, 64 * kKiB);
  EXPECT_EQ(engine.mover->MoveAndWait(again, dram, 64 * kKiB).code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace tierd
