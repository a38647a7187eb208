// Collective communication between the ranks of a data-parallel job: the interface the
// trainers use, the slices ZeRO partitions a tensor into, and the traffic each call adds up.
// Backends: MpiCommunicator (CPU ranks, OpenMPI), NcclCommunicator (GPU ranks) and the
// single-process LocalCommunicator (no traffic), so the trainer has one code path.
#ifndef TIERD_COMM_COMMUNICATOR_H_
#define TIERD_COMM_COMMUNICATOR_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace tierd::comm {

// Rank r's part of a tensor of `total` elements: [offset[r], offset[r] + count[r]). Every
// boundary but the last is a multiple of `align` (8-bit optimizer blocks must not straddle
// two ranks), so the last ranks' slices may be shorter or empty.
struct Slices {
  std::vector<int64_t> offset, count;
  static Slices Even(int64_t total, int ranks, int64_t align = 1);
};

// Bytes this rank put on the wire, by the usual algorithms' count (ring all-reduce sends
// 2(N-1)/N of the buffer, reduce-scatter and all-gather (N-1)/N, a gather of fixed blocks
// N-1 blocks), and the time spent inside the calls.
struct CommStats {
  double bytes_sent = 0;
  double seconds = 0;
  int64_t calls = 0;
};

enum class ReduceOp { kSum, kMax, kMin };

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string name() const = 0;  // "mpi", "nccl", "local"

  // In place: every rank ends with the elementwise reduction over ranks.
  virtual absl::Status AllReduce(float* data, int64_t count, ReduceOp op = ReduceOp::kSum) = 0;
  virtual absl::Status AllReduce(double* data, int64_t count, ReduceOp op = ReduceOp::kSum) = 0;
  // In place: the sum over ranks of slice r lands in data[offset[r], +count[r]) of rank r;
  // the rest of `data` is left unspecified.
  virtual absl::Status ReduceScatterSum(float* data, const Slices& slices) = 0;
  // In place: each rank's slice r (of its own `data`) is copied into every rank's data.
  virtual absl::Status AllGather(float* data, const Slices& slices) = 0;
  // `bytes` from each rank into out[rank * bytes, +bytes) on every rank (out includes ours).
  virtual absl::Status AllGatherBytes(const void* in, void* out, int64_t bytes) = 0;
  virtual absl::Status Barrier() = 0;

  const CommStats& stats() const { return stats_; }

 protected:
  void Account(double bytes_sent, double seconds) {
    stats_.bytes_sent += bytes_sent;
    stats_.seconds += seconds;
    ++stats_.calls;
  }

 private:
  CommStats stats_;
};

// One process: every collective is the identity and sends nothing.
std::unique_ptr<Communicator> MakeLocalCommunicator();

}  // namespace tierd::comm

#endif  // TIERD_COMM_COMMUNICATOR_H_
