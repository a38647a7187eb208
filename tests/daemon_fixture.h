// The fixture of the daemon's end-to-end tests: the real tierd binary started per test on
// a fake GPU, real shared memory and real io_uring files, stopped with SIGTERM after it,
// checking that it leaves no socket or segment behind.
#ifndef TIERD_TESTS_DAEMON_FIXTURE_H_
#define TIERD_TESTS_DAEMON_FIXTURE_H_

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "base/units.h"
#include "clients/client.h"
#include "ipc/hello_server.h"
#include "ipc/unix_socket.h"
#include "proto/tierd.grpc.pb.h"
#include "tests/process.h"

namespace tierd::testing {

class DaemonTest : public ::testing::Test {
 protected:
  void SetUp() override {
    runtime_dir_ = "/tmp/tierd-e2e-" + std::to_string(getpid()) + "-" +
                   std::to_string(std::random_device{}() % 100000) + "-" +
                   ::testing::UnitTest::GetInstance()->current_test_info()->name();
    const char* tmp = std::getenv("TEST_TMPDIR");
    std::vector<std::string> flags = {"--gpu=fake",         "--gpu_bytes=16MiB",
                                      "--dram_bytes=16MiB", std::string("--nvme_dir=") + (tmp ? tmp : "/tmp"),
                                      "--nvme_bytes=96MiB", "--runtime_dir=" + runtime_dir_};
    // Only the test that scrapes serves metrics: stopping civetweb takes about a second.
    const bool metrics =
        std::string(::testing::UnitTest::GetInstance()->current_test_info()->name()).find("Prometheus") !=
        std::string::npos;
    if (metrics) flags.push_back("--metrics=127.0.0.1:0");
    for (const std::string& flag : ExtraFlags()) flags.push_back(flag);
    daemon_ = std::make_unique<Process>("server/tierd", flags);
    const std::string instance = daemon_->WaitForLine("tierd: instance ", 20000);
    ASSERT_NE(instance, "") << daemon_->output();
    instance_ = instance.substr(16, instance.find(' ', 16) - 16) + "-";
    if (metrics) {
      const std::string line = daemon_->WaitForLine("tierd: metrics at", 20000);
      ASSERT_NE(line, "") << daemon_->output();
      metrics_port_ = std::stoi(line.substr(line.find("(port ") + 6));
    }
    ASSERT_NE(daemon_->WaitForLine("tierd: ready", 20000), "") << daemon_->output();
  }
  // A fixture derived for one setting adds its tierd flags here.
  virtual std::vector<std::string> ExtraFlags() const { return {}; }
  void TearDown() override {
    if (daemon_ == nullptr) return;
    daemon_->Signal(SIGTERM);
    EXPECT_EQ(daemon_->Wait(), 0) << daemon_->output();
    EXPECT_NE(access((runtime_dir_ + "/tierd.sock").c_str(), F_OK), 0) << "hello socket left behind";
    EXPECT_NE(access((runtime_dir_ + "/tierd.grpc.sock").c_str(), F_OK), 0) << "gRPC socket left behind";
    EXPECT_EQ(CountShm(instance_), 0) << "shared-memory segments left behind";
    rmdir(runtime_dir_.c_str());
  }
  std::unique_ptr<Client> Connect(SessionQuota quota = {1 * kMiB, 1 * kMiB, 4 * kMiB}) {
    auto client = Client::Connect({runtime_dir_, "test", quota});
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? std::move(*client) : nullptr;
  }
  // Polls the daemon's session count (sessions end asynchronously, on socket close).
  bool WaitForSessions(Client& observer, uint64_t want) {
    for (int i = 0; i < 400; ++i) {
      auto stats = observer.Stats();
      if (stats.ok() && stats->sessions() == want) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }
  // Plain HTTP GET of /metrics.
  std::string Scrape() {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(metrics_port_);
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) return "";
    const std::string request = "GET /metrics HTTP/1.0\r\n\r\n";
    (void)!write(fd, request.data(), request.size());
    std::string response;
    char chunk[4096];
    ssize_t n;
    while ((n = read(fd, chunk, sizeof(chunk))) > 0) response.append(chunk, n);
    close(fd);
    return response;
  }
  std::string runtime_dir_;
  std::string instance_;
  int metrics_port_ = 0;
  std::unique_ptr<Process> daemon_;
};

}  // namespace tierd::testing

#endif  // TIERD_TESTS_DAEMON_FIXTURE_H_
