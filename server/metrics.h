// Prometheus metrics: the daemon's StatsReply rendered in the text exposition format
// (names tierd_*, units last), served at GET /metrics by civetweb when configured.
#ifndef TIERD_RUNTIME_METRICS_H_
#define TIERD_RUNTIME_METRICS_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "proto/tierd.pb.h"

struct mg_context;
struct mg_connection;

namespace tierd {

std::string RenderPrometheus(const v1::StatsReply& stats);

// OK for an address a listener can be given ("PORT", "HOST:PORT"): INVALID_ARGUMENT naming
// what is wrong (a port beyond 65535, a dotted host that is no IPv4 address) instead of a
// failed bind blamed on a port in use.
absl::Status CheckListenAddress(const std::string& address);

class MetricsServer {
 public:
  // `address` as "127.0.0.1:9464" ("127.0.0.1:0" picks a free port). `render` is called
  // on civetweb's threads for each scrape.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(const std::string& address,
                                                              std::function<std::string()> render);
  ~MetricsServer();
  int port() const { return port_; }

 private:
  MetricsServer() = default;
  static int Handle(::mg_connection* connection, void* self);
  mg_context* context_ = nullptr;
  std::function<std::string()> render_;
  int port_ = 0;
};

}  // namespace tierd

#endif  // TIERD_RUNTIME_METRICS_H_
