#include "trainer_ref/kernels/fp8_linear.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_format.h"
#include "base/units.h"
#include "trainer_ref/kernels/fp8_ops.h"

namespace tierd::trainer::gpu {
namespace {

constexpr uint64_t kAlign = 256;
constexpr int kMaxWindow = 1024;

uint64_t Aligned(uint64_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

struct Sizes {
  uint64_t weights = 0;  // one layer's weights' codes, each aligned
  int64_t max_features = 0;
  // The scaling state: slots (4 floats a tensor), history (window floats a tensor), states.
  uint64_t slots = 0, history = 0, states = 0;
};

Sizes SizesOf(const Fp8Linear::Shapes& weights, int layers, const Fp8ScalingOptions& scaling) {
  Sizes s;
  for (const auto& [out, in] : weights) {
    s.weights += Aligned(static_cast<uint64_t>(out) * in);
    s.max_features = std::max<int64_t>({s.max_features, out, in});
  }
  const uint64_t tensors = static_cast<uint64_t>(std::max(layers, 1)) * 3 * weights.size();
  s.slots = Aligned(tensors * 4 * sizeof(float));
  s.history = Aligned(tensors * std::max(scaling.window, 1) * sizeof(float));
  s.states = Aligned(tensors * sizeof(Fp8ScalingState));
  return s;
}

}  // namespace

uint64_t Fp8Linear::BytesFor(int64_t rows, const Shapes& weights, int layers, const Fp8ScalingOptions& scaling) {
  const Sizes s = SizesOf(weights, layers, scaling);
  const uint64_t activations = Aligned(static_cast<uint64_t>(rows) * s.max_features);
  return 2 * s.weights + 3 * activations + s.slots + s.history + s.states;
}

absl::StatusOr<std::unique_ptr<Fp8Linear>> Fp8Linear::Create(Gemm* gemm, int64_t rows, const Shapes& weights,
                                                             int layers, const Fp8ScalingOptions& scaling) {
  bool aligned = rows % 16 == 0;
  for (const auto& [out, in] : weights) aligned = aligned && out % 16 == 0 && in % 16 == 0;
  if (!aligned) {
    std::string shapes;
    for (const auto& [out, in] : weights) absl::StrAppendFormat(&shapes, " %dx%d", out, in);
    return absl::InvalidArgumentError(absl::StrFormat(
        "FP8 matmuls need every dimension a multiple of 16: %d rows (batch x sequence), weights%s", rows, shapes));
  }
  const auto good_scale = [](float s) { return s > 0 && std::isfinite(s) && std::isfinite(1.0f / s); };
  if (scaling.fixed_scale != 0 && (!good_scale(scaling.fixed_scale) || !good_scale(scaling.fixed_grad_scale))) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "FP8 fixed scaling: scales that are positive, finite and have a finite inverse (got %g for weights and "
        "inputs, %g for gradients)",
        scaling.fixed_scale, scaling.fixed_grad_scale));
  }
  if (scaling.window < 1 || scaling.window > kMaxWindow || scaling.margin < 0 || scaling.margin > 32 || layers < 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("FP8 scaling: an amax window of 1..%d steps and a margin of 0..32 (got %d and %d, %d layers)",
                        kMaxWindow, scaling.window, scaling.margin, layers));
  }
  std::unique_ptr<Fp8Linear> linear(new Fp8Linear());
  linear->gemm_ = gemm;
  linear->rows_ = rows;
  linear->layers_ = layers;
  linear->scaling_ = scaling;
  linear->weights_ = weights;
  const Sizes s = SizesOf(weights, layers, scaling);
  linear->max_features_ = s.max_features;
  uint64_t at = 0;
  for (const auto& [out, in] : weights) {
    linear->weight_offset_.push_back(at);
    at += Aligned(static_cast<uint64_t>(out) * in);
  }
  linear->made_from_.assign(weights.size(), {});
  const uint64_t activations = Aligned(static_cast<uint64_t>(rows) * s.max_features);
  void** targets[] = {
      reinterpret_cast<void**>(&linear->weight_codes_), reinterpret_cast<void**>(&linear->weight_codes_t_),
      reinterpret_cast<void**>(&linear->in_),           reinterpret_cast<void**>(&linear->dout_),
      reinterpret_cast<void**>(&linear->dout_t_),       reinterpret_cast<void**>(&linear->slots_),
      reinterpret_cast<void**>(&linear->history_),      reinterpret_cast<void**>(&linear->states_)};
  const uint64_t bytes[] = {s.weights, s.weights, activations, activations, activations, s.slots, s.history, s.states};
  for (int i = 0; i < 8; ++i) {
    void* p = nullptr;
    if (cudaMalloc(&p, std::max<uint64_t>(bytes[i], 1)) != cudaSuccess) {
      cudaGetLastError();
      return absl::ResourceExhaustedError(absl::StrFormat(
          "no room on the GPU for the FP8 matmuls' %s (codes of one layer's weights, both ways, of %d rows of "
          "activations, and the scales of %d layers)",
          FormatBytes(BytesFor(rows, weights, layers, scaling)), rows, layers));
    }
    linear->allocations_.push_back(p);
    *targets[i] = p;
  }
  const int tensors = linear->Tensors();
  if (cudaMallocHost(reinterpret_cast<void**>(&linear->host_states_), tensors * sizeof(Fp8ScalingState)) !=
          cudaSuccess ||
      cudaEventCreateWithFlags(&linear->states_copied_, cudaEventDisableTiming) != cudaSuccess) {
    cudaGetLastError();
    return absl::ResourceExhaustedError("no pinned host memory for the FP8 scaling states");
  }
  // Scale 1 in every slot until a conversion or EndStep writes one (zeros would read as "scale
  // 0"); running amaxes 0; each tensor's format: output gradients E5M2, the rest E4M3. Fixed
  // scaling: each tensor's scale, for good.
  std::vector<float> slots(s.slots / sizeof(float), 0.0f);
  for (int t = 0; t < tensors; ++t) slots[4 * t] = slots[4 * t + 1] = 1.0f;
  std::vector<Fp8ScalingState> states(tensors);
  for (int l = 0; l < layers; ++l) {
    for (int k = 0; k < static_cast<int>(weights.size()); ++k) {
      states[linear->SlotIndex(l, Fp8Trouble::kOutputGradient, k)].e5m2 = 1;
    }
  }
  if (scaling.fixed()) {
    for (int t = 0; t < tensors; ++t) {
      const float scale = states[t].e5m2 ? scaling.fixed_grad_scale : scaling.fixed_scale;
      states[t].scale = slots[4 * t + 1] = scale;
      slots[4 * t] = 1.0f / scale;
      states[t].has_scale = 1;
    }
  }
  std::memcpy(linear->host_states_, states.data(), tensors * sizeof(Fp8ScalingState));
  if (cudaMemcpy(linear->slots_, slots.data(), s.slots, cudaMemcpyHostToDevice) != cudaSuccess ||
      cudaMemset(linear->history_, 0, s.history) != cudaSuccess ||
      cudaMemcpy(linear->states_, states.data(), tensors * sizeof(Fp8ScalingState), cudaMemcpyHostToDevice) !=
          cudaSuccess ||
      cudaEventRecord(linear->states_copied_) != cudaSuccess) {
    return absl::InternalError("CUDA: initialising the FP8 scaling state failed");
  }
  return linear;
}

