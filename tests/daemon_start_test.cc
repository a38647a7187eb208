// The real tierd binary at start and at its edges: it sweeps a dead daemon's segments,
// limits sessions, keeps administration off TCP, and refuses impossible budgets, flags and
// addresses with the numbers.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <random>
#include <string>
#include <thread>

#include "absl/strings/str_format.h"
#include "base/units.h"
#include "clients/client.h"
#include "ipc/hello_server.h"
#include "ipc/unix_socket.h"
#include "proto/tierd.grpc.pb.h"
#include "tests/daemon_fixture.h"
#include "tests/process.h"

namespace tierd {
namespace {

using testing::CountShm;
using testing::DaemonTest;
using testing::Process;

TEST(DaemonStartTest, SweepsSegmentsOfADaemonThatDied) {
  const std::string tag = std::to_string(getpid()) + "-" + std::to_string(std::random_device{}() % 100000);
  // One segment nobody holds (its daemon died), one held as a live daemon holds its own.
  const std::string stale = "/dev/shm/tierd-" + tag + "-old-dram";
  const std::string live = "/dev/shm/tierd-" + tag + "-live-dram";
  const int stale_fd = open(stale.c_str(), O_CREAT | O_RDWR, 0600);
  const int live_fd = open(live.c_str(), O_CREAT | O_RDWR, 0600);
  ASSERT_GE(stale_fd, 0);
  ASSERT_GE(live_fd, 0);
  close(stale_fd);
  ASSERT_EQ(flock(live_fd, LOCK_SH), 0);
  const std::string dir = "/tmp/tierd-e2e-sweep-" + tag;
  Process daemon("server/tierd", {"--gpu=fake", "--dram_bytes=16MiB", "--runtime_dir=" + dir});
  EXPECT_NE(daemon.WaitForLine("tierd: ready", 10000), "") << daemon.output();
  // (Another tierd starting at the same time on this machine may have swept it first.)
  EXPECT_NE(access(stale.c_str(), F_OK), 0) << daemon.output();
  EXPECT_EQ(access(live.c_str(), F_OK), 0);  // a held segment is left alone
  unlink(live.c_str());
  close(live_fd);
  daemon.Signal(SIGTERM);
  EXPECT_EQ(daemon.Wait(), 0);
  rmdir(dir.c_str());
}

TEST(DaemonStartTest, LimitsSessionsAndKeepsAdministrationOffTcp) {
  const std::string dir =
      "/tmp/tierd-e2e-limits-" + std::to_string(getpid()) + "-" + std::to_string(std::random_device{}() % 100000);
  const int port = 20000 + std::random_device{}() % 20000;
  Process daemon("server/tierd", {"--gpu=fake", "--dram_bytes=16MiB", "--max_sessions=1",
                                  "--grpc_tcp=" + std::to_string(port), "--runtime_dir=" + dir});
  ASSERT_NE(daemon.WaitForLine("tierd: ready", 10000), "") << daemon.output();
  EXPECT_NE(daemon.output().find("and 127.0.0.1:" + std::to_string(port)), std::string::npos) << daemon.output();
  auto first = Client::Connect({dir, "first", {0, 1 * kMiB, 0}});
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = Client::Connect({dir, "second", {0, 1 * kMiB, 0}});
  EXPECT_EQ(second.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(second.status().message().find("at most 1 sessions"), absl::string_view::npos);
  auto tcp =
      v1::Tierd::NewStub(grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials()));
  v1::Empty empty;
  v1::ConfigReply config;
  grpc::ClientContext context;
  EXPECT_EQ(tcp->GetConfig(&context, empty, &config).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  v1::StatsReply stats;
  grpc::ClientContext context2;
  EXPECT_TRUE(tcp->Stats(&context2, empty, &stats).ok());
  EXPECT_EQ(stats.sessions(), 1u);
  // Tensor names, offsets and pins are not served over TCP; over the Unix socket they are.
  v1::ListLeasesRequest every;
  v1::ListLeasesReply leases;
  grpc::ClientContext context3;
  EXPECT_EQ(tcp->ListLeases(&context3, every, &leases).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_TRUE((*first)->ListLeases(/*every_session=*/true).ok());
  first->reset();
  daemon.Signal(SIGTERM);
  EXPECT_EQ(daemon.Wait(), 0);
  // A bind beyond loopback is refused unless allowed, and said when allowed.
  Process wide("server/tierd", {"--gpu=fake", "--dram_bytes=16MiB", "--grpc_tcp=0.0.0.0:" + std::to_string(port),
                                "--runtime_dir=" + dir});
  EXPECT_NE(wide.WaitForLine(
                "tierd: cannot start: gRPC on 0.0.0.0:" + std::to_string(port) + " would be reachable beyond this host",
                10000),
            "")
      << wide.output();
  EXPECT_EQ(wide.Wait(), 1);
  Process allowed("server/tierd", {"--gpu=fake", "--dram_bytes=16MiB", "--grpc_tcp=0.0.0.0:" + std::to_string(port),
                                   "--grpc_tcp_public", "--runtime_dir=" + dir});
  EXPECT_NE(allowed.WaitForLine(
                "tierd: warning: gRPC on 0.0.0.0:" + std::to_string(port) + " is reachable beyond this host", 10000),
            "")
      << allowed.output();
  EXPECT_NE(allowed.WaitForLine("tierd: ready", 10000), "") << allowed.output();
  allowed.Signal(SIGTERM);
  EXPECT_EQ(allowed.Wait(), 0);
  rmdir(dir.c_str());
}

TEST(DaemonStartTest, RefusesImpossibleConfigsWithTheNumbers) {
  const std::string dir =
      "/tmp/tierd-e2e-refuse-" + std::to_string(getpid()) + "-" + std::to_string(std::random_device{}() % 100000);
  Process too_much("server/tierd", {"--gpu=fake", "--dram_bytes=100TiB", "--runtime_dir=" + dir});
  EXPECT_NE(too_much.WaitForLine("tierd: cannot start: dram tier: budget 100 TiB exceeds what this "
                                 "host can give",
                                 10000),
            "")
      << too_much.output();
  EXPECT_EQ(too_much.Wait(), 1);
  Process bad_dir("server/tierd", {"--gpu=fake", "--dram_bytes=16MiB", "--nvme_dir=/nonexistent/x", "--nvme_bytes=1GiB",
                                   "--runtime_dir=" + dir});
  EXPECT_NE(bad_dir.WaitForLine("tierd: cannot start: nvme tier: /nonexistent/x does not exist", 10000), "")
      << bad_dir.output();
  EXPECT_EQ(bad_dir.Wait(), 1);
  Process bad_flag("server/tierd", {"--gpu=quantum", "--runtime_dir=" + dir});
  EXPECT_NE(bad_flag.WaitForLine("tierd: --gpu must be auto, cuda or fake", 10000), "") << bad_flag.output();
  EXPECT_EQ(bad_flag.Wait(), 2);
  // A flag out of its range: tierd exits 2 with the bound in the message.
  auto refused = [&dir](const std::string& flag, const std::string& message) {
    Process tierd("server/tierd", {"--gpu=fake", flag, "--runtime_dir=" + dir});
    EXPECT_NE(tierd.WaitForLine("tierd: " + message, 10000), "") << tierd.output();
    EXPECT_EQ(tierd.Wait(), 2) << flag;
  };
  refused("--planner_gpu_headroom_fraction=0.5", "--planner_gpu_headroom_fraction must be 0 to 0.25 (of the quota)");
  refused("--planner_dram_headroom_tensors=17", "--planner_dram_headroom_tensors must be 0 to 16 (tensors)");
  refused("--planner_load_lead_ops=-3", "--planner_load_lead_ops=-3: give -1 (a lap) or 0 and up");
  refused("--planner_replan_drift=0", "--planner_replan_drift=0: give a mean relative difference above 0");
  refused("--planner_keep_plan_margin=3", "--planner_keep_plan_margin=3: give a share of the step at most 1");
  refused("--gpu_join_bounce=2GiB", "--gpu_join_bounce=2GiB: at most 1.00 GiB");
  // Flags that made no sense and were taken silently: each refused, naming what is wrong.
  Process negative("server/tierd", {"--gpu=fake", "--max_sessions=-1", "--runtime_dir=" + dir});
  EXPECT_NE(negative.WaitForLine("tierd: --max_sessions=-1: give at least 1", 10000), "") << negative.output();
  EXPECT_EQ(negative.Wait(), 2);
  Process bad_metrics("server/tierd",
                      {"--gpu=fake", "--dram_bytes=16MiB", "--metrics=999.1.1.1:99999", "--runtime_dir=" + dir});
  EXPECT_NE(bad_metrics.WaitForLine(
                "tierd: cannot start: cannot serve metrics on 999.1.1.1:99999: '99999' is not a port", 10000),
            "")
      << bad_metrics.output();
  EXPECT_EQ(bad_metrics.Wait(), 1);
  Process bad_host("server/tierd",
                   {"--gpu=fake", "--dram_bytes=16MiB", "--metrics=999.1.1.1:9464", "--runtime_dir=" + dir});
  EXPECT_NE(
      bad_host.WaitForLine(
          "tierd: cannot start: cannot serve metrics on 999.1.1.1:9464: '999.1.1.1' is not an IPv4 address", 10000),
      "")
      << bad_host.output();
  EXPECT_EQ(bad_host.Wait(), 1);
  Process big_quota("server/tierd",
                    {"--gpu=fake", "--dram_bytes=16MiB", "--default_quota=0,32MiB,0", "--runtime_dir=" + dir});
  EXPECT_NE(
      big_quota.WaitForLine("tierd: the default quota's dram 32.0 MiB is above the dram tier's budget 16.0 MiB", 10000),
      "")
      << big_quota.output();
  EXPECT_EQ(big_quota.Wait(), 2);
  Process rounded("server/tierd",
                  {"--gpu=fake", "--dram_bytes=16MiB", "--nvme_dir=/tmp", "--nvme_bytes=1000", "--runtime_dir=" + dir});
  EXPECT_NE(rounded.WaitForLine("tierd: the nvme budget 1000 bytes is rounded up to 4.00 KiB", 10000), "")
      << rounded.output();
  EXPECT_NE(rounded.WaitForLine("tierd: ready", 10000), "") << rounded.output();
  rounded.Signal(SIGTERM);
  EXPECT_EQ(rounded.Wait(), 0);
  Process bad_speed("tools/tierctl/tierctl", {"plan", "--model=tiny", "--nvme_write_gbps=-1"});
  EXPECT_NE(bad_speed.WaitForLine("tierctl: --nvme_write_gbps must be > 0", 10000), "") << bad_speed.output();
  EXPECT_EQ(bad_speed.Wait(), 2);
  rmdir(dir.c_str());
}

}  // namespace
}  // namespace tierd
