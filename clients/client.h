// tierd::Client: the shim a trainer links to lease tensors from tierd.
//
//   auto client = tierd::Client::Connect({.runtime_dir = "/tmp/tierd", .label = "rank0",
//                                         .quota = {8 << 30, 32ull << 30, 100ull << 30}});
//   auto w = (*client)->Lease({"layers.0.w", TensorClass::kParam, DType::kBF16, {4096, 4096}});
//   void* p = *(*client)->Acquire(*w, Access::kWrite, Place::kGpu);  // device pointer
//   ... use p ...
//   (*client)->Release(*w);
//
// Connect says hello on tierd's Unix socket, receives the session's arenas (its DRAM
// shared-memory segment and its GPU pool) and maps them; pointers handed out are into
// those mappings and stay valid until Release. Closing the client (or the process dying)
// ends the session: tierd reclaims every lease. If tierd dies or ends the session, every
// call after that (and one waiting on the ring, within limits::kClientSessionCheckMs)
// fails with UNAVAILABLE saying so: the session's bytes are gone with it.
//
// Thread-safety: calls may come from several threads, each on a ring of its own while the
// session has enough (ClientOptions::rings); a tensor's acquire and release are expected from
// one owner.
#ifndef TIERD_CLIENTS_CLIENT_H_
#define TIERD_CLIENTS_CLIENT_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "ipc/ring.h"
#include "proto/tierd.grpc.pb.h"
#include "runtime/session.h"
#include "runtime/tensor.h"
#include "runtime/tier.h"

namespace tierd {

namespace testing {
class ClientRingPeer;  // tests: ring messages a well-behaved client never sends
}  // namespace testing

struct ClientOptions {
  std::string runtime_dir = "/tmp/tierd";
  std::string label = "client";
  SessionQuota quota;  // all zero: the daemon's default quota
  // Acquire/release through the shared-memory ring (microseconds) rather than gRPC.
  bool use_ring = true;
  // An observer (tierctl, a watcher): leases nothing, holds no quota; its session only
  // proves an allowed uid on listings and administration (AddCallerMetadata).
  bool observer = false;
  // Rings the session asks for (tierd grants 1 to limits::kRingsPerSessionMax): a call takes
  // a free one, so a thread's slow acquire (a demand fetch) does not hold another thread's
  // exchange (an optimizer's update beside the forward's fetches). One per thread that calls.
  int rings = 2;
};

class Client {
 public:
  struct Tensor {
    TensorId id = 0;
    uint64_t bytes = 0;
    std::string name;
  };

  static absl::StatusOr<std::unique_ptr<Client>> Connect(const ClientOptions& options);
  ~Client();

  absl::StatusOr<Tensor> Lease(const TensorSpec& spec);
  absl::Status Unlease(const Tensor& tensor);
  // A pointer to the tensor's bytes at `place`, valid until Release. With a real GPU and
  // Place::kGpu it is a device pointer (CUDA), otherwise a host pointer.
  absl::StatusOr<void*> Acquire(const Tensor& tensor, Access access, Place place);
  absl::Status Release(const Tensor& tensor);
  // Release after the GPU work queued on `cuda_stream` (a cudaStream_t): returns at once;
  // tierd waits for that work (CUDA IPC event) before it moves or reuses the tensor's GPU
  // memory. Without a real GPU or the ring it synchronises the stream, then releases.
  absl::Status Release(const Tensor& tensor, void* cuda_stream);
  // Several tensors at `place` in one exchange with tierd: through the ring, the requests are
  // pushed together and the answers read together, so n tensors cost about one round trip
  // (a host optimizer's update acquires a weight, its gradient and its moments at once). The
  // pointers come back in order. All or none: where tierd refuses one, the ones it granted are
  // released again and the first refusal is returned.
  struct AcquireItem {
    const Tensor* tensor;
    Access access;
  };
  absl::StatusOr<std::vector<void*>> AcquireAll(const std::vector<AcquireItem>& items, Place place);
  // Release(t) for each, in one exchange; every one is tried, the first error returned.
  absl::Status ReleaseAll(const std::vector<const Tensor*>& tensors);
  // Release(t, cuda_stream) for each: one event recorded on the stream covers them all.
  absl::Status ReleaseAll(const std::vector<const Tensor*>& tensors, void* cuda_stream);
  // This process's time in the hot path's ring calls (request to answer) by kind, and in
  // recording release events on streams.
  struct RingTimes {
    int64_t acquires = 0, releases = 0, op_begins = 0;
    double acquire_seconds = 0, release_seconds = 0, op_begin_seconds = 0, event_record_seconds = 0;
  };
  RingTimes ring_times() const;
  // The planner: register the iteration (the ops in order, the tensors each reads, writes
  // and overwrites, by lease name) and get the plan's prediction back; then say which op
  // is about to run (through the ring: microseconds) so tierd moves bytes ahead of it.
  // Acquire overwritten tensors with Access::kOverwrite.
  absl::StatusOr<v1::PlanReply> RegisterGraph(const v1::GraphSpec& graph);
  absl::Status OpBegin(uint32_t op);
  // Or, without a graph: mark each iteration's start. tierd records the first iteration's
  // acquires and releases (an op per run of acquires between releases), plans from them at
  // the second mark, and follows the ops as they are acquired from then on. The reply says
  // which: recording, or the plan's prediction.
  absl::StatusOr<v1::PlanReply> MarkIteration();
  // After each training step: its number (from 1), loss (not finite: a skipped step), seconds
  // and tokens. tierctl stats and Prometheus then show the session's step time, tokens/s and
  // the mean and variance of its last 100 losses beside the tiers'.
  absl::Status ReportStep(int64_t step, double loss, double seconds, double tokens);
  absl::Status Pin(const Tensor& tensor, Tier tier);
  absl::Status Unpin(const Tensor& tensor);
  absl::StatusOr<v1::StatsReply> Stats();
  absl::StatusOr<v1::ListLeasesReply> ListLeases(bool every_session);
  // This session's use of each tier: allocated bytes now and the most since it opened or
  // since the last call with reset_peaks (which restarts the peaks from now).
  absl::StatusOr<v1::SessionUsageReply> Usage(bool reset_peaks);

