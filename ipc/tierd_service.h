// TierdService: the gRPC control plane over the LeaseTable. Every session call is
// checked against the session's secret token (handed out only on the Unix socket, to
// the uid-checked peer), so one session can never touch another's tensors.
//
// Thread-safety: gRPC calls it from many threads; everything it touches is thread-safe.
#ifndef TIERD_IPC_TIERD_SERVICE_H_
#define TIERD_IPC_TIERD_SERVICE_H_

#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "base/clock.h"
#include "ipc/step_board.h"
#include "proto/tierd.grpc.pb.h"
#include "base/gpu_utilisation.h"
#include "runtime/lease_table.h"
#include "runtime/mover.h"
#include "runtime/session_service.h"
#include "runtime/tier_store.h"

namespace tierd::ipc {

inline constexpr size_t kSessionTokenBytes = 16;

// Session id -> token. Thread-safe.
class SessionDirectory {
 public:
  void Add(SessionId session, std::string token);
  void Remove(SessionId session);
  // PERMISSION_DENIED for an unknown session or a wrong token (constant-time compare).
  absl::Status Check(const v1::SessionRef& ref) const;

 private:
  mutable absl::Mutex mutex_;
  std::map<SessionId, std::string> tokens_ ABSL_GUARDED_BY(mutex_);
};

// The planner's entry points, implemented by the daemon (which owns the sessions' plans);
// the hot path's (acquires, releases, ops) go through SessionService.
class PlannerHooks {
 public:
  virtual ~PlannerHooks() = default;
  virtual absl::StatusOr<v1::PlanReply> RegisterGraph(SessionId session, const v1::GraphSpec& graph) = 0;
  virtual absl::StatusOr<v1::PlanReply> GetPlan(SessionId session, const std::string& explain, bool trace,
                                                bool graph) = 0;
  // A tensor of the session was pinned or unpinned: its plan must follow.
  virtual void PinsChanged(SessionId session) = 0;
  // An iteration boundary (the session records its iteration instead of registering it).
  virtual absl::StatusOr<v1::PlanReply> MarkIteration(SessionId session) = 0;
};

class TierdService final : public v1::Tierd::Service {
 public:
  TierdService(LeaseTable& leases, SessionService& hot_path, TierStore& store, Mover& mover, SessionDirectory& sessions,
               Clock& clock, std::string gpu_description)
      : leases_(leases),
        hot_path_(hot_path),
        store_(store),
        mover_(mover),
        sessions_(sessions),
        clock_(clock),
        gpu_description_(std::move(gpu_description)),
        started_nanos_(clock.NowNanos()) {}

  grpc::Status Lease(grpc::ServerContext*, const v1::LeaseRequest*, v1::LeaseReply*) override;
  grpc::Status Unlease(grpc::ServerContext*, const v1::TensorRef*, v1::Empty*) override;
  grpc::Status Acquire(grpc::ServerContext*, const v1::AcquireRequest*, v1::AcquireReply*) override;
  grpc::Status Release(grpc::ServerContext*, const v1::TensorRef*, v1::Empty*) override;
  grpc::Status MarkIteration(grpc::ServerContext*, const v1::MarkIterationRequest*, v1::PlanReply*) override;
  grpc::Status Pin(grpc::ServerContext*, const v1::PinRequest*, v1::Empty*) override;
  grpc::Status Unpin(grpc::ServerContext*, const v1::TensorRef*, v1::Empty*) override;
  grpc::Status ListLeases(grpc::ServerContext*, const v1::ListLeasesRequest*,
                          v1::ListLeasesReply*) override;
  grpc::Status Stats(grpc::ServerContext*, const v1::Empty*, v1::StatsReply*) override;
  grpc::Status ReportStep(grpc::ServerContext*, const v1::StepReport*, v1::Empty*) override;
  grpc::Status SessionUsage(grpc::ServerContext*, const v1::SessionUsageRequest*, v1::SessionUsageReply*) override;
  grpc::Status Health(grpc::ServerContext*, const v1::Empty*, v1::HealthReply*) override;
  grpc::Status AdminPin(grpc::ServerContext*, const v1::AdminPinRequest*, v1::Empty*) override;
  grpc::Status GetConfig(grpc::ServerContext*, const v1::Empty*, v1::ConfigReply*) override;
  grpc::Status RegisterGraph(grpc::ServerContext*, const v1::RegisterGraphRequest*, v1::PlanReply*) override;
  grpc::Status OpBegin(grpc::ServerContext*, const v1::OpBeginRequest*, v1::Empty*) override;
  grpc::Status GetPlan(grpc::ServerContext*, const v1::GetPlanRequest*, v1::PlanReply*) override;

  // Shown by GetConfig (set once, before serving).
  void set_config_text(std::string text) { config_text_ = std::move(text); }
  // Set once, before serving; without it the planner calls are UNIMPLEMENTED.
  void set_planner(PlannerHooks* planner) { planner_ = planner; }
  // Set once, before serving: the GPU's utilisation for Stats (none: not reported).
  void set_gpu_utilisation(GpuUtilisation* util) { gpu_utilisation_ = util; }
  // The session has ended: its steps leave Stats.
  void SessionEnded(SessionId session) { steps_.Forget(session); }

 private:
  LeaseTable& leases_;
  SessionService& hot_path_;
  TierStore& store_;
  Mover& mover_;
  SessionDirectory& sessions_;
  Clock& clock_;
  const std::string gpu_description_;
  const int64_t started_nanos_;
  std::string config_text_;
  PlannerHooks* planner_ = nullptr;
  GpuUtilisation* gpu_utilisation_ = nullptr;
  StepBoard steps_;
};

}  // namespace tierd::ipc

#endif  // TIERD_IPC_TIERD_SERVICE_H_
