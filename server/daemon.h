// Daemon: tierd assembled. Owns the GPU, the TierStore (node budgets), the Mover, the
// LeaseTable, the Unix-socket hello server and the gRPC server, and turns a client's
// hello into a session with its own GPU and DRAM arenas.
//
// Files it makes in runtime_dir: tierd.sock (hello, 0600) and tierd.grpc.sock (gRPC,
// 0600); both are removed at shutdown. TCP gRPC only when grpc_tcp_address is set.
#ifndef TIERD_RUNTIME_DAEMON_H_
#define TIERD_RUNTIME_DAEMON_H_

#include <sys/types.h>

#include <atomic>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "base/limits.h"
#include "ipc/hello_server.h"
#include "ipc/ring_server.h"
#include "ipc/tierd_service.h"
#include "prefetcher/recorder.h"
#include "prefetcher/simulate.h"
#include "runtime/gpu_factory.h"
#include "base/gpu_utilisation.h"
#include "runtime/lease_table.h"
#include "runtime/mover.h"
#include "server/planned_session.h"
#include "runtime/session_service.h"
#include "runtime/tier_store.h"
#include "server/metrics.h"

namespace grpc {
class Server;
}

namespace tierd {

namespace ipc {
class SessionDirectory;
class TierdService;
}  // namespace ipc

struct DaemonOptions {
  GpuOptions gpu;
  TierStoreOptions store;  // budgets; default_arenas is forced off
  int nvme_queue_depth = limits::kNvmeQueueDepthDefault;
  uint64_t nvme_chunk_bytes = limits::kNvmeChunkBytesDefault;
  // Copies moved within the GPU to join free space, up to this size, go through pinned host
  // memory on the PCIe links instead of a device copy (MoverOptions::gpu_bounce_bytes); 0: never.
  uint64_t gpu_join_bounce_bytes = 0;
  std::string runtime_dir = "/tmp/tierd";
  // e.g. "127.0.0.1:7070"; a bare port (":7070" or "7070") binds loopback only; empty: off.
  std::string grpc_tcp_address;
  // A TCP address beyond loopback is refused unless this is set (anyone who reaches it can
  // read the node's statistics, and with a session's token call on its tensors).
  bool grpc_tcp_public = false;
  std::string metrics_address;   // e.g. "127.0.0.1:9464" for Prometheus; empty: off
  std::set<uid_t> allowed_uids;  // empty: the daemon's own uid
  // With a group, the runtime directory becomes 0750 and both sockets 0660 of that group,
  // so allowed users of other uids (members of it) can connect; without, all is private.
  std::optional<gid_t> socket_group;
  std::vector<PinRule> pins;
  std::vector<PriorityRule> priorities;  // eviction priorities by name (config `priorities:`)
  // config `thrash:`; the lock on by default in the daemon (the library's default is off): on
  // tierd's online policy it took a 1.3B run at 11 GiB from 21,267 to 23,610 tokens/s.
  ThrashOptions thrash = ThrashOptions{.lock = true};
  // Used for a hello that asks for no quota at all.
  SessionQuota default_quota;
  // Sessions served at once; one more hello is refused with RESOURCE_EXHAUSTED.
  uint32_t max_sessions = 64;
  // The link speeds the planner plans with (defaults: the lent H200 machine's).
  prefetcher::LinkModel planner_links;
  // Also try hoisted loads and victims chosen by time when planning a session
  // (prefetcher::TimeAwareStyles; planbench --time_aware), not only MIN and exclusive loads.
  bool planner_time_aware = false;
  // A planned load waits for its layout range while the tensors planned there before it hold
  // it, instead of going elsewhere (LeaseTable::SetLayoutWait).
  bool planner_layout_wait = false;
  // A planned load issues at most this many ops before the op it serves (-1: up to a lap
  // ahead; prefetcher::ExecutorOptions::load_lead_ops).
  int planner_load_lead_ops = -1;
  // When a plan starts, the session's GPU copies go to the layout's offsets or leave the GPU
  // (LeaseTable::SettleIntoLayout).
  bool planner_settle_layout = true;
  // And after each replan (PlanningOptions::settle_after_replan; an experiment, off).
  bool planner_settle_after_replan = false;
  // Measured op times this far from the plan's (mean relative difference over a lap) replan
  // (prefetcher::ExecutorOptions::replan_drift).
  double planner_replan_drift = 0.25;
  // PlanningOptions::keep_plan_margin.
  double planner_keep_plan_margin = 0.05;
  // What a session's plan leaves free of its quotas for fragmentation (PlanningHeadroom):
  // DRAM one of the largest tensors, not three: the tiers join fragmented room by moving
  // copies, so more held back only shrinks what the plan can keep (the 7B trainer on the
  // H200 ran 10% faster a step with one).
  PlanningHeadroom planner_headroom;
  // How long one graph may take to plan (RegisterGraph, or a recorded iteration): beyond it
  // the planning stops and the request is refused with DEADLINE_EXCEEDED and the graph's size.
  // The planner runs off the request thread, at most kPlanningMax graphs at once.
  double planner_deadline_seconds = 60;
};

// Removes /dev/shm segments named "tierd-..." that no live process holds (left by a
// daemon that was killed; see DramSegment's lock). Returns how many. Start() runs it first.
int SweepStaleSegments(const std::string& shm_directory);

class PlannedSession;

inline constexpr size_t kObserversMax = 64;
// Graphs planned at once (each on its own thread, two cores' worth of work at most per
// client); one more is refused with RESOURCE_EXHAUSTED.
inline constexpr size_t kPlanningMax = 4;
inline constexpr SessionId kFirstObserverId = SessionId{1} << 48;

class Daemon : public ipc::HelloHandler, public ipc::PlannerHooks, public HotPathObserver {
 public:
  static absl::StatusOr<std::unique_ptr<Daemon>> Start(const DaemonOptions& options);
  // Ends every session, stops the servers, drains the mover, removes sockets and segments.
  ~Daemon() override;

