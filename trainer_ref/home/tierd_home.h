// A home whose every tensor is leased from tierd by its name (see home.h): acquired on the
// host or the GPU through the client's shared-memory ring, released with the stream that
// uses it (CUDA IPC events: no device-wide sync), the step's ops registered so the planner
// moves tensors ahead of use.
#ifndef TIERD_TRAINER_REF_HOME_TIERD_HOME_H_
#define TIERD_TRAINER_REF_HOME_TIERD_HOME_H_

#include <memory>

#include "absl/status/statusor.h"
#include "clients/client.h"
#include "trainer_ref/home/home.h"

namespace tierd::trainer {

// Connects to the tierd at options.runtime_dir with its quotas and leases every tensor of
// the table (a refusal comes back as tierd gave it, naming the tensor).
absl::StatusOr<std::unique_ptr<Home>> MakeTierdHome(HomeTable table, const ClientOptions& options);

}  // namespace tierd::trainer

#endif  // TIERD_TRAINER_REF_HOME_TIERD_HOME_H_