  uint64_t session_id() const { return session_id_; }
  // The session's id and token on a gRPC call of administration or listing, which tierd
  // serves only to a caller that said hello as an allowed uid.
  void AddCallerMetadata(grpc::ClientContext* context) const;
  // False once tierd closed the session's socket (it died, was stopped, or ended it).
  bool SessionOpen();
  bool fake_gpu() const { return fake_gpu_; }
  // This process's mapping of the session's DRAM arena (every host pointer Acquire returns lies
  // in it), fixed while the client lives: a caller may register it with CUDA once, so copies
  // between the GPU and acquired host tensors run at pinned speed.
  std::pair<void*, uint64_t> dram_arena() const { return {dram_base_, dram_bytes_}; }

 private:
  friend class testing::ClientRingPeer;
  Client() = default;
  absl::Status MapArenas(const v1::HelloReply& reply, std::vector<int>& fds);
  // The error every call returns once the session is gone.
  absl::Status SessionLost() const;
  // A gRPC call's status; UNAVAILABLE because the session is gone says so.
  absl::Status Checked(const grpc::Status& status);
  v1::SessionRef Ref() const;
  using TensorMethod = grpc::Status (v1::Tierd::Stub::*)(grpc::ClientContext*, const v1::TensorRef&,
                                                           v1::Empty*);
  absl::Status TensorCall(TensorMethod method, const Tensor& tensor);
  absl::StatusOr<void*> AcquireRpc(const Tensor& tensor, Access access, Place place);
  absl::Status ReleaseRpc(const Tensor& tensor);
  // One ring and its conversation with the tierd thread that serves it. A call holds its lane
  // for the whole exchange (the rings are single-producer, single-consumer); a release naming
  // an event records it on the lane too, so the event is not recorded again before tierd has
  // made its fence from it. Lane k uses the release events k, k + lanes, ...
  struct Lane {
    ipc::RingSegment* ring = nullptr;
    int index = 0;
    absl::Mutex mutex;
    uint64_t sequence ABSL_GUARDED_BY(mutex) = 0;
    uint32_t next_release_event ABSL_GUARDED_BY(mutex) = 0;
  };
  // A lane for this call, locked: this thread's own if it is free (a thread's calls keep to
  // one ring while there are enough), else any free one, else its own once free.
  Lane& TakeLane() ABSL_NO_THREAD_SAFETY_ANALYSIS;
  // One request, its answer; or the daemon's refusal with its code and words.
  absl::StatusOr<ipc::RingMessage> RingCall(const ipc::RingMessage& request);
  // Requests in one exchange on a lane (pushed kRingSlots at most at a time, answers read in
  // order): each one's answer or refusal.
  std::vector<absl::StatusOr<ipc::RingMessage>> RingCalls(const std::vector<ipc::RingMessage>& requests);
  std::vector<absl::StatusOr<ipc::RingMessage>> RingCallsOn(Lane& lane, const std::vector<ipc::RingMessage>& requests)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(lane.mutex);
  // The answer to the request numbered `sequence`, the next on the lane's response ring.
  absl::StatusOr<ipc::RingMessage> RingAnswer(Lane& lane, uint64_t sequence) ABSL_EXCLUSIVE_LOCKS_REQUIRED(lane.mutex);
  // Releases in one exchange on the lane, each naming `release_event` (1 + a shared event's
  // index; 0: none).
  absl::Status ReleaseOnRing(Lane& lane, const std::vector<const Tensor*>& tensors, uint64_t release_event)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(lane.mutex);
  absl::StatusOr<void*> PointerFor(const Tensor& tensor, Place place, uint64_t arena,
                                   uint64_t offset, uint64_t bytes) const;

  mutable absl::Mutex times_mutex_;
  RingTimes ring_times_ ABSL_GUARDED_BY(times_mutex_);
  int hello_fd_ = -1;
  std::string socket_path_;
  std::atomic<bool> lost_{false};
  uint64_t session_id_ = 0;
  std::string token_;
  bool fake_gpu_ = false;
  uint64_t dram_arena_ = 0, gpu_arena_ = 0;
  uint8_t* dram_base_ = nullptr;
  uint64_t dram_bytes_ = 0;
  uint8_t* gpu_base_ = nullptr;  // fake: our mapping of the memfd; real: imported pool
  uint64_t gpu_bytes_ = 0;
  std::unique_ptr<v1::Tierd::Stub> stub_;
  std::vector<std::unique_ptr<Lane>> lanes_;  // empty: no ring, gRPC
  // Interprocess events shared with tierd at hello (CUDA builds with a GPU), used in turn.
  std::vector<void*> release_events_;  // cudaEvent_t
};

}  // namespace tierd

#endif  // TIERD_CLIENTS_CLIENT_H_
