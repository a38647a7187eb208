#include "comm/mpi_communicator.h"

#include <mpi.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "absl/strings/str_format.h"
#include "base/units.h"

namespace tierd::comm {
namespace {

using Clock = std::chrono::steady_clock;

MPI_Op ToMpi(ReduceOp op) {
  switch (op) {
    case ReduceOp::kMax:
      return MPI_MAX;
    case ReduceOp::kMin:
      return MPI_MIN;
    case ReduceOp::kSum:
      break;
  }
  return MPI_SUM;
}

std::string ErrorString(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  return std::string(text, static_cast<size_t>(length));
}

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(const MpiOptions& options, int rank, int size) : options_(options), rank_(rank), size_(size) {}
  ~MpiCommunicator() override {
    // A communicator that timed out leaves requests MPI cannot finish: do not wait for them.
    if (!broken_) MPI_Finalize();
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "mpi"; }

  absl::Status AllReduce(float* data, int64_t count, ReduceOp op) override {
    return Run("all-reduce", count * 4.0, 2.0 * (size_ - 1) / size_, [&](MPI_Request* r) {
      return MPI_Iallreduce(MPI_IN_PLACE, data, static_cast<int>(count), MPI_FLOAT, ToMpi(op), MPI_COMM_WORLD, r);
    });
  }
  absl::Status AllReduce(double* data, int64_t count, ReduceOp op) override {
    return Run("all-reduce", count * 8.0, 2.0 * (size_ - 1) / size_, [&](MPI_Request* r) {
      return MPI_Iallreduce(MPI_IN_PLACE, data, static_cast<int>(count), MPI_DOUBLE, ToMpi(op), MPI_COMM_WORLD, r);
    });
  }
  absl::Status ReduceScatterSum(float* data, const Slices& slices) override {
    std::vector<int> counts(slices.count.begin(), slices.count.end());
    int64_t total = 0;
    for (int64_t c : slices.count) total += c;
    // MPI's in-place reduce-scatter puts rank r's result at the buffer's start: move it.
    const int r = rank_;
    absl::Status s = Run("reduce-scatter", total * 4.0, (size_ - 1.0) / size_, [&](MPI_Request* q) {
      return MPI_Ireduce_scatter(MPI_IN_PLACE, data, counts.data(), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD, q);
    });
    if (s.ok() && slices.offset[r] != 0 && slices.count[r] > 0) {
      std::memmove(data + slices.offset[r], data, static_cast<size_t>(slices.count[r]) * sizeof(float));
    }
    return s;
  }
  absl::Status AllGather(float* data, const Slices& slices) override {
    std::vector<int> counts(slices.count.begin(), slices.count.end());
    std::vector<int> offsets(slices.offset.begin(), slices.offset.end());
    int64_t total = 0;
    for (int64_t c : slices.count) total += c;
    return Run("all-gather", total * 4.0, (size_ - 1.0) / size_, [&](MPI_Request* q) {
      return MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, data, counts.data(), offsets.data(), MPI_FLOAT,
                             MPI_COMM_WORLD, q);
    });
  }
  absl::Status AllGatherBytes(const void* in, void* out, int64_t bytes) override {
    return Run("all-gather", bytes * static_cast<double>(size_), (size_ - 1.0) / size_, [&](MPI_Request* q) {
      return MPI_Iallgather(in, static_cast<int>(bytes), MPI_BYTE, out, static_cast<int>(bytes), MPI_BYTE,
                            MPI_COMM_WORLD, q);
    });
  }
  absl::Status Barrier() override {
    return Run("barrier", 0, 0, [&](MPI_Request* q) { return MPI_Ibarrier(MPI_COMM_WORLD, q); });
  }

 private:
  // Starts the call, then waits for it with a deadline; polling yields the core (the ranks
  // of a CPU job share cores with their own compute threads).
  template <typename Start>
  absl::Status Run(const char* what, double buffer_bytes, double wire_share, Start start) {
    if (broken_) return absl::FailedPreconditionError("MPI communicator unusable after an earlier failure");
    const auto t0 = Clock::now();
    MPI_Request request;
    if (int rc = start(&request); rc != MPI_SUCCESS) {
      return absl::InternalError(absl::StrFormat("rank %d: MPI %s: %s", rank_, what, ErrorString(rc)));
    }
    int done = 0;
    for (int spins = 0;; ++spins) {
      if (int rc = MPI_Test(&request, &done, MPI_STATUS_IGNORE); rc != MPI_SUCCESS) {
        broken_ = true;
        return absl::UnavailableError(absl::StrFormat("rank %d: MPI %s of %s: %s", rank_, what,
                                                      FormatBytes(static_cast<uint64_t>(buffer_bytes)),
                                                      ErrorString(rc)));
      }
      if (done) break;
      const double waited = std::chrono::duration<double>(Clock::now() - t0).count();
      if (waited > options_.timeout_seconds) {
        broken_ = true;
        return absl::DeadlineExceededError(absl::StrFormat(
            "rank %d of %d: MPI %s of %s not done after %.0f s: another rank died or hangs (--comm_timeout)", rank_,
            size_, what, FormatBytes(static_cast<uint64_t>(buffer_bytes)), waited));
      }
      if (spins > 1000) std::this_thread::sleep_for(std::chrono::microseconds(spins > 100000 ? 1000 : 20));
    }
    Account(buffer_bytes * wire_share, std::chrono::duration<double>(Clock::now() - t0).count());
    return absl::OkStatus();
  }

  MpiOptions options_;
  int rank_, size_;
  bool broken_ = false;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Communicator>> MakeMpiCommunicator(const MpiOptions& options) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int provided = 0;
    if (int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided); rc != MPI_SUCCESS) {
      return absl::UnavailableError("MPI_Init: " + ErrorString(rc));
    }
  }
  // Errors come back as codes (reported with the call and its size), not as an abort.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return std::unique_ptr<Communicator>(new MpiCommunicator(options, rank, size));
}

}  // namespace tierd::comm
