// The real tierd binary, really started, with real client processes: sessions, leases
// through eviction to NVMe and back, a client killed mid-session, bad input on every
// entry point, the C interface, tierctl and Prometheus. Fake GPU (the CPU machine), real
// shared memory, real io_uring files.
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
#include <atomic>
#include <string>
#include <thread>

#include "absl/strings/str_format.h"
#include "base/limits.h"
#include "base/units.h"
#include "clients/client.h"
#include "ipc/hello_server.h"
#include "ipc/hot_path_wire.h"
#include "ipc/unix_socket.h"
#include "proto/tierd.grpc.pb.h"
#include "tests/daemon_fixture.h"
#include "tests/process.h"

namespace tierd {
namespace testing {

// Sends a raw ring message on a client's session: what only a broken or hostile client sends.
class ClientRingPeer {
 public:
  static absl::Status Send(Client& client, const ipc::RingMessage& message) {
    return client.RingCall(message).status();
  }
  static size_t Lanes(const Client& client) { return client.lanes_.size(); }
  // Takes ring `lane` and jams the tierd thread that serves it: more requests than its answer
  // ring holds, none of the answers read, so that thread waits for room to answer.
  static void Jam(Client& client, size_t lane, int requests) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    Client::Lane& l = *client.lanes_[lane];
    l.mutex.Lock();
    for (int k = 0; k < requests; ++k) {
      ipc::RingMessage m = ipc::ToRing({.kind = ipc::HotPathKind::kOpBegin, .op = 0});
      m.sequence = ++l.sequence;
      while (!ipc::RingPush(l.ring->requests, m)) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  // Reads the jammed ring's answers (in order) and gives it back; how many came.
  static int Unjam(Client& client, size_t lane, int requests) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    Client::Lane& l = *client.lanes_[lane];
    int answered = 0;
    for (int k = 0; k < requests; ++k) {
      auto answer = ipc::RingPop(l.ring->responses, l.ring->closed, 5000);
      if (!answer.ok() || answer->sequence != l.sequence - requests + 1 + k) break;
      ++answered;
    }
    l.mutex.Unlock();
    return answered;
  }
};

}  // namespace testing
namespace {

using testing::CountShm;
using testing::DaemonTest;
using testing::Process;

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
  // Killed while moving: a worker in the middle of its evict/fetch round trips.
  Process busy("tests/client_worker", {runtime_dir_, "roundtrip", "9"});
  ASSERT_TRUE(WaitForSessions(*observer, 2));  // it said hello; now let it get busy moving
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  busy.Signal(SIGKILL);
  busy.Wait();
  EXPECT_TRUE(WaitForSessions(*observer, 1));
  EXPECT_EQ(CountShm(instance_), before);
  auto after = observer->Stats();
  ASSERT_TRUE(after.ok());
  for (const auto& tier : after->tiers()) {
    if (tier.tier() == v1::TIER_NVME) {
      EXPECT_EQ(tier.used_bytes(), 0u) << "NVMe extents leaked";
    }
  }
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
  // Refusals on the hot-path ring come with the daemon's words (sent beside the answer).
  const absl::Status unheld = client->Release(t);
  EXPECT_EQ(unheld.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(unheld.message().find("'t'"), absl::string_view::npos) << unheld;
  const absl::Status unknown = client->Acquire(Client::Tensor{999, 4, "nope"}, Access::kRead, Place::kGpu).status();
  EXPECT_EQ(unknown.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(unknown.message().find("has no tensor 999"), absl::string_view::npos) << unknown;
  // Ring messages a client built with ipc::ToRing never sends: each refused naming what is
  // wrong, and the ring still serves the session after them.
  {
    ipc::RingMessage m = ipc::ToRing({.kind = ipc::HotPathKind::kAcquire, .tensor = t.id});
    m.access = 3;
    absl::Status s = testing::ClientRingPeer::Send(*client, m);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("malformed ring request: access 3"), absl::string_view::npos) << s;
    m.access = 0;
    m.op = 9;
    s = testing::ClientRingPeer::Send(*client, m);
    EXPECT_NE(s.message().find("malformed ring request: op 9"), absl::string_view::npos) << s;
    // A release naming a GPU event the session never shared (the fake GPU shares none).
    s = testing::ClientRingPeer::Send(
        *client, ipc::ToRing({.kind = ipc::HotPathKind::kRelease, .tensor = t.id, .release_event = 7}));
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("release names an event the session did not share"), absl::string_view::npos) << s;
    ASSERT_TRUE(client->Acquire(t, Access::kWrite, Place::kHost).ok());
    EXPECT_TRUE(client->Release(t).ok());
  }
  // gRPC with another session's id and a forged token.
  auto channel = grpc::CreateChannel("unix:" + runtime_dir_ + "/tierd.grpc.sock", grpc::InsecureChannelCredentials());
  auto stub = v1::Tierd::NewStub(channel);
  v1::TensorRef forged;
  forged.mutable_session()->set_session_id(client->session_id());
  forged.mutable_session()->set_token("0123456789abcdef");
  forged.set_tensor_id(t.id);
  v1::Empty empty;
  grpc::ClientContext context;
  const grpc::Status denied = stub->Unlease(&context, forged, &empty);
  EXPECT_EQ(denied.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  // A request gRPC cannot decode (a tensor name that is not UTF-8) is refused with a reason,
  // not INTERNAL with none, and leases nothing.
  {
    const auto leases_before = client->ListLeases(/*every_session=*/false);
    ASSERT_TRUE(leases_before.ok()) << leases_before.status();
    v1::LeaseRequest undecodable;
    undecodable.mutable_session()->set_session_id(client->session_id());
    undecodable.mutable_spec()->set_name("caf\xe9");  // Latin-1, not UTF-8
    undecodable.mutable_spec()->add_shape(4);
    v1::LeaseReply reply;
    grpc::ClientContext lease_context;
    const grpc::Status refused = stub->Lease(&lease_context, undecodable, &reply);
    EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << refused.error_message();
    EXPECT_NE(refused.error_message().find("tierd could not decode this /tierd.v1.Tierd/Lease request: a string "
                                           "field (a tensor or op name, a label) that is not valid UTF-8"),
              std::string::npos)
        << refused.error_message();
    auto listed = client->ListLeases(/*every_session=*/false);
    ASSERT_TRUE(listed.ok()) << listed.status();
    EXPECT_EQ(listed->leases_size(), leases_before->leases_size()) << "nothing was leased";
  }
  // Hellos protobuf cannot decode (a label that is not UTF-8), 30 of them: each refused, and
  // at most 10 of protobuf's complaints a minute reach tierd's log.
  v1::HelloRequest bad;
  bad.set_protocol_version(ipc::kProtocolVersion);
  bad.set_label("ok");
  std::string bytes = bad.SerializeAsString();
  bytes[bytes.size() - 1] = '\xff';  // the label's last byte
  for (int i = 0; i < 30; ++i) {
    auto flood = ipc::ConnectUnix(runtime_dir_ + "/tierd.sock");
    ASSERT_TRUE(flood.ok());
    ASSERT_TRUE(ipc::SendFrame(*flood, bytes).ok());
    auto answer = ipc::ReceiveFrame(*flood, 5000);
    ASSERT_TRUE(answer.ok()) << answer.status();
    v1::HelloReply no;
    ASSERT_TRUE(no.ParseFromString(answer->payload));
    EXPECT_EQ(no.code(), static_cast<int>(absl::StatusCode::kInvalidArgument)) << no.message();
    close(*flood);
  }
  EXPECT_NE(daemon_->WaitForLine("tierd: protobuf error: String field 'tierd.v1.HelloRequest.label' contains "
                                 "invalid UTF-8",
                                 5000),
            "")
      << "protobuf's complaint reaches the log";
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the rest of the log is read
  const std::string log = daemon_->output();
  int complaints = 0;
  for (size_t at = log.find("tierd: protobuf"); at != std::string::npos; at = log.find("tierd: protobuf", at + 1)) {
    ++complaints;
  }
  EXPECT_LE(complaints, 10) << log;
  // The session still works.
  EXPECT_TRUE(client->Acquire(t, Access::kWrite, Place::kGpu).ok());
  EXPECT_TRUE(client->Release(t).ok());
}

// AcquireAll/ReleaseAll: many tensors in one exchange (more than the ring's slots), the same
// bytes as one by one, and all or none: a refusal releases what was granted with it. Through
// the ring and through gRPC alike.
TEST_F(DaemonTest, SeveralTensorsAreAcquiredInOneExchangeAllOrNone) {
  for (const bool use_ring : {true, false}) {
    SCOPED_TRACE(use_ring ? "ring" : "gRPC");
    auto connected = Client::Connect({runtime_dir_, "many", {1 * kMiB, 1 * kMiB, 4 * kMiB}, use_ring});
    ASSERT_TRUE(connected.ok()) << connected.status();
    Client& client = **connected;
    constexpr int kTensors = ipc::kRingSlots + 6;
    std::vector<Client::Tensor> tensors;
    std::vector<Client::AcquireItem> items;
    std::vector<const Client::Tensor*> all;
    for (int i = 0; i < kTensors; ++i) {
      auto t = client.Lease({absl::StrFormat("t%d", i), TensorClass::kOptState, DType::kF32, {256}});
      ASSERT_TRUE(t.ok()) << t.status();
      tensors.push_back(*t);
    }
    for (const auto& t : tensors) {
      items.push_back({&t, Access::kOverwrite});
      all.push_back(&t);
    }
    auto pointers = client.AcquireAll(items, Place::kHost);
    ASSERT_TRUE(pointers.ok()) << pointers.status();
    ASSERT_EQ(pointers->size(), tensors.size());
    for (int i = 0; i < kTensors; ++i) {
      float* values = static_cast<float*>((*pointers)[i]);
      for (int k = 0; k < 256; ++k) values[k] = static_cast<float>(i * 1000 + k);
    }
    ASSERT_TRUE(client.ReleaseAll(all).ok());
    for (int i = 0; i < kTensors; ++i) {  // one by one: the bytes written through AcquireAll
      auto p = client.Acquire(tensors[i], Access::kRead, Place::kHost);
      ASSERT_TRUE(p.ok()) << p.status();
      EXPECT_EQ(static_cast<float*>(*p)[255], static_cast<float>(i * 1000 + 255));
      ASSERT_TRUE(client.Release(tensors[i]).ok());
    }
    // One refusal among them: its error, and the others are not left acquired.
    const Client::Tensor unknown{999, 1024, "nope"};
    auto refused = client.AcquireAll({{&tensors[0], Access::kRead}, {&unknown, Access::kRead}, {&tensors[1], Access::kWrite}},
                                     Place::kHost);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kNotFound);
    EXPECT_NE(refused.status().message().find("has no tensor 999"), absl::string_view::npos) << refused.status();
    EXPECT_EQ(client.Release(tensors[0]).code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_EQ(client.Release(tensors[1]).code(), absl::StatusCode::kFailedPrecondition);
    // Releasing one that is not held fails, and still releases the rest.
    ASSERT_TRUE(client.AcquireAll({{&tensors[2], Access::kRead}, {&tensors[3], Access::kRead}}, Place::kHost).ok());
    const absl::Status partly = client.ReleaseAll({&tensors[2], &tensors[4], &tensors[3]});
    EXPECT_EQ(partly.code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(partly.message().find("'t4'"), absl::string_view::npos) << partly;
    EXPECT_EQ(client.Release(tensors[3]).code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_TRUE(client.AcquireAll({}, Place::kHost).ok());  // nothing asked: nothing to do
    if (use_ring) {
      const Client::RingTimes t = client.ring_times();
      EXPECT_GE(t.acquires, 2 * kTensors);
      EXPECT_GE(t.releases, 2 * kTensors);
    }
  }
}

// Each of a session's rings has its own serving thread in tierd: with one ring jammed (its
// thread stuck answering), the session's calls go on through another, from any thread; a
// single-ring session asks for one and gets one; asking for more than tierd grants gets its most.
TEST_F(DaemonTest, ASessionsRingsAreServedEachOnItsOwn) {
  auto one = Client::Connect({.runtime_dir = runtime_dir_, .label = "one-ring", .quota = {1 * kMiB, 1 * kMiB, 4 * kMiB},
                              .rings = 1});
  ASSERT_TRUE(one.ok()) << one.status();
  EXPECT_EQ(testing::ClientRingPeer::Lanes(**one), 1u);
  auto many = Client::Connect({.runtime_dir = runtime_dir_, .label = "too-many", .quota = {1 * kMiB, 1 * kMiB, 4 * kMiB},
                               .rings = 1000});
  ASSERT_TRUE(many.ok()) << many.status();
  EXPECT_EQ(testing::ClientRingPeer::Lanes(**many), limits::kRingsPerSessionMax);
  many->reset();
  auto connected = Client::Connect({.runtime_dir = runtime_dir_, .label = "lanes", .quota = {1 * kMiB, 1 * kMiB, 4 * kMiB},
                                    .rings = 3});
  ASSERT_TRUE(connected.ok()) << connected.status();
  Client& client = **connected;
  ASSERT_EQ(testing::ClientRingPeer::Lanes(client), 3u);
  auto t = client.Lease({"t", TensorClass::kOptState, DType::kF32, {256}});
  ASSERT_TRUE(t.ok()) << t.status();
  constexpr int kJam = ipc::kRingSlots + 8;  // more than an answer ring holds
  testing::ClientRingPeer::Jam(client, 0, kJam);  // its thread answers 64, then waits
  // Meanwhile, from two threads, a hundred exchanges each through the other rings.
  std::vector<std::thread> callers;
  std::atomic<int> done{0};
  for (int c = 0; c < 2; ++c) {
    callers.emplace_back([&, c] {
      auto mine = client.Lease({absl::StrFormat("mine%d", c), TensorClass::kOptState, DType::kF32, {256}});
      ASSERT_TRUE(mine.ok()) << mine.status();
      for (int k = 0; k < 100; ++k) {
        auto p = client.Acquire(*mine, Access::kWrite, Place::kHost);
        ASSERT_TRUE(p.ok()) << p.status();
        static_cast<float*>(*p)[0] = static_cast<float>(k);
        ASSERT_TRUE(client.Release(*mine).ok());
      }
      done.fetch_add(1);
    });
  }
  for (auto& c : callers) c.join();
  EXPECT_EQ(done.load(), 2);
  EXPECT_EQ(testing::ClientRingPeer::Unjam(client, 0, kJam), kJam) << "the jammed ring's answers, in order";
  // The jammed ring serves again.
  for (int k = 0; k < 10; ++k) {
    ASSERT_TRUE(client.Acquire(*t, Access::kRead, Place::kHost).ok());
    ASSERT_TRUE(client.Release(*t).ok());
  }
}

TEST_F(DaemonTest, TheCInterfaceWorksFromPlainC) {
  Process c("tests/c_client_smoke", {runtime_dir_});
  EXPECT_NE(c.WaitForLine("c client ok", 10000), "") << c.output();
  EXPECT_EQ(c.Wait(), 0) << c.output();
}

TEST_F(DaemonTest, TierctlAndPrometheusSeeWhatClientsDo) {
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  auto w = *client->Lease({"layers.0.w", TensorClass::kParam, DType::kBF16, {64, 64}});
  ASSERT_TRUE(client->Acquire(w, Access::kWrite, Place::kGpu).ok());
  ASSERT_TRUE(client->Release(w).ok());
  const std::string dir = "--runtime_dir=" + runtime_dir_;
  Process leases("tools/tierctl/tierctl", {dir, "leases"});
  EXPECT_NE(leases.WaitForLine(std::to_string(client->session_id()) + "        layers.0.w", 10000), "")
      << leases.output();
  EXPECT_EQ(leases.Wait(), 0);
  Process pin("tools/tierctl/tierctl", {dir, "pin", std::to_string(client->session_id()), "layers.0.w", "dram"});
  EXPECT_NE(pin.WaitForLine("pinned layers.0.w", 10000), "") << pin.output();
  EXPECT_EQ(pin.Wait(), 0);
  auto listed = client->ListLeases(false);
  ASSERT_TRUE(listed.ok());
  EXPECT_EQ(listed->leases(0).pinned(), v1::TIER_DRAM);
  ASSERT_EQ(listed->leases(0).extents_size(), listed->leases(0).copies_size());
  // The DRAM arena's map: two more copies on the host, the first of them let go: its room
  // is a gap between the other two. A bad tier is a usage error.
  auto first = *client->Lease({"host.a", TensorClass::kParam, DType::kBF16, {64, 64}});
  auto second = *client->Lease({"host.b", TensorClass::kParam, DType::kBF16, {64, 64}});
  for (const auto& t : {first, second}) {
    ASSERT_TRUE(client->Acquire(t, Access::kOverwrite, Place::kHost).ok());
    ASSERT_TRUE(client->Release(t).ok());
  }
  ASSERT_TRUE(client->Unlease(first).ok());
  Process map("tools/tierctl/tierctl", {dir, "map", std::to_string(client->session_id()), "dram"});
  EXPECT_NE(map.WaitForLine("           0 B   8.00 KiB  layers.0.w", 10000), "") << map.output();
  EXPECT_NE(map.WaitForLine("      8.00 KiB   8.00 KiB  (free)", 10000), "") << map.output();
  EXPECT_NE(map.WaitForLine("      16.0 KiB   8.00 KiB  host.b", 10000), "") << map.output();
  EXPECT_NE(map.WaitForLine("session " + std::to_string(client->session_id()) +
                                " dram: 2 copies, 16.0 KiB held; 1 gaps between them, 8.00 KiB free there (largest "
                                "8.00 KiB)",
                            10000),
            "")
      << map.output();
  EXPECT_EQ(map.Wait(), 0);
  ASSERT_TRUE(client->Unlease(second).ok());
  Process bad_map("tools/tierctl/tierctl", {dir, "map", std::to_string(client->session_id()), "tape"});
  EXPECT_NE(bad_map.WaitForLine("usage: tierctl map SESSION gpu|dram|nvme", 10000), "") << bad_map.output();
  EXPECT_EQ(bad_map.Wait(), 2);
  // The session's own use: the 8 KiB were on the GPU (the peak says so) and are in DRAM now
  // (the pin put them there); a reset restarts the peaks from what is held.
  auto usage = client->Usage(/*reset_peaks=*/true);
  ASSERT_TRUE(usage.ok()) << usage.status();
  ASSERT_EQ(usage->tiers_size(), 3);
  EXPECT_EQ(usage->tiers(0).tier(), v1::TIER_GPU);
  EXPECT_GE(usage->tiers(0).peak_bytes(), 8192u);
  EXPECT_GE(usage->tiers(1).used_bytes(), 8192u);
  auto after_reset = client->Usage(/*reset_peaks=*/false);
  ASSERT_TRUE(after_reset.ok());
  EXPECT_EQ(after_reset->tiers(0).peak_bytes(), usage->tiers(0).used_bytes())
      << "the peak restarted from what was held at the reset";
  Process bad_pin("tools/tierctl/tierctl", {dir, "pin", std::to_string(client->session_id()), "nope", "gpu"});
  EXPECT_NE(bad_pin.WaitForLine("tierctl: no tensor named 'nope'", 10000), "") << bad_pin.output();
  EXPECT_EQ(bad_pin.Wait(), 1);
  // The session's training as its trainer reports it: three steps, one skipped (NaN), then the
  // mean and standard deviation of the finite losses, the last step's time and tokens/s, in
  // Stats, tierctl's table and Prometheus; bad reports and another's token are refused.
  ASSERT_TRUE(client->ReportStep(1, 3.0, 0.5, 1000).ok());
  ASSERT_TRUE(client->ReportStep(2, std::nan(""), 0.5, 1000).ok());
  ASSERT_TRUE(client->ReportStep(3, 1.0, 0.25, 1000).ok());
  EXPECT_EQ(client->ReportStep(4, 1.0, -1, 1000).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client->ReportStep(0, 1.0, 1, 1000).code(), absl::StatusCode::kInvalidArgument);
  {
    v1::StepReport forged;
    forged.mutable_session()->set_session_id(client->session_id());
    forged.mutable_session()->set_token("not the token");
    forged.set_step(5);
    v1::Empty empty;
    grpc::ClientContext context;
    auto channel = grpc::CreateChannel("unix:" + runtime_dir_ + "/tierd.grpc.sock", grpc::InsecureChannelCredentials());
    EXPECT_EQ(v1::Tierd::NewStub(channel)->ReportStep(&context, forged, &empty).error_code(),
              grpc::StatusCode::PERMISSION_DENIED);
  }
  auto with_steps = client->Stats();
  ASSERT_TRUE(with_steps.ok());
  ASSERT_EQ(with_steps->session_steps_size(), 1);
  const v1::SessionSteps& steps = with_steps->session_steps(0);
  EXPECT_EQ(steps.session_id(), client->session_id());
  EXPECT_EQ(steps.step(), 3);
  EXPECT_EQ(steps.loss(), 1.0);
  EXPECT_EQ(steps.loss_mean(), 2.0);
  EXPECT_EQ(steps.loss_sd(), 1.0);
  EXPECT_EQ(steps.window(), 2u);
  EXPECT_EQ(steps.step_seconds(), 0.25);
  EXPECT_EQ(steps.tokens_per_second(), 4000.0);
  EXPECT_EQ(steps.skipped_steps(), 1u);
  EXPECT_EQ(steps.reports(), 3u);
  Process table("tools/tierctl/tierctl", {dir, "stats"});
  EXPECT_NE(table.WaitForLine(absl::StrFormat("%-8d %8d %10.3f %10.0f %8.4f %12s %8.4f %8d", client->session_id(), 3,
                                              0.25, 4000.0, 1.0, "2.0000 (2)", 1.0, 1),
                              10000),
            "")
      << table.output();
  EXPECT_EQ(table.Wait(), 0);
  Process stats("tools/tierctl/tierctl", {dir, "stats", "--json"});
  EXPECT_NE(stats.WaitForLine(" \"sessions\": \"1\"", 10000), "") << stats.output();
  EXPECT_EQ(stats.Wait(), 0);
  Process config("tools/tierctl/tierctl", {dir, "config"});
  EXPECT_NE(config.WaitForLine("  dram: {bytes: 16MiB", 10000), "") << config.output();
  EXPECT_EQ(config.Wait(), 0);
  Process nowhere("tools/tierctl/tierctl", {"--runtime_dir=/nonexistent", "stats"});
  EXPECT_NE(nowhere.WaitForLine("tierctl: cannot reach tierd at /nonexistent/tierd.sock", 10000), "")
      << nowhere.output();
  EXPECT_EQ(nowhere.Wait(), 1);
  const std::string scraped = Scrape();
  EXPECT_NE(scraped.find("tierd_sessions 1\n"), std::string::npos) << scraped;
  EXPECT_NE(scraped.find("tierd_leases 1\n"), std::string::npos);
  EXPECT_NE(scraped.find("tierd_moved_bytes_total{from=\"gpu\",to=\"dram\"} 8192\n"), std::string::npos)
      << scraped;  // the pin moved the 8 KiB tensor down
  EXPECT_NE(scraped.find("tierd_tier_budget_bytes{tier=\"nvme\"} 100663296\n"), std::string::npos);
  EXPECT_NE(scraped.find("tierd_placements_total{where=\"layout\"} 0\n"), std::string::npos)
      << "no graph registered: nothing placed by a layout";
  EXPECT_NE(scraped.find("tierd_gpu_relocations_total{why=\"join\"} 0\n"), std::string::npos) << scraped;
  EXPECT_NE(scraped.find("tierd_gpu_relocations_total{why=\"rehome\"} 0\n"), std::string::npos)
      << "no layout: nothing moved to one";
  EXPECT_NE(scraped.find("tierd_nvme_duplicates_dropped_total 0\n"), std::string::npos) << scraped;
  EXPECT_NE(scraped.find("tierd_refetches_total 0\n"), std::string::npos) << "nothing was evicted for room";
  EXPECT_NE(scraped.find("tierd_thrash_locks_total 0\n"), std::string::npos) << scraped;
  EXPECT_NE(scraped.find("tierd_thrash_unlocks_total 0\n"), std::string::npos) << scraped;
  // The fake GPU has no NVML figure: no gauge rather than a made-up 0.
  EXPECT_EQ(scraped.find("tierd_gpu_utilisation_percent"), std::string::npos) << scraped;
  const std::string session = "{session=\"" + std::to_string(client->session_id()) + "\"} ";
  EXPECT_NE(scraped.find("tierd_session_step" + session + "3\n"), std::string::npos) << scraped;
  EXPECT_NE(scraped.find("tierd_session_step_seconds" + session + "0.25\n"), std::string::npos) << scraped;
  EXPECT_NE(scraped.find("tierd_session_loss_mean" + session + "2\n"), std::string::npos) << scraped;
  EXPECT_NE(scraped.find("tierd_session_loss_sd" + session + "1\n"), std::string::npos) << scraped;
  EXPECT_NE(scraped.find("tierd_session_skipped_steps" + session + "1\n"), std::string::npos) << scraped;
  // The session gone, its steps go with it.
  client.reset();
  auto observer = Connect();
  ASSERT_NE(observer, nullptr);
  ASSERT_TRUE(WaitForSessions(*observer, 1));
  auto after = observer->Stats();
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->session_steps_size(), 0);
}

}  // namespace
}  // namespace tierd
