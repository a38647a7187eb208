// AdamW with fp32 moments: 8 bytes of state a parameter beside the master, indexed as the
// master weights are (so leased in sub-groups where asked).
#include "trainer_ref/gpu/gpu_optimizer.h"
#include "trainer_ref/host_adamw.h"

namespace tierd::trainer::gpu {
namespace {

class AdamWOptimizer final : public GpuOptimizer {
 public:
  uint64_t StateBytes(const TensorLayout& t) const override { return t.count * sizeof(float); }
  bool HasSecondPart() const override { return true; }
  bool StateAtTensorOffsets() const override { return false; }
  absl::Status StepGpu(const TensorUpdate& u, float*, cudaStream_t stream) const override {
    auto* m = static_cast<float*>(u.m);
    auto* v = static_cast<float*>(u.v);
    if (u.grads_bf16 != nullptr) {
      AdamW(u.master, m, v, u.weights, u.grads_bf16, u.count, u.params, stream);
    } else {
      AdamW(u.master, m, v, u.weights, u.grads, u.count, u.params, stream);
    }
    return absl::OkStatus();
  }
  void StepHost(const TensorUpdate& u) const override {
    HostAdamW(u.master, static_cast<float*>(u.m), static_cast<float*>(u.v), u.weights, u.grads, u.count, u.params);
  }
};

}  // namespace

std::unique_ptr<GpuOptimizer> MakeAdamW() { return std::make_unique<AdamWOptimizer>(); }

}  // namespace tierd::trainer::gpu
