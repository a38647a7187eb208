// Learning a session's iteration by watching it, for clients that do not register a graph:
// between two iteration marks, every acquire and release in order, with times; then the
// graph the planner takes. An op is a run of acquires: a new op begins with the first
// acquire after a mark or after a release (the tensors a client holds together are one
// op); it reads, read-modify-writes or overwrites what it acquired (as the acquires said),
// and it lasts until the next op begins (the last one until the closing mark). A session
// that acquires both on the GPU and on the host (a GPU trainer with its optimizer on the
// CPU) gets its host acquires as host uses; one that only acquires on the host, a host
// graph (DRAM over NVMe). After the
// recording, the same rule numbers the ops of later iterations as they run, so the executor
// follows without the client naming its ops; each mark restarts the count at op 0.
//
// Thread-compatible: the owner serialises calls.
#ifndef TIERD_PREFETCHER_RECORDER_H_
#define TIERD_PREFETCHER_RECORDER_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "base/access.h"
#include "prefetcher/graph.h"

namespace tierd::prefetcher {

class IterationRecorder {
 public:
  enum class Phase { kWaiting, kRecording, kFollowing };

  // An iteration boundary at `nanos`: the first starts the recording, the second ends it
  // (MakeGraph has it from then on), later ones restart the op count.
  void Mark(int64_t nanos);
  // While following: the index of the op this acquire begins, if it begins one.
  std::optional<uint32_t> Acquired(uint64_t tensor, Access touch, bool host, int64_t nanos);
  void Released(uint64_t tensor);

  Phase phase() const { return phase_; }
  uint32_t ops() const { return static_cast<uint32_t>(ops_.size()); }

  struct TensorInfo {
    std::string name;
    uint64_t bytes = 0;
  };
  // The recorded iteration as a graph. `describe` names a tensor id and gives its size;
  // tensors it does not know (unleased since) are left out, and ops left with nothing are
  // kept (their time still passes). FAILED_PRECONDITION before the recording ended or when
  // it saw no acquire.
  absl::StatusOr<Graph> MakeGraph(const std::function<std::optional<TensorInfo>(uint64_t)>& describe) const;

 private:
  struct RecordedOp {
    int64_t start_nanos = 0;
    struct Touched {
      uint64_t tensor;
      Access touch;
      bool host;  // acquired on the host
    };
    std::vector<Touched> touched;  // in first-acquire order, once each
  };
  bool BeginsOp();

  Phase phase_ = Phase::kWaiting;
  std::vector<RecordedOp> ops_;
  int64_t end_nanos_ = 0;
  bool host_seen_ = false, gpu_seen_ = false;
  bool after_release_ = true;  // the next acquire begins an op
  uint32_t next_op_ = 0;       // following: the index the next op start gets
};

}  // namespace tierd::prefetcher

#endif  // TIERD_PREFETCHER_RECORDER_H_
