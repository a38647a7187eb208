// Which rank of how many this process is, read from the launcher that started it: mpirun
// (OpenMPI's OMPI_COMM_WORLD_*), torchrun and its kin (RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT) or Slurm's srun (SLURM_PROCID, SLURM_NTASKS,
// SLURM_LOCALID). tierd starts no processes itself.
#ifndef TIERD_COMM_LAUNCH_ENV_H_
#define TIERD_COMM_LAUNCH_ENV_H_

#include <functional>
#include <string>

#include "absl/status/statusor.h"

namespace tierd::comm {

struct LaunchInfo {
  std::string launcher = "none";  // "mpirun", "torchrun", "srun" or "none" (one process)
  int rank = 0, size = 1;
  int local_rank = 0, local_size = 1;  // on this node
  std::string master_addr;             // torchrun's rendezvous, when set
  int master_port = 0;
  // Where GPU ranks meet to share NCCL's id (rendezvous.h): TIERD_RDZV_PORT when set; under
  // torchrun MASTER_PORT + 1 (torchrun's own store listens on MASTER_PORT); else MASTER_PORT.
  int rendezvous_port = 0;
  std::string Describe() const;  // "rank 1 of 4 (local 1 of 2), launched by mpirun"
};

using GetEnv = std::function<const char*(const char*)>;

// Errors name the variable and its value: a rank outside [0, size), a size below 1, a
// number that does not parse.
absl::StatusOr<LaunchInfo> LaunchFromEnv(const GetEnv& getenv);
absl::StatusOr<LaunchInfo> LaunchFromEnv();  // the process's environment

}  // namespace tierd::comm

#endif  // TIERD_COMM_LAUNCH_ENV_H_
