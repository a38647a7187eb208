#include "trainer_ref/gpu/gpu_tierd_home.h"

#include "trainer_ref/home/tierd_home.h"

namespace tierd::trainer::gpu {

absl::StatusOr<std::unique_ptr<GpuHome>> MakeTierdGpuHome(const GpuHomeLayout& layout, const ClientOptions& options) {
  auto home = MakeTierdHome(layout.Table(), options);
  if (!home.ok()) return home.status();
  if (!(*home)->Holds(Place::kGpu)) {
    return absl::FailedPreconditionError(
        "the tierd at " + options.runtime_dir +
        " has a fake GPU (started with --gpu=fake or without CUDA): the GPU trainer needs it on the real one "
        "(--gpu=cuda)");
  }
  return GpuHome::Over(layout, std::move(*home));
}

}  // namespace tierd::trainer::gpu
