// tierd: the per-node memory-tiering daemon. See --help.
#include <signal.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <tuple>

#include <google/protobuf/stubs/logging.h>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "base/limits.h"
#include "base/log_limiter.h"
#include "base/units.h"
#include "server/config.h"
#include "server/daemon.h"

ABSL_FLAG(std::string, config, "", "YAML config file (example: tools/tierd.example.yaml)");
ABSL_FLAG(std::string, runtime_dir, "", "where the sockets go (default /tmp/tierd)");
ABSL_FLAG(std::string, gpu, "", "auto | cuda | fake (default auto)");
ABSL_FLAG(std::string, gpu_bytes, "", "GPU tier budget, e.g. 20GiB");
ABSL_FLAG(std::string, dram_bytes, "", "DRAM tier budget, e.g. 64GiB");
ABSL_FLAG(std::string, nvme_dir, "", "directory on a local disk for the NVMe tier");
ABSL_FLAG(std::string, nvme_bytes, "", "NVMe tier budget, reserved at start");
ABSL_FLAG(std::string, gpu_join_bounce, "",
          "copies moved within the GPU to join free space, up to this size, go through pinned host memory on the "
          "PCIe links (e.g. 64MiB; 0: never): a device copy from tierd's context waits for a trainer's time slice");
ABSL_FLAG(std::string, allowed_uids, "", "comma-separated uids that may open sessions (default: own uid)");
ABSL_FLAG(int, socket_group, -1, "gid whose members may reach the sockets (0660); default private (0600)");
ABSL_FLAG(std::string, grpc_tcp, "", "also serve gRPC on TCP; a bare port binds loopback only");
ABSL_FLAG(bool, grpc_tcp_public, false,
          "allow --grpc_tcp beyond loopback (unencrypted; tensor listings and administration stay on the Unix "
          "socket)");
ABSL_FLAG(int, max_sessions, 0, "client sessions served at once (default 64)");
ABSL_FLAG(std::string, metrics, "", "serve Prometheus /metrics here, e.g. 127.0.0.1:9464");
ABSL_FLAG(std::string, default_quota, "", "gpu,dram,nvme bytes for clients that ask none");
ABSL_FLAG(bool, planner_time_aware, false,
          "plan sessions with hoisted loads and victims chosen by time tried too (planbench --time_aware); "
          "off: MIN and exclusive loads only");
ABSL_FLAG(bool, planner_layout_wait, false,
          "a planned load waits for its range in the plan's static GPU layout while the tensors planned there "
          "before it still hold it, instead of going elsewhere (an experiment: fewer moves within the GPU, more loads "
          "just in time in tools/planreplay)");
ABSL_FLAG(int, planner_load_lead_ops, -1,
          "a planned load into the GPU issues at most this many ops before the op it serves (-1: up to a lap ahead, "
          "as room allows; an experiment: 1 kept the static layout in tools/planreplay)");
ABSL_FLAG(bool, planner_settle_layout, true,
          "when a session's plan starts, its GPU copies go to the plan's layout offsets or leave the GPU, so the "
          "plan's loads find their ranges (false: copies made before the plan keep their places)");
ABSL_FLAG(bool, planner_settle_after_replan, false,
          "and again after each replan, the plan's loads paused until it is done (an experiment: a replan lays the "
          "GPU out anew; unmeasured on a GPU since its first form replanned every other lap)");
ABSL_FLAG(double, planner_replan_drift, -1,
          "replan a session when its measured op times differ from the plan's by more than this (mean relative "
          "difference over a lap; default 0.25; 1e9: keep the first plan)");
ABSL_FLAG(double, planner_keep_plan_margin, std::numeric_limits<double>::quiet_NaN(),
          "a replan for drift swaps its plan in only when it predicts a step at least this share shorter than the "
          "plan in force at the measured times; else the plan in force and its GPU layout stay (default 0.05; below "
          "0: always swapped in)");
ABSL_FLAG(int, planner_dram_headroom_tensors, -1,
          "plan DRAM below the GPU this many of a session's largest tensors under its quota, for room lost to "
          "fragmentation (default 1; at most a quarter of the quota)");