  const std::string& hello_path() const { return hello_path_; }
  const std::string& grpc_address() const { return grpc_address_; }
  int metrics_port() const;
  // Several lines: where it listens, the GPU, each tier's budget.
  std::string Banner() const;
  // The hot path's requests served so far and the daemon's time in each (the ring's GPU
  // fences apart), for the log at shutdown.
  std::string HotPathSummary() const;

  absl::StatusOr<ipc::HelloGrant> OnHello(const ipc::PeerCredentials& peer, const v1::HelloRequest& request) override;
  void OnGoodbye(uint64_t session_id) override;

  // The planner (daemon_planner.cc): a session's graph, its progress (OpBegin, Acquired,
  // Released: HotPathObserver, told by SessionService), its plan.
  absl::StatusOr<v1::PlanReply> RegisterGraph(SessionId session, const v1::GraphSpec& graph) override;
  absl::Status OpBegin(SessionId session, uint32_t op) override;
  absl::StatusOr<v1::PlanReply> GetPlan(SessionId session, const std::string& explain, bool trace, bool graph) override;
  void PinsChanged(SessionId session) override;
  absl::StatusOr<v1::PlanReply> MarkIteration(SessionId session) override;
  void Acquired(SessionId session, TensorId tensor, Access access, Place place, int64_t waited_nanos) override;
  // An acquire this long held the client up (a hit takes microseconds).
  static constexpr int64_t kAcquireWaitWorthNoting = 50'000;
  void Released(SessionId session, TensorId tensor) override;

