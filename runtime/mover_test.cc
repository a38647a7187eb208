#include "runtime/mover.h"

#include <gtest/gtest.h>

#include <atomic>

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