Fp8Linear::~Fp8Linear() {
  for (void* p : allocations_) cudaFree(p);
  if (host_states_ != nullptr) cudaFreeHost(host_states_);
  if (states_copied_ != nullptr) cudaEventDestroy(states_copied_);
}

void Fp8Linear::ForgetWeights() { made_from_.assign(weights_.size(), {}); }

Fp8Codes Fp8Linear::Quantize(uint8_t* plain, uint8_t* transposed, int slot, const Bf16* in, int rows, int cols,
                             bool e5m2, cudaStream_t stream) {
  float* s = Slot(slot);
  float* amax = recording_ ? s + 2 : nullptr;  // the step's running amax
  // Current scaling (and delayed scaling's first step): this tensor's own largest |x| first.
  if (!scaling_.fixed() && (!scaling_.delayed || steps_ == 0)) {
    AbsMax(s + 3, in, static_cast<int64_t>(rows) * cols, stream);
    ScaleFromAmax(s + 1, s, s + 3, e5m2, stream, amax);
    amax = nullptr;  // taken already
  }
  if (transposed != nullptr) {
    QuantizeFp8Transposed(transposed, in, rows, cols, s + 1, e5m2, stream, plain, amax);  // both from one read
  } else if (plain != nullptr) {
    QuantizeFp8(plain, in, static_cast<int64_t>(rows) * cols, s + 1, e5m2, stream, amax);
  }
  return {plain != nullptr ? plain : transposed, s};
}

