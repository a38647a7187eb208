// GpuLink: one direction of the host<->GPU link. A worker thread takes moves from a
// bounded queue, issues each as one async copy on its own CopyStream (its own copy
// engine, so both directions run at once), keeps up to kGpuCopiesInFlightMax copies
// queued on the stream so the engine never idles between moves, and runs each move's
// callback once its fence has passed.
//
// Thread-safe: Enqueue and Drain from any thread; callbacks run on the worker.
#ifndef TIERD_RUNTIME_GPU_LINK_H_
#define TIERD_RUNTIME_GPU_LINK_H_

#include <deque>
#include <functional>
#include <memory>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "runtime/gpu_device.h"
#include "runtime/link_meter.h"

namespace tierd {

using MoveCallback = std::function<void(absl::Status)>;

class GpuLink {
 public:
  GpuLink(CopyDirection direction, std::unique_ptr<CopyStream> stream, Clock& clock);
  ~GpuLink();  // drains, then stops the worker

  // Blocks while kMovesQueuedPerLinkMax moves are queued (backpressure).
  void Enqueue(void* dst, const void* src, uint64_t bytes, MoveCallback done);
  // Returns when every move enqueued so far has completed (callbacks included).
  void Drain();
  LinkStats Stats() const { return meter_.Stats(); }
  // Bytes enqueued whose copies have not ended yet (a callback may still be running): how long
  // a move enqueued now waits.
  uint64_t UnfinishedBytes() const {
    absl::MutexLock lock(&mutex_);
    return unfinished_bytes_;
  }

 private:
  struct Move {
    void* dst;
    const void* src;
    uint64_t bytes;
    MoveCallback done;
    uint64_t fence = 0;
  };
  void Run();
  void Complete(Move& move);

  const CopyDirection direction_;
  std::unique_ptr<CopyStream> stream_;
  LinkMeter meter_;
  mutable absl::Mutex mutex_;
  std::deque<Move> queue_ ABSL_GUARDED_BY(mutex_);
  uint64_t unfinished_ ABSL_GUARDED_BY(mutex_) = 0;  // enqueued, callback not yet run
  uint64_t unfinished_bytes_ ABSL_GUARDED_BY(mutex_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mutex_) = false;
  std::thread worker_;
};

}  // namespace tierd

#endif  // TIERD_RUNTIME_GPU_LINK_H_
