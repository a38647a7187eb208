// The real tierd binary, really started, with real client processes: sessions, leases
// through eviction to NVMe and back, a client killed mid-session, bad input on every
// entry point, and a clean SIGTERM. Fake GPU (the CPU machine), real shared memory, real
// io_uring files.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <dirent.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>

#include "base/units.h"
#include "clients/client.h"
#include "ipc/unix_socket.h"
#include "proto/tierd.grpc.pb.h"
#include "tests/process.h"

namespace tierd {
namespace {

using testing::Process;

int CountShm(const std::string& prefix) {
  int count = 0;
  DIR* dir = opendir("/dev/shm");
  while (dirent* entry = readdir(dir)) count += std::string(entry->d_name).rfind(prefix, 0) == 0;
  closedir(dir);
  return count;
}

class DaemonTest : public ::testing::Test {
 protected:
  void SetUp() override {
    runtime_dir_ = "/tmp/tierd-e2e-" + std::to_string(getpid()) + "-" +
                   ::testing::UnitTest::GetInstance()->current_test_info()->name();
    const char* tmp = std::getenv("TEST_TMPDIR");
    daemon_ = std::make_unique<Process>(
        "runtime/tierd",
        std::vector<std::string>{"--gpu=fake", "--gpu_bytes=16MiB", "--dram_bytes=16MiB",
                                 std::string("--nvme_dir=") + (tmp ? tmp : "/tmp"), "--nvme_bytes=96MiB",
                                 "--runtime_dir=" + runtime_dir_});
    ASSERT_NE(daemon_->WaitForLine("tierd: ready", 20000), "") << daemon_->output();
    instance_ = "tierd-" + std::to_string(daemon_->pid()) + "-";
  }
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
  std::string runtime_dir_;
  std::string instance_;
  std::unique_ptr<Process> daemon_;
};

TEST_F(DaemonTest, TwoClientProcessesRoundTripTheirBytesThroughEveryTier) {
  Process a("tests/client_worker", {runtime_dir_, "roundtrip", "1"});
  Process b("tests/client_worker", {runtime_dir_, "roundtrip", "2"});
  EXPECT_EQ(a.Wait(), 0) << a.WaitForLine("ok", 100) << a.output();
  EXPECT_EQ(b.Wait(), 0) << b.output();
  auto observer = Connect();
  ASSERT_NE(observer, nullptr);
  auto stats = observer->Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_GT(stats->writebacks(), 0u);
  EXPECT_GT(stats->stalls(), 0u);
  EXPECT_TRUE(WaitForSessions(*observer, 1));  // the workers' sessions are gone
  for (const auto& link : stats->links()) {
    if (link.link() == "dram->nvme" || link.link() == "nvme->dram") {
      EXPECT_GT(link.moves(), 0u) << link.link();
    }
  }
}

TEST_F(DaemonTest, AKilledClientIsReclaimedAndOthersAreUntouched) {
  auto observer = Connect();
  ASSERT_NE(observer, nullptr);
  auto mine = *observer->Lease({"mine", TensorClass::kParam, DType::kF32, {256}});
  void* p = *observer->Acquire(mine, Access::kWrite, Place::kHost);
  std::memset(p, 0x3C, mine.bytes);
  ASSERT_TRUE(observer->Release(mine).ok());
  const int before = CountShm(instance_);
  Process holder("tests/client_worker", {runtime_dir_, "hold"});
  ASSERT_NE(holder.WaitForLine("ready", 10000), "") << holder.output();
  EXPECT_TRUE(WaitForSessions(*observer, 2));
  EXPECT_EQ(CountShm(instance_), before + 1);
  holder.Signal(SIGKILL);
  holder.Wait();
  EXPECT_TRUE(WaitForSessions(*observer, 1));
  EXPECT_EQ(CountShm(instance_), before);
  auto leases = observer->ListLeases(/*every_session=*/true);
  ASSERT_TRUE(leases.ok());
  ASSERT_EQ(leases->leases_size(), 1);
  EXPECT_EQ(leases->leases(0).spec().name(), "mine");
  void* again = *observer->Acquire(mine, Access::kRead, Place::kHost);
  EXPECT_EQ(static_cast<uint8_t*>(again)[mine.bytes - 1], 0x3C);
  ASSERT_TRUE(observer->Release(mine).ok());
}

TEST_F(DaemonTest, BadInputGetsClearErrorsAndHurtsNobody) {
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  // Garbage on the hello socket.
  auto raw = ipc::ConnectUnix(runtime_dir_ + "/tierd.sock");
  ASSERT_TRUE(raw.ok());
  ASSERT_EQ(write(*raw, "\xff\xff\xff\xff garbage", 12), 12);
  auto refused = ipc::ReceiveFrame(*raw, 5000);
  ASSERT_TRUE(refused.ok());
  v1::HelloReply reply;
  ASSERT_TRUE(reply.ParseFromString(refused->payload));
  EXPECT_EQ(reply.code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  close(*raw);
  // A quota beyond the node budget.
  auto greedy = Client::Connect({runtime_dir_, "greedy", {1 * kGiB, 0, 0}});
  EXPECT_EQ(greedy.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(greedy.status().message().find("does not fit the node budget"), absl::string_view::npos)
      << greedy.status().message();
  // Bad leases.
  EXPECT_EQ(client->Lease({"", TensorClass::kParam, DType::kF32, {4}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client->Lease({"neg", TensorClass::kParam, DType::kF32, {-4}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto big = client->Lease({"big", TensorClass::kParam, DType::kF32, {64 * 1024 * 1024}});
  EXPECT_EQ(big.status().code(), absl::StatusCode::kResourceExhausted);
  auto t = *client->Lease({"t", TensorClass::kParam, DType::kF32, {1024}});
  EXPECT_EQ(client->Release(t).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(client->Acquire(Client::Tensor{999, 4, "nope"}, Access::kRead, Place::kGpu).status().code(),
            absl::StatusCode::kNotFound);
  // gRPC with another session's id and a forged token.
  auto channel = grpc::CreateChannel("unix:" + runtime_dir_ + "/tierd.grpc.sock",
                                     grpc::InsecureChannelCredentials());
  auto stub = v1::Tierd::NewStub(channel);
  v1::TensorRef forged;
  forged.mutable_session()->set_session_id(client->session_id());
  forged.mutable_session()->set_token("0123456789abcdef");
  forged.set_tensor_id(t.id);
  v1::Empty empty;
  grpc::ClientContext context;
  const grpc::Status denied = stub->Unlease(&context, forged, &empty);
  EXPECT_EQ(denied.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  // The session still works.
  EXPECT_TRUE(client->Acquire(t, Access::kWrite, Place::kGpu).ok());
  EXPECT_TRUE(client->Release(t).ok());
}

TEST(DaemonStartTest, RefusesImpossibleConfigsWithTheNumbers) {
  const std::string dir = "/tmp/tierd-e2e-refuse-" + std::to_string(getpid());
  Process too_much("runtime/tierd", {"--gpu=fake", "--dram_bytes=100TiB", "--runtime_dir=" + dir});
  EXPECT_NE(too_much.WaitForLine("tierd: cannot start: dram tier: budget 100 TiB exceeds what this "
                                 "host can give", 10000), "") << too_much.output();
  EXPECT_EQ(too_much.Wait(), 1);
  Process bad_dir("runtime/tierd", {"--gpu=fake", "--dram_bytes=16MiB", "--nvme_dir=/nonexistent/x",
                                    "--nvme_bytes=1GiB", "--runtime_dir=" + dir});
  EXPECT_NE(bad_dir.WaitForLine("tierd: cannot start: nvme tier: /nonexistent/x does not exist", 10000), "")
      << bad_dir.output();
  EXPECT_EQ(bad_dir.Wait(), 1);
  Process bad_flag("runtime/tierd", {"--gpu=quantum", "--runtime_dir=" + dir});
  EXPECT_NE(bad_flag.WaitForLine("tierd: --gpu must be auto, cuda or fake", 10000), "") << bad_flag.output();
  EXPECT_EQ(bad_flag.Wait(), 2);
  rmdir(dir.c_str());
}

}  // namespace
}  // namespace tierd
