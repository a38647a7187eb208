// The reference trainer on one GPU: tierd-train --device=gpu (or auto, with a GPU there).
#ifndef TIERD_TRAINER_REF_GPU_GPU_RUN_H_
#define TIERD_TRAINER_REF_GPU_GPU_RUN_H_

#include <string>

#include "trainer_ref/train_flags.h"

namespace tierd::trainer::gpu {

// Whether a CUDA GPU can be used here; `why` names the device, or why not.
bool GpuUsable(std::string* why);

// Trains as the settings (and the GPU flags) say, printing progress; the process's exit
// status (0 done, 1 a failure said on stderr with where the last checkpoint is).
int RunOnGpu(const RunSettings& settings);

}  // namespace tierd::trainer::gpu

#endif  // TIERD_TRAINER_REF_GPU_GPU_RUN_H_