Fp8Codes Fp8Linear::QuantizeInput(int layer, int index, const Bf16* in, int rows, int cols, cudaStream_t stream) {
  return Quantize(in_, nullptr, SlotIndex(layer, Fp8Trouble::kInput, index), in, rows, cols, /*e5m2=*/false, stream);
}

Fp8Codes Fp8Linear::QuantizeInputTransposed(int layer, int index, const Bf16* in, int rows, int cols,
                                            cudaStream_t stream) {
  return Quantize(nullptr, in_, SlotIndex(layer, Fp8Trouble::kInput, index), in, rows, cols, /*e5m2=*/false, stream);
}

Fp8Codes Fp8Linear::QuantizeInputKeepingTransposed(int layer, int index, const Bf16* in, int rows, int cols,
                                                    uint8_t* transposed, cudaStream_t stream) {
  return Quantize(in_, transposed, SlotIndex(layer, Fp8Trouble::kInput, index), in, rows, cols, /*e5m2=*/false, stream);
}

void Fp8Linear::TransposeInputCodes(int rows, int cols, uint8_t* transposed, cudaStream_t stream) {
  TransposeFp8(transposed, in_, rows, cols, stream);
}

Fp8Codes Fp8Linear::WeightCodes(int layer, int index, const Bf16* weight, bool transposed, cudaStream_t stream) {
  uint8_t* codes = (transposed ? weight_codes_t_ : weight_codes_) + weight_offset_[index];
  const int slot = SlotIndex(layer, Fp8Trouble::kWeight, index);
  Made& made = transposed ? made_from_[index].second : made_from_[index].first;
  if (made.layer == layer && made.from == weight) return {codes, Slot(slot)};
  made = {layer, weight};
  const auto [out, in] = weights_[index];
  return Quantize(transposed ? nullptr : codes, transposed ? codes : nullptr, slot, weight, out, in, false, stream);
}

Fp8Codes Fp8Linear::TransposedCodes(int layer, int index, Fp8Codes weight, cudaStream_t stream) {
  if (weight.transposed != nullptr) return {weight.transposed, weight.scale_inv};
  uint8_t* codes = weight_codes_t_ + weight_offset_[index];
  Made& made = made_from_[index].second;
  if (made.layer != layer || made.from != weight.codes) {
    made = {layer, weight.codes};
    const auto [out, in] = weights_[index];
    TransposeFp8(codes, weight.codes, out, in, stream);
  }
  return {codes, weight.scale_inv};
}

absl::Status Fp8Linear::CheckCall(const char* what, int layer, int index, int n, int ic, int oc) const {
  if (layer < 0 || layer >= layers_ || index < 0 || index >= static_cast<int>(weights_.size()) ||
      weights_[index] != std::make_pair(oc, ic) || n > rows_) {
    return absl::InvalidArgumentError(
        absl::StrFormat("FP8 %s of layer %d's weight %d as %dx%d over %d rows (made for %d layers, %d maps, %d rows)",
                        what, layer, index, oc, ic, n, layers_, weights_.size(), rows_));
  }
  return absl::OkStatus();
}

absl::Status Fp8Linear::Forward(Bf16* out, Fp8Codes in, int layer, int index, const Bf16* weight, int n, int ic, int oc,
                                cudaStream_t stream) {
  if (absl::Status st = CheckCall("forward", layer, index, n, ic, oc); !st.ok()) return st;
  const Fp8Codes w = WeightCodes(layer, index, weight, /*transposed=*/false, stream);
  return gemm_->ForwardFp8(out, in.codes, w.codes, in.scale_inv, w.scale_inv, n, ic, oc, stream,
                           scaling_.fast_forward);
}

