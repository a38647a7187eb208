#include "server/config.h"

#include <yaml-cpp/yaml.h>

#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <stdexcept>
#include <type_traits>

#include "absl/strings/str_format.h"
#include "base/limits.h"
#include "base/units.h"

namespace tierd {
namespace {

absl::Status Error(const YAML::Node& node, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrFormat("config line %d: %s", node.Mark().line + 1, what));
}

// A value that is not of its key's type, said with the key, the type and the line (yaml-cpp
// says only "bad conversion"); caught by ParseConfig.
struct TypeError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

template <typename T>
const char* TypeName() {
  if constexpr (std::is_same_v<T, bool>) return "true or false";
  else if constexpr (std::is_floating_point_v<T>) return "a number";
  else if constexpr (std::is_integral_v<T> && std::is_unsigned_v<T>) return "a whole number >= 0";
  else if constexpr (std::is_integral_v<T>) return "a whole number";
  else return "a string";
}

template <typename T>
T As(const YAML::Node& node, const std::string& key) {
  try {
    return node.as<T>();
  } catch (const YAML::BadConversion&) {
    const std::string value = node.IsScalar() ? "'" + node.Scalar() + "'" : node.IsSequence() ? "a list" : "a mapping";
    throw TypeError(
        absl::StrFormat("config line %d: %s must be %s, not %s", node.Mark().line + 1, key, TypeName<T>(), value));
  }
}

absl::Status CheckKeys(const YAML::Node& map, const std::string& where, const std::set<std::string>& allowed) {
  if (!map.IsMap()) return Error(map, where + " must be a mapping");
  for (const auto& entry : map) {
    const std::string key = entry.first.as<std::string>();
    if (allowed.count(key) == 0) {
      std::string known;
      for (const std::string& k : allowed) known += (known.empty() ? "" : ", ") + k;
      return Error(entry.first, absl::StrFormat("unknown key '%s' in %s (known: %s)", key, where, known));
    }
  }
  return absl::OkStatus();
}

absl::Status ReadBytes(const YAML::Node& map, const char* key, uint64_t* out) {
  if (!map[key]) return absl::OkStatus();
  auto bytes = ParseBytes(As<std::string>(map[key], key));
  if (!bytes.ok()) return Error(map[key], std::string(key) + ": " + std::string(bytes.status().message()));
  *out = *bytes;
  return absl::OkStatus();
}

#define RETURN_IF_ERROR(expression)            \
  do {                                         \
    const absl::Status status_ = (expression); \
    if (!status_.ok()) return status_;         \
  } while (0)

absl::Status ParseTiers(const YAML::Node& tiers, DaemonOptions* options) {
  RETURN_IF_ERROR(CheckKeys(tiers, "tiers", {"gpu", "dram", "nvme"}));
  if (const YAML::Node gpu = tiers["gpu"]) {
    RETURN_IF_ERROR(CheckKeys(gpu, "tiers.gpu", {"bytes", "device", "kind", "join_bounce"}));
    RETURN_IF_ERROR(ReadBytes(gpu, "bytes", &options->store.gpu_bytes));
    RETURN_IF_ERROR(ReadBytes(gpu, "join_bounce", &options->gpu_join_bounce_bytes));
    if (options->gpu_join_bounce_bytes > limits::kGpuJoinBounceBytesMax) {
      return Error(gpu["join_bounce"], absl::StrFormat("tiers.gpu.join_bounce is at most %s (a device copy is "
                                                       "faster beyond ~100 MiB)",
                                                       FormatBytes(limits::kGpuJoinBounceBytesMax)));
    }
    if (gpu["device"]) options->gpu.device_ordinal = As<int>(gpu["device"], "tiers.gpu.device");
    if (gpu["kind"]) {
      const std::string kind = As<std::string>(gpu["kind"], "tiers.gpu.kind");
      if (kind == "auto") options->gpu.choice = GpuChoice::kAuto;
      else if (kind == "cuda") options->gpu.choice = GpuChoice::kCuda;
      else if (kind == "fake") options->gpu.choice = GpuChoice::kFake;
      else return Error(gpu["kind"], "tiers.gpu.kind must be auto, cuda or fake");
    }
  }
  if (const YAML::Node dram = tiers["dram"]) {
    RETURN_IF_ERROR(CheckKeys(dram, "tiers.dram", {"bytes", "headroom"}));
    RETURN_IF_ERROR(ReadBytes(dram, "bytes", &options->store.dram_bytes));
    RETURN_IF_ERROR(ReadBytes(dram, "headroom", &options->store.dram_headroom_bytes));
  }
  if (const YAML::Node nvme = tiers["nvme"]) {
    RETURN_IF_ERROR(CheckKeys(nvme, "tiers.nvme", {"bytes", "path", "queue_depth", "chunk"}));
    RETURN_IF_ERROR(ReadBytes(nvme, "bytes", &options->store.nvme_bytes));
    RETURN_IF_ERROR(ReadBytes(nvme, "chunk", &options->nvme_chunk_bytes));
    const uint64_t chunk = options->nvme_chunk_bytes;
    if (nvme["chunk"] &&
        (!IsPowerOfTwo(chunk) || chunk < limits::kNvmeChunkBytesMin || chunk > limits::kNvmeChunkBytesMax)) {
      return Error(nvme["chunk"], absl::StrFormat("tiers.nvme.chunk must be a power of two from %s to %s, not %s",
                                                  FormatBytes(limits::kNvmeChunkBytesMin),
                                                  FormatBytes(limits::kNvmeChunkBytesMax), FormatBytes(chunk)));
    }
    if (nvme["path"]) options->store.nvme_directory = As<std::string>(nvme["path"], "tiers.nvme.path");
    if (nvme["queue_depth"]) {
      options->nvme_queue_depth = As<int>(nvme["queue_depth"], "tiers.nvme.queue_depth");
      if (options->nvme_queue_depth < 1 || options->nvme_queue_depth > static_cast<int>(limits::kNvmeQueueDepthMax)) {
        return Error(nvme["queue_depth"], absl::StrFormat("tiers.nvme.queue_depth must be 1 to %d, not %d",
                                                          limits::kNvmeQueueDepthMax, options->nvme_queue_depth));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status ParseRest(const YAML::Node& root, DaemonOptions* options) {
  if (const YAML::Node pins = root["pins"]) {
    if (!pins.IsSequence()) return Error(pins, "pins must be a list of {pattern, tier}");
    for (const YAML::Node& pin : pins) {
      RETURN_IF_ERROR(CheckKeys(pin, "a pin", {"pattern", "tier"}));
      if (!pin["pattern"] || !pin["tier"]) return Error(pin, "a pin needs pattern and tier");
      const std::string tier = As<std::string>(pin["tier"], "pins[].tier");
      PinRule rule{As<std::string>(pin["pattern"], "pins[].pattern"), Tier::kGpu};
      try {
        std::regex(rule.pattern, std::regex::ECMAScript);
      } catch (const std::regex_error& e) {
        return Error(pin["pattern"],
                     absl::StrFormat("pins[].pattern '%s' is not a regular expression (%s)", rule.pattern, e.what()));
      }
      if (tier == "gpu") rule.tier = Tier::kGpu;
      else if (tier == "dram") rule.tier = Tier::kDram;
      else if (tier == "nvme") rule.tier = Tier::kNvme;
      else return Error(pin["tier"], "a pin's tier must be gpu, dram or nvme");
      options->pins.push_back(rule);
    }
  }
  if (const YAML::Node priorities = root["priorities"]) {
    if (!priorities.IsSequence()) return Error(priorities, "priorities must be a list of {pattern, priority}");
    for (const YAML::Node& entry : priorities) {
      RETURN_IF_ERROR(CheckKeys(entry, "a priority", {"pattern", "priority"}));
      if (!entry["pattern"] || !entry["priority"]) return Error(entry, "a priority needs pattern and priority");
      PriorityRule rule{As<std::string>(entry["pattern"], "priorities[].pattern"), 0};
      try {
        std::regex(rule.pattern, std::regex::ECMAScript);
      } catch (const std::regex_error& e) {
        return Error(entry["pattern"], absl::StrFormat("priorities[].pattern '%s' is not a regular expression (%s)",
                                                       rule.pattern, e.what()));
      }
      int priority = 0;
      if (!YAML::convert<int>::decode(entry["priority"], priority) || priority < -1000 || priority > 1000) {
        return Error(entry["priority"], "a priority is a whole number from -1000 to 1000 (higher: evicted later)");
      }
      rule.priority = priority;
      options->priorities.push_back(rule);
    }
  }
  if (const YAML::Node listen = root["listen"]) {
    RETURN_IF_ERROR(CheckKeys(listen, "listen", {"runtime_dir", "grpc_tcp", "grpc_tcp_public", "metrics"}));
    if (listen["metrics"]) options->metrics_address = As<std::string>(listen["metrics"], "listen.metrics");
    if (listen["runtime_dir"]) options->runtime_dir = As<std::string>(listen["runtime_dir"], "listen.runtime_dir");
    if (listen["grpc_tcp"]) options->grpc_tcp_address = As<std::string>(listen["grpc_tcp"], "listen.grpc_tcp");
    if (listen["grpc_tcp_public"])
      options->grpc_tcp_public = As<bool>(listen["grpc_tcp_public"], "listen.grpc_tcp_public");
  }
  if (const YAML::Node security = root["security"]) {
    RETURN_IF_ERROR(CheckKeys(security, "security", {"allowed_uids", "socket_group"}));
    if (security["socket_group"]) options->socket_group = As<gid_t>(security["socket_group"], "security.socket_group");
    if (const YAML::Node uids = security["allowed_uids"]) {
      for (const YAML::Node& uid : uids) options->allowed_uids.insert(As<uid_t>(uid, "security.allowed_uids[]"));
    }
  }
  if (const YAML::Node limits = root["limits"]) {
    RETURN_IF_ERROR(CheckKeys(limits, "limits", {"sessions"}));
    if (limits["sessions"]) options->max_sessions = As<uint32_t>(limits["sessions"], "limits.sessions");
    if (options->max_sessions == 0) return Error(limits["sessions"], "limits.sessions must be at least 1");
  }
  if (const YAML::Node thrash = root["thrash"]) {
    RETURN_IF_ERROR(CheckKeys(thrash, "thrash", {"lock", "warmup_acquires", "refetches", "max_locked_fraction"}));
    ThrashOptions& t = options->thrash;
    if (thrash["lock"]) t.lock = As<bool>(thrash["lock"], "thrash.lock");
    if (thrash["warmup_acquires"])
      t.warmup_acquires = As<uint64_t>(thrash["warmup_acquires"], "thrash.warmup_acquires");
    if (thrash["refetches"]) t.refetches = As<uint32_t>(thrash["refetches"], "thrash.refetches");
    if (thrash["max_locked_fraction"]) {
      t.max_locked_fraction = As<double>(thrash["max_locked_fraction"], "thrash.max_locked_fraction");
    }
    if (t.refetches < 1) return Error(thrash["refetches"], "thrash.refetches must be at least 1");
    if (!(t.max_locked_fraction > 0 && t.max_locked_fraction <= 1)) {
      return Error(thrash["max_locked_fraction"],
                   "thrash.max_locked_fraction is a share of a quota, above 0 and at most 1");
    }
  }
  if (const YAML::Node planner = root["planner"]) {
    RETURN_IF_ERROR(CheckKeys(planner, "planner",
                              {"h2d_gbps", "d2h_gbps", "nvme_gbps", "time_aware", "layout_wait", "load_lead_ops", "settle_layout", "settle_after_replan",
                               "replan_drift", "keep_plan_margin",
                               "gpu_headroom_fraction",
                               "gpu_headroom_tensors", "dram_headroom_tensors", "deadline_s"}));
    if (planner["time_aware"]) options->planner_time_aware = As<bool>(planner["time_aware"], "planner.time_aware");
    if (planner["layout_wait"]) options->planner_layout_wait = As<bool>(planner["layout_wait"], "planner.layout_wait");
    if (planner["settle_layout"]) {
      options->planner_settle_layout = As<bool>(planner["settle_layout"], "planner.settle_layout");
    }
    if (planner["settle_after_replan"]) {
      options->planner_settle_after_replan = As<bool>(planner["settle_after_replan"], "planner.settle_after_replan");
    }
    if (planner["replan_drift"]) {
      options->planner_replan_drift = As<double>(planner["replan_drift"], "planner.replan_drift");
      if (!(options->planner_replan_drift > 0)) {
        return Error(planner["replan_drift"],
                     "planner.replan_drift must be above 0 (a mean relative difference; 1e9: never replan)");
      }
    }
    if (planner["keep_plan_margin"]) {
      options->planner_keep_plan_margin = As<double>(planner["keep_plan_margin"], "planner.keep_plan_margin");
      if (!(options->planner_keep_plan_margin <= 1)) {
        return Error(planner["keep_plan_margin"],
                     "planner.keep_plan_margin must be at most 1 (a share of the step; below 0: always replan)");
      }
    }
    if (planner["load_lead_ops"]) {
      options->planner_load_lead_ops = As<int>(planner["load_lead_ops"], "planner.load_lead_ops");
      if (options->planner_load_lead_ops < -1) {
        return absl::InvalidArgumentError("planner.load_lead_ops must be -1 (a lap ahead) or 0 and up");
      }
    }
    PlanningHeadroom& headroom = options->planner_headroom;
    for (auto [key, out] : {std::pair{"gpu_headroom_tensors", &headroom.gpu_tensors},
                            std::pair{"dram_headroom_tensors", &headroom.dram_tensors}}) {
      if (!planner[key]) continue;
      *out = As<int>(planner[key], std::string("planner.") + key);
      if (*out < 0 || *out > 16) {
        return Error(planner[key], std::string("planner.") + key + " must be 0 to 16 (tensors)");
      }
    }
    if (planner["deadline_s"]) {
      options->planner_deadline_seconds = As<double>(planner["deadline_s"], "planner.deadline_s");
      if (!(options->planner_deadline_seconds > 0 && options->planner_deadline_seconds <= 3600)) {
        return Error(planner["deadline_s"], "planner.deadline_s must be above 0 and at most 3600 (seconds)");
      }
    }
    if (planner["gpu_headroom_fraction"]) {
      headroom.gpu_fraction = As<double>(planner["gpu_headroom_fraction"], "planner.gpu_headroom_fraction");
      if (!(headroom.gpu_fraction >= 0 && headroom.gpu_fraction <= 0.25)) {
        return Error(planner["gpu_headroom_fraction"],
                     "planner.gpu_headroom_fraction must be 0 to 0.25 (of the quota)");
      }
    }
    for (auto [key, out] : {std::pair{"h2d_gbps", &options->planner_links.h2d_bytes_per_s},
                            std::pair{"d2h_gbps", &options->planner_links.d2h_bytes_per_s},
                            std::pair{"nvme_gbps", &options->planner_links.nvme_read_bytes_per_s}}) {
      if (!planner[key]) continue;
      const double gbps = As<double>(planner[key], std::string("planner.") + key);
      if (!(gbps > 0)) return Error(planner[key], std::string("planner.") + key + " must be > 0 (GB/s)");
      *out = gbps * 1e9;
    }
    options->planner_links.nvme_write_bytes_per_s = options->planner_links.nvme_read_bytes_per_s;
  }
  if (const YAML::Node quota = root["default_session_quota"]) {
    RETURN_IF_ERROR(CheckKeys(quota, "default_session_quota", {"gpu", "dram", "nvme"}));
    RETURN_IF_ERROR(ReadBytes(quota, "gpu", &options->default_quota.gpu_bytes));
    RETURN_IF_ERROR(ReadBytes(quota, "dram", &options->default_quota.dram_bytes));
    RETURN_IF_ERROR(ReadBytes(quota, "nvme", &options->default_quota.nvme_bytes));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<DaemonOptions> ParseConfig(const std::string& yaml_text) {
  DaemonOptions options;
  try {
    const YAML::Node root = YAML::Load(yaml_text);
    if (root.IsNull()) return options;
    RETURN_IF_ERROR(CheckKeys(
        root, "the config",
        {"tiers", "pins", "priorities", "listen", "security", "limits", "thrash", "planner", "default_session_quota"}));
    if (root["tiers"]) RETURN_IF_ERROR(ParseTiers(root["tiers"], &options));
    RETURN_IF_ERROR(ParseRest(root, &options));
  } catch (const TypeError& e) {
    return absl::InvalidArgumentError(e.what());
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrFormat("config: %s", e.what()));
  }
  return options;
}

namespace {

// Exact, and parseable by ParseBytes: "20GiB", "512MiB", "4096".
std::string ExactBytes(uint64_t bytes) {
  if (bytes != 0 && bytes % kGiB == 0) return absl::StrFormat("%dGiB", bytes / kGiB);
  if (bytes != 0 && bytes % kMiB == 0) return absl::StrFormat("%dMiB", bytes / kMiB);
  if (bytes != 0 && bytes % kKiB == 0) return absl::StrFormat("%dKiB", bytes / kKiB);
  return absl::StrFormat("%d", bytes);
}

// A YAML single-quoted scalar: no escapes, a quote is doubled.
std::string Quoted(const std::string& text) {
  std::string out = "'";
  for (char c : text) out += c == '\'' ? std::string("''") : std::string(1, c);
  return out + "'";
}

}  // namespace

std::string DescribeConfig(const DaemonOptions& o) {
  const char* kinds[] = {"auto", "cuda", "fake"};
  std::string out = absl::StrFormat(
      "tiers:\n  gpu: {kind: %s, device: %d, bytes: %s, join_bounce: %s}\n  dram: {bytes: %s, headroom: %s}\n"
      "  nvme: {path: %s, bytes: %s, queue_depth: %d, chunk: %s}\n",
      kinds[static_cast<int>(o.gpu.choice)], o.gpu.device_ordinal, ExactBytes(o.store.gpu_bytes),
      ExactBytes(o.gpu_join_bounce_bytes),
      ExactBytes(o.store.dram_bytes), ExactBytes(o.store.dram_headroom_bytes), Quoted(o.store.nvme_directory),
      ExactBytes(o.store.nvme_bytes), o.nvme_queue_depth, ExactBytes(o.nvme_chunk_bytes));
  out += o.pins.empty() ? "pins: []\n" : "pins:\n";
  for (const PinRule& pin : o.pins) {
    absl::StrAppendFormat(&out, "  - {pattern: %s, tier: %s}\n", Quoted(pin.pattern), TierName(pin.tier));
  }
  out += o.priorities.empty() ? "priorities: []\n" : "priorities:\n";
  for (const PriorityRule& rule : o.priorities) {
    absl::StrAppendFormat(&out, "  - {pattern: %s, priority: %d}\n", Quoted(rule.pattern), rule.priority);
  }
  absl::StrAppendFormat(&out, "listen: {runtime_dir: %s, grpc_tcp: %s, grpc_tcp_public: %s, metrics: %s}\n",
                        Quoted(o.runtime_dir), Quoted(o.grpc_tcp_address), o.grpc_tcp_public ? "true" : "false",
                        Quoted(o.metrics_address));
  out += "security:\n  allowed_uids: [";
  bool first = true;
  for (uid_t uid : o.allowed_uids) {
    absl::StrAppendFormat(&out, "%s%d", first ? "" : ", ", uid);
    first = false;
  }
  out += "]\n";
  if (o.socket_group) absl::StrAppendFormat(&out, "  socket_group: %d\n", *o.socket_group);
  absl::StrAppendFormat(&out, "limits: {sessions: %d}\n", o.max_sessions);
  absl::StrAppendFormat(&out, "thrash: {lock: %s, warmup_acquires: %d, refetches: %d, max_locked_fraction: %.17g}\n",
                        o.thrash.lock ? "true" : "false", o.thrash.warmup_acquires, o.thrash.refetches,
                        o.thrash.max_locked_fraction);
  absl::StrAppendFormat(
      &out,
      "planner: {h2d_gbps: %.17g, d2h_gbps: %.17g, nvme_gbps: %.17g, time_aware: %s, layout_wait: %s, load_lead_ops: %d, "
      "settle_layout: %s, settle_after_replan: %s, replan_drift: %.17g, keep_plan_margin: %.17g, "
      "gpu_headroom_fraction: %.17g, gpu_headroom_tensors: %d, dram_headroom_tensors: %d, deadline_s: %.17g}\n",
      o.planner_links.h2d_bytes_per_s / 1e9, o.planner_links.d2h_bytes_per_s / 1e9,
      o.planner_links.nvme_read_bytes_per_s / 1e9, o.planner_time_aware ? "true" : "false",
      o.planner_layout_wait ? "true" : "false", o.planner_load_lead_ops, o.planner_settle_layout ? "true" : "false",
      o.planner_settle_after_replan ? "true" : "false", o.planner_replan_drift, o.planner_keep_plan_margin,
      o.planner_headroom.gpu_fraction, o.planner_headroom.gpu_tensors, o.planner_headroom.dram_tensors,
      o.planner_deadline_seconds);
  absl::StrAppendFormat(&out, "default_session_quota: {gpu: %s, dram: %s, nvme: %s}\n",
                        ExactBytes(o.default_quota.gpu_bytes), ExactBytes(o.default_quota.dram_bytes),
                        ExactBytes(o.default_quota.nvme_bytes));
  return out;
}

absl::StatusOr<DaemonOptions> LoadConfig(const std::string& path) {
  std::ifstream file(path);
  if (!file) return absl::NotFoundError(absl::StrFormat("cannot read the config file %s", path));
  std::stringstream text;
  text << file.rdbuf();
  auto options = ParseConfig(text.str());
  if (!options.ok()) {
    return absl::Status(options.status().code(), path + ": " + std::string(options.status().message()));
  }
  return options;
}

}  // namespace tierd
