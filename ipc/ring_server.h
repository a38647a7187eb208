// RingServer: the daemon's side of one session's rings. A thread pops requests, runs
// them through `execute` (the LeaseTable), and pushes the answers. A broken ring (the
// client scribbled over the counters) stops the server and reports it; other sessions
// are unaffected.
#ifndef TIERD_IPC_RING_SERVER_H_
#define TIERD_IPC_RING_SERVER_H_

#include <functional>
#include <string>
#include <thread>

#include "ipc/ring.h"

namespace tierd::ipc {

class RingServer {
 public:
  // The answer to `request`; with a nonzero code, `error` says why (sent in the segment).
  using Execute = std::function<RingMessage(const RingMessage& request, std::string* error)>;
  using OnBroken = std::function<void(const absl::Status& why)>;

  // Takes ownership of the mapping `segment`.
  RingServer(RingSegment* segment, Execute execute, OnBroken on_broken);
  ~RingServer();  // closes the rings, wakes and joins the thread, unmaps

 private:
  void Run();
  RingSegment* segment_;
  Execute execute_;
  OnBroken on_broken_;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

}  // namespace tierd::ipc

#endif  // TIERD_IPC_RING_SERVER_H_