absl::Status Fp8Linear::ForwardFromCodes(Bf16* out, Fp8Codes in, int layer, int index, Fp8Codes weight, int n, int ic,
                                         int oc, cudaStream_t stream) {
  if (absl::Status st = CheckCall("forward", layer, index, n, ic, oc); !st.ok()) return st;
  return gemm_->ForwardFp8(out, in.codes, weight.codes, in.scale_inv, weight.scale_inv, n, ic, oc, stream,
                           scaling_.fast_forward);
}

absl::Status Fp8Linear::Backward(Bf16* din, float* dweight, const Bf16* dout, Fp8Codes in_t, int layer, int index,
                                 const Bf16* weight, int n, int ic, int oc, cudaStream_t stream, bool accumulate_din,
                                 bool accumulate_dweight) {
  if (absl::Status st = CheckCall("backward", layer, index, n, ic, oc); !st.ok()) return st;
  const Fp8Codes w = din != nullptr ? WeightCodes(layer, index, weight, /*transposed=*/true, stream) : Fp8Codes{};
  return BackwardWith(din, dweight, dout, nullptr, in_t, layer, index, w, n, ic, oc, stream, accumulate_din,
                      accumulate_dweight);
}

absl::Status Fp8Linear::BackwardFromCodes(Bf16* din, float* dweight, const Bf16* dout, Fp8Codes in_t, int layer,
                                          int index, Fp8Codes weight, int n, int ic, int oc, cudaStream_t stream,
                                          bool accumulate_din, bool accumulate_dweight) {
  if (absl::Status st = CheckCall("backward", layer, index, n, ic, oc); !st.ok()) return st;
  const Fp8Codes w = din != nullptr ? TransposedCodes(layer, index, weight, stream) : Fp8Codes{};
  return BackwardWith(din, dweight, dout, nullptr, in_t, layer, index, w, n, ic, oc, stream, accumulate_din,
                      accumulate_dweight);
}

std::optional<Fp8Linear::EncodeTarget> Fp8Linear::Target(Fp8Trouble::Role role, int layer, int index,
                                                          uint8_t* codes) const {
  if (layer < 0 || layer >= layers_ || index < 0 || index >= static_cast<int>(weights_.size())) return std::nullopt;
  if (!scaling_.fixed() && (!scaling_.delayed || steps_ == 0)) return std::nullopt;  // the scale is the tensor's own
  float* s = Slot(SlotIndex(layer, role, index));
  return EncodeTarget{s + 1, recording_ ? s + 2 : nullptr, codes};
}

std::optional<Fp8Linear::EncodeTarget> Fp8Linear::OutputGradientTarget(int layer, int index) const {
  return Target(Fp8Trouble::kOutputGradient, layer, index, nullptr);
}

std::optional<Fp8Linear::EncodeTarget> Fp8Linear::InputTarget(int layer, int index) const {
  return Target(Fp8Trouble::kInput, layer, index, in_);
}

Fp8Codes Fp8Linear::InputCodes(int layer, int index) const {
  return {in_, Slot(SlotIndex(layer, Fp8Trouble::kInput, index))};
}

absl::Status Fp8Linear::BackwardFromOutputCodes(Bf16* din, float* dweight, const uint8_t* dout_codes, Fp8Codes in_t,
                                                int layer, int index, const Bf16* weight, Fp8Codes weight_codes, int n,
                                                int ic, int oc, cudaStream_t stream, bool accumulate_din,
                                                bool accumulate_dweight, const uint8_t* dout_codes_t) {
  if (absl::Status st = CheckCall("backward", layer, index, n, ic, oc); !st.ok()) return st;
  if (!OutputGradientTarget(layer, index).has_value()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "FP8 backward of layer %d's weight %d from output-gradient codes: their scale is not known before the "
        "gradient (%s scaling, step %d)",
        layer, index, ModeName(), steps_));
  }
  Fp8Codes w;
  if (din != nullptr) {
    w = weight != nullptr ? WeightCodes(layer, index, weight, /*transposed=*/true, stream)
                          : TransposedCodes(layer, index, weight_codes, stream);
  }
  return BackwardWith(din, dweight, nullptr, dout_codes, in_t, layer, index, w, n, ic, oc, stream, accumulate_din,
                      accumulate_dweight, dout_codes_t);
}

