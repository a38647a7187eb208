// The training loop of the reference trainer on the CPU (fp32): micro-batches with
// gradient accumulation, global-norm clipping, AdamW on a warmup + cosine schedule, a guard
// that skips a step whose loss or gradients are not finite (and says where), and state that
// can be checkpointed and resumed bit-exactly. Every tensor of the model's state lives in a
// home (home/home.h: plain buffers, or tierd) and is acquired only while an op uses it.
#ifndef TIERD_TRAINER_REF_TRAINER_H_
#define TIERD_TRAINER_REF_TRAINER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "trainer_ref/data.h"
#include "trainer_ref/grad_sync.h"
#include "trainer_ref/host_adamw.h"
#include "trainer_ref/model.h"
#include "trainer_ref/optimizer.h"
#include "trainer_ref/tensor_home.h"

namespace tierd::trainer {

struct TrainOptions {
  int batch = 4;
  int seq = 64;
  int grad_accum = 1;
  int64_t steps = 200;
  int64_t warmup = 20;
  double lr = 3e-3, min_lr = 3e-4;
  double clip = 1.0;  // global gradient norm; <= 0: off
  AdamWOptions adam;
  uint64_t seed = 1;
  uint64_t data_seed = 0;      // of the data order; 0: seed's
  bool checkpointing = false;  // keep only each layer's input; recompute the rest in backward
  bool plan = true;            // register the step's graph with the home (tierd's planner)
  // Instead of registering it: mark each step's start, so tierd records the first step's
  // acquires and releases and plans from them at the second (for trainers that cannot
  // describe their step; this one can, so it is here to show and test the recording).
  bool record_plan = false;
  // AdamW's moments in 8 bits, blockwise (adamw8bit.h; the home must be made the same way).
  bool moments_8bit = false;
  // Lion instead of AdamW (one moment; betas from lion, weight decay from adam).
  bool lion = false;
  LionOptions lion_options;
  // Adafactor instead (optimizer.h; no first moment, each matrix's second moment as its row and
  // column means; weight decay from adam; not with ZeRO-2, whose slices cut matrices).
  bool adafactor = false;
  // Initial weights other than the seeded ones (--init_from): fills the model's flat
  // parameters (ParamLayout order) before they go into the home. Null: the seed's.
  std::function<absl::Status(std::vector<float>* params)> init_params;
  // Data parallelism: this process is one of dp.ranks(); each step it takes its share of the
  // global batch (the micro-batches one process with ranks x grad_accum would take, in rank
  // order) and the ranks agree on the gradient before the optimizer steps (grad_sync.h).
  DataParallelOptions dp;
};

// The tensors a trainer with these options leases: with ZeRO-2 the moments of this rank's
// slices, with a sparse sync a residual per tensor.
HomeShape HomeShapeFor(const ModelConfig& config, const TrainOptions& options);

struct StepResult {
  int64_t step = 0;       // the step just taken (1-based)
  double loss = 0;        // mean over the micro-batches
  double grad_norm = 0;   // before clipping
  double lr = 0;
  bool skipped = false;   // not finite: the parameters were left as they were
  std::string why;        // for a skipped step: where the first non-finite value was
  bool synced = true;     // the ranks agreed (false: a local step between syncs)
};

class Trainer {
 public:
  // Writes the initial weights (seeded) and zero moments into `home`, which must be made for
  // HomeShapeFor(config, options).Table() (INVALID_ARGUMENT else) and outlive the trainer.
  // An error of the home (a tierd that refuses) comes back as it is.
  static absl::StatusOr<std::unique_ptr<Trainer>> Create(const ModelConfig& config, const TrainOptions& options,
                                                         const Dataset& data, Home& home);

