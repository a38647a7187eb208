#include "ipc/ring_server.h"

#include <thread>

namespace tierd::ipc {

RingServer::RingServer(RingSegment* segment, Execute execute, OnBroken on_broken)
    : segment_(segment), execute_(std::move(execute)), on_broken_(std::move(on_broken)),
      thread_([this] { Run(); }) {}

RingServer::~RingServer() {
  stopping_ = true;
  segment_->closed.store(1, std::memory_order_release);
  RingWake(segment_->requests);
  RingWake(segment_->responses);
  thread_.join();
  UnmapRingSegment(segment_);
}

void RingServer::Run() {
  while (!stopping_) {
    auto request = RingPop(segment_->requests, segment_->closed, /*timeout_ms=*/-1);
    if (!request.ok()) {
      if (request.status().code() == absl::StatusCode::kDataLoss) on_broken_(request.status());
      return;  // closed (by us or the client) or broken
    }
    std::string error;
    const RingMessage response = execute_(*request, &error);
    if (response.code != 0) SetRingErrorText(*segment_, response.sequence, error);
    // The client consumes one answer per request; a full ring means it stopped reading.
    while (!RingPush(segment_->responses, response)) {
      if (stopping_ || segment_->closed.load() != 0) return;
      std::this_thread::yield();
    }
  }
}

}  // namespace tierd::ipc
