// The daemon's side of the hot path: a request decoded from either door (ipc/hot_path_wire.h)
// served on the SessionService, and the answer encoded for the door it came through.
#ifndef TIERD_IPC_HOT_PATH_DOOR_H_
#define TIERD_IPC_HOT_PATH_DOOR_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "ipc/hot_path_wire.h"
#include "runtime/session_service.h"

namespace tierd::ipc {

// An acquire's placement; a release or an op's start answers an empty Placement. `fence`:
// a release's wait for the client's GPU work (the ring's door makes it from the event).
absl::StatusOr<Placement> Serve(SessionService& service, SessionId session, const HotPathRequest& request,
                                std::unique_ptr<GpuFence> fence = nullptr);

// The answer on the ring: the status code in `response`, its words in `error`, and an
// acquire's placement.
void AnswerOnRing(const absl::StatusOr<Placement>& served, RingMessage* response, std::string* error);
void ToReply(const Placement& placement, v1::AcquireReply* reply);

}  // namespace tierd::ipc

#endif  // TIERD_IPC_HOT_PATH_DOOR_H_
