// What a GPU run's checkpoint carries besides the model's tensors (the step, the data's
// position, the loss window), and saving and resuming both.
#ifndef TIERD_TRAINER_REF_GPU_GPU_RUN_CHECKPOINT_H_
#define TIERD_TRAINER_REF_GPU_GPU_RUN_CHECKPOINT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "trainer_ref/gpu/gpu_model.h"
#include "trainer_ref/run_report.h"
#include "trainer_ref/train_flags.h"

namespace tierd::trainer::gpu {

// The run's state beyond the model: what a checkpoint carries besides the tensors.
struct RunState {
  int64_t step = 0;            // optimizer steps done
  int64_t batches_drawn = 0;   // micro-batches taken from the data
  std::vector<double> losses;  // the loss window's
};

// A checkpoint of the run and the model in --checkpoint_dir (the oldest pruned to
// --checkpoint_keep); its path.
absl::StatusOr<std::string> SaveCheckpoint(GpuModel& model, const RunState& run, const RunSettings& s);
// The run and the model's state from the newest checkpoint that verifies; `ck` says which.
absl::StatusOr<RunState> Resume(GpuModel& model, const RunSettings& s, CheckpointTrail& ck);

}  // namespace tierd::trainer::gpu

#endif  // TIERD_TRAINER_REF_GPU_GPU_RUN_CHECKPOINT_H_
