// The reference trainer on the CPU (fp32; the oracle): tierd-train --device=cpu.
#ifndef TIERD_TRAINER_REF_CPU_RUN_H_
#define TIERD_TRAINER_REF_CPU_RUN_H_

#include "trainer_ref/train_flags.h"

namespace tierd::trainer {

// Trains as the settings say, printing progress; the process's exit status (0 done, 1 a
// failure said on stderr with where the last checkpoint is).
int RunOnCpu(const RunSettings& settings);

}  // namespace tierd::trainer

#endif  // TIERD_TRAINER_REF_CPU_RUN_H_
