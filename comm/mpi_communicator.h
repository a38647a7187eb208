// The MPI backend (OpenMPI): CPU ranks started by mpirun or srun. Every collective is
// non-blocking underneath and waited for with a deadline, so a rank whose peer died or hangs
// gets an error that says which call, how many bytes and how long it waited, instead of
// hanging in MPI forever.
#ifndef TIERD_COMM_MPI_COMMUNICATOR_H_
#define TIERD_COMM_MPI_COMMUNICATOR_H_

#include <memory>

#include "absl/status/statusor.h"
#include "comm/communicator.h"

namespace tierd::comm {

struct MpiOptions {
  double timeout_seconds = 120;  // a collective not done by then fails (a dead or stuck rank)
};

// Initialises MPI (once a process); MPI is finalised when the communicator is destroyed.
// Fails when the process was not started by an MPI launcher and MPI cannot start alone.
absl::StatusOr<std::unique_ptr<Communicator>> MakeMpiCommunicator(const MpiOptions& options);

}  // namespace tierd::comm

#endif  // TIERD_COMM_MPI_COMMUNICATOR_H_
