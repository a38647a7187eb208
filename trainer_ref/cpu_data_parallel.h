// The CPU trainer's data-parallel run: its communicator from the launcher's environment, the
// checkpoint every rank resumes from, and the message a rank leaves when the launcher stops
// it because another rank failed.
#ifndef TIERD_TRAINER_REF_CPU_DATA_PARALLEL_H_
#define TIERD_TRAINER_REF_CPU_DATA_PARALLEL_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "comm/communicator.h"
#include "comm/launch_env.h"
#include "trainer_ref/grad_sync.h"
#include "trainer_ref/train_flags.h"

namespace tierd::trainer {

// One process (no launcher, or one rank): null. Ranks from mpirun or srun: MPI. A torchrun
// environment, or a build without MPI: an error that says what to do.
absl::StatusOr<std::unique_ptr<comm::Communicator>> MakeCpuCommunicator(const RunSettings& s, comm::LaunchInfo* launch);

DataParallelOptions DataParallelFrom(const RunSettings& s, comm::Communicator* comm);

// The newest checkpoint in `dir` (this rank's) whose step every rank has: the ranks agree
// on the smallest of their newest verified steps. One process: the newest that verifies.
absl::StatusOr<std::string> AgreedCheckpoint(comm::Communicator* comm, const std::string& dir);

// SIGTERM (the launcher ending the job after another rank failed) prints "rank R: stopped
// by the launcher..." with `advice` (where the last checkpoint is) and exits 143.
void InstallStopHandler(int rank, int ranks);
void SetStopAdvice(const std::string& advice);

}  // namespace tierd::trainer

#endif  // TIERD_TRAINER_REF_CPU_DATA_PARALLEL_H_
