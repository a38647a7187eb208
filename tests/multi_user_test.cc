// tierd and a client of another uid: the 0600 sockets refuse it by default; with the
// socket group and an allowed uid it is served. Runs outside Bazel's sandbox (tag
// no-sandbox): inside its user namespace root cannot become another uid.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <random>
#include <string>

#include "tests/process.h"

namespace tierd {
namespace {

using testing::Process;

// Another user: refused by the 0600 sockets by default; served when allowed and given the
// socket group. Needs root to become that user.
TEST(MultiUserTest, OtherUsersNeedTheSocketGroupAndAnAllowedUid) {
  if (getuid() != 0) GTEST_SKIP() << "needs root to run a client as another uid";
  // Inside a user namespace (a sandbox) root may not become other uids; in a chroot whose
  // root directory is private (mode 0700, as mktemp -d makes it) no other uid can reach
  // /tmp, whatever tierd does. Either way the test cannot tell anything: say which.
  const pid_t probe = fork();
  if (probe == 0) {
    if (setgid(65534) != 0 || setuid(65534) != 0) _exit(1);
    _exit(access("/tmp", X_OK) == 0 ? 0 : 2);
  }
  int probe_status = 0;
  waitpid(probe, &probe_status, 0);
  if (!WIFEXITED(probe_status) || WEXITSTATUS(probe_status) == 1) {
    GTEST_SKIP() << "this environment does not let root become uid 65534 (user namespace?)";
  }
  if (WEXITSTATUS(probe_status) == 2) {
    GTEST_SKIP() << "uid 65534 cannot search /tmp here (a directory above it is private, e.g. a chroot made "
                    "by mktemp -d): no other user could reach any socket under it";
  }
  const uid_t nobody = 65534;
  const std::string tag = std::to_string(getpid()) + "-" + std::to_string(std::random_device{}() % 100000);
  const std::string private_dir = "/tmp/tierd-e2e-private-" + tag;
  {
    Process daemon("server/tierd",
                   {"--gpu=fake", "--gpu_bytes=8MiB", "--dram_bytes=16MiB", "--runtime_dir=" + private_dir});
    ASSERT_NE(daemon.WaitForLine("tierd: ready", 10000), "") << daemon.output();
    Process stranger("tests/client_worker", {private_dir, "roundtrip-as", std::to_string(nobody), "4"});
    EXPECT_NE(stranger.WaitForLine("client_worker: connect: UNAVAILABLE: cannot reach tierd", 10000), "")
        << stranger.output();
    EXPECT_EQ(stranger.Wait(), 1);
    daemon.Signal(SIGTERM);
    EXPECT_EQ(daemon.Wait(), 0);
  }
  const std::string shared_dir = "/tmp/tierd-e2e-shared-" + tag;
  {
    const char* tmp = std::getenv("TEST_TMPDIR");
    Process daemon("server/tierd", {"--gpu=fake", "--gpu_bytes=8MiB", "--dram_bytes=16MiB",
                                    std::string("--nvme_dir=") + (tmp ? tmp : "/tmp"), "--nvme_bytes=32MiB",
                                    "--runtime_dir=" + shared_dir, "--socket_group=" + std::to_string(nobody),
                                    "--allowed_uids=0," + std::to_string(nobody)});
    ASSERT_NE(daemon.WaitForLine("tierd: ready", 10000), "") << daemon.output();
    Process member("tests/client_worker", {shared_dir, "roundtrip-as", std::to_string(nobody), "5"});
    EXPECT_NE(member.WaitForLine("ok:", 20000), "") << member.output();
    EXPECT_EQ(member.Wait(), 0) << member.output();
    // An allowed uid administers once it said hello (an observer session).
    Process admin("tests/client_worker", {shared_dir, "admin-as", std::to_string(nobody)});
    EXPECT_NE(admin.WaitForLine("admin: ListLeases as an observer: OK", 20000), "") << admin.output();
    EXPECT_EQ(admin.Wait(), 0) << admin.output();
    daemon.Signal(SIGTERM);
    EXPECT_EQ(daemon.Wait(), 0);
  }
  // A member of the socket's group whose uid is not allowed reaches the sockets but may do
  // nothing: no session, no listing of others' tensors, no pinning them, no config.
  const std::string group_dir = "/tmp/tierd-e2e-group-" + tag;
  {
    Process daemon("server/tierd",
                   {"--gpu=fake", "--gpu_bytes=8MiB", "--dram_bytes=16MiB", "--runtime_dir=" + group_dir,
                    "--socket_group=" + std::to_string(nobody), "--allowed_uids=0"});
    ASSERT_NE(daemon.WaitForLine("tierd: ready", 10000), "") << daemon.output();
    Process owner("tests/client_worker", {group_dir, "hold"});
    ASSERT_NE(owner.WaitForLine("ready", 10000), "") << owner.output();
    Process intruder("tests/client_worker", {group_dir, "admin-as", std::to_string(nobody)});
    for (const char* call : {"GetConfig", "ListLeases", "AdminPin"}) {
      EXPECT_NE(
          intruder.WaitForLine(
              std::string("admin: ") + call + " without a hello: administration and listings need a session", 20000),
          "")
          << intruder.output();
    }
    EXPECT_NE(intruder.WaitForLine("admin: observer hello: tierd refused the session: uid 65534 may not use this tierd",
                                   20000),
              "")
        << intruder.output();
    EXPECT_EQ(intruder.Wait(), 0) << intruder.output();
    owner.Signal(SIGKILL);
    owner.Wait();
    daemon.Signal(SIGTERM);
    EXPECT_EQ(daemon.Wait(), 0);
  }
  rmdir(group_dir.c_str());
  rmdir(private_dir.c_str());
  rmdir(shared_dir.c_str());
}

}  // namespace
}  // namespace tierd
