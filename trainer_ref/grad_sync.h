// How the ranks of a data-parallel run agree on each gradient, one tensor at a time, after
// each rank has summed its own micro-batches' gradients:
//   dense    all-reduce, then the mean over every rank's micro-batches;
//   ZeRO-2   reduce-scatter: a rank ends with the mean of its slice only (it steps that
//            slice's moments, then the parameters are all-gathered);
//   ZeRO-3   the same, but a rank keeps only its slice of the parameters too: each tensor
//            is all-gathered when a forward or backward reaches it (GatherFull) and
//            dropped when it leaves;
//   sparse   TopK: the rank adds its mean gradient to the tensor's residual, sends the k
//            entries of largest magnitude as (index, bf16 value), keeps the rest (and the
//            rounding of what it sent) in the residual, and every rank sums all ranks'
//            entries over N: error feedback, so nothing is dropped, only delayed;
//   update   (sparse_update) the same TopK and residual, over each rank's optimizer update
//            instead of its gradient: the gradient stays the rank's own;
//   momentum (sparse_momentum) after a dense warm-up, the TopK of each rank's accumulated
//            momentum, over a frozen second moment (MomentumPhase);
//   local    a local step between syncs: the rank's own mean, nothing sent.
// With one process (LocalCommunicator) dense and ZeRO-2 are the plain mean.
#ifndef TIERD_TRAINER_REF_GRAD_SYNC_H_
#define TIERD_TRAINER_REF_GRAD_SYNC_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "comm/communicator.h"
#include "trainer_ref/model.h"

namespace tierd::trainer {

struct DataParallelOptions {
  comm::Communicator* comm = nullptr;  // null: one process
  bool zero2 = false;
  bool zero3 = false;  // ZeRO-2's slices, and the parameters sharded too
  bool sharded() const { return zero2 || zero3; }
  // In (0, 1): the fraction of each tensor's elements sent a step; 0 or 1: dense. The first
  // pattern (a regex over the whole tensor name) that matches sets a tensor's own fraction.
  double sparse_ratio = 0;
  std::vector<std::pair<std::string, double>> sparse_ratio_by;
  // What a sparse tensor sends: its gradient (the optimizer then steps on the sparse mean,
  // the same on every rank), or the update (each rank steps its own moments on its own
  // gradient; the TopK of the change is exchanged and every rank applies the mean). With
  // AdamW the bursts a sparse gradient arrives in inflate the second moment: an element sent
  // every k-th step moves ~1/sqrt(k) as far, which the update mode avoids.
  bool sparse_update = false;
  // Momentum (AdamW): dense for sparse_warmup steps; then the second moment is frozen, each
  // rank adds its own momentum (of its own gradient) to the residual and the ranks exchange
  // its TopK, applied as the update's numerator over the frozen second moment. With the
  // denominator fixed the update is linear in the momentum, so what error feedback delays
  // arrives whole (1-bit Adam's argument); a bursty sparse gradient never reaches v.
  bool sparse_momentum = false;
  // Steps over which the sent fraction falls from 1 (dense) to its ratio, geometrically
  // (Deep Gradient Compression's warm-up): the early steps, where gradients change fastest,
  // are not delayed.
  int sparse_warmup = 0;
  int sync_every = 1;  // > 1: the ranks step on their own and average parameters every K steps
  int ranks() const { return comm == nullptr ? 1 : comm->size(); }
  int rank() const { return comm == nullptr ? 0 : comm->rank(); }
  bool sparse() const;  // some tensor is synced sparsely
};

// One sparse entry on the wire: the element's index and its value in bf16.
constexpr int kSparseEntryBytes = 6;

// Writes the k entries of `acc` of largest magnitude (ties: the lower index) into out
// (k * kSparseEntryBytes, in index order) and subtracts what they carry (the bf16 value)
// from acc, which is left holding what was not sent.
void TopKPack(float* acc, int64_t count, int64_t k, uint8_t* out);
// Adds k packed entries into sum.
void UnpackAdd(const uint8_t* in, int64_t k, float* sum);

class GradSync {
 public:
  // INVALID_ARGUMENT for what cannot be combined or parsed (the message names the flag).
  // ZeRO-2's slice boundaries fall on multiples of slice_align (8-bit moments' blocks).
  static absl::StatusOr<GradSync> Create(const DataParallelOptions& options, const std::vector<TensorLayout>& layout,
                                         int64_t slice_align = 1);

  // The slice of tensor e this rank steps: all of it but with ZeRO-2 and 3.
  const comm::Slices& slices(size_t e) const { return slices_[e]; }
  std::pair<int64_t, int64_t> Owned(size_t e) const;
  // Elements of tensor e sent sparsely a step (0: dense), at its ratio; KNow: at the step
  // BeginStep named (larger during the warm-up).
  int64_t SparseK(size_t e) const { return k_[e]; }
  int64_t KNow(size_t e) const;
  void BeginStep(int64_t step) { step_ = step; }
  // Momentum mode past its dense warm-up (the step BeginStep named).
  bool MomentumPhase() const { return sparse_ && options_.sparse_momentum && step_ > options_.sparse_warmup; }
  bool sparse() const { return sparse_; }

  // g: tensor e's gradient summed over this rank's `micro_batches`; residual: its residual
  // (sparse only, else unused). Afterwards g over Owned(e) holds the step's mean gradient.
  // local: a local step (sync_every > 1 and not a sync step).
  absl::Status Sync(size_t e, float* g, float* residual, int micro_batches, bool local);
  // Momentum mode: `velocity` (this rank's momentum of tensor e) is added to the residual, whose
  // TopK the ranks exchange; `mean` gets the mean of what they sent.
  absl::Status SparseMomentum(size_t e, const float* velocity, float* residual, float* mean);
  // Update mode: the optimizer stepped tensor e on this rank's own gradient from `before` to
  // `params`; the ranks exchange the TopK of (that change + the residual) and every rank
  // applies the mean of what was sent to `before`, into params.
  absl::Status SparseUpdate(size_t e, float* params, const float* before, float* residual);
  // After the optimizer stepped Owned(e) of the parameters: every rank gets every slice
  // (ZeRO-2; nothing to do otherwise).
  absl::Status GatherParams(size_t e, float* params);
  // ZeRO-3: tensor e whole into `full` from every rank's slice (this rank's: `slice`, its
  // Owned(e) elements).
  absl::Status GatherFull(size_t e, const float* slice, float* full);
  // Every sync_every steps with local steps: the ranks' parameters averaged.
  absl::Status AverageParams(size_t e, float* params);
  // What a dense all-reduce of every gradient would put on the wire from this rank a step.
  double DenseBytesPerStep() const;

 private:
  // TopK of `residual` (what was sent leaves it), gathered from every rank; `mean` gets the
  // mean over the ranks of what they sent.
  absl::Status ExchangeTopK(size_t e, float* residual, float* mean);

  DataParallelOptions options_;
  std::vector<TensorLayout> layout_;
  std::vector<comm::Slices> slices_;
  std::vector<int64_t> k_;
  bool sparse_ = false;
  int64_t step_ = 1;
  std::vector<uint8_t> mine_, all_;  // the sparse entries sent and received
};

}  // namespace tierd::trainer

#endif  // TIERD_TRAINER_REF_GRAD_SYNC_H_
