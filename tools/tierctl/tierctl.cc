// tierctl: look at and steer a running tierd. See --help.
#include <google/protobuf/util/json_util.h>
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <string>
#include <thread>

#include "absl/flags/declare.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/units.h"
#include "clients/client.h"
#include "proto/tierd.grpc.pb.h"
#include "tools/tierctl/plan_cmd.h"

ABSL_FLAG(std::string, runtime_dir, "/tmp/tierd", "tierd's runtime directory (where its sockets are)");
ABSL_FLAG(bool, json, false, "print JSON instead of tables (for scripts)");
ABSL_FLAG(double, interval, 1.0, "top: seconds between refreshes");
ABSL_FLAG(int, iterations, 0, "top: stop after this many refreshes (0: until Ctrl-C)");
ABSL_FLAG(uint64_t, session, 0, "leases: only this session; plan/trace: that session's registered graph");
ABSL_DECLARE_FLAG(std::string, explain);
ABSL_DECLARE_FLAG(std::string, out);
ABSL_DECLARE_FLAG(bool, dump_graph);

namespace tierd {
namespace {

using v1::Tierd;

// tierctl's observer session: it leases nothing, but proves to tierd that this uid is
// allowed (its hello's SO_PEERCRED check), which listings and administration require.
const Client* caller = nullptr;

void Identify(grpc::ClientContext* context) {
  if (caller != nullptr) caller->AddCallerMetadata(context);
}

int Fail(const grpc::Status& status) {
  std::fprintf(stderr, "tierctl: %s\n", status.error_message().c_str());
  if (status.error_code() == grpc::StatusCode::UNAVAILABLE) {
    std::fprintf(stderr, "tierctl: is tierd running with --runtime_dir=%s?\n",
                 absl::GetFlag(FLAGS_runtime_dir).c_str());
  }
  return 1;
}

void PrintJson(const google::protobuf::Message& message) {
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.always_print_primitive_fields = true;
  (void)google::protobuf::util::MessageToJsonString(message, &json, options);
  std::printf("%s\n", json.c_str());
}

const char* TierName(v1::Tier tier) {
  switch (tier) {
    case v1::TIER_GPU: return "gpu";
    case v1::TIER_DRAM: return "dram";
    case v1::TIER_NVME: return "nvme";
    default: return "-";
  }
}

void PrintStats(const v1::StatsReply& stats, const v1::StatsReply* previous, double seconds) {
  std::printf("tierd on %s, up %.1f s: %lu session(s), %lu lease(s)%s\n\n", stats.gpu().c_str(), stats.uptime_seconds(),
              static_cast<unsigned long>(stats.sessions()), static_cast<unsigned long>(stats.leases()),
              stats.has_gpu_utilisation_percent()
                  ? absl::StrFormat(", GPU-Util %.0f%% (the last second)", stats.gpu_utilisation_percent()).c_str()
                  : "");
  std::printf("%-5s %12s %12s %12s %12s %14s %6s\n", "tier", "budget", "reserved", "used", "peak", "largest free",
              "frag");
  for (const auto& t : stats.tiers()) {
    std::printf("%-5s %12s %12s %12s %12s %14s %6.2f\n", TierName(t.tier()), FormatBytes(t.budget_bytes()).c_str(),
                FormatBytes(t.reserved_bytes()).c_str(), FormatBytes(t.used_bytes()).c_str(),
                FormatBytes(t.peak_used_bytes()).c_str(), FormatBytes(t.largest_free_block_bytes()).c_str(),
                t.fragmentation());
  }
  std::printf("\n%-11s %12s %8s %7s %9s %12s%s\n", "link", "moved", "moves", "failed", "busy s", "while busy",
              previous ? "      now" : "");
  for (int i = 0; i < stats.links_size(); ++i) {
    const auto& l = stats.links(i);
    std::string now;
    if (previous && i < previous->links_size() && seconds > 0) {
      now = FormatRate((l.bytes() - previous->links(i).bytes()) / seconds);
    }
    std::printf("%-11s %12s %8lu %7lu %9.2f %12s %8s\n", l.link().c_str(), FormatBytes(l.bytes()).c_str(),
                static_cast<unsigned long>(l.moves()), static_cast<unsigned long>(l.failed_moves()),
                l.busy_seconds(), l.busy_seconds() > 0 ? FormatRate(l.bytes() / l.busy_seconds()).c_str() : "-",
                now.c_str());
  }
  std::printf("\nstalls %lu (%.3f s waiting); evictions: %lu for room, %lu asked; write-backs %lu; "
              "moves within DRAM against fragmentation %lu; within the GPU %lu (%lu of them to the layout's offset); "
              "NVMe copies dropped for room (a tier above had the bytes) %lu\n",
              static_cast<unsigned long>(stats.stalls()), stats.stall_seconds(),
              static_cast<unsigned long>(stats.evictions_capacity()),
              static_cast<unsigned long>(stats.evictions_explicit()), static_cast<unsigned long>(stats.writebacks()),
              static_cast<unsigned long>(stats.relocations()), static_cast<unsigned long>(stats.gpu_relocations()),
              static_cast<unsigned long>(stats.rehomed()), static_cast<unsigned long>(stats.nvme_duplicates_dropped()));
  if (stats.session_steps_size() == 0) return;
  std::printf("\n%-8s %8s %10s %10s %8s %12s %12s %8s\n", "session", "step", "step s", "tokens/s", "loss", "loss mean",
              "loss sd", "skipped");
  for (const auto& s : stats.session_steps()) {
    std::printf("%-8lu %8ld %10.3f %10.0f %8.4f %12s %8.4f %8lu\n", static_cast<unsigned long>(s.session_id()),
                static_cast<long>(s.step()), s.step_seconds(), s.tokens_per_second(), s.loss(),
                absl::StrFormat("%.4f (%u)", s.loss_mean(), s.window()).c_str(), s.loss_sd(),
                static_cast<unsigned long>(s.skipped_steps()));
  }
}

int Stats(Tierd::Stub& stub) {
  v1::Empty empty;
  v1::StatsReply stats;
  grpc::ClientContext context;
  Identify(&context);
  if (auto s = stub.Stats(&context, empty, &stats); !s.ok()) return Fail(s);
  if (absl::GetFlag(FLAGS_json)) PrintJson(stats);
  else PrintStats(stats, nullptr, 0);
  return 0;
}

int Top(Tierd::Stub& stub) {
  v1::StatsReply previous;
  bool have_previous = false;
  for (int i = 0; absl::GetFlag(FLAGS_iterations) == 0 || i < absl::GetFlag(FLAGS_iterations); ++i) {
    v1::Empty empty;
    v1::StatsReply stats;
    grpc::ClientContext context;
    Identify(&context);
    if (auto s = stub.Stats(&context, empty, &stats); !s.ok()) return Fail(s);
    if (isatty(1)) std::printf("\033[H\033[2J");
    PrintStats(stats, have_previous ? &previous : nullptr, absl::GetFlag(FLAGS_interval));
    std::fflush(stdout);
    previous = stats;
    have_previous = true;
    std::this_thread::sleep_for(std::chrono::duration<double>(absl::GetFlag(FLAGS_interval)));
  }
  return 0;
}

int Leases(Tierd::Stub& stub) {
  v1::ListLeasesRequest request;
  request.set_session_id(absl::GetFlag(FLAGS_session));
  v1::ListLeasesReply reply;
  grpc::ClientContext context;
  Identify(&context);
  if (auto s = stub.ListLeases(&context, request, &reply); !s.ok()) return Fail(s);
  if (absl::GetFlag(FLAGS_json)) {
    PrintJson(reply);
    return 0;
  }
  std::printf("%-8s %-32s %-10s %-7s %-16s %10s %-14s %-6s %-8s %s\n", "session", "name", "class", "dtype", "shape",
              "bytes", "copies", "pinned", "acquired", "refetched gpu,dram");
  for (const auto& l : reply.leases()) {
    std::vector<std::string> copies;
    for (int t : l.copies()) copies.push_back(TierName(static_cast<v1::Tier>(t)));
    std::printf("%-8lu %-32s %-10s %-7s %-16s %10s %-14s %-6s %-8u %s%s\n", static_cast<unsigned long>(l.session_id()),
                l.spec().name().c_str(), v1::TensorClass_Name(l.spec().tensor_class()).substr(13).c_str(),
                v1::DType_Name(l.spec().dtype()).substr(6).c_str(), absl::StrJoin(l.spec().shape(), "x").c_str(),
                FormatBytes(l.bytes()).c_str(), absl::StrJoin(copies, ",").c_str(), TierName(l.pinned()), l.acquired(),
                absl::StrJoin(l.refetches(), ",").c_str(), l.thrash_locked() ? " (locked: it thrashed)" : "");
  }
  return 0;
}

// One session's copies in one tier by offset, with the free gaps between them: where a
// fragmented arena's free bytes are (tierctl stats gives the tier's largest free block).
int Map(Tierd::Stub& stub, const std::vector<char*>& args) {
  const std::string tier_name = args.size() == 4 ? args[3] : "";
  const v1::Tier tier = tier_name == "gpu" ? v1::TIER_GPU : tier_name == "dram" ? v1::TIER_DRAM
                        : tier_name == "nvme" ? v1::TIER_NVME : v1::TIER_UNSPECIFIED;
  uint64_t session = 0;
  if (args.size() != 4 || tier == v1::TIER_UNSPECIFIED || !absl::SimpleAtoi(args[2], &session) || session == 0) {
    std::fprintf(stderr, "usage: tierctl map SESSION gpu|dram|nvme\n");
    return 2;
  }
  v1::ListLeasesRequest request;
  request.set_session_id(session);
  v1::ListLeasesReply reply;
  grpc::ClientContext context;
  Identify(&context);
  if (auto s = stub.ListLeases(&context, request, &reply); !s.ok()) return Fail(s);
  struct Copy {
    uint64_t offset, bytes;
    std::string name;
  };
  std::vector<Copy> copies;
  for (const auto& l : reply.leases()) {
    for (int i = 0; i < l.copies_size() && i < l.offsets_size() && i < l.extents_size(); ++i) {
      if (l.copies(i) == tier) copies.push_back({l.offsets(i), l.extents(i), l.spec().name()});
    }
  }
  std::sort(copies.begin(), copies.end(), [](const Copy& a, const Copy& b) { return a.offset < b.offset; });
  uint64_t held = 0, gaps = 0, free = 0, largest = 0, end = 0;
  std::printf("%14s %10s  %s\n", "offset", "bytes", "copy (or the free gap before it)");
  for (const Copy& c : copies) {
    if (c.offset > end) {
      const uint64_t gap = c.offset - end;
      std::printf("%14s %10s  (free)\n", FormatBytes(end).c_str(), FormatBytes(gap).c_str());
      ++gaps;
      free += gap;
      largest = std::max(largest, gap);
    }
    std::printf("%14s %10s  %s\n", FormatBytes(c.offset).c_str(), FormatBytes(c.bytes).c_str(), c.name.c_str());
    held += c.bytes;
    end = std::max(end, c.offset + c.bytes);
  }
  std::printf("session %lu %s: %zu copies, %s held; %lu gaps between them, %s free there (largest %s); the "
              "last copy ends at %s\n",
              static_cast<unsigned long>(session), tier_name.c_str(), copies.size(), FormatBytes(held).c_str(),
              static_cast<unsigned long>(gaps), FormatBytes(free).c_str(), FormatBytes(largest).c_str(),
              FormatBytes(end).c_str());
  return 0;
}

int Pin(Tierd::Stub& stub, const std::vector<char*>& args, bool pin) {
  if (args.size() != (pin ? 5u : 4u)) {
    std::fprintf(stderr, "usage: tierctl %s\n", pin ? "pin SESSION NAME gpu|dram|nvme" : "unpin SESSION NAME");
    return 2;
  }
  v1::AdminPinRequest request;
  request.set_session_id(std::stoull(args[2]));
  request.set_name(args[3]);
  if (pin) {
    const std::string tier = args[4];
    request.set_tier(tier == "gpu" ? v1::TIER_GPU : tier == "dram" ? v1::TIER_DRAM : tier == "nvme" ? v1::TIER_NVME
                                                                                                     : v1::TIER_UNSPECIFIED);
    if (request.tier() == v1::TIER_UNSPECIFIED) {
      std::fprintf(stderr, "tierctl: the tier must be gpu, dram or nvme\n");
      return 2;
    }
  }
  v1::Empty reply;
  grpc::ClientContext context;
  Identify(&context);
  if (auto s = stub.AdminPin(&context, request, &reply); !s.ok()) return Fail(s);
  std::printf("%s %s of session %s\n", pin ? "pinned" : "unpinned", args[3], args[2]);
  return 0;
}

// tierctl plan --session N [--explain NAME], tierctl trace --session N: a running session's
// plan, what the executor has seen, and its recorded timeline.
int SessionPlan(Tierd::Stub& stub, bool trace) {
  v1::GetPlanRequest request;
  request.set_session_id(absl::GetFlag(FLAGS_session));
  request.set_explain(trace ? "" : absl::GetFlag(FLAGS_explain));
  request.set_trace(trace);
  request.set_graph(!trace && absl::GetFlag(FLAGS_dump_graph));
  v1::PlanReply reply;
  grpc::ClientContext context;
  Identify(&context);
  if (auto s = stub.GetPlan(&context, request, &reply); !s.ok()) return Fail(s);
  if (trace) {
    const std::string path = absl::GetFlag(FLAGS_out);
    FILE* f = std::fopen(path.c_str(), "w");
    if (f == nullptr || std::fwrite(reply.trace_json().data(), 1, reply.trace_json().size(), f) !=
                            reply.trace_json().size() || std::fclose(f) != 0) {
      std::fprintf(stderr, "tierctl: cannot write %s\n", path.c_str());
      return 1;
    }
    std::printf("wrote %s: the last two iterations of session %lu as recorded (ui.perfetto.dev)\n", path.c_str(),
                static_cast<unsigned long>(request.session_id()));
    return 0;
  }
  if (request.graph()) {
    std::printf("%s", reply.graph_yaml().c_str());
    return 0;
  }
  if (absl::GetFlag(FLAGS_json)) {
    PrintJson(reply);
    return 0;
  }
  std::printf("%s%s", reply.summary().c_str(), reply.explain().c_str());
  return 0;
}

int Config(Tierd::Stub& stub) {
  v1::Empty empty;
  v1::ConfigReply reply;
  grpc::ClientContext context;
  Identify(&context);
  if (auto s = stub.GetConfig(&context, empty, &reply); !s.ok()) return Fail(s);
  if (absl::GetFlag(FLAGS_json)) PrintJson(reply);
  else std::printf("%s", reply.text().c_str());
  return 0;
}

}  // namespace
}  // namespace tierd

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "look at and steer a running tierd.\n"
      "  tierctl stats              tiers, links, stalls, evictions (--json for scripts)\n"
      "  tierctl top                the same, refreshed, with current link rates\n"
      "  tierctl leases             every leased tensor: where its copies are, pins, acquires\n"
      "  tierctl map SESSION gpu|dram|nvme    a session's copies in a tier by offset, and the gaps\n"
      "  tierctl pin SESSION NAME gpu|dram|nvme    keep a tensor in a tier\n"
      "  tierctl unpin SESSION NAME\n"
      "  tierctl config             the daemon's effective configuration\n"
      "Planning (offline, no daemon needed):\n"
      "  tierctl plan --model 7b --accum 16 --gpu 24GiB --dram 64GiB [--simulate]\n"
      "                             predicted step, stall, bytes per link, peaks; --simulate adds\n"
      "                             the on-demand LRU baseline and the lower bound\n"
      "  tierctl plan --graph step.yaml --explain layers.3.w    where a tensor is at each op, and why\n"
      "  tierctl plan --model tiny --dump_graph    the graph file format, by example\n"
      "  tierctl trace --model 7b --out step.json  the planned timeline for ui.perfetto.dev\n"
      "A running session (its registered graph):\n"
      "  tierctl plan --session N [--explain NAME]  predicted vs observed, and why a tensor is where\n"
      "  tierctl plan --session N --dump_graph > g.yaml    the graph as planned (measured op times),\n"
      "                             to plan offline: tierctl plan --graph g.yaml --simulate\n"
      "  tierctl trace --session N --out run.json   the last two iterations as recorded\n"
      "Common flag: --runtime_dir (default /tmp/tierd).");
  std::vector<char*> args = absl::ParseCommandLine(argc, argv);
  if (args.size() < 2) {
    std::fprintf(stderr, "tierctl: say what to do: stats, top, leases, map, pin, unpin, config, plan or trace (--help)\n");
    return 2;
  }
  const std::string command = args[1];
  const bool planning = command == "plan" || command == "trace";
  if (planning && absl::GetFlag(FLAGS_session) == 0) {
    return tierd::RunPlanCommand(std::vector<std::string>(args.begin() + 1, args.end()));
  }
  tierd::ClientOptions observer;
  observer.runtime_dir = absl::GetFlag(FLAGS_runtime_dir);
  observer.label = "tierctl";
  observer.use_ring = false;
  observer.observer = true;
  auto session = tierd::Client::Connect(observer);
  if (!session.ok()) {
    std::fprintf(stderr, "tierctl: %s\n", std::string(session.status().message()).c_str());
    return 1;
  }
  tierd::caller = session->get();
  auto stub = tierd::v1::Tierd::NewStub(grpc::CreateChannel(
      "unix:" + absl::GetFlag(FLAGS_runtime_dir) + "/tierd.grpc.sock", grpc::InsecureChannelCredentials()));
  if (planning) return tierd::SessionPlan(*stub, command == "trace");
  if (command == "stats") return tierd::Stats(*stub);
  if (command == "top") return tierd::Top(*stub);
  if (command == "leases") return tierd::Leases(*stub);
  if (command == "map") return tierd::Map(*stub, args);
  if (command == "pin") return tierd::Pin(*stub, args, true);
  if (command == "unpin") return tierd::Pin(*stub, args, false);
  if (command == "config") return tierd::Config(*stub);
  std::fprintf(stderr, "tierctl: unknown command '%s' (stats, top, leases, map, pin, unpin, config, plan, trace)\n", command.c_str());
  return 2;
}
