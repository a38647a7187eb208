#include "trainer_ref/kernels/fp8_linear.h"

#include <algorithm>

#include "absl/strings/str_format.h"
#include "base/units.h"
#include "trainer_ref/kernels/fp8_ops.h"

namespace tierd::trainer::gpu {
namespace {

constexpr int kInputSlot = 0, kDoutSlot = 1, kFirstWeightSlot = 2;  // then two per weight
constexpr uint64_t kAlign = 256;

uint64_t Aligned(uint64_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

struct Sizes {
  uint64_t weights = 0;  // every weight's codes, each aligned
  int64_t max_features = 0;
};

Sizes SizesOf(const Fp8Linear::Shapes& weights) {
  Sizes s;
  for (const auto& [out, in] : weights) {
    s.weights += Aligned(static_cast<uint64_t>(out) * in);
    s.max_features = std::max<int64_t>({s.max_features, out, in});
  }
  return s;
}

}  // namespace

uint64_t Fp8Linear::BytesFor(int64_t rows, const Shapes& weights) {
  const Sizes s = SizesOf(weights);
  const uint64_t activations = Aligned(static_cast<uint64_t>(rows) * s.max_features);
  const uint64_t slots = Aligned((kFirstWeightSlot + 2 * weights.size()) * 4 * sizeof(float));
  return 2 * s.weights + 3 * activations + slots;
}

absl::StatusOr<std::unique_ptr<Fp8Linear>> Fp8Linear::Create(Gemm* gemm, int64_t rows, const Shapes& weights) {
  bool aligned = rows % 16 == 0;
  for (const auto& [out, in] : weights) aligned = aligned && out % 16 == 0 && in % 16 == 0;
  if (!aligned) {
    std::string shapes;
    for (const auto& [out, in] : weights) absl::StrAppendFormat(&shapes, " %dx%d", out, in);
    return absl::InvalidArgumentError(absl::StrFormat(
        "FP8 matmuls need every dimension a multiple of 16: %d rows (batch x sequence), weights%s", rows, shapes));
  }
  std::unique_ptr<Fp8Linear> linear(new Fp8Linear());
  linear->gemm_ = gemm;
  linear->rows_ = rows;
  linear->weights_ = weights;
  const Sizes s = SizesOf(weights);
  linear->max_features_ = s.max_features;
  uint64_t at = 0;
  for (const auto& [out, in] : weights) {
    linear->weight_offset_.push_back(at);
    at += Aligned(static_cast<uint64_t>(out) * in);
  }
  linear->made_from_.assign(weights.size(), {nullptr, nullptr});
  const uint64_t activations = Aligned(static_cast<uint64_t>(rows) * s.max_features);
  const uint64_t slots = Aligned((kFirstWeightSlot + 2 * weights.size()) * 4 * sizeof(float));
  void** targets[] = {
      reinterpret_cast<void**>(&linear->weight_codes_), reinterpret_cast<void**>(&linear->weight_codes_t_),
      reinterpret_cast<void**>(&linear->in_),           reinterpret_cast<void**>(&linear->dout_),
      reinterpret_cast<void**>(&linear->dout_t_),       reinterpret_cast<void**>(&linear->slots_)};
  const uint64_t bytes[] = {s.weights, s.weights, activations, activations, activations, slots};
  for (int i = 0; i < 6; ++i) {
    void* p = nullptr;
    if (cudaMalloc(&p, std::max<uint64_t>(bytes[i], 1)) != cudaSuccess) {
      cudaGetLastError();
      return absl::ResourceExhaustedError(absl::StrFormat(
          "no room on the GPU for the FP8 matmuls' %s (codes of one layer's weights, both ways, and of %d rows of "
          "activations)",
          FormatBytes(BytesFor(rows, weights))));
    }
    linear->allocations_.push_back(p);
    *targets[i] = p;
  }
  // A slot's scale is read before any conversion writes it only if a caller skips Quantize;
  // zeros there would read as "scale 0", so start from 1.
  std::vector<float> ones(slots / sizeof(float), 1.0f);
  if (cudaMemcpy(linear->slots_, ones.data(), slots, cudaMemcpyHostToDevice) != cudaSuccess) {
    return absl::InternalError("CUDA: initialising the FP8 scale slots failed");
  }
  return linear;
}

Fp8Linear::~Fp8Linear() {
  for (void* p : allocations_) cudaFree(p);
}

void Fp8Linear::ForgetWeights() { made_from_.assign(weights_.size(), {nullptr, nullptr}); }

Fp8Codes Fp8Linear::Quantize(uint8_t* plain, uint8_t* transposed, int slot, const Bf16* in, int rows, int cols,
                             bool e5m2, cudaStream_t stream) {
  float* s = Slot(slot);
  AbsMax(s + 2, in, static_cast<int64_t>(rows) * cols, stream);
  ScaleFromAmax(s + 1, s, s + 2, e5m2, stream);
  if (transposed != nullptr) {
    QuantizeFp8Transposed(transposed, in, rows, cols, s + 1, e5m2, stream, plain);  // both from one read
  } else if (plain != nullptr) {
    QuantizeFp8(plain, in, static_cast<int64_t>(rows) * cols, s + 1, e5m2, stream);
  }
  return {plain != nullptr ? plain : transposed, s};
}

Fp8Codes Fp8Linear::QuantizeInput(const Bf16* in, int rows, int cols, cudaStream_t stream) {
  return Quantize(in_, nullptr, kInputSlot, in, rows, cols, /*e5m2=*/false, stream);
}

Fp8Codes Fp8Linear::QuantizeInputTransposed(const Bf16* in, int rows, int cols, cudaStream_t stream) {
  return Quantize(nullptr, in_, kInputSlot, in, rows, cols, /*e5m2=*/false, stream);
}

Fp8Codes Fp8Linear::WeightCodes(int index, const Bf16* weight, bool transposed, cudaStream_t stream) {
  uint8_t* codes = (transposed ? weight_codes_t_ : weight_codes_) + weight_offset_[index];
  const int slot = kFirstWeightSlot + 2 * index + (transposed ? 1 : 0);
  const Bf16*& made = transposed ? made_from_[index].second : made_from_[index].first;
  if (made == weight) return {codes, Slot(slot)};
  made = weight;
  const auto [out, in] = weights_[index];
  return Quantize(transposed ? nullptr : codes, transposed ? codes : nullptr, slot, weight, out, in, false, stream);
}

absl::Status Fp8Linear::Forward(Bf16* out, Fp8Codes in, int index, const Bf16* weight, int n, int ic, int oc,
                                cudaStream_t stream) {
  if (index < 0 || index >= static_cast<int>(weights_.size()) || weights_[index] != std::make_pair(oc, ic) ||
      n > rows_) {
    return absl::InvalidArgumentError(
        absl::StrFormat("FP8 forward of weight %d as %dx%d over %d rows", index, oc, ic, n));
  }
  const Fp8Codes w = WeightCodes(index, weight, /*transposed=*/false, stream);
  return gemm_->ForwardFp8(out, in.codes, w.codes, in.scale_inv, w.scale_inv, n, ic, oc, stream);
}

absl::Status Fp8Linear::Backward(Bf16* din, float* dweight, const Bf16* dout, Fp8Codes in_t, int index,
                                 const Bf16* weight, int n, int ic, int oc, cudaStream_t stream, bool accumulate_din) {
  if (index < 0 || index >= static_cast<int>(weights_.size()) || weights_[index] != std::make_pair(oc, ic) ||
      n > rows_) {
    return absl::InvalidArgumentError(
        absl::StrFormat("FP8 backward of weight %d as %dx%d over %d rows", index, oc, ic, n));
  }
  const Fp8Codes d = Quantize(din != nullptr ? dout_ : nullptr, dweight != nullptr ? dout_t_ : nullptr, kDoutSlot, dout,
                              n, oc, /*e5m2=*/true, stream);
  const Fp8Codes w = din != nullptr ? WeightCodes(index, weight, /*transposed=*/true, stream) : Fp8Codes{};
  return gemm_->BackwardFp8(din, dweight, dout_, dout_t_, in_t.codes, w.codes, d.scale_inv, in_t.scale_inv, w.scale_inv,
                            n, ic, oc, stream, accumulate_din);
}

}  // namespace tierd::trainer::gpu
