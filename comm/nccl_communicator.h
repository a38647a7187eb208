// The NCCL backend: GPU ranks, one a GPU, started by any launcher that sets the ranks'
// environment (torchrun, mpirun or srun with MASTER_ADDR/MASTER_PORT exported): rank 0 makes
// NCCL's id and hands it to the others at MASTER_ADDR:MASTER_PORT (rendezvous.h). Every
// pointer a collective takes is device memory on the rank's GPU, but AllReduce's, which may
// also be host memory (a loss, a step number: copied through the GPU). A collective is queued on
// the rank's stream (after what is queued there) and waited for with a deadline, so a rank
// whose peer died or hangs gets an error that says which call, how many bytes and how long
// it waited (NCCL aborted), instead of hanging.
// NCCL is loaded at run time (libnccl.so.2 from the library path, or CUDA's lib64), so the
// binaries start, and train on one GPU, where it is not installed.
#ifndef TIERD_COMM_NCCL_COMMUNICATOR_H_
#define TIERD_COMM_NCCL_COMMUNICATOR_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "comm/communicator.h"
#include "comm/launch_env.h"

namespace tierd::comm {

struct NcclOptions {
  double timeout_seconds = 120;  // a collective (or the rendezvous) not done by then fails
  int device = -1;               // the CUDA device; -1: the launcher's local rank
  void* stream = nullptr;        // cudaStream_t the collectives are queued on; null: one of its own
};

absl::StatusOr<std::unique_ptr<Communicator>> MakeNcclCommunicator(const LaunchInfo& launch,
                                                                   const NcclOptions& options = {});

// "NCCL 2.27.7 (/usr/local/cuda/lib64/libnccl.so.2)", or why it cannot be loaded.
absl::StatusOr<std::string> NcclVersion();

}  // namespace tierd::comm

#endif  // TIERD_COMM_NCCL_COMMUNICATOR_H_