absl::Status Fp8Linear::BackwardWith(Bf16* din, float* dweight, const Bf16* dout, const uint8_t* dout_codes,
                                     Fp8Codes in_t, int layer, int index, Fp8Codes w, int n, int ic, int oc,
                                     cudaStream_t stream, bool accumulate_din, bool accumulate_dweight,
                                     const uint8_t* dout_codes_t) {
  const int slot = SlotIndex(layer, Fp8Trouble::kOutputGradient, index);
  const uint8_t* plain = dout_;
  const uint8_t* transposed = dout_t_;
  Fp8Codes d;
  if (dout_codes != nullptr) {  // made at the slot's scale, its amax recorded by their maker
    if (dout_codes_t != nullptr) {
      transposed = dout_codes_t;
    } else if (dweight != nullptr) {
      TransposeFp8(dout_t_, dout_codes, n, oc, stream);
    }
    plain = dout_codes;
    d = {dout_codes, Slot(slot)};
  } else {
    d = Quantize(din != nullptr ? dout_ : nullptr, dweight != nullptr ? dout_t_ : nullptr, slot, dout, n, oc,
                 /*e5m2=*/true, stream);
  }
  return gemm_->BackwardFp8(din, dweight, plain, transposed, in_t.codes, w.codes, d.scale_inv, in_t.scale_inv,
                            w.scale_inv, n, ic, oc, stream, accumulate_din, accumulate_dweight);
}

void Fp8Linear::EndStep(cudaStream_t stream) {
  const int tensors = Tensors();
  UpdateDelayedScaling(slots_, history_, states_, tensors, scaling_.window, scaling_.margin,
                       scaling_.delayed || scaling_.fixed(), stream, scaling_.fixed());
  cudaMemcpyAsync(host_states_, states_, tensors * sizeof(Fp8ScalingState), cudaMemcpyDeviceToHost, stream);
  cudaEventRecord(states_copied_, stream);
  ++steps_;
  ForgetWeights();  // their codes were made at the old scales
}

std::vector<Fp8Trouble> Fp8Linear::Trouble(int in_a_row) {
  std::vector<Fp8Trouble> trouble;
  if (in_a_row <= 0 || cudaEventSynchronize(states_copied_) != cudaSuccess) return trouble;
  const int maps = static_cast<int>(weights_.size());
  const bool scale_can_miss = scaling_.delayed || scaling_.fixed();  // current scaling fits each tensor
  for (int l = 0; l < layers_; ++l) {
    for (int role = 0; role < 3; ++role) {
      for (int k = 0; k < maps; ++k) {
        const Fp8ScalingState& st = host_states_[SlotIndex(l, static_cast<Fp8Trouble::Role>(role), k)];
        const bool bad = st.non_finite >= in_a_row ||
                         (scale_can_miss && (st.saturated_in_a_row >= in_a_row || st.underflow_in_a_row >= in_a_row));
        if (!bad) continue;
        trouble.push_back({l, k, static_cast<Fp8Trouble::Role>(role), st.non_finite,
                           scale_can_miss ? st.saturated_in_a_row : 0, scale_can_miss ? st.underflow_in_a_row : 0,
                           st.last_amax, st.scale});
      }
    }
  }
  return trouble;
}

const char* Fp8Linear::ModeName() const {
  return scaling_.fixed() ? "fixed" : scaling_.delayed ? "delayed" : "current";
}

std::string Fp8Linear::StateHeader() const {
  return absl::StrFormat("fp8-scaling v1 %s window=%d margin=%d tensors=%d steps=%d;", ModeName(), scaling_.window,
                         scaling_.margin, Tensors(), steps_);
}

