#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "base/units.h"
#include "runtime/fault_injecting_block_io.h"
#include "runtime/nvme_file.h"
#include "runtime/uring_block_io.h"

namespace tierd {
namespace {

struct AlignedBuffer {
  explicit AlignedBuffer(size_t bytes) : bytes(bytes) {
    data = static_cast<uint8_t*>(std::aligned_alloc(4096, bytes));
  }
  ~AlignedBuffer() { std::free(data); }
  uint8_t* data;
  size_t bytes;
};

std::string TestDir() { return std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp"; }

std::vector<IoCompletion> ReapAll(BlockIo& io, size_t count) {
  std::vector<IoCompletion> all;
  IoCompletion batch[8];
  while (all.size() < count) {
    auto reaped = io.Reap(batch, 8, true);
    EXPECT_TRUE(reaped.ok());
    all.insert(all.end(), batch, batch + *reaped);
  }
  return all;
}

// The slow, obvious oracle: pread through a second, buffered descriptor.
std::vector<uint8_t> PreadOracle(int direct_fd, uint64_t offset, size_t bytes) {
  const int fd = open(("/proc/self/fd/" + std::to_string(direct_fd)).c_str(), O_RDONLY);
  std::vector<uint8_t> out(bytes);
  EXPECT_EQ(pread(fd, out.data(), bytes, static_cast<off_t>(offset)), static_cast<ssize_t>(bytes));
  close(fd);
  return out;
}

TEST(UringBlockIoTest, WritesAndReadsMatchThePreadOracle) {
  auto file = *NvmeFile::Create(TestDir(), "uring_test", 8 * kMiB);
  auto io = *CreateUringBlockIo(file->fd(), 8);
  // Small buffers: registration pins them against RLIMIT_MEMLOCK (often 8 MiB).
  AlignedBuffer out(1 * kMiB), in(1 * kMiB);
  std::mt19937 rng(11);
  for (size_t i = 0; i < out.bytes; ++i) out.data[i] = static_cast<uint8_t>(rng());
  ASSERT_TRUE(io->RegisterBuffers({iovec{out.data, out.bytes}, iovec{in.data, in.bytes}}).ok());
  for (uint32_t i = 0; i < 4; ++i) {
    ASSERT_TRUE(io->Queue(IoOp{IoKind::kWrite, out.data + i * 256 * kKiB, kMiB + i * 256 * kKiB,
                               static_cast<uint32_t>(256 * kKiB), 0, i})
                    .ok());
  }
  ASSERT_TRUE(io->Submit().ok());
  for (const IoCompletion& c : ReapAll(*io, 4)) EXPECT_EQ(c.result, static_cast<int32_t>(256 * kKiB));
  EXPECT_EQ(PreadOracle(file->fd(), kMiB, kMiB), std::vector<uint8_t>(out.data, out.data + out.bytes));
  // Read back through the registered buffer 1 and, unregistered, once more.
  ASSERT_TRUE(io->Queue(IoOp{IoKind::kRead, in.data, kMiB, static_cast<uint32_t>(kMiB), 1, 9}).ok());
  ASSERT_TRUE(io->Submit().ok());
  auto done = ReapAll(*io, 1);
  EXPECT_EQ(done[0].tag, 9u);
  EXPECT_EQ(done[0].result, static_cast<int32_t>(kMiB));
  EXPECT_EQ(std::memcmp(in.data, out.data, out.bytes), 0);
}

TEST(UringBlockIoTest, RejectsBadQueueDepths) {
  EXPECT_EQ(CreateUringBlockIo(0, 0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CreateUringBlockIo(0, 3).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CreateUringBlockIo(0, 1024).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(FaultInjectingBlockIoTest, FailsAndShortensTheChosenOps) {
  auto file = *NvmeFile::Create(TestDir(), "fault_test", 1 * kMiB);
  FaultInjectingBlockIo io(*CreateUringBlockIo(file->fd(), 8),
                           {{.kind = IoKind::kWrite, .nth = 1, .error_number = EIO},
                            {.kind = IoKind::kWrite, .nth = 2, .short_bytes = 4096}});
  AlignedBuffer buffer(64 * kKiB);
  std::memset(buffer.data, 0xAB, buffer.bytes);
  for (uint32_t i = 0; i < 3; ++i) {
    ASSERT_TRUE(io.Queue(IoOp{IoKind::kWrite, buffer.data, i * 64 * kKiB,
                              static_cast<uint32_t>(64 * kKiB), -1, i}).ok());
  }
  ASSERT_TRUE(io.Submit().ok());
  int32_t results[3] = {};
  for (const IoCompletion& c : ReapAll(io, 3)) results[c.tag] = c.result;
  EXPECT_EQ(results[0], static_cast<int32_t>(64 * kKiB));
  EXPECT_EQ(results[1], -EIO);
  EXPECT_EQ(results[2], 4096);
  EXPECT_EQ(io.faults_fired(), 2u);
}

}  // namespace
}  // namespace tierd
