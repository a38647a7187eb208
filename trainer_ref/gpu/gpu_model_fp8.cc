// The GPU model's FP8 layers (UseFp8): their workspace, the step's end for their scales, and
// a layer falling back to bf16 when its scaling keeps going wrong (one with rooms for its inputs'
// codes then keeps lean: GpuModel::LeanNow).
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "trainer_ref/gpu/gpu_model.h"
#include "trainer_ref/gpu/gpu_model_internal.h"

namespace tierd::trainer::gpu {

uint64_t GpuModel::Fp8WorkspaceBytesFor(const ModelConfig& config, int batch, int seq,
                                        const Fp8ScalingOptions& scaling) {
  return Fp8Linear::BytesFor(int64_t{batch} * seq, LinearShapes(config), config.layers, scaling);
}

absl::Status GpuModel::UseFp8(std::vector<bool> layers, const Fp8ScalingOptions& scaling) {
  if (layers.empty()) layers.assign(config_.layers, true);
  if (static_cast<int>(layers.size()) != config_.layers) {
    return absl::InvalidArgumentError(
        absl::StrFormat("FP8 chosen for %d layers of a %d-layer model", layers.size(), config_.layers));
  }
  if (fp8_ != nullptr || micro_ > 0) return absl::FailedPreconditionError("FP8 is chosen once, before the first step");
  int major = 0, minor = 0, device = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
  if (major * 10 + minor < 89) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "FP8 matmuls need FP8 tensor cores (compute capability 8.9 or later); this GPU is %d.%d", major, minor));
  }
  auto linear = Fp8Linear::Create(gemm_.get(), int64_t{batch_} * seq_, LinearShapes(config_), config_.layers, scaling);
  if (!linear.ok()) return linear.status();
  fp8_ = std::move(*linear);
  fp8_layer_ = std::move(layers);
  device_bytes_ += Fp8WorkspaceBytesFor(config_, batch_, seq_, scaling);
  return absl::OkStatus();
}

void GpuModel::EndFp8Step() {
  if (fp8_ != nullptr) fp8_->EndStep(stream_);
}

std::vector<std::string> GpuModel::Fp8FallBack(int in_a_row) {
  std::vector<std::string> lines;
  if (fp8_ == nullptr) return lines;
  static constexpr const char* kMaps[kLinears] = {"q", "k", "v", "o", "gate", "up", "down"};
  static constexpr const char* kInputs[kLinears] = {"the attention norm's output (the q, k, v input)",
                                                    "",
                                                    "",
                                                    "the attention's output (the o input)",
                                                    "the mlp norm's output (the gate, up input)",
                                                    "",
                                                    "the swiglu output (the down input)"};
  for (const Fp8Trouble& t : fp8_->Trouble(in_a_row)) {
    if (!fp8_layer_[t.layer]) continue;  // fell back already (its scales keep counting)
    fp8_layer_[t.layer] = false;
    const std::string tensor = t.role == Fp8Trouble::kInput ? std::string(kInputs[t.index])
                               : t.role == Fp8Trouble::kOutputGradient
                                   ? absl::StrFormat("%s's output gradient (e5m2)", kMaps[t.index])
                                   : absl::StrFormat("the %s weight", kMaps[t.index]);
    std::string why;
    if (t.non_finite >= in_a_row) {
      why = absl::StrFormat("its largest value was not finite in %d steps", t.non_finite);
    } else if (t.saturated_in_a_row >= in_a_row) {
      why = absl::StrFormat("saturated %d steps in a row (largest |x| %g at scale %g)", t.saturated_in_a_row, t.amax,
                            t.scale);
    } else {
      why = absl::StrFormat("fell below the format's smallest normal %d steps in a row (largest |x| %g at scale %g)",
                            t.underflow_in_a_row, t.amax, t.scale);
    }
    lines.push_back(absl::StrFormat("layer %d falls back to bf16: %s %s", t.layer, tensor, why));
  }
  return lines;
}

}  // namespace tierd::trainer::gpu
