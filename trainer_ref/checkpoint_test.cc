#include "trainer_ref/checkpoint.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <random>
#include <vector>

namespace tierd::trainer {
namespace {

std::string FreshDir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = std::string(tmp ? tmp : "/tmp") + "/" + name + "." + std::to_string(getpid());
  std::system(("rm -rf " + dir + " && mkdir -p " + dir).c_str());
  return dir;
}

std::vector<float> RandomFloats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-3.f, 3.f);
  std::vector<float> out(n);
  for (float& x : out) x = dist(rng);
  return out;
}

TEST(CheckpointTest, DamagedFilesAreRefusedAndTheOlderOneIsUsed) {
  const std::string dir = FreshDir("ckpts");
  ASSERT_TRUE(WriteCheckpoint(dir, 10, std::string(1000, 'a')).ok());
  auto newest = WriteCheckpoint(dir, 20, std::string(1000, 'b'));
  ASSERT_TRUE(newest.ok());
  {
    std::fstream f(*newest, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(500);
    f.put('X');  // one flipped byte
  }
  EXPECT_EQ(ReadCheckpoint(*newest).status().code(), absl::StatusCode::kDataLoss);
  std::string skipped;
  auto latest = LatestCheckpoint(dir, &skipped);
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_NE(latest->find("ckpt-00000010.bin"), std::string::npos);
  EXPECT_NE(skipped.find("fails its checksum"), std::string::npos) << skipped;
  EXPECT_EQ(*ReadCheckpoint(*latest), std::string(1000, 'a'));
  EXPECT_EQ(ReadCheckpoint(dir + "/nope.bin").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(WriteCheckpoint("/nonexistent/dir", 1, "x").status().code(), absl::StatusCode::kInternal);
}

// A state written in pieces of one size comes back whole, and in pieces of another size.
TEST(CheckpointTest, RecordsStreamInPiecesAndComeBackBitForBit) {
  const std::string dir = FreshDir("stream");
  const std::vector<float> a = RandomFloats(100'003, 1), b = RandomFloats(777, 2);
  auto writer = CheckpointWriter::Create(dir, 7);
  ASSERT_TRUE(writer.ok()) << writer.status();
  ASSERT_TRUE((*writer)->Append("meta", "model=tiny", 10).ok());
  ASSERT_TRUE((*writer)->BeginRecord("layers.0.master", a.size() * 4).ok());
  for (size_t at = 0; at < a.size(); at += 4096) {
    const size_t n = std::min<size_t>(4096, a.size() - at);
    ASSERT_TRUE((*writer)->Write(a.data() + at, n * 4).ok());
  }
  ASSERT_TRUE((*writer)->EndRecord().ok());
  ASSERT_TRUE((*writer)->Append("layers.1.master", b.data(), b.size() * 4).ok());
  EXPECT_FALSE((*writer)->EndRecord().ok()) << "no record is open";
  auto path = (*writer)->Commit();
  ASSERT_TRUE(path.ok()) << path.status();
  EXPECT_TRUE(VerifyCheckpoint(*path).ok());

  auto reader = CheckpointReader::Open(*path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ(*(*reader)->ReadString("meta"), "model=tiny");
  std::vector<float> a2(a.size()), b2(b.size());
  ASSERT_TRUE((*reader)->BeginRecord("layers.0.master", a.size() * 4).ok());
  for (size_t at = 0; at < a.size(); at += 1000) {
    const size_t n = std::min<size_t>(1000, a.size() - at);
    ASSERT_TRUE((*reader)->ReadPiece(a2.data() + at, n * 4).ok());
  }
  ASSERT_TRUE((*reader)->EndRecord().ok());
  auto wrong = (*reader)->Read("layers.1.weights", b2.data(), b2.size() * 4);
  EXPECT_EQ(wrong.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(wrong.message().find("holds record 'layers.1.master'"), absl::string_view::npos) << wrong;
  ASSERT_TRUE((*reader)->Read("layers.1.master", b2.data(), b2.size() * 4).ok());
  EXPECT_EQ(a, a2);
  EXPECT_EQ(b, b2);
}

// A writer dropped mid-way (the trainer failed, or the process died before Commit) leaves
// no checkpoint and no temporary file that resume could take; a file cut short is refused.
TEST(CheckpointTest, AnUnfinishedWriteLeavesTheOlderCheckpointNewest) {
  const std::string dir = FreshDir("unfinished");
  ASSERT_TRUE(WriteCheckpoint(dir, 1, "old").ok());
  {
    auto writer = CheckpointWriter::Create(dir, 2);
    ASSERT_TRUE(writer.ok());
    ASSERT_TRUE((*writer)->Append("state", "new", 3).ok());
  }
  EXPECT_EQ(ListCheckpoints(dir).size(), 1u);
  EXPECT_NE(access((dir + "/ckpt-00000002.bin.tmp").c_str(), F_OK), 0);
  // A crash (no destructor) leaves the temporary file: it is never taken, and pruned.
  std::ofstream(dir + "/ckpt-00000003.bin.tmp") << "trkcpt02 half";
  auto full = WriteCheckpoint(dir, 4, std::string(5000, 'z'));
  ASSERT_TRUE(full.ok());
  truncate(full->c_str(), 3000);  // as if the disk lost the tail
  std::string skipped;
  auto latest = LatestCheckpoint(dir, &skipped);
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_NE(latest->find("ckpt-00000001.bin"), std::string::npos) << *latest;
  EXPECT_NE(skipped.find("cut short"), std::string::npos) << skipped;
  PruneCheckpoints(dir, 1);
  EXPECT_EQ(ListCheckpoints(dir), std::vector<std::string>{dir + "/ckpt-00000004.bin"});
  EXPECT_NE(access((dir + "/ckpt-00000003.bin.tmp").c_str(), F_OK), 0) << "stale temporary file pruned";
}

// Out of room mid-write: RESOURCE_EXHAUSTED that says the older checkpoints are untouched,
// and they are.
TEST(CheckpointTest, NoRoomMidWriteLosesNothing) {
  const std::string dir = FreshDir("full");
  ASSERT_TRUE(WriteCheckpoint(dir, 1, "kept").ok());
  rlimit old{};
  getrlimit(RLIMIT_FSIZE, &old);
  signal(SIGXFSZ, SIG_IGN);  // the write fails with EFBIG instead of killing the test
  rlimit small = old;
  small.rlim_cur = 1 << 20;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  const std::vector<float> big = RandomFloats(1 << 19, 3);  // 2 MiB
  auto writer = CheckpointWriter::Create(dir, 2);
  ASSERT_TRUE(writer.ok());
  const absl::Status s = (*writer)->Append("state", big.data(), big.size() * 4);
  setrlimit(RLIMIT_FSIZE, &old);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_NE(s.message().find("are untouched"), absl::string_view::npos) << s;
  EXPECT_EQ((*writer)->Commit().status().code(), absl::StatusCode::kResourceExhausted) << "the first error sticks";
  writer->reset();
  auto latest = LatestCheckpoint(dir);
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(*ReadCheckpoint(*latest), "kept");
}

}  // namespace
}  // namespace tierd::trainer
