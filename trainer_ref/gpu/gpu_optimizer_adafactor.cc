// Adafactor (optimizer.h's AdafactorStep with its default decay rate, eps1 and clip
// threshold): no first moment, a matrix's second moment factored into its row and column
// means, each tensor's state whole at its offset in the first part.
#include <algorithm>
#include <cmath>

#include "trainer_ref/gpu/gpu_optimizer.h"
#include "trainer_ref/host_adafactor.h"
#include "trainer_ref/optimizer.h"

namespace tierd::trainer::gpu {
namespace {

// The step's parameters: beta2t from the step count.
AdafactorParams AdafactorParamsOf(const AdamWParams& p) {
  const AdafactorOptions defaults;
  AdafactorParams a;
  a.lr = p.lr;
  a.beta2t = static_cast<float>(1.0 - std::pow(static_cast<double>(p.step), defaults.decay_rate));
  a.eps1 = static_cast<float>(defaults.eps1);
  a.clip_threshold = static_cast<float>(defaults.clip_threshold);
  a.weight_decay = p.weight_decay;
  a.grad_scale = p.grad_scale;
  a.decay = p.decay;
  return a;
}

class AdafactorOptimizer final : public GpuOptimizer {
 public:
  uint64_t StateBytes(const TensorLayout& t) const override {
    const auto [rows, cols] = FactoredShape(t);
    return AdafactorStateCount(static_cast<size_t>(rows), static_cast<size_t>(cols)) * sizeof(float);
  }
  bool HasSecondPart() const override { return false; }
  bool StateAtTensorOffsets() const override { return true; }
  int64_t ScratchFloats(const std::vector<TensorLayout>& tensors) const override {
    int64_t widest = 0;
    for (const TensorLayout& t : tensors) widest = std::max(widest, FactoredShape(t).second);
    return AdafactorScratchFloats(widest);
  }
  absl::Status StepGpu(const TensorUpdate& u, float* scratch, cudaStream_t stream) const override {
    const auto [rows, cols] = FactoredShape(*u.tensor);
    auto* state = static_cast<float*>(u.m);
    const AdafactorParams ap = AdafactorParamsOf(u.params);
    const cudaError_t e = u.grads_bf16 != nullptr
                              ? Adafactor(u.master, state, u.weights, u.grads_bf16, rows, cols, ap, scratch, stream)
                              : Adafactor(u.master, state, u.weights, u.grads, rows, cols, ap, scratch, stream);
    if (e != cudaSuccess) return absl::InternalError(std::string("CUDA adafactor: ") + cudaGetErrorString(e));
    return absl::OkStatus();
  }
  void StepHost(const TensorUpdate& u) const override {
    const auto [rows, cols] = FactoredShape(*u.tensor);
    HostAdafactor(u.master, static_cast<float*>(u.m), u.grads, rows, cols, AdafactorParamsOf(u.params), u.weights);
  }
  std::string OptimizerRecord() const override { return " optimizer=adafactor"; }
};

}  // namespace

std::unique_ptr<GpuOptimizer> MakeAdafactor() { return std::make_unique<AdafactorOptimizer>(); }

}  // namespace tierd::trainer::gpu
