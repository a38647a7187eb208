// `tierd-train export`: a trainer checkpoint's weights (the fp32 master copy) as a Hugging
// Face checkpoint, without a GPU and without the state in memory: the GPU trainer's
// checkpoints are read record by record, a group's master weights at a time; the CPU
// trainer's (one record) whole.
#ifndef TIERD_TRAINER_REF_EXPORT_CHECKPOINT_H_
#define TIERD_TRAINER_REF_EXPORT_CHECKPOINT_H_

#include <string>

#include "absl/status/status.h"
#include "trainer_ref/hf/hf_checkpoint.h"
#include "trainer_ref/model_config.h"

namespace tierd::trainer {

// `checkpoint`: a checkpoint file, or a --checkpoint_dir (its newest that verifies). The model
// must be the checkpoint's (INVALID_ARGUMENT saying both otherwise).
absl::Status ExportTrainerCheckpoint(const ModelConfig& config, const std::string& checkpoint, const std::string& to,
                                     const hf::ExportOptions& options);

// The parameters (ParamLayout order, `count` of them) of a CPU trainer's state record.
// INVALID_ARGUMENT for another model's state or a ZeRO-3 rank's slice.
absl::StatusOr<std::vector<float>> ParamsOfTrainerState(const std::string& state, uint64_t count);

}  // namespace tierd::trainer

#endif  // TIERD_TRAINER_REF_EXPORT_CHECKPOINT_H_
