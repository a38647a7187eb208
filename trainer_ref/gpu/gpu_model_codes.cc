// The FP8 layers' weights as E4M3 codes (StateOptions::fp8_weight_codes): the part's layout,
// which layers read it, and where its codes are made — by the host's optimizer step after
// each update, or on the GPU from the bf16 part when that changed some other way.
#include <cstring>
#include <functional>
#include <vector>

#include "trainer_ref/fp8_codes.h"
#include "trainer_ref/host_adamw.h"
#include "trainer_ref/gpu/gpu_model.h"
#include "trainer_ref/gpu/gpu_model_internal.h"
#include "trainer_ref/kernels/fp8_ops.h"

namespace tierd::trainer::gpu {
namespace {

constexpr uint64_t kCodesAlign = 256;
constexpr uint64_t kSlotBytes = 16;  // scale_inv, scale, amax, (unused)

uint64_t AlignCodes(uint64_t bytes) { return (bytes + kCodesAlign - 1) / kCodesAlign * kCodesAlign; }

}  // namespace

uint64_t GpuModel::WeightCodesOffset(const ModelConfig& config, int index, bool transposed) {
  const Fp8Linear::Shapes shapes = LinearShapes(config);
  const uint64_t slots = AlignCodes(kLinears * kSlotBytes);
  uint64_t at = slots;
  for (int k = 0; k < kLinears; ++k) {
    if (k == index) break;
    at += AlignCodes(static_cast<uint64_t>(shapes[k].first) * shapes[k].second);
  }
  // The transposed codes follow the plain ones, each at its plain twin's distance from the start.
  return transposed ? at + WeightCodesOffset(config, -1) - slots : at;
}

uint64_t GpuModel::WeightCodesBytes(const ModelConfig& config, bool transposed) {
  return WeightCodesOffset(config, -1, transposed);
}

int GpuModel::LayersReadingWeightCodes() const {
  int n = 0;
  for (int l = 0; l < config_.layers; ++l) n += ReadsCodes(l + 1);
  return n;
}

bool GpuModel::ReadsCodes(int group) const {
  return weight_codes_ && fp8_ != nullptr && group >= 1 && group <= config_.layers && fp8_layer_[group - 1] &&
         home_layout_.bytes[group][static_cast<int>(Part::kWeightCodes)] > 0;
}

size_t GpuModel::LinearEntry(int layer, int index) const {
  const Layer& w = layers_[layer];
  const size_t entries[kLinears] = {w.wq, w.wk, w.wv, w.wo, w.w1, w.w3, w.w2};
  return entries[index];
}

Fp8Codes GpuModel::CodesOf(int layer, int index) const {
  auto* base = Inside<unsigned char>(acquired_[layer + 1][static_cast<int>(Part::kWeightCodes)], 0, "FP8 weight codes",
                                     layout_[LinearEntry(layer, index)].name);
  return {CodesAt(base, index), reinterpret_cast<const float*>(base + index * kSlotBytes),
          transposed_codes_ ? CodesAt(base, index, /*transposed=*/true) : nullptr};
}

absl::Status GpuModel::EnterLayerWeights(int group) {
  if (!ReadsCodes(group)) return Enter(group, Part::kWeights, Access::kRead);
  RETURN_IF_ERROR(AwaitOptimizerUpdate(group));  // the host's step may be writing them
  if (!codes_current_[group]) RETURN_IF_ERROR(MakeWeightCodes(group));
  return Enter(group, Part::kWeightCodes, Access::kRead);
}

absl::Status GpuModel::LeaveLayerWeights(int group) {
  return Leave(group,
               acquired_[group][static_cast<int>(Part::kWeightCodes)] != nullptr ? Part::kWeightCodes : Part::kWeights);
}

absl::Status GpuModel::MakeWeightCodes(int group) {
  // New parameters or a loaded checkpoint, where the bf16 part is the codes' scratch (the plan
  // drops it): the codes from the master copy's bf16 values on the host, the same bits.
  if (WeightsAreScratch(group)) {
    std::vector<Bf16> weights(GroupCount(group));
    size_t at = 0;
    RETURN_IF_ERROR(WeightsFromMasterOnHost(group, [&](const Bf16* piece, size_t n) {
      std::memcpy(weights.data() + at, piece, n * sizeof(Bf16));
      at += n;
      return absl::OkStatus();
    }));
    return EncodeWeightCodesOnHost(group, weights.data());
  }
  RETURN_IF_ERROR(Enter(group, Part::kWeights, Access::kRead));
  const absl::Status s = EncodeWeightCodes(group);
  const absl::Status left = Leave(group, Part::kWeights);
  RETURN_IF_ERROR(s);
  RETURN_IF_ERROR(left);
  codes_current_[group] = 1;
  return absl::OkStatus();
}

absl::Status GpuModel::EncodeWeightCodes(int group, bool amax_folded) {
  RETURN_IF_ERROR(Enter(group, Part::kWeightCodes, Access::kOverwrite));
  auto* base = static_cast<unsigned char*>(acquired_[group][static_cast<int>(Part::kWeightCodes)]);
  if (amax_folded) {  // every slot's scales in one launch, no pass over the weights for them
    Timed(kFp8Cast, [&] {
      ScalesFromAmaxes(reinterpret_cast<float*>(base), kSlotBytes / sizeof(float), weights_amax_, kLinears,
                       /*e5m2=*/false, stream_);
      return 0;
    });
  }
  const Fp8Linear::Shapes shapes = LinearShapes(config_);
  for (int k = 0; k < kLinears; ++k) {
    const size_t e = LinearEntry(group - 1, k);
    auto* slot = reinterpret_cast<float*>(base + k * kSlotBytes);
    Timed(kFp8Cast, [&] {
      if (!amax_folded) {
        AbsMax(slot + 2, W(e), static_cast<int64_t>(layout_[e].count), stream_);
        ScaleFromAmax(slot + 1, slot, slot + 2, /*e5m2=*/false, stream_);
      }
      uint8_t* plain = CodesAt(base, k);
      if (transposed_codes_) {  // both from one read of the weights
        const auto [out, in] = shapes[k];
        QuantizeFp8Transposed(CodesAt(base, k, /*transposed=*/true), W(e), out, in, slot + 1, /*e5m2=*/false, stream_,
                              plain);
      } else {
        QuantizeFp8(plain, W(e), static_cast<int64_t>(layout_[e].count), slot + 1, /*e5m2=*/false, stream_);
      }
      return 0;
    });
  }
  const absl::Status s = Cuda(cudaGetLastError(), "FP8 weight codes");
  const absl::Status left = Leave(group, Part::kWeightCodes);
  return s.ok() ? left : s;
}

absl::Status GpuModel::WeightsFromMasterOnHost(int group,
                                               const std::function<absl::Status(const Bf16*, size_t)>& fn) {
  std::vector<uint16_t> bf16;
  for (int c = 0; c < home_layout_.Chunks(group, Part::kMaster); ++c) {
    auto master = home_->AcquireHost(group, Part::kMaster, c, Access::kRead);
    if (!master.ok()) return AcquireError(master.status(), group, Part::kMaster, c, " on the host");
    const size_t n = home_layout_.Chunk(group, Part::kMaster, c).bytes / sizeof(float);
    const auto* values = static_cast<const float*>(*master);
    bf16.resize(n);
    for (size_t i = 0; i < n; ++i) bf16[i] = Bf16Bits(values[i]);
    const absl::Status released = home_->ReleaseHost(group, Part::kMaster, c);
    RETURN_IF_ERROR(released);
    RETURN_IF_ERROR(fn(reinterpret_cast<const Bf16*>(bf16.data()), n));
  }
  return absl::OkStatus();
}

absl::Status GpuModel::EncodeWeightCodesOnHost(int group, const Bf16* weights) {
  auto codes = home_->AcquireHost(group, Part::kWeightCodes, 0, Access::kOverwrite);
  if (!codes.ok()) return AcquireError(codes.status(), group, Part::kWeightCodes, 0, " on the host");
  auto* base = static_cast<unsigned char*>(*codes);
  const Fp8Linear::Shapes shapes = LinearShapes(config_);
  for (int k = 0; k < kLinears; ++k) {
    const size_t e = LinearEntry(group - 1, k);
    const fp8::Fp8Scaled s =
        fp8::EncodeE4M3CurrentScaled(weights + (layout_[e].offset - group_offset_[group]),
                                     static_cast<int64_t>(layout_[e].count), CodesAt(base, k));
    const float slot[4] = {s.scale_inv, s.scale, s.amax, 0.0f};
    std::memcpy(base + k * kSlotBytes, slot, sizeof(slot));
    if (transposed_codes_) {
      const auto [out, in] = shapes[k];
      fp8::TransposeCodes(CodesAt(base, k), out, in, CodesAt(base, k, /*transposed=*/true));
    }
  }
  RETURN_IF_ERROR(home_->ReleaseHost(group, Part::kWeightCodes, 0));
  codes_current_[group] = 1;
  return absl::OkStatus();
}

}  // namespace tierd::trainer::gpu
