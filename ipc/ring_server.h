// RingServer: the daemon's side of one session's rings. A thread pops requests, runs
// them through `execute` (the LeaseTable), and pushes the answers. A broken ring (the
// client scribbled over the counters) stops the server and reports it; other sessions
// are unaffected.
#ifndef TIERD_IPC_RING_SERVER_H_
#define TIERD_IPC_RING_SERVER_H_

#include <functional>
#include <thread>

#include "ipc/ring.h"

namespace tierd::ipc {

class RingServer {
 public:
  using Execute = std::function<RingMessage(const RingMessage& request)>;
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