 private:
  void LogSessionOpened(SessionId id, const std::string& label, const SessionQuota& quota, double seconds);
  Daemon() = default;
  absl::Status StartServers();
  // `events`: the session's release events (its entry in release_events_, whose address holds
  // while its rings are served: the ring threads never look the map up while the hello thread
  // adds other sessions to it).
  ipc::RingMessage ServeRing(SessionId session, const std::vector<std::unique_ptr<ImportedEvent>>& events,
                             const ipc::RingMessage& request, std::string* error);
  // A ring release's wait for the client's GPU work: 1 + the index of the event it shared at its
  // hello, recorded after that work (0: none, nullptr).
  absl::StatusOr<std::unique_ptr<GpuFence>> ReleaseFence(const std::vector<std::unique_ptr<ImportedEvent>>& events,
                                                         uint64_t event);

  DaemonOptions options_;
  OpenedGpu gpu_;
  std::unique_ptr<GpuUtilisation> gpu_utilisation_;  // null: no NVML, or the fake GPU
  std::unique_ptr<TierStore> store_;
  std::unique_ptr<Mover> mover_;
  std::unique_ptr<LeaseTable> leases_;
  std::atomic<int64_t> fences_{0}, fence_nanos_{0};  // ring releases' FenceAfter
  std::unique_ptr<SessionService> hot_path_;  // the ring's and gRPC's acquires, releases and ops
  std::unique_ptr<ipc::SessionDirectory> directory_;
  std::unique_ptr<ipc::TierdService> service_;
  std::unique_ptr<grpc::Server> grpc_server_;
  std::unique_ptr<ipc::HelloServer> hello_server_;
  std::unique_ptr<MetricsServer> metrics_;
  // Plans `graph` for the session under its quotas and starts its executor (replacing a
  // previous plan): RegisterGraph's and a recording's common path.
  absl::StatusOr<v1::PlanReply> PlanGraph(SessionId session, prefetcher::Graph graph);
  bool HasPlan(SessionId session);
  // Graphs being planned off their request threads (daemon_planner.cc); each job's thread is
  // joined once done, by the next PlanGraph or the destructor (which cancels them first).
  struct PlanningJob;
  absl::Mutex planning_mutex_;
  std::vector<std::shared_ptr<PlanningJob>> planning_ ABSL_GUARDED_BY(planning_mutex_);
  bool planning_stopped_ ABSL_GUARDED_BY(planning_mutex_) = false;  // the destructor began
  void JoinPlanning(bool all);
  void StopPlanning();  // cancels them all and plans no more
  absl::Mutex recorders_mutex_;
  // Sessions that mark iterations instead of registering a graph.
  std::map<SessionId, std::unique_ptr<prefetcher::IterationRecorder>> recorders_ ABSL_GUARDED_BY(recorders_mutex_);
  // !recorders_.empty(), readable without the lock: the acquire/release hot path of every
  // session checks it before taking recorders_mutex_ (no session records: no lock at all).
  std::atomic<bool> recording_{false};
  void RecordersChanged() ABSL_EXCLUSIVE_LOCKS_REQUIRED(recorders_mutex_) {
    recording_.store(!recorders_.empty(), std::memory_order_release);
  }
  absl::Mutex planned_mutex_;
  std::map<SessionId, std::shared_ptr<PlannedSession>> planned_ ABSL_GUARDED_BY(planned_mutex_);
  std::string hello_path_;
  std::string grpc_path_;
  std::string grpc_address_;
  uint64_t hellos_ = 0;  // hello thread only
  // Observer sessions (a token, nothing leased), by id; their ids start far above any the
  // lease table hands out, so the two never meet. Hello thread only.
  std::set<SessionId> observers_;
  SessionId next_observer_ = kFirstObserverId;
  int stale_segments_removed_ = 0;
  // Each session's hot-path servers, a thread each. Hello thread only (and the destructor after it).
  std::map<uint64_t, std::vector<std::unique_ptr<ipc::RingServer>>> rings_;
  // Each session's release events, opened here. Written by the hello thread before the
  // session's rings start and erased after they stop; the ring threads hold their session's
  // entry (a map's elements stay put) and never look the map up.
  std::map<uint64_t, std::vector<std::unique_ptr<ImportedEvent>>> release_events_;
};

}  // namespace tierd

#endif  // TIERD_RUNTIME_DAEMON_H_