  // An error of the home mid-step (tierd gone, out of room) ends training: the state in
  // the home may hold part of a step; the last checkpoint does not.
  absl::StatusOr<StepResult> Step();
  absl::StatusOr<double> ValidationLoss(int batches);  // mean loss on held-out windows
  int64_t step() const { return step_; }
  const std::vector<TensorLayout>& layout() const { return model_.layout(); }
  Home& home() { return home_.home(); }
  const GradSync& sync() const { return sync_; }
  // What registering the step's graph with the home gave: the planner's prediction, why
  // there is no plan (tensors then move on demand), or "" for a home without a planner.
  const std::string& plan_note() const { return plan_note_; }
  // The step as the planner sees it: one op per tensor to zero its gradient, forward and
  // backward per group per micro-batch (parameters read, saved activations written, then
  // read), one op per tensor to scale its gradient, one per tensor for AdamW. Op times
  // are estimates (10 GFLOP/s, 5 GB/s); the planner measures them as the step runs.
  prefetcher::Graph StepGraph() const;
  // Op indices of StepGraph(): what the trainer reports as it reaches each.
  uint32_t ZeroOp(size_t entry) const { return static_cast<uint32_t>(entry); }
  uint32_t GroupOp(int micro, int group, bool backward) const;
  uint32_t ScaleOp(size_t entry) const;
  uint32_t AdamOp(size_t entry) const;

  // The parameter `entry` (ParamLayout order) whole, into out (its count floats): for an
  // export. FAILED_PRECONDITION with ZeRO-3 (each rank holds a slice).
  absl::Status ReadParam(size_t entry, float* out);

  // Everything a resume needs: step, parameters, moments, the data order.
  absl::StatusOr<std::string> SaveState();
  absl::Status LoadState(const std::string& bytes);

 private:
  Trainer(const ModelConfig& config, const TrainOptions& options, const Dataset& data, TensorHome home);
  absl::Status Init();
  // Forward (and backward) with each group's tensors acquired only while it runs.
  absl::StatusOr<double> ForwardBackward(const int32_t* inputs, const int32_t* targets, bool backward);

  // Draws this rank's micro-batches of the step (skipping the other ranks').
  absl::Status MicroBatches(StepResult& r);
  // The ranks agree on the loss and on whether a step is skipped.
  absl::Status AgreeOnLoss(StepResult& r);
  // How this step syncs: a local step (no sync), sparse updates, momentum past its warm-up.
  struct SyncModes {
    bool local = false, update = false, momentum = false;
  };
  // Tensor e's optimizer step (its slice with ZeRO), after the ranks agreed on its gradient.
  absl::Status UpdateTensor(size_t e, double clip, const SyncModes& modes, StepResult& r);
  HostAdamWParams AdamParams(double lr, double clip, const TensorLayout& t) const;
  uint32_t DpFlags() const;        // a state's data-parallel layout (trainer_state.cc)
  uint32_t MomentsFormat() const;  // a state's moments: fp32, 8-bit, Lion's, Adafactor's

  ModelConfig config_;
  TrainOptions options_;
  HomeShape shape_;
  GradSync sync_;
  const Dataset& data_;
  TensorHome home_;
  Model<float> model_;
  std::unique_ptr<Batcher> batcher_;
  uint64_t batcher_seed_ = 0;
  int64_t batches_drawn_ = 0;
  int64_t step_ = 0;
  void Progress(uint32_t op);  // tells the home which op runs next, during a step

  std::string plan_note_;
  bool registered_ = false;
  bool in_step_ = false;
  int micro_ = 0;
  absl::Status hook_error_;           // the first acquire that failed inside forward/backward
  std::vector<float> scratch_;        // stands in for a tensor whose acquire failed
  std::vector<std::vector<float>> gathered_;  // ZeRO-3: the tensors a group has whole while inside it
  std::vector<float> momentum_mean_;          // --sparse_sync=momentum: the ranks' mean of what they sent
  std::vector<float>& MomentumScratch(size_t n) {
    if (momentum_mean_.size() < n) momentum_mean_.resize(n);
    return momentum_mean_;
  }
};

}  // namespace tierd::trainer

#endif  // TIERD_TRAINER_REF_TRAINER_H_
