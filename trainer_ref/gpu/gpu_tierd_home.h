// The GPU model's state leased from tierd (see gpu_home.h): every (group, part) a tensor of
// the session, acquired on the GPU, released with the model's stream (CUDA IPC events:
// no device-wide sync), the step's ops registered so the planner moves parts ahead of use.
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
