#include "trainer_ref/gpu/gpu_optimizer.h"

#include <algorithm>

namespace tierd::trainer::gpu {

std::unique_ptr<GpuOptimizer> MakeGpuOptimizer(const OptimizerKind& choice) {
  if (choice.adafactor) return MakeAdafactor();
  if (choice.lion) return MakeLion();
  if (choice.moments_8bit) return MakeAdamW8bit(std::max<int64_t>(0, choice.moments_8bit_min));
  return MakeAdamW();
}

std::pair<int64_t, int64_t> FactoredShape(const TensorLayout& t) {
  if (t.shape.size() == 2) return {t.shape[0], t.shape[1]};
  return {static_cast<int64_t>(t.count), 0};
}

}  // namespace tierd::trainer::gpu
