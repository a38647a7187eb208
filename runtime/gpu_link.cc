#include "runtime/gpu_link.h"

#include "base/limits.h"

namespace tierd {

GpuLink::GpuLink(CopyDirection direction, std::unique_ptr<CopyStream> stream, Clock& clock)
    : direction_(direction), stream_(std::move(stream)), meter_(clock), worker_([this] { Run(); }) {}

GpuLink::~GpuLink() {
  Drain();
  {
    absl::MutexLock lock(&mutex_);
    stopping_ = true;
  }
  worker_.join();
}

void GpuLink::Enqueue(void* dst, const void* src, uint64_t bytes, MoveCallback done) {
  absl::MutexLock lock(&mutex_);
  auto has_room = [this]() ABSL_SHARED_LOCKS_REQUIRED(mutex_) {
    return queue_.size() < limits::kMovesQueuedPerLinkMax;
  };
  mutex_.Await(absl::Condition(&has_room));
  queue_.push_back(Move{dst, src, bytes, std::move(done)});
  ++unfinished_;
  unfinished_bytes_ += bytes;
}

void GpuLink::Drain() {
  absl::MutexLock lock(&mutex_);
  auto drained = [this]() ABSL_SHARED_LOCKS_REQUIRED(mutex_) { return unfinished_ == 0; };
  mutex_.Await(absl::Condition(&drained));
}

void GpuLink::Complete(Move& move) {
  absl::Status status = stream_->WaitFence(move.fence);
  meter_.End(move.bytes, status.ok());
  // The bytes are off the link once the copy ends, before its callback runs: a caller woken by
  // the callback that asks for room must not see its own finished copy (mover bounces).
  {
    absl::MutexLock lock(&mutex_);
    unfinished_bytes_ -= move.bytes;
  }
  move.done(std::move(status));
  absl::MutexLock lock(&mutex_);
  --unfinished_;
}

void GpuLink::Run() {
  std::deque<Move> in_flight;
  for (;;) {
    // Issue while the stream has room, then complete the oldest copy.
    {
      absl::MutexLock lock(&mutex_);
      auto ready = [this, &in_flight]() ABSL_SHARED_LOCKS_REQUIRED(mutex_) {
        return !in_flight.empty() || !queue_.empty() || stopping_;
      };
      mutex_.Await(absl::Condition(&ready));
      if (in_flight.empty() && queue_.empty()) return;  // stopping, drained
      while (!queue_.empty() && in_flight.size() < limits::kGpuCopiesInFlightMax) {
        in_flight.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
    }
    for (Move& move : in_flight) {
      if (move.fence != 0) continue;  // already issued
      meter_.Begin();
      absl::Status status = stream_->CopyAsync(move.dst, move.src, move.bytes, direction_);
      auto fence = stream_->RecordFence();
      if (!status.ok() || !fence.ok()) {
        // Not issued: fail this move alone (its fence is 0, so it completes at once).
        meter_.End(move.bytes, false);
        {
          absl::MutexLock lock(&mutex_);
          unfinished_bytes_ -= move.bytes;
        }
        move.done(status.ok() ? fence.status() : status);
        move.done = nullptr;
        absl::MutexLock lock(&mutex_);
        --unfinished_;
        continue;
      }
      move.fence = *fence;
    }
    // Drop the moves that failed to issue, then complete the oldest.
    std::erase_if(in_flight, [](const Move& move) { return move.done == nullptr; });
    if (in_flight.empty()) continue;
    Complete(in_flight.front());
    in_flight.pop_front();
  }
}

}  // namespace tierd
