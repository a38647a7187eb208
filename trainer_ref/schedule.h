// The default learning-rate schedule, chosen from what the run is: fine-tuning a checkpoint
// (--init_from) or training from scratch, the model's size, the optimizer, the steps. Linear
// warmup, then cosine decay to a tenth of the peak (optimizer.h's LearningRate).
#ifndef TIERD_TRAINER_REF_SCHEDULE_H_
#define TIERD_TRAINER_REF_SCHEDULE_H_

#include <cstdint>
#include <string>

#include "trainer_ref/model_config.h"

namespace tierd::trainer {

struct Schedule {
  double lr = 0;        // peak
  int64_t warmup = 0;   // steps
  std::string why;      // for the startup line
};

// Fine-tuning (`fine_tune`): AdamW's usual full fine-tuning rate, 2e-5 (Lion a third of it),
// warmup 3% of the steps (at least 1). From scratch on a GPU: GPT-3's peak rates by model size
// (6e-4 at 125M to 1e-4 at 13B, interpolated on log scales; Lion a third), warmup 10 steps a
// billion parameters (at least 10, at most half the steps): a 7B model's first steps at 3e-4
// after 10 steps of warmup diverged to a loss of 30 before recovering. On the CPU (the tiny
// reference models): 3e-3 and 20 steps. `lr` or `warmup` given (> 0, >= 0) are kept as given.
Schedule ChooseSchedule(const ModelConfig& config, int64_t steps, bool fine_tune, bool gpu, bool lion, double lr,
                        int64_t warmup);

}  // namespace tierd::trainer

#endif  // TIERD_TRAINER_REF_SCHEDULE_H_