ABSL_FLAG(int, planner_gpu_headroom_tensors, -1,
          "plan the GPU at least this many of a session's largest tensors under its quota (default 1)");
ABSL_FLAG(double, planner_gpu_headroom_fraction, -1,
          "plan the GPU at least this share of its quota under it (default 0.035; the larger of the two holds, at most "
          "a quarter)");

ABSL_FLAG(double, planner_deadline_s, -1,
          "stop planning a session's graph after this many seconds and refuse it with the graph's size "
          "(default 60)");

namespace tierd {
namespace {

absl::Status Override(DaemonOptions* options) {
  auto bytes = [](const std::string& text, uint64_t* out) -> absl::Status {
    if (text.empty()) return absl::OkStatus();
    auto parsed = ParseBytes(text);
    if (!parsed.ok()) return parsed.status();
    *out = *parsed;
    return absl::OkStatus();
  };
  if (!absl::GetFlag(FLAGS_runtime_dir).empty()) options->runtime_dir = absl::GetFlag(FLAGS_runtime_dir);
  const std::string gpu = absl::GetFlag(FLAGS_gpu);
  if (gpu == "cuda") options->gpu.choice = GpuChoice::kCuda;
  else if (gpu == "fake") options->gpu.choice = GpuChoice::kFake;
  else if (gpu == "auto") options->gpu.choice = GpuChoice::kAuto;
  else if (!gpu.empty()) return absl::InvalidArgumentError("--gpu must be auto, cuda or fake");
  if (!absl::GetFlag(FLAGS_nvme_dir).empty()) options->store.nvme_directory = absl::GetFlag(FLAGS_nvme_dir);
  if (!absl::GetFlag(FLAGS_metrics).empty()) options->metrics_address = absl::GetFlag(FLAGS_metrics);
  if (!absl::GetFlag(FLAGS_grpc_tcp).empty()) options->grpc_tcp_address = absl::GetFlag(FLAGS_grpc_tcp);
  if (absl::GetFlag(FLAGS_grpc_tcp_public)) options->grpc_tcp_public = true;
  if (absl::GetFlag(FLAGS_max_sessions) < 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--max_sessions=%d: give at least 1 (unset: 64)", absl::GetFlag(FLAGS_max_sessions)));
  }
  if (absl::GetFlag(FLAGS_max_sessions) > 0) options->max_sessions = absl::GetFlag(FLAGS_max_sessions);
  if (absl::GetFlag(FLAGS_planner_time_aware)) options->planner_time_aware = true;
  if (absl::GetFlag(FLAGS_planner_layout_wait)) options->planner_layout_wait = true;
  if (!absl::GetFlag(FLAGS_planner_settle_layout)) options->planner_settle_layout = false;
  if (absl::GetFlag(FLAGS_planner_settle_after_replan)) options->planner_settle_after_replan = true;
  if (const double drift = absl::GetFlag(FLAGS_planner_replan_drift); drift != -1) {
    if (!(drift > 0)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("--planner_replan_drift=%g: give a mean relative difference above 0 (unset: 0.25)", drift));
    }
    options->planner_replan_drift = drift;
  }
  if (const double margin = absl::GetFlag(FLAGS_planner_keep_plan_margin); !std::isnan(margin)) {
    if (!(margin <= 1)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--planner_keep_plan_margin=%g: give a share of the step at most 1 (below 0: always replan)", margin));
    }
    options->planner_keep_plan_margin = margin;
  }
  if (absl::GetFlag(FLAGS_planner_load_lead_ops) < -1) {
    return absl::InvalidArgumentError(absl::StrFormat("--planner_load_lead_ops=%d: give -1 (a lap) or 0 and up",
                                                      absl::GetFlag(FLAGS_planner_load_lead_ops)));
  }
  if (absl::GetFlag(FLAGS_planner_load_lead_ops) >= 0) {
    options->planner_load_lead_ops = absl::GetFlag(FLAGS_planner_load_lead_ops);
  }
  for (auto [flag, name, out] :
       {std::tuple{absl::GetFlag(FLAGS_planner_dram_headroom_tensors), "dram", &options->planner_headroom.dram_tensors},
        std::tuple{absl::GetFlag(FLAGS_planner_gpu_headroom_tensors), "gpu", &options->planner_headroom.gpu_tensors}}) {
    if (flag < 0) continue;
    if (flag > 16) {
      return absl::InvalidArgumentError(
          absl::StrFormat("--planner_%s_headroom_tensors must be 0 to 16 (tensors)", name));
    }
    *out = flag;
  }
  if (const double f = absl::GetFlag(FLAGS_planner_gpu_headroom_fraction); f >= 0) {
    if (f > 0.25) return absl::InvalidArgumentError("--planner_gpu_headroom_fraction must be 0 to 0.25 (of the quota)");
    options->planner_headroom.gpu_fraction = f;
  }
  if (const double d = absl::GetFlag(FLAGS_planner_deadline_s); d != -1) {
    if (!(d > 0 && d <= 3600)) {
      return absl::InvalidArgumentError(absl::StrFormat("--planner_deadline_s=%g: give 0 < seconds <= 3600", d));
    }
    options->planner_deadline_seconds = d;
  }
  if (absl::GetFlag(FLAGS_socket_group) >= 0) options->socket_group = absl::GetFlag(FLAGS_socket_group);
  if (!absl::GetFlag(FLAGS_allowed_uids).empty()) {
    options->allowed_uids.clear();
    for (absl::string_view uid : absl::StrSplit(absl::GetFlag(FLAGS_allowed_uids), ',')) {
      uint32_t value = 0;
      if (!absl::SimpleAtoi(uid, &value)) return absl::InvalidArgumentError("--allowed_uids takes numbers");
      options->allowed_uids.insert(value);
    }
  }
  for (auto [flag, out] : {std::pair{absl::GetFlag(FLAGS_gpu_bytes), &options->store.gpu_bytes},
                           {absl::GetFlag(FLAGS_dram_bytes), &options->store.dram_bytes},
                           {absl::GetFlag(FLAGS_nvme_bytes), &options->store.nvme_bytes},
                           {absl::GetFlag(FLAGS_gpu_join_bounce), &options->gpu_join_bounce_bytes}}) {
    if (absl::Status s = bytes(flag, out); !s.ok()) return s;
  }
  if (options->gpu_join_bounce_bytes > limits::kGpuJoinBounceBytesMax) {
    return absl::InvalidArgumentError(absl::StrFormat("--gpu_join_bounce=%s: at most %s (a device copy is faster "
                                                      "beyond ~100 MiB)",
                                                      absl::GetFlag(FLAGS_gpu_join_bounce),
                                                      FormatBytes(limits::kGpuJoinBounceBytesMax)));
  }
  const std::string quota = absl::GetFlag(FLAGS_default_quota);
  if (!quota.empty()) {
    std::vector<std::string> parts = absl::StrSplit(quota, ',');
    if (parts.size() != 3) return absl::InvalidArgumentError("--default_quota takes gpu,dram,nvme");
    SessionQuota& q = options->default_quota;
    for (auto [text, out] : {std::pair{parts[0], &q.gpu_bytes}, {parts[1], &q.dram_bytes}, {parts[2], &q.nvme_bytes}}) {
      if (absl::Status s = bytes(text, out); !s.ok()) return s;
    }
  }
  return absl::OkStatus();
}

// What flags and config leave inconsistent: a default quota above a tier's budget (no
// session could get it) is refused; budgets the tiers round up are said.
// `quota_given`: the default quota came from --default_quota or the config (the built-in
// one is not held against small budgets).
absl::Status Check(const DaemonOptions& options, bool quota_given) {
  const TierStoreOptions& store = options.store;
  const SessionQuota& q = options.default_quota;
  for (auto [name, quota, budget] :
       {std::tuple{"gpu", q.gpu_bytes, store.gpu_bytes}, std::tuple{"dram", q.dram_bytes, store.dram_bytes},
        std::tuple{"nvme", q.nvme_bytes, store.nvme_bytes}}) {
    if (quota_given && budget > 0 && quota > budget) {
      return absl::InvalidArgumentError(
          absl::StrFormat("the default quota's %s %s is above the %s tier's budget %s: no session could get it "
                          "(--default_quota or default_session_quota in the config, and the budgets)",
                          name, FormatBytes(quota), name, FormatBytes(budget)));
    }
  }
  for (auto [name, bytes] : {std::pair{"dram", store.dram_bytes}, std::pair{"nvme", store.nvme_bytes}}) {
    if (bytes % limits::kDirectIoAlignmentBytes == 0) continue;
    const uint64_t up = (bytes / limits::kDirectIoAlignmentBytes + 1) * limits::kDirectIoAlignmentBytes;
    std::printf("%s", absl::StrFormat("tierd: the %s budget %d bytes is rounded up to %s (that tier works in blocks of "
                                      "%s)\n",
                                      name, bytes, FormatBytes(up), FormatBytes(limits::kDirectIoAlignmentBytes))
                          .c_str());
  }
  return absl::OkStatus();
}

// protobuf logs a line for each request it cannot decode (invalid UTF-8 in a string, ...):
// at most 10 a minute reach tierd's log, then how many were dropped.
void ProtobufLog(google::protobuf::LogLevel level, const char* file, int line, const std::string& message) {
  static LogLimiter limiter(RealClock(), 10, int64_t{60} * 1'000'000'000);
  int64_t dropped = 0;
  if (!limiter.Allow(&dropped)) return;
  if (dropped > 0)
    std::fprintf(stderr, "tierd: protobuf: %ld more lines dropped (at most 10 a minute)\n", static_cast<long>(dropped));
  std::fprintf(stderr, "tierd: protobuf %s: %s (%s:%d)\n", level >= google::protobuf::LOGLEVEL_ERROR ? "error" : "note",
               message.c_str(), file, line);
}

int Main() {
  google::protobuf::SetLogHandler(&ProtobufLog);
  DaemonOptions options;
  options.store.dram_bytes = uint64_t{1} << 30;  // small, safe defaults
  const SessionQuota builtin_quota = {uint64_t{256} << 20, uint64_t{256} << 20, 0};
  options.default_quota = builtin_quota;
  if (!absl::GetFlag(FLAGS_config).empty()) {
    auto loaded = LoadConfig(absl::GetFlag(FLAGS_config));
    if (!loaded.ok()) {
      std::fprintf(stderr, "tierd: %s\n", std::string(loaded.status().message()).c_str());
      return 2;
    }
    options = *loaded;
  }
  if (absl::Status s = Override(&options); !s.ok()) {
    std::fprintf(stderr, "tierd: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  const SessionQuota& q = options.default_quota;
  const bool quota_given = q.gpu_bytes != builtin_quota.gpu_bytes || q.dram_bytes != builtin_quota.dram_bytes ||
                           q.nvme_bytes != builtin_quota.nvme_bytes;
  if (absl::Status s = Check(options, quota_given); !s.ok()) {
    std::fprintf(stderr, "tierd: %s\n", std::string(s.message()).c_str());
    return 2;
  }
  // Threads started from here on inherit the mask: only sigwait below sees these.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  auto daemon = Daemon::Start(options);
  if (!daemon.ok()) {
    std::fprintf(stderr, "tierd: cannot start: %s\n", std::string(daemon.status().message()).c_str());
    return 1;
  }
  std::printf("%stierd: ready (SIGTERM or Ctrl-C stops it)\n", (*daemon)->Banner().c_str());
  std::fflush(stdout);
  int received = 0;
  sigwait(&signals, &received);
  std::printf("tierd: %s: ending sessions, draining moves\n", received == SIGTERM ? "SIGTERM" : "SIGINT");
  std::printf("tierd: %s\n", (*daemon)->HotPathSummary().c_str());
  std::fflush(stdout);
  daemon->reset();
  std::printf("tierd: stopped\n");
  return 0;
}

}  // namespace
}  // namespace tierd

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "the per-node memory-tiering daemon: owns the GPU, DRAM and NVMe tiers and lends tensors\n"
      "to trainer processes (clients/ shim) over a Unix socket and gRPC.\n"
      "  tierd --config tools/tierd.example.yaml\n"
      "  tierd --gpu=fake --dram_bytes=2GiB --nvme_dir=/var/tmp --nvme_bytes=8GiB\n"
      "Budgets are hard: tierd refuses to start when the machine cannot give them.");
  absl::ParseCommandLine(argc, argv);
  return tierd::Main();
}
