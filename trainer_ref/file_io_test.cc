#include "trainer_ref/file_io.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdlib>
#include <string>

namespace tierd::trainer {
namespace {

std::string Temp(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return std::string(tmp ? tmp : "/tmp") + "/" + name + "." + std::to_string(getpid());
}

TEST(FileIoTest, WrittenAsideReadBackWhole) {
  const std::string path = Temp("whole");
  const std::string bytes = std::string("a\0b", 3) + std::string(100000, 'x');
  ASSERT_TRUE(WriteFileAside(path, bytes).ok());
  EXPECT_EQ(access((path + ".partial").c_str(), F_OK), -1);
  auto back = ReadWholeFile(path);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, bytes);
  auto absent = ReadWholeFile(Temp("absent"));
  EXPECT_EQ(absent.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(absent.status().message().find("No such file"), absl::string_view::npos) << absent.status();
}

// A full disk (a file size limit stands in for it): RESOURCE_EXHAUSTED, the old file as it was,
// nothing of the new one.
TEST(FileIoTest, AFullDiskKeepsTheOldFile) {
  const std::string path = Temp("kept");
  ASSERT_TRUE(WriteFileAside(path, "old").ok());
  rlimit old{};
  getrlimit(RLIMIT_FSIZE, &old);
  signal(SIGXFSZ, SIG_IGN);
  rlimit small = old;
  small.rlim_cur = 64 << 10;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &small), 0);
  const absl::Status s = WriteFileAside(path, std::string(1 << 20, 'n'));
  setrlimit(RLIMIT_FSIZE, &old);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_NE(s.message().find("nothing of it is left"), absl::string_view::npos) << s;
  EXPECT_EQ(*ReadWholeFile(path), "old");
  EXPECT_EQ(access((path + ".partial").c_str(), F_OK), -1);
}

}  // namespace
}  // namespace tierd::trainer
