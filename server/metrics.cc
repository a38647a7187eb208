#include "server/metrics.h"

#include <arpa/inet.h>
#include <civetweb.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

namespace tierd {
namespace {

const char* TierLabel(v1::Tier tier) {
  switch (tier) {
    case v1::TIER_GPU:
      return "gpu";
    case v1::TIER_DRAM:
      return "dram";
    case v1::TIER_NVME:
      return "nvme";
    default:
      return "unknown";
  }
}

void Family(std::string* out, const char* name, const char* type, const char* help) {
  absl::StrAppendFormat(out, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

}  // namespace

std::string RenderPrometheus(const v1::StatsReply& stats) {
  std::string out;
  struct TierMetric {
    const char* name;
    const char* help;
    double (*value)(const v1::TierStats&);
  };
  const TierMetric tier_metrics[] = {
      {"tierd_tier_budget_bytes", "Hard budget of the tier.",
       [](const v1::TierStats& t) { return double(t.budget_bytes()); }},
      {"tierd_tier_reserved_bytes", "Bytes of the budget reserved by session arenas.",
       [](const v1::TierStats& t) { return double(t.reserved_bytes()); }},
      {"tierd_tier_bytes", "Bytes allocated to tensors (real allocations, not reservations).",
       [](const v1::TierStats& t) { return double(t.used_bytes()); }},
      {"tierd_tier_largest_free_block_bytes", "Largest free block in any arena of the tier.",
       [](const v1::TierStats& t) { return double(t.largest_free_block_bytes()); }},
      {"tierd_fragmentation_ratio", "1 - largest free block / free bytes.",
       [](const v1::TierStats& t) { return t.fragmentation(); }},
  };
  for (const TierMetric& metric : tier_metrics) {
    Family(&out, metric.name, "gauge", metric.help);
    for (const v1::TierStats& tier : stats.tiers()) {
      absl::StrAppendFormat(&out, "%s{tier=\"%s\"} %.17g\n", metric.name, TierLabel(tier.tier()), metric.value(tier));
    }
  }
  struct LinkMetric {
    const char* name;
    const char* help;
    double (*value)(const v1::LinkStats&);
  };
  const LinkMetric link_metrics[] = {
      {"tierd_moved_bytes_total", "Bytes moved between tiers.",
       [](const v1::LinkStats& l) { return double(l.bytes()); }},
      {"tierd_moves_total", "Moves completed.", [](const v1::LinkStats& l) { return double(l.moves()); }},
      {"tierd_failed_moves_total", "Moves that failed (their source kept).",
       [](const v1::LinkStats& l) { return double(l.failed_moves()); }},
      {"tierd_link_busy_seconds_total", "Time the link had a move in flight.",
       [](const v1::LinkStats& l) { return l.busy_seconds(); }},
  };
  for (const LinkMetric& metric : link_metrics) {
    Family(&out, metric.name, "counter", metric.help);
    for (const v1::LinkStats& link : stats.links()) {
      std::vector<std::string> ends = absl::StrSplit(link.link(), "->");
      if (ends.size() != 2) continue;
      absl::StrAppendFormat(&out, "%s{from=\"%s\",to=\"%s\"} %.17g\n", metric.name, ends[0], ends[1],
                            metric.value(link));
    }
  }
  Family(&out, "tierd_stalls_total", "counter", "Acquires that had to wait for a demand fetch.");
  absl::StrAppendFormat(&out, "tierd_stalls_total %d\n", stats.stalls());
  Family(&out, "tierd_stall_seconds_total", "counter", "Time acquires waited for demand fetches.");
  absl::StrAppendFormat(&out, "tierd_stall_seconds_total %.9f\n", stats.stall_seconds());
  Family(&out, "tierd_evictions_total", "counter", "Copies dropped or moved down, by reason.");
  absl::StrAppendFormat(&out, "tierd_evictions_total{reason=\"capacity\"} %d\n", stats.evictions_capacity());
  absl::StrAppendFormat(&out, "tierd_evictions_total{reason=\"explicit\"} %d\n", stats.evictions_explicit());
  absl::StrAppendFormat(&out, "tierd_evictions_total{reason=\"planned\"} %d\n", stats.planned_evictions());
  Family(&out, "tierd_writebacks_total", "counter", "Evictions that had to copy the only copy down first.");
  absl::StrAppendFormat(&out, "tierd_writebacks_total %d\n", stats.writebacks());
  Family(&out, "tierd_prefetches_total", "counter", "Copies the planner made ahead of use.");
  absl::StrAppendFormat(&out, "tierd_prefetches_total %d\n", stats.prefetches());
  Family(&out, "tierd_prefetch_bytes_total", "counter", "Bytes the planner moved ahead of use.");
  absl::StrAppendFormat(&out, "tierd_prefetch_bytes_total %d\n", stats.prefetch_bytes());
  Family(&out, "tierd_discards_total", "counter", "Dead values dropped without a write-back (the plan knew).");
  absl::StrAppendFormat(&out, "tierd_discards_total %d\n", stats.discards());
  Family(&out, "tierd_prefetch_hit_ratio", "gauge", "Acquires that found their bytes in place, of all acquires.");
  const uint64_t acquires = stats.acquire_hits() + stats.stalls();
  absl::StrAppendFormat(&out, "tierd_prefetch_hit_ratio %.6f\n",
                        acquires == 0 ? 1.0 : static_cast<double>(stats.acquire_hits()) / acquires);
  Family(&out, "tierd_placements_total", "counter",
         "Copies placed where the planner's static layout put them (layout) or, that range taken, elsewhere (online).");
  absl::StrAppendFormat(&out, "tierd_placements_total{where=\"layout\"} %d\n", stats.planned_placements());
  absl::StrAppendFormat(&out, "tierd_placements_total{where=\"online\"} %d\n", stats.off_plan_placements());
  Family(&out, "tierd_layout_waits_total", "counter",
         "Planned loads that found their layout range still held by the tensors planned there before them and "
         "waited for it instead of going elsewhere.");
  absl::StrAppendFormat(&out, "tierd_layout_waits_total %d\n", stats.layout_waits());
  Family(&out, "tierd_relocations_total", "counter",
         "Copies moved within a fragmented DRAM arena to join free space instead of spilling to NVMe.");
  absl::StrAppendFormat(&out, "tierd_relocations_total %d\n", stats.relocations());
  Family(&out, "tierd_gpu_relocations_total", "counter",
         "Copies moved within the GPU region: to join free space (join), or to the planner's layout offset when "
         "acquired off it (rehome).");
  absl::StrAppendFormat(&out, "tierd_gpu_relocations_total{why=\"join\"} %d\n",
                        stats.gpu_relocations() - stats.rehomed());
  absl::StrAppendFormat(&out, "tierd_gpu_relocations_total{why=\"rehome\"} %d\n", stats.rehomed());
  Family(&out, "tierd_nvme_duplicates_dropped_total", "counter",
         "NVMe copies dropped to make room there on demand: a tier above held the same bytes.");
  absl::StrAppendFormat(&out, "tierd_nvme_duplicates_dropped_total %d\n", stats.nvme_duplicates_dropped());
  Family(&out, "tierd_refetches_total", "counter",
         "Fetches back into a tier a copy was evicted from to make room (thrashing).");
  absl::StrAppendFormat(&out, "tierd_refetches_total %d\n", stats.refetches());
  Family(&out, "tierd_thrash_locks_total", "counter", "Tensors the thrash lock pinned where they thrashed.");
  absl::StrAppendFormat(&out, "tierd_thrash_locks_total %d\n", stats.thrash_locks());
  Family(&out, "tierd_thrash_unlocks_total", "counter",
         "Thrash locks let go because a placement needed their room (a lock never makes one fail).");
  absl::StrAppendFormat(&out, "tierd_thrash_unlocks_total %d\n", stats.thrash_unlocks());
  Family(&out, "tierd_sessions", "gauge", "Connected client sessions.");
  absl::StrAppendFormat(&out, "tierd_sessions %d\n", stats.sessions());
  Family(&out, "tierd_leases", "gauge", "Leased tensors.");
  absl::StrAppendFormat(&out, "tierd_leases %d\n", stats.leases());
  if (stats.has_gpu_utilisation_percent()) {
    Family(&out, "tierd_gpu_utilisation_percent", "gauge",
           "The GPU's utilisation over about the last second (NVML: the share of time a kernel ran, every process's).");
    absl::StrAppendFormat(&out, "tierd_gpu_utilisation_percent %.1f\n", stats.gpu_utilisation_percent());
  }
  Family(&out, "tierd_uptime_seconds", "gauge", "Seconds since tierd started.");
  absl::StrAppendFormat(&out, "tierd_uptime_seconds %.3f\n", stats.uptime_seconds());
  // The sessions' training, as their trainers report it (ReportStep), one series a session.
  struct StepGauge {
    const char* name;
    const char* help;
    double (*value)(const v1::SessionSteps&);
  };
  const StepGauge step_gauges[] = {
      {"tierd_session_step", "The last step a session's trainer reported.",
       [](const v1::SessionSteps& s) { return static_cast<double>(s.step()); }},
      {"tierd_session_step_seconds", "The time of that step.",
       [](const v1::SessionSteps& s) { return s.step_seconds(); }},
      {"tierd_session_tokens_per_second", "Tokens a second in that step.",
       [](const v1::SessionSteps& s) { return s.tokens_per_second(); }},
      {"tierd_session_loss", "The last finite loss reported.", [](const v1::SessionSteps& s) { return s.loss(); }},
      {"tierd_session_loss_mean", "The mean of the last (up to) 100 finite losses.",
       [](const v1::SessionSteps& s) { return s.loss_mean(); }},
      {"tierd_session_loss_sd", "Their standard deviation (the loss's variance, as its root).",
       [](const v1::SessionSteps& s) { return s.loss_sd(); }},
      {"tierd_session_skipped_steps", "Steps reported with a non-finite loss.",
       [](const v1::SessionSteps& s) { return static_cast<double>(s.skipped_steps()); }},
  };
  if (stats.session_steps_size() > 0) {
    for (const StepGauge& g : step_gauges) {
      Family(&out, g.name, "gauge", g.help);
      for (const auto& s : stats.session_steps()) {
        absl::StrAppendFormat(&out, "%s{session=\"%d\"} %.9g\n", g.name, s.session_id(), g.value(s));
      }
    }
  }
  return out;
}

int MetricsServer::Handle(mg_connection* connection, void* self) {
  const std::string body = static_cast<MetricsServer*>(self)->render_();
  mg_printf(connection,
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: %zu\r\n"
            "Connection: close\r\n\r\n",
            body.size());
  mg_write(connection, body.data(), body.size());
  return 200;
}

absl::Status CheckListenAddress(const std::string& address) {
  // "PORT", "HOST:PORT" or "[IPv6]:PORT"; HOST a dotted IPv4 address or a name.
  const size_t colon = address.rfind(':');
  const std::string host = colon == std::string::npos ? "" : address.substr(0, colon);
  const std::string port = colon == std::string::npos ? address : address.substr(colon + 1);
  int number = -1;
  if (!absl::SimpleAtoi(port, &number) || number < 0 || number > 65535) {
    return absl::InvalidArgumentError(absl::StrFormat("'%s' is not a port (0-65535)", port));
  }
  if (!host.empty() && host.find_first_not_of("0123456789.") == std::string::npos) {
    in_addr parsed{};
    if (inet_pton(AF_INET, host.c_str(), &parsed) != 1) {
      return absl::InvalidArgumentError(absl::StrFormat("'%s' is not an IPv4 address", host));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(const std::string& address,
                                                                    std::function<std::string()> render) {
  if (absl::Status valid = CheckListenAddress(address); !valid.ok()) {
    return absl::InvalidArgumentError(absl::StrFormat("cannot serve metrics on %s: %s", address, valid.message()));
  }
  std::unique_ptr<MetricsServer> server(new MetricsServer());
  server->render_ = std::move(render);
  mg_init_library(0);
  const char* options[] = {"listening_ports", address.c_str(), "num_threads", "2", nullptr};
  server->context_ = mg_start(nullptr, nullptr, options);
  if (server->context_ == nullptr) {
    return absl::UnavailableError(absl::StrFormat("cannot serve metrics on %s (port in use?)", address));
  }
  mg_set_request_handler(server->context_, "/metrics", &MetricsServer::Handle, server.get());
  mg_server_port ports[4];
  const int count = mg_get_server_ports(server->context_, 4, ports);
  if (count > 0) server->port_ = ports[0].port;
  return server;
}

MetricsServer::~MetricsServer() {
  if (context_ != nullptr) mg_stop(context_);
}

}  // namespace tierd
