// The training loop of the reference trainer on the CPU (fp32): micro-batches with
// gradient accumulation, global-norm clipping, AdamW on a warmup + cosine schedule, a guard
// that skips a step whose loss or gradients are not finite (and says where), and state that
// can be checkpointed and resumed bit-exactly.
#ifndef TIERD_TRAINER_REF_TRAINER_H_
#define TIERD_TRAINER_REF_TRAINER_H_

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "trainer_ref/data.h"
#include "trainer_ref/model.h"
#include "trainer_ref/optimizer.h"

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
};

struct StepResult {
  int64_t step = 0;       // the step just taken (1-based)
  double loss = 0;        // mean over the micro-batches
  double grad_norm = 0;   // before clipping
  double lr = 0;
  bool skipped = false;   // not finite: the parameters were left as they were
  std::string why;        // for a skipped step: where the first non-finite value was
};

class Trainer {
 public:
  Trainer(const ModelConfig& config, const TrainOptions& options, const Dataset& data);

  StepResult Step();
  double ValidationLoss(int batches);  // mean loss on held-out windows (deterministic)
  int64_t step() const { return step_; }
  Model<float>& model() { return model_; }

  // Everything a resume needs: step, parameters, moments, the data order.
  std::string SaveState() const;
  absl::Status LoadState(const std::string& bytes);

 private:
  ModelConfig config_;
  TrainOptions options_;
  const Dataset& data_;
  Model<float> model_;
  std::vector<float> m_, v_;
  std::vector<bool> decay_;  // per element: weight decay applies (not norm weights)
  std::unique_ptr<Batcher> batcher_;
  uint64_t batcher_seed_ = 0;
  int64_t batches_drawn_ = 0;
  int64_t step_ = 0;
};

}  // namespace tierd::trainer

#endif  // TIERD_TRAINER_REF_TRAINER_H_
