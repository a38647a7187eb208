// The one exchange GPU ranks need before NCCL can connect them: rank 0's bytes (NCCL's unique
// id) handed to every other rank, over TCP at the launcher's MASTER_ADDR and
// LaunchInfo::rendezvous_port (MASTER_PORT, or the port after it under torchrun, whose own
// store holds MASTER_PORT). Rank 0 listens there; the others connect (retrying while rank 0 is
// still starting) and read the bytes; nothing else crosses. One process: the bytes as given.
#ifndef TIERD_COMM_RENDEZVOUS_H_
#define TIERD_COMM_RENDEZVOUS_H_

#include <string>

#include "absl/status/statusor.h"
#include "comm/launch_env.h"

namespace tierd::comm {

struct RendezvousOptions {
  double timeout_seconds = 120;  // waiting for rank 0 (the others), or for every rank (rank 0)
};

// Rank 0 passes `bytes` and gets them back once every other rank has them; the others get
// rank 0's. Errors say who waited for whom at which address and for how long, and what to
// check (MASTER_ADDR/MASTER_PORT unset, a port taken, a rank that never came).
absl::StatusOr<std::string> ShareFromRankZero(const LaunchInfo& launch, const std::string& bytes,
                                              const RendezvousOptions& options = {});

}  // namespace tierd::comm

#endif  // TIERD_COMM_RENDEZVOUS_H_
