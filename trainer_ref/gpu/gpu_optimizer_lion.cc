// Lion: one fp32 moment (4 bytes of state a parameter beside the master), indexed as the
// master weights are; its betas and weight decay are the step's AdamW parameters'.
#include "trainer_ref/gpu/gpu_optimizer.h"
#include "trainer_ref/host_lion.h"

namespace tierd::trainer::gpu {
namespace {

class LionOptimizer final : public GpuOptimizer {
 public:
  uint64_t StateBytes(const TensorLayout& t) const override { return t.count * sizeof(float); }
  bool HasSecondPart() const override { return false; }
  bool StateAtTensorOffsets() const override { return false; }
  absl::Status StepGpu(const TensorUpdate& u, float*, cudaStream_t stream) const override {
    auto* m = static_cast<float*>(u.m);
    if (u.grads_bf16 != nullptr) {
      Lion(u.master, m, u.weights, u.grads_bf16, u.count, u.params, stream);
    } else {
      Lion(u.master, m, u.weights, u.grads, u.count, u.params, stream);
    }
    return absl::OkStatus();
  }
  void StepHost(const TensorUpdate& u) const override {
    HostLionParams lp;
    lp.lr = u.params.lr;
    lp.beta1 = u.params.beta1;
    lp.beta2 = u.params.beta2;
    lp.weight_decay = u.params.weight_decay;
    lp.grad_scale = u.params.grad_scale;
    lp.decay = u.params.decay;
    HostLion(u.master, static_cast<float*>(u.m), u.grads, u.count, lp, 0, u.weights);
  }
  std::string OptimizerRecord() const override { return " optimizer=lion"; }
};

}  // namespace

std::unique_ptr<GpuOptimizer> MakeLion() { return std::make_unique<LionOptimizer>(); }

}  // namespace tierd::trainer::gpu