absl::StatusOr<std::string> Fp8Linear::SaveState(cudaStream_t stream) {
  const uint64_t tensors = Tensors();
  const uint64_t slot_bytes = tensors * 4 * sizeof(float), history_bytes = tensors * scaling_.window * sizeof(float),
                 state_bytes = tensors * sizeof(Fp8ScalingState);
  std::string bytes = StateHeader();
  const size_t at = bytes.size();
  bytes.resize(at + slot_bytes + history_bytes + state_bytes);
  char* p = bytes.data() + at;
  if (cudaMemcpyAsync(p, slots_, slot_bytes, cudaMemcpyDeviceToHost, stream) != cudaSuccess ||
      cudaMemcpyAsync(p + slot_bytes, history_, history_bytes, cudaMemcpyDeviceToHost, stream) != cudaSuccess ||
      cudaMemcpyAsync(p + slot_bytes + history_bytes, states_, state_bytes, cudaMemcpyDeviceToHost, stream) !=
          cudaSuccess ||
      cudaStreamSynchronize(stream) != cudaSuccess) {
    return absl::InternalError("CUDA: reading the FP8 scaling state failed");
  }
  return bytes;
}

absl::Status Fp8Linear::RestoreState(const std::string& bytes, cudaStream_t stream) {
  const size_t header_end = bytes.find(';');
  if (header_end == std::string::npos) return absl::DataLossError("the FP8 scaling record has no header");
  char mode[16] = {};
  int window = 0, margin = 0, tensors = 0;
  long long steps = 0;
  if (std::sscanf(bytes.c_str(), "fp8-scaling v1 %15s window=%d margin=%d tensors=%d steps=%lld;", mode, &window,
                  &margin, &tensors, &steps) != 5) {
    return absl::DataLossError("the FP8 scaling record's header is malformed");
  }
  const std::string saved(bytes, 0, header_end);
  if (std::strcmp(mode, ModeName()) != 0 || window != scaling_.window || margin != scaling_.margin ||
      tensors != Tensors()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("the checkpoint's FP8 scaling (%s) is not this run's (%s): resume with the same --fp8_scaling, "
                        "--fp8_window, --fp8_margin and layers",
                        saved, StateHeader()));
  }
  const uint64_t slot_bytes = uint64_t(tensors) * 4 * sizeof(float),
                 history_bytes = uint64_t(tensors) * window * sizeof(float),
                 state_bytes = uint64_t(tensors) * sizeof(Fp8ScalingState);
  if (bytes.size() != header_end + 1 + slot_bytes + history_bytes + state_bytes) {
    return absl::DataLossError(absl::StrFormat("the FP8 scaling record is %d bytes, not %d", bytes.size(),
                                               header_end + 1 + slot_bytes + history_bytes + state_bytes));
  }
  const char* p = bytes.data() + header_end + 1;
  if (scaling_.fixed()) {  // the scales are the run's flags: another run's would be taken silently
    for (int t = 0; t < tensors; ++t) {
      Fp8ScalingState st;
      std::memcpy(&st, p + slot_bytes + history_bytes + t * sizeof(Fp8ScalingState), sizeof(st));
      const float want = st.e5m2 ? scaling_.fixed_grad_scale : scaling_.fixed_scale;
      if (st.scale != want) {
        return absl::InvalidArgumentError(absl::StrFormat(
            "the checkpoint's fixed FP8 scale of tensor %d (%s) is %g, this run's %g: resume with the same "
            "--fp8_fixed_scale and --fp8_fixed_grad_scale",
            t, st.e5m2 ? "E5M2" : "E4M3", st.scale, want));
      }
    }
  }
  std::memcpy(host_states_, p + slot_bytes + history_bytes, state_bytes);
  if (cudaMemcpyAsync(slots_, p, slot_bytes, cudaMemcpyHostToDevice, stream) != cudaSuccess ||
      cudaMemcpyAsync(history_, p + slot_bytes, history_bytes, cudaMemcpyHostToDevice, stream) != cudaSuccess ||
      cudaMemcpyAsync(states_, p + slot_bytes + history_bytes, state_bytes, cudaMemcpyHostToDevice, stream) !=
          cudaSuccess ||
      cudaStreamSynchronize(stream) != cudaSuccess) {
    return absl::InternalError("CUDA: restoring the FP8 scaling state failed");
  }
  steps_ = steps;
  ForgetWeights();
  return absl::OkStatus();
}

}  // namespace tierd::trainer::gpu
