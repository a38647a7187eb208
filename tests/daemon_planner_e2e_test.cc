// The real tierd's planner with real client processes: a planned session served ahead of
// use (on the GPU tier and with its optimizer on the host), graphs of random sizes and bad
// graphs or progress refused with the reason, tierctl's plan and trace.
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
  EXPECT_NE(plan.WaitForLine("lower bound at the same op times and links, in the whole quotas: ", 10000), "")
      << plan.output();
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
  // The session gone, its plan's prediction and what happened stay in the daemon's log.
  worker.Signal(SIGKILL);
  worker.Wait();
  const std::string prefix = "tierd: session " + session + "'s plan at its end: ";
  EXPECT_NE(daemon_->WaitForLine(prefix + "predicted per iteration: ", 10000), "") << daemon_->output();
  EXPECT_NE(daemon_->WaitForLine(prefix + "links assumed: ", 10000), "") << daemon_->output();
  EXPECT_NE(daemon_->WaitForLine(prefix + "observed: ", 10000), "") << daemon_->output();
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
// 65,537 tensors, 1,000 ops of 65,537 tensors).
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

// A daemon whose planner may take a third of a second a graph.
class DaemonDeadlineTest : public DaemonTest {
 protected:
  std::vector<std::string> ExtraFlags() const override { return {"--planner_deadline_s=0.3"}; }
};

// A graph within the bounds that takes seconds to plan: the planning is stopped at the
// deadline and the request refused with the graph's size; the session and the daemon go on,
// and a small graph plans at once (the stopped planning does not hold a planner slot).
TEST_F(DaemonDeadlineTest, AGraphPastThePlannersDeadlineIsStoppedAndRefused) {
  auto client = Connect({2 * kMiB, 4 * kMiB, 16 * kMiB});
  ASSERT_NE(client, nullptr);
  auto w = client->Lease({"w", TensorClass::kParam, DType::kF32, {1024}});
  ASSERT_TRUE(w.ok());
  std::mt19937_64 rng(7);
  v1::GraphSpec big;
  constexpr int kTensors = 1000, kOps = 16384;
  for (int t = 0; t < kTensors; ++t) {
    auto* tensor = big.add_tensors();
    tensor->set_name("t" + std::to_string(t));
    tensor->set_bytes(4096);
  }
  for (int o = 0; o < kOps; ++o) {
    auto* op = big.add_ops();
    op->set_name("op" + std::to_string(o));
    op->set_seconds(1e-4);
    for (int u = 0; u < 3; ++u) op->add_reads("t" + std::to_string(rng() % kTensors));
    op->add_writes("t" + std::to_string(rng() % kTensors));
  }
  // More refusals than the planner has slots: a stopped planning that went on would hold
  // its slot, and the fifth would be refused for want of one.
  for (int i = 0; i < 5; ++i) {  // tierd plans 4 graphs at once (kPlanningMax)
    const auto sent = std::chrono::steady_clock::now();
    auto refused = client->RegisterGraph(big);
    // A stopped planning's thread may need a moment to run on a busy machine and free its
    // slot (seconds at most; one that went on would hold it for minutes).
    while (absl::IsResourceExhausted(refused.status()) &&
           std::chrono::steady_clock::now() - sent < std::chrono::seconds(30)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      refused = client->RegisterGraph(big);
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - sent).count();
    std::printf("the big graph answered in %.2f s: %s\n", seconds,
                refused.ok() ? "planned" : refused.status().ToString().c_str());
    ASSERT_FALSE(refused.ok()) << "planned in " << seconds << " s: make the graph harder to plan";
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kDeadlineExceeded) << refused.status();
    EXPECT_NE(refused.status().message().find("16384 ops and 1000 tensors took longer than 0.3 s"), std::string::npos)
        << refused.status();
  }
  // Several small graphs in a row: more than the planner's slots, so a stopped planning
  // that held its slot would show.
  v1::GraphSpec small;
  auto* tensor = small.add_tensors();
  tensor->set_name("w");
  tensor->set_bytes(4096);
  auto* op = small.add_ops();
  op->set_name("use");
  op->set_seconds(1e-3);
  op->add_reads("w");
  // A stopped planning ends at its next op, but on a busy machine its thread may need a moment
  // to run at all: the first small graph may find the slots still taken, for seconds at most
  // (a planning that went on would hold its slot for minutes).
  const auto small_sent = std::chrono::steady_clock::now();
  for (int i = 0; i < 6; ++i) {
    auto plan = client->RegisterGraph(small);
    while (absl::IsResourceExhausted(plan.status()) &&
           std::chrono::steady_clock::now() - small_sent < std::chrono::seconds(30)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      plan = client->RegisterGraph(small);
    }
    ASSERT_TRUE(plan.ok()) << "small graph " << i << ": " << plan.status();
  }
  std::printf("six small graphs planned %.2f s after the last refusal\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - small_sent).count());
  EXPECT_TRUE(client->OpBegin(0).ok());
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
  EXPECT_EQ(client->RegisterGraph(graph({{"w", 4096}}, {"w"}, -1)).status().code(), absl::StatusCode::kInvalidArgument);
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
  // Ops and tensors each within bounds, but their product past what the planner's next-use
  // table may hold (8,193 x 8,193 > 2^26).
  v1::GraphSpec square = graph({{"w", 4096}}, {"w"}, 0.001);
  for (int i = 1; i < 8193; ++i) {
    *square.add_ops() = square.ops(0);
    auto* t = square.add_tensors();
    t->set_name("t" + std::to_string(i));
    t->set_bytes(4096);
  }
  auto too_square = client->RegisterGraph(square);
  EXPECT_EQ(too_square.status().code(), absl::StatusCode::kInvalidArgument) << too_square.status();
  EXPECT_NE(too_square.status().message().find("a graph of 8193 ops and 8193 tensors: the planner keeps a next use "
                                               "per op and tensor, 67125249 of them (256 MiB); tierd plans at most "
                                               "67108864"),
            absl::string_view::npos)
      << too_square.status();
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
  auto host_ok = client->RegisterGraph(host_graph(8));  // 2 MiB through 1 MiB of DRAM
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

}  // namespace
}  // namespace tierd
