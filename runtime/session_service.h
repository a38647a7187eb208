// The hot path's requests — acquire, release, an op's start — done once for both of the
// daemon's doors: the shared-memory ring (Daemon::ServeRing) and gRPC (ipc::TierdService)
// only decode a request, call here and encode the answer. An acquire is LeaseTable::Acquire,
// timed, then told to the planner; a release (after the client's GPU fence, if it gave one)
// likewise; an op's start goes to the planner.
//
// Thread-safe as LeaseTable is; the observer's calls must be too.
#ifndef TIERD_RUNTIME_SESSION_SERVICE_H_
#define TIERD_RUNTIME_SESSION_SERVICE_H_

#include <atomic>
#include <string>

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "base/access.h"
#include "base/clock.h"
#include "runtime/gpu_device.h"
#include "runtime/lease_table.h"
#include "runtime/session.h"

namespace tierd {

// What the planner (the daemon) hears of the hot path: every successful acquire and release
// of a session in order, and each op's start.
class HotPathObserver {
 public:
  virtual ~HotPathObserver() = default;
  virtual absl::Status OpBegin(SessionId session, uint32_t op) = 0;
  // `waited_nanos`: how long the acquire took (a fetch, or a planned move it waited for).
  virtual void Acquired(SessionId session, TensorId tensor, Access access, Place place, int64_t waited_nanos) = 0;
  virtual void Released(SessionId session, TensorId tensor) = 0;
};

// How long the daemon spent doing each kind of hot-path request (the lease table's answer
// and the planner's hook; an acquire's wait for bytes included), all sessions together.
struct HotPathTimes {
  int64_t acquires = 0, releases = 0, op_begins = 0;
  double acquire_seconds = 0, release_seconds = 0, op_begin_seconds = 0;
  std::string Describe() const;  // "acquire 1200 x 3.1 us, release ..."
};

class SessionService {
 public:
  SessionService(LeaseTable& leases, Clock& clock) : leases_(leases), clock_(clock) {}

  // Once, before serving; without one OpBegin is UNIMPLEMENTED and nothing is reported.
  void set_observer(HotPathObserver* observer) { observer_ = observer; }

  absl::StatusOr<Placement> Acquire(SessionId session, TensorId tensor, Access access, Place place);
  absl::Status Release(SessionId session, TensorId tensor, std::unique_ptr<GpuFence> fence = nullptr);
  absl::Status OpBegin(SessionId session, uint32_t op);
  HotPathTimes times() const;

 private:
  void Count(int kind, int64_t start);
  // Counts and nanoseconds: acquire, release, op begin.
  std::atomic<int64_t> count_[3] = {}, nanos_[3] = {};
  LeaseTable& leases_;
  Clock& clock_;
  HotPathObserver* observer_ = nullptr;
};

}  // namespace tierd

#endif  // TIERD_RUNTIME_SESSION_SERVICE_H_
