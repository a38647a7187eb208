// The GPU model's state leased from tierd (gpu_home.h over home/tierd_home.h): every chunk
// of every part a tensor of the session, acquired on the GPU (or, for the host's optimizer,
// in the DRAM tier), released with the model's stream.
#ifndef TIERD_TRAINER_REF_GPU_GPU_TIERD_HOME_H_
#define TIERD_TRAINER_REF_GPU_GPU_TIERD_HOME_H_

#include <memory>

#include "absl/status/statusor.h"
#include "clients/client.h"
#include "trainer_ref/gpu/gpu_home.h"

namespace tierd::trainer::gpu {

// Connects with these quotas and leases every part. The daemon must own a real GPU
// (FAILED_PRECONDITION for a fake one: the kernels need device pointers).
absl::StatusOr<std::unique_ptr<GpuHome>> MakeTierdGpuHome(const GpuHomeLayout& layout, const ClientOptions& options);

}  // namespace tierd::trainer::gpu

#endif  // TIERD_TRAINER_REF_GPU_GPU_TIERD_HOME_H_
