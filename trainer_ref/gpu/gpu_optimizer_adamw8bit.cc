// AdamW with 8-bit blockwise moments (adamw8bit.h): each tensor's codes and scales whole at
// its offset in the group's parts (~2 bytes a parameter for both); tensors of fewer values
// than `fp32_under` keep fp32 moments at their offsets all the same (bitsandbytes'
// min_8bit_size: the norms' weights).
#include "absl/strings/str_format.h"
#include "trainer_ref/adamw8bit.h"
#include "trainer_ref/gpu/gpu_optimizer.h"

namespace tierd::trainer::gpu {
namespace {

class AdamW8bitOptimizer final : public GpuOptimizer {
 public:
  explicit AdamW8bitOptimizer(int64_t fp32_under) : fp32_under_(fp32_under) {}
  uint64_t StateBytes(const TensorLayout& t) const override {
    return EightBit(t) ? Moment8bitBytes(t.count) : t.count * sizeof(float);
  }
  bool HasSecondPart() const override { return true; }
  bool StateAtTensorOffsets() const override { return true; }
  bool FoldsWeightsAmax(const TensorLayout& t) const override { return EightBit(t); }
  absl::Status StepGpu(const TensorUpdate& u, float*, cudaStream_t stream) const override {
    if (!EightBit(*u.tensor)) return fp32_->StepGpu(u, nullptr, stream);
    const cudaError_t e =
        u.grads_bf16 != nullptr
            ? AdamW8bit(u.master, u.m, u.v, u.weights, u.grads_bf16, u.count, u.params, stream, u.weights_amax)
            : AdamW8bit(u.master, u.m, u.v, u.weights, u.grads, u.count, u.params, stream, u.weights_amax);
    if (e != cudaSuccess) return absl::InternalError(std::string("CUDA adamw8bit: ") + cudaGetErrorString(e));
    return absl::OkStatus();
  }
  // The 8-bit tensors in one launch (AdamW8bitMany), the fp32 ones (the norms, under
  // fp32_under) as ever.
  absl::Status StepGpuAll(const std::vector<TensorUpdate>& us, float*, cudaStream_t stream) const override {
    std::vector<AdamW8bitTensor> eight;
    for (const TensorUpdate& u : us) {
      if (!EightBit(*u.tensor)) {
        if (absl::Status s = fp32_->StepGpu(u, nullptr, stream); !s.ok()) return s;
        continue;
      }
      eight.push_back({.master = u.master,
                       .m_bytes = u.m,
                       .v_bytes = u.v,
                       .weights = u.weights,
                       .grads = u.grads,
                       .grads_bf16 = u.grads_bf16,
                       .n = u.count,
                       .params = u.params,
                       .weights_amax = u.weights_amax});
    }
    const cudaError_t e = AdamW8bitMany(eight, stream);
    if (e != cudaSuccess) return absl::InternalError(std::string("CUDA adamw8bit: ") + cudaGetErrorString(e));
    return absl::OkStatus();
  }
  void StepHost(const TensorUpdate& u) const override {
    if (!EightBit(*u.tensor)) return fp32_->StepHost(u);
    HostAdamW8bit(u.master, u.m, u.v, u.weights, u.grads, u.count, u.params);
  }
  std::string MomentsRecord() const override {
    return absl::StrFormat(" moments=8bit-root-v-blocks-%d", q8::kQuantBlock) +
           (fp32_under_ > 0 ? absl::StrFormat(" moments-fp32-under=%d", fp32_under_) : "");
  }

 private:
  bool EightBit(const TensorLayout& t) const { return static_cast<int64_t>(t.count) >= fp32_under_; }
  int64_t fp32_under_;
  std::unique_ptr<GpuOptimizer> fp32_ = MakeAdamW();
};

}  // namespace

std::unique_ptr<GpuOptimizer> MakeAdamW8bit(int64_t fp32_under) {
  return std::make_unique<AdamW8bitOptimizer>(fp32_under);
}

}  // namespace tierd::trainer::gpu
