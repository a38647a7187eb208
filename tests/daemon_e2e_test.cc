// The real tierd binary, really started, with real client processes: sessions, leases
// through eviction to NVMe and back, a client killed mid-session, bad input on every
// entry point, and a clean SIGTERM. Fake GPU (the CPU machine), real shared memory, real
// io_uring files.
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <arpa/inet.h>
#include <netinet/in.h>
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

#include "absl/strings/str_format.h"
#include "base/units.h"
#include "clients/client.h"
#include "ipc/hello_server.h"
#include "ipc/unix_socket.h"
#include "proto/tierd.grpc.pb.h"
#include "tests/process.h"

namespace tierd {
namespace {

using testing::CountShm;
using testing::Process;

class DaemonTest : public ::testing::Test {
 protected:
  void SetUp() override {
    runtime_dir_ = "/tmp/tierd-e2e-" + std::to_string(getpid()) + "-" + std::to_string(std::random_device{}() % 100000) +
                   "-" + ::testing::UnitTest::GetInstance()->current_test_info()->name();
    const char* tmp = std::getenv("TEST_TMPDIR");
    std::vector<std::string> flags = {"--gpu=fake", "--gpu_bytes=16MiB", "--dram_bytes=16MiB",
                                      std::string("--nvme_dir=") + (tmp ? tmp : "/tmp"),
                                      "--nvme_bytes=96MiB", "--runtime_dir=" + runtime_dir_};
    // Only the test that scrapes serves metrics: stopping civetweb takes about a second.
    const bool metrics = std::string(::testing::UnitTest::GetInstance()->current_test_info()->name())
                             .find("Prometheus") != std::string::npos;
    if (metrics) flags.push_back("--metrics=127.0.0.1:0");
    daemon_ = std::make_unique<Process>("runtime/tierd", flags);
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
}

// The planner end to end: a client process registers its iteration graph, reports ops
// through the ring, and tierd moves tensors ahead of them; tierctl shows the plan, the
// run next to the prediction, why a tensor is where it is, and the recorded timeline.
// A planned worker's summary line: "ok planned: 4 laps, prefetches P, discards D, hits H,
// stalls S".
struct PlannedRun {
  std::string line;
  unsigned long laps = 0, prefetches = 0, discards = 0, hits = 0, stalls = 0;
};
PlannedRun WaitForPlannedRun(Process& worker) {
  PlannedRun run;
  run.line = worker.WaitForLine("ok planned:", 60000);
  EXPECT_NE(run.line, "") << worker.output();
  EXPECT_EQ(std::sscanf(run.line.c_str(), "ok planned: %lu laps, prefetches %lu, discards %lu, hits %lu, stalls %lu",
                        &run.laps, &run.prefetches, &run.discards, &run.hits, &run.stalls),
            5)
      << run.line;
  return run;
}

TEST_F(DaemonTest, APlannedSessionIsServedAheadOfUseAndTierctlShowsIt) {
  Process worker("tests/client_worker", {runtime_dir_, "planned-hold", "4"});
  const PlannedRun run = WaitForPlannedRun(worker);
  ASSERT_FALSE(HasFailure());
  const std::string& ok = run.line;
  const unsigned long prefetches = run.prefetches, discards = run.discards, hits = run.hits, stalls = run.stalls;
  EXPECT_GT(prefetches, 0u) << "the executor moved tensors ahead of use";
  EXPECT_GT(discards, 0u) << "dead activations were dropped, not written back";
  EXPECT_GT(hits, 10 * stalls) << ok;  // most acquires found their bytes in place
  const std::string ready = worker.WaitForLine("ready ", 10000);
  ASSERT_NE(ready, "") << worker.output();
  const std::string session = ready.substr(6);
  const std::string dir = "--runtime_dir=" + runtime_dir_;
  Process plan("tools/tierctl/tierctl", {dir, "plan", "--session=" + session});
  EXPECT_NE(plan.WaitForLine("predicted per iteration:", 10000), "") << plan.output();
  EXPECT_NE(plan.WaitForLine("lower bound at the same op times and links, in the whole quotas: ", 10000), "") << plan.output();
  EXPECT_NE(plan.WaitForLine("static layout: ", 10000), "") << plan.output();
  EXPECT_NE(plan.WaitForLine("observed: 3 iteration(s)", 10000), "") << plan.output();
  EXPECT_NE(plan.WaitForLine("moved in the last lap (the daemon's links, every session): DRAM->GPU ", 10000), "")
      << plan.output();
  EXPECT_NE(plan.WaitForLine("the tiers' own moves for room (not planned", 10000), "") << plan.output();
  EXPECT_EQ(plan.Wait(), 0);
  // The session's graph as planned, planned again offline from the file.
  Process dump("tools/tierctl/tierctl", {dir, "plan", "--session=" + session, "--dump_graph"});
  EXPECT_NE(dump.WaitForLine("# offline: tierctl plan --graph FILE", 10000), "") << dump.output();
  dump.WaitForLine("(to the end)", 10000);  // reads the rest
  EXPECT_EQ(dump.Wait(), 0);
  const std::string graph_path = runtime_dir_ + "-graph.yaml";
  {
    std::ofstream graph_file(graph_path);
    graph_file << dump.output();
  }
  Process offline("tools/tierctl/tierctl", {"plan", "--graph=" + graph_path, "--simulate", "--nvme_write_gbps=1"});
  EXPECT_NE(offline.WaitForLine("plan for " + graph_path + ": ", 10000), "") << offline.output();
  EXPECT_NE(offline.WaitForLine("lower bound: ", 10000), "") << offline.output();
  EXPECT_EQ(offline.Wait(), 0);
  std::remove(graph_path.c_str());
  Process explain("tools/tierctl/tierctl", {dir, "plan", "--session=" + session, "--explain=opt.m.layers.3"});
  EXPECT_NE(explain.WaitForLine("opt.m.layers.3 (", 10000), "") << explain.output();
  EXPECT_EQ(explain.Wait(), 0);
  const std::string trace_path = runtime_dir_ + "-trace.json";
  Process trace("tools/tierctl/tierctl", {dir, "trace", "--session=" + session, "--out=" + trace_path});
  EXPECT_NE(trace.WaitForLine("wrote ", 10000), "") << trace.output();
  EXPECT_EQ(trace.Wait(), 0);
  std::FILE* f = std::fopen(trace_path.c_str(), "r");
  ASSERT_NE(f, nullptr);
  char head[64] = {};
  ASSERT_GT(std::fread(head, 1, sizeof(head) - 1, f), 0u);
  std::fclose(f);
  std::remove(trace_path.c_str());
  EXPECT_NE(std::string(head).find("traceEvents"), std::string::npos) << head;
  Process none("tools/tierctl/tierctl", {dir, "plan", "--session=999"});
  EXPECT_NE(none.WaitForLine("tierctl: session 999 has registered no graph", 10000), "") << none.output();
  EXPECT_EQ(none.Wait(), 1);
}

// The optimizer on the host (a GPU trainer's CPU AdamW): the graph's host ops take the
// gradients down with their values and the rewritten weights back up; every value the
// worker reads, on the GPU or on the host, is the one it wrote last.
TEST_F(DaemonTest, APlannedSessionWithItsOptimizerOnTheHostLosesNothing) {
  Process worker("tests/client_worker", {runtime_dir_, "planned-host-optimizer", "4"});
  const PlannedRun run = WaitForPlannedRun(worker);
  ASSERT_FALSE(HasFailure());
  EXPECT_EQ(worker.Wait(), 0) << worker.output();
  EXPECT_GT(run.prefetches, 0u) << run.line;
  EXPECT_GT(run.hits, 10 * run.stalls) << run.line;
  std::printf("%s\n", run.line.c_str());
}

// The planner's entry points refuse bad graphs and out-of-order progress with the reason,
// and the session goes on working.
// RegisterGraph with graphs of random sizes and contents (a fixed seed): each one planned or
// refused with INVALID_ARGUMENT or RESOURCE_EXHAUSTED, never anything else, promptly, and the
// daemon and the session keep working. Sizes span empty graphs, up to 1,000 ops (kept small:
// planning is timed in planbench, not here), and past the bounds (16,385 and 40,000 ops,
// 65,537 tensors).
TEST_F(DaemonTest, GraphsOfRandomSizesArePlannedOrRefusedNeverWorse) {
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  auto w = client->Lease({"w", TensorClass::kParam, DType::kF32, {1024}});
  ASSERT_TRUE(w.ok());
  std::mt19937_64 rng(2026);
  const int ops_choices[] = {0, 1, 7, 60, 300, 1000, 16385, 40000};
  const int tensor_choices[] = {0, 1, 5, 100, 1000, 65537};
  int planned = 0, refused = 0;
  const auto start = std::chrono::steady_clock::now();
  for (int round = 0; round < 24; ++round) {
    const int ops = ops_choices[rng() % 8];
    const int tensors = tensor_choices[rng() % 6];
    v1::GraphSpec spec;
    for (int t = 0; t < tensors; ++t) {
      auto* tensor = spec.add_tensors();
      tensor->set_name("t" + std::to_string(t));
      tensor->set_bytes(4096 * (1 + rng() % 64));  // up to 256 KiB; the GPU quota is 1 MiB
    }
    // One graph in four carries one flaw: a duration of inf, NaN or < 0, or an unknown tensor.
    const int flaw = rng() % 4 == 0 ? static_cast<int>(rng() % 4) : -1;
    const int flawed_op = ops > 0 ? static_cast<int>(rng() % ops) : 0;
    for (int o = 0; o < ops; ++o) {
      auto* op = spec.add_ops();
      op->set_name("op" + std::to_string(o));
      op->set_seconds(1e-4 * static_cast<double>(rng() % 100));
      const int uses = tensors == 0 ? 0 : static_cast<int>(rng() % 4);
      for (int u = 0; u < uses; ++u) {
        (rng() % 2 ? op->add_reads() : op->add_writes())->assign("t" + std::to_string(rng() % tensors));
      }
      if (o != flawed_op) continue;
      if (flaw == 0) op->set_seconds(std::numeric_limits<double>::infinity());
      if (flaw == 1) op->set_seconds(std::nan(""));
      if (flaw == 2) op->set_seconds(-1.0);
      if (flaw == 3) op->add_reads("missing");
    }
    const auto sent = std::chrono::steady_clock::now();
    auto plan = client->RegisterGraph(spec);
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - sent).count();
    SCOPED_TRACE(absl::StrFormat("round %d: %d ops, %d tensors: %s (%.2f s)", round, ops, tensors,
                                 plan.ok() ? "planned" : plan.status().ToString(), seconds));
    if (plan.ok()) {
      ++planned;
      EXPECT_LE(ops, 16384);
    } else {
      ++refused;
      EXPECT_TRUE(absl::IsInvalidArgument(plan.status()) || absl::IsResourceExhausted(plan.status())) << plan.status();
      EXPECT_FALSE(plan.status().message().empty());
      if (ops > 16384 || tensors > 65536) {
        EXPECT_LT(seconds, 2.0) << "a graph past the bounds is refused before any planning";
      }
    }
    auto stats = client->Stats();
    ASSERT_TRUE(stats.ok()) << "the daemon answers after round " << round << ": " << stats.status();
  }
  std::printf("%d graphs planned, %d refused in %.1f s\n", planned, refused,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  EXPECT_GT(planned, 0);
  EXPECT_GT(refused, 0);
  EXPECT_TRUE(client->Acquire(*w, Access::kRead, Place::kGpu).ok()) << "the session still works";
  ASSERT_TRUE(client->Release(*w).ok());
}

TEST_F(DaemonTest, BadGraphsAndProgressAreRefusedWithTheReason) {
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  auto w = client->Lease({"w", TensorClass::kParam, DType::kF32, {1024}});
  ASSERT_TRUE(w.ok());
  EXPECT_EQ(client->OpBegin(0).code(), absl::StatusCode::kFailedPrecondition) << "no graph registered yet";
  // A recorded iteration that acquired nothing: refused with the reason, and the next mark
  // starts a new recording.
  auto first = client->MarkIteration();
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->summary().rfind("recording", 0), 0u) << first->summary();
  auto empty = client->MarkIteration();
  ASSERT_EQ(empty.status().code(), absl::StatusCode::kFailedPrecondition) << empty.status();
  EXPECT_NE(empty.status().message().find("acquired nothing"), absl::string_view::npos) << empty.status();
  auto again = client->MarkIteration();
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->summary().rfind("recording", 0), 0u) << again->summary();
  auto graph = [](std::vector<std::pair<std::string, uint64_t>> tensors, std::vector<std::string> reads,
                  double seconds) {
    v1::GraphSpec spec;
    for (const auto& [name, bytes] : tensors) {
      auto* t = spec.add_tensors();
      t->set_name(name);
      t->set_bytes(bytes);
    }
    auto* op = spec.add_ops();
    op->set_name("fwd");
    op->set_seconds(seconds);
    for (const auto& r : reads) op->add_reads(r);
    return spec;
  };
  auto unknown = client->RegisterGraph(graph({{"w", 4096}}, {"nope"}, 0.01));
  ASSERT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(unknown.status().message().find("uses tensor 'nope', which the graph's tensors do not list"),
            absl::string_view::npos)
      << unknown.status();
  auto twice = client->RegisterGraph(graph({{"w", 4096}, {"w", 4096}}, {"w"}, 0.01));
  EXPECT_NE(twice.status().message().find("lists tensor 'w' twice"), absl::string_view::npos) << twice.status();
  EXPECT_EQ(client->RegisterGraph(graph({{"w", 4096}}, {"w"}, -1)).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto forever = client->RegisterGraph(graph({{"w", 4096}}, {"w"}, std::numeric_limits<double>::infinity()));
  EXPECT_EQ(forever.status().code(), absl::StatusCode::kInvalidArgument) << forever.status();
  EXPECT_NE(forever.status().message().find("has a duration of inf s"), absl::string_view::npos) << forever.status();
  // A graph past the planner's bound is refused at once, with the numbers.
  v1::GraphSpec wide = graph({{"w", 4096}}, {"w"}, 0.001);
  for (int i = 1; i < 16385; ++i) *wide.add_ops() = wide.ops(0);
  const auto started = std::chrono::steady_clock::now();
  auto too_many = client->RegisterGraph(wide);
  EXPECT_EQ(too_many.status().code(), absl::StatusCode::kInvalidArgument) << too_many.status();
  EXPECT_NE(too_many.status().message().find("a graph of 1 tensors and 16385 ops; tierd plans at most 65536 and 16384"),
            absl::string_view::npos)
      << too_many.status();
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count(), 5.0);
  auto too_big = client->RegisterGraph(graph({{"w", 4096}, {"huge", 64 * kMiB}}, {"w", "huge"}, 0.01));
  ASSERT_EQ(too_big.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(too_big.status().message().find("cannot plan this graph under the session's quotas"),
            absl::string_view::npos)
      << too_big.status();
  auto ok = client->RegisterGraph(graph({{"w", 4096}}, {"w"}, 0.01));
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_NE(ok->summary().find("predicted per iteration"), std::string::npos);
  EXPECT_TRUE(client->OpBegin(0).ok());
  EXPECT_EQ(client->OpBegin(1).code(), absl::StatusCode::kInvalidArgument) << "the graph has one op";
  EXPECT_TRUE(client->Acquire(*w, Access::kRead, Place::kGpu).ok()) << "the session still works";
  ASSERT_TRUE(client->Release(*w).ok());
  // A client on the host (a CPU trainer): DRAM is planned over NVMe, and NVMe must hold it all.
  auto host_graph = [](int tensors) {
    v1::GraphSpec spec;
    spec.set_host(true);
    for (int i = 0; i < tensors; ++i) {
      auto* t = spec.add_tensors();
      t->set_name("h" + std::to_string(i));
      t->set_bytes(256 * kKiB);
      auto* op = spec.add_ops();
      op->set_name("use" + std::to_string(i));
      op->set_seconds(0.001);
      op->add_writes(t->name());
    }
    return spec;
  };
  auto host_too_big = client->RegisterGraph(host_graph(24));  // 6 MiB; the NVMe quota is 4 MiB
  ASSERT_EQ(host_too_big.status().code(), absl::StatusCode::kResourceExhausted) << host_too_big.status();
  EXPECT_NE(host_too_big.status().message().find("the NVMe quota ("), absl::string_view::npos) << host_too_big.status();
  EXPECT_NE(host_too_big.status().message().find("must hold all of them (6.00 MiB)"), absl::string_view::npos)
      << host_too_big.status();
  v1::GraphSpec host_wide = host_graph(1);
  host_wide.mutable_tensors(0)->set_bytes(2 * kMiB);  // more than the 1 MiB DRAM quota
  auto host_dram = client->RegisterGraph(host_wide);
  ASSERT_EQ(host_dram.status().code(), absl::StatusCode::kResourceExhausted) << host_dram.status();
  EXPECT_NE(host_dram.status().message().find("DRAM budget"), absl::string_view::npos) << host_dram.status();
  EXPECT_EQ(host_dram.status().message().find("GPU"), absl::string_view::npos) << host_dram.status();
  auto host_ok = client->RegisterGraph(host_graph(8));       // 2 MiB through 1 MiB of DRAM
  ASSERT_TRUE(host_ok.ok()) << host_ok.status();
  EXPECT_GT(host_ok->predicted_h2d_bytes(), 0u) << "NVMe -> DRAM stages every iteration";
  EXPECT_TRUE(client->OpBegin(7).ok());
  Process both("tools/tierctl/tierctl", {"plan", "--model=tiny", "--graph=x.yaml"});
  EXPECT_NE(both.WaitForLine("tierctl: give the iteration as --graph FILE or as --model", 10000), "") << both.output();
  EXPECT_EQ(both.Wait(), 2);
  Process unknown_model("tools/tierctl/tierctl", {"plan", "--model=70b"});
  EXPECT_NE(unknown_model.WaitForLine("tierctl: unknown model '70b'", 10000), "") << unknown_model.output();
  EXPECT_EQ(unknown_model.Wait(), 2);
}

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
  Process daemon("runtime/tierd", {"--gpu=fake", "--dram_bytes=16MiB", "--runtime_dir=" + dir});
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
  const std::string dir = "/tmp/tierd-e2e-limits-" + std::to_string(getpid()) + "-" +
                          std::to_string(std::random_device{}() % 100000);
  const int port = 20000 + std::random_device{}() % 20000;
  Process daemon("runtime/tierd", {"--gpu=fake", "--dram_bytes=16MiB", "--max_sessions=1",
                                   "--grpc_tcp=" + std::to_string(port), "--runtime_dir=" + dir});
  ASSERT_NE(daemon.WaitForLine("tierd: ready", 10000), "") << daemon.output();
  EXPECT_NE(daemon.output().find("and 127.0.0.1:" + std::to_string(port)), std::string::npos) << daemon.output();
  auto first = Client::Connect({dir, "first", {0, 1 * kMiB, 0}});
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = Client::Connect({dir, "second", {0, 1 * kMiB, 0}});
  EXPECT_EQ(second.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(second.status().message().find("at most 1 sessions"), absl::string_view::npos);
  auto tcp = v1::Tierd::NewStub(grpc::CreateChannel("127.0.0.1:" + std::to_string(port),
                                                    grpc::InsecureChannelCredentials()));
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
  Process wide("runtime/tierd", {"--gpu=fake", "--dram_bytes=16MiB", "--grpc_tcp=0.0.0.0:" + std::to_string(port),
                                 "--runtime_dir=" + dir});
  EXPECT_NE(wide.WaitForLine(
                "tierd: cannot start: gRPC on 0.0.0.0:" + std::to_string(port) + " would be reachable beyond this host",
                10000),
            "")
      << wide.output();
  EXPECT_EQ(wide.Wait(), 1);
  Process allowed("runtime/tierd", {"--gpu=fake", "--dram_bytes=16MiB", "--grpc_tcp=0.0.0.0:" + std::to_string(port),
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
  const std::string dir = "/tmp/tierd-e2e-refuse-" + std::to_string(getpid()) + "-" +
                          std::to_string(std::random_device{}() % 100000);
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
  // The planner's headroom flags are bounded, with the bound in the message.
  Process too_much_room("runtime/tierd", {"--gpu=fake", "--planner_gpu_headroom_fraction=0.5", "--runtime_dir=" + dir});
  EXPECT_NE(too_much_room.WaitForLine("tierd: --planner_gpu_headroom_fraction must be 0 to 0.25 (of the quota)", 10000),
            "")
      << too_much_room.output();
  EXPECT_EQ(too_much_room.Wait(), 2);
  Process too_many("runtime/tierd", {"--gpu=fake", "--planner_dram_headroom_tensors=17", "--runtime_dir=" + dir});
  EXPECT_NE(too_many.WaitForLine("tierd: --planner_dram_headroom_tensors must be 0 to 16 (tensors)", 10000), "")
      << too_many.output();
  EXPECT_EQ(too_many.Wait(), 2);
  // Flags that made no sense and were taken silently: each refused, naming what is wrong.
  Process negative("runtime/tierd", {"--gpu=fake", "--max_sessions=-1", "--runtime_dir=" + dir});
  EXPECT_NE(negative.WaitForLine("tierd: --max_sessions=-1: give at least 1", 10000), "") << negative.output();
  EXPECT_EQ(negative.Wait(), 2);
  Process bad_metrics("runtime/tierd",
                      {"--gpu=fake", "--dram_bytes=16MiB", "--metrics=999.1.1.1:99999", "--runtime_dir=" + dir});
  EXPECT_NE(bad_metrics.WaitForLine(
                "tierd: cannot start: cannot serve metrics on 999.1.1.1:99999: '99999' is not a port", 10000),
            "")
      << bad_metrics.output();
  EXPECT_EQ(bad_metrics.Wait(), 1);
  Process bad_host("runtime/tierd",
                   {"--gpu=fake", "--dram_bytes=16MiB", "--metrics=999.1.1.1:9464", "--runtime_dir=" + dir});
  EXPECT_NE(
      bad_host.WaitForLine(
          "tierd: cannot start: cannot serve metrics on 999.1.1.1:9464: '999.1.1.1' is not an IPv4 address", 10000),
      "")
      << bad_host.output();
  EXPECT_EQ(bad_host.Wait(), 1);
  Process big_quota("runtime/tierd",
                    {"--gpu=fake", "--dram_bytes=16MiB", "--default_quota=0,32MiB,0", "--runtime_dir=" + dir});
  EXPECT_NE(
      big_quota.WaitForLine("tierd: the default quota's dram 32.0 MiB is above the dram tier's budget 16.0 MiB", 10000),
      "")
      << big_quota.output();
  EXPECT_EQ(big_quota.Wait(), 2);
  Process rounded("runtime/tierd",
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
