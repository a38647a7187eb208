// The NVMe link under a misbehaving disk: short writes, EIO, ENOSPC and bytes
// corrupted on disk. Each is detected and reported; nothing is silently wrong, and
// the source of a failed move still holds its data.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include "runtime/mover_test_util.h"

namespace tierd {
namespace {

using testing::MakeEngine;

constexpr uint64_t kBytes = 3 * kMiB + 8192;  // four chunks, the last one short

TEST(MoverFaultTest, ShortWritesAndReadsAreCompletedNotLost) {
  auto engine = MakeEngine("short", {{.kind = IoKind::kWrite, .nth = 1, .short_bytes = 8192},
                                     {.kind = IoKind::kRead, .nth = 2, .short_bytes = 4096}});
  TierStore& store = *engine.store;
  Extent source = *store.Allocate(Tier::kDram, kBytes);
  Extent nvme = *store.Allocate(Tier::kNvme, kBytes);
  Extent back = *store.Allocate(Tier::kDram, kBytes);
  engine.Fill(source, kBytes, 9);
  ASSERT_TRUE(engine.mover->MoveAndWait(source, nvme, kBytes).ok());
  ASSERT_TRUE(engine.mover->MoveAndWait(nvme, back, kBytes).ok());
  EXPECT_EQ(engine.faults->faults_fired(), 2u);
  EXPECT_EQ(engine.Bytes(source, kBytes), engine.Bytes(back, kBytes));
}

TEST(MoverFaultTest, EioFailsTheMoveKeepsTheSourceAndARetrySucceeds) {
  auto engine = MakeEngine("eio", {{.kind = IoKind::kWrite, .nth = 2, .error_number = EIO}});
  TierStore& store = *engine.store;
  Extent source = *store.Allocate(Tier::kDram, kBytes);
  Extent nvme = *store.Allocate(Tier::kNvme, kBytes);
  engine.Fill(source, kBytes, 10);
  const auto before = engine.Bytes(source, kBytes);
  absl::Status failed = engine.mover->MoveAndWait(source, nvme, kBytes);
  ASSERT_EQ(failed.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(failed.message().find("nvme tier: write of 1.00 MiB at file offset"), absl::string_view::npos)
      << failed.message();
  EXPECT_NE(failed.message().find("Input/output error (errno 5)"), absl::string_view::npos);
  EXPECT_EQ(engine.Bytes(source, kBytes), before);
  EXPECT_EQ(engine.mover->Stats(Link::kDramToNvme).failed_moves, 1u);
  // A failed write leaves no checksums: reading the extent is refused, not garbage.
  Extent back = *store.Allocate(Tier::kDram, kBytes);
  EXPECT_EQ(engine.mover->MoveAndWait(nvme, back, kBytes).code(), absl::StatusCode::kNotFound);
  // The fault was one op: the same move again goes through.
  ASSERT_TRUE(engine.mover->MoveAndWait(source, nvme, kBytes).ok());
  ASSERT_TRUE(engine.mover->MoveAndWait(nvme, back, kBytes).ok());
  EXPECT_EQ(engine.Bytes(back, kBytes), before);
}

TEST(MoverFaultTest, EnospcIsReportedAsResourceExhausted) {
  auto engine = MakeEngine("enospc", {{.kind = IoKind::kWrite, .nth = 0, .error_number = ENOSPC}});
  Extent source = *engine.store->Allocate(Tier::kDram, kBytes);
  Extent nvme = *engine.store->Allocate(Tier::kNvme, kBytes);
  engine.Fill(source, kBytes, 11);
  absl::Status status = engine.mover->MoveAndWait(source, nvme, kBytes);
  EXPECT_EQ(status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(status.message().find("no space left on the disk"), absl::string_view::npos);
}

TEST(MoverFaultTest, EioOnReadFailsTheMove) {
  auto engine = MakeEngine("eio-read", {{.kind = IoKind::kRead, .nth = 3, .error_number = EIO}});
  Extent source = *engine.store->Allocate(Tier::kDram, kBytes);
  Extent nvme = *engine.store->Allocate(Tier::kNvme, kBytes);
  Extent back = *engine.store->Allocate(Tier::kDram, kBytes);
  engine.Fill(source, kBytes, 12);
  ASSERT_TRUE(engine.mover->MoveAndWait(source, nvme, kBytes).ok());
  EXPECT_EQ(engine.mover->MoveAndWait(nvme, back, kBytes).code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(engine.mover->Stats(Link::kNvmeToDram).failed_moves, 1u);
}

TEST(MoverFaultTest, ABlockCorruptedOnDiskIsDetectedOnRead) {
  auto engine = MakeEngine("corrupt");
  TierStore& store = *engine.store;
  Extent source = *store.Allocate(Tier::kDram, kBytes);
  Extent nvme = *store.Allocate(Tier::kNvme, kBytes);
  Extent back = *store.Allocate(Tier::kDram, kBytes);
  engine.Fill(source, kBytes, 13);
  ASSERT_TRUE(engine.mover->MoveAndWait(source, nvme, kBytes).ok());
  // Flip one byte in the third chunk, behind the daemon's back (buffered fd, fsync).
  const int fd = open(("/proc/self/fd/" + std::to_string(store.nvme()->fd())).c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  const off_t where = static_cast<off_t>(nvme.offset() + 2 * kMiB + 777);
  uint8_t byte = 0;
  ASSERT_EQ(pread(fd, &byte, 1, where), 1);
  byte ^= 0x01;
  ASSERT_EQ(pwrite(fd, &byte, 1, where), 1);
  ASSERT_EQ(fsync(fd), 0);
  close(fd);
  absl::Status status = engine.mover->MoveAndWait(nvme, back, kBytes);
  ASSERT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(status.message().find("checksum mismatch in chunk 2"), absl::string_view::npos)
      << status.message();
}

}  // namespace
}  // namespace tierd
