// Randomized input against the real tierd: random bytes on the hello socket, and random
// lease/acquire/release/unlease/pin requests (bad names, shapes, enum values, ids) over
// gRPC and the ring. Every call must get OK or a clear error code, the daemon must stay
// up, and its books must balance afterwards. Seeded: the same inputs every run.
#include <gtest/gtest.h>
#include <unistd.h>

#include <map>
#include <random>
#include <set>

#include "base/units.h"
#include "clients/client.h"
#include "ipc/unix_socket.h"
#include "tests/process.h"

namespace tierd {
namespace {

using testing::Process;

TEST(RequestFuzzTest, RandomRequestsGetClearAnswersAndTheBooksBalance) {
  const std::string dir = "/tmp/tierd-fuzz-" + std::to_string(getpid()) + "-" +
                          std::to_string(std::random_device{}() % 100000);
  const char* tmp = std::getenv("TEST_TMPDIR");
  Process daemon("server/tierd",
                 {"--gpu=fake", "--gpu_bytes=8MiB", "--dram_bytes=8MiB",
                  std::string("--nvme_dir=") + (tmp ? tmp : "/tmp"), "--nvme_bytes=32MiB", "--runtime_dir=" + dir});
  ASSERT_NE(daemon.WaitForLine("tierd: ready", 20000), "") << daemon.output();
  std::mt19937_64 rng(7);

  // 1. Random bytes on the hello socket: each connection is refused or dropped.
  for (int i = 0; i < 200; ++i) {
    auto fd = ipc::ConnectUnix(dir + "/tierd.sock");
    ASSERT_TRUE(fd.ok()) << "the daemon stopped accepting at attempt " << i;
    std::string junk(rng() % 64, '\0');
    for (char& c : junk) c = static_cast<char>(rng());
    if (rng() % 2) {
      ASSERT_TRUE(ipc::SendFrame(*fd, junk).ok());  // well framed, garbage inside
    } else {
      (void)!write(*fd, junk.data(), junk.size());  // not even framed (may be truncated)
    }
    if (rng() % 3 == 0) {
      auto reply = ipc::ReceiveFrame(*fd, 3000);  // an error reply or a closed connection
      if (reply.ok()) for (int f : reply->fds) close(f);
    }
    close(*fd);
  }

  // 2. Random control-plane and hot-path requests on a real session.
  auto client = Client::Connect({dir, "fuzz", {4 * kMiB, 4 * kMiB, 16 * kMiB}});
  ASSERT_TRUE(client.ok()) << client.status();
  const std::set<absl::StatusCode> expected = {
      absl::StatusCode::kOk, absl::StatusCode::kInvalidArgument, absl::StatusCode::kNotFound,
      absl::StatusCode::kAlreadyExists, absl::StatusCode::kFailedPrecondition,
      absl::StatusCode::kResourceExhausted};
  const std::string alphabet = "abcXYZ019._:/- \t\n\xff";
  std::map<TensorId, Client::Tensor> live;
  std::map<TensorId, int> acquired;
  int answered = 0;
  for (int step = 0; step < 1500; ++step) {
    const int op = rng() % 6;
    absl::Status status;
    if (op == 0 || live.empty()) {
      TensorSpec spec;
      const size_t length = rng() % 12;
      for (size_t i = 0; i < length; ++i) spec.name += alphabet[rng() % alphabet.size()];
      spec.tensor_class = static_cast<TensorClass>(rng() % 7);  // 5 and 6 are not classes
      spec.dtype = static_cast<DType>(rng() % 10);              // 8 and 9 are not dtypes
      for (size_t d = rng() % 4; d > 0; --d) {
        const int kind = rng() % 10;
        spec.shape.push_back(kind == 0 ? -5 : kind == 1 ? 0 : kind == 2 ? (int64_t{1} << 40) : 1 + rng() % 300);
      }
      auto t = (*client)->Lease(spec);
      status = t.status();
      if (t.ok()) live[t->id] = *t;
    } else {
      auto it = std::next(live.begin(), rng() % live.size());
      Client::Tensor tensor = it->second;
      if (rng() % 8 == 0) tensor.id = rng() % 1000 + 100000;  // not ours
      const Place place = rng() % 2 ? Place::kGpu : Place::kHost;
      if (op <= 2) {
        auto p = (*client)->Acquire(tensor, rng() % 2 ? Access::kWrite : Access::kRead, place);
        status = p.status();
        if (p.ok()) ++acquired[tensor.id];
      } else if (op == 3) {
        status = (*client)->Release(tensor);
        if (status.ok()) --acquired[tensor.id];
      } else if (op == 4) {
        status = (*client)->Pin(tensor, static_cast<Tier>(rng() % 3));
      } else {
        status = (*client)->Unlease(tensor);
        if (status.ok()) live.erase(tensor.id);
      }
    }
    ASSERT_EQ(expected.count(status.code()), 1u) << "step " << step << ": " << status;
    ++answered;
  }
  EXPECT_EQ(answered, 1500);
  auto stats = (*client)->Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->leases(), live.size());
  EXPECT_EQ(stats->sessions(), 1u);  // the 200 junk hellos left no session behind
  auto listed = (*client)->ListLeases(false);
  ASSERT_TRUE(listed.ok());
  for (const auto& lease : listed->leases()) {
    EXPECT_EQ(lease.acquired(), static_cast<uint32_t>(acquired[lease.tensor_id()])) << lease.spec().name();
  }
  client->reset();
  daemon.Signal(SIGTERM);
  EXPECT_EQ(daemon.Wait(), 0) << daemon.output();
  rmdir(dir.c_str());
}

}  // namespace
}  // namespace tierd
