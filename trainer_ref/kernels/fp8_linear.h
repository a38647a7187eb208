// The decoder layers' linear maps (nn.Linear without bias) in FP8: the precision policy's
// lowest level, for the GEMMs that carry almost all of a step's FLOPs. Weights and inputs go
// in as E4M3, output gradients as E5M2; outputs stay bf16 and weight gradients fp32
// (accumulated over micro-batches, as Gemm::Backward). Each tensor of each layer — a linear
// map's input, its output gradient, its weight — has its own scale, in one of two modes:
//  - delayed (Transformer Engine's recipe, the default): the scale comes from the largest |x|
//    the tensor had over the last `window` steps (fp8.h: DelayedScaling), so a conversion is
//    one read of the tensor, which also takes this step's largest |x| for the history;
//  - current: each conversion first reads the tensor for its largest |x| (AbsMax,
//    ScaleFromAmax, then the conversion), two reads, exact for this tensor;
//  - fixed (for debugging): one scale per format for the whole run, set by the caller.
// Delayed scaling converts at the current scale until the first EndStep (no history yet).
// Everything stays on the stream: the host never waits, except in Health and the state calls.
//
// The codes of a layer's weights are made at their first use and kept while the same
// weights are in use: under layer-major micro-batching a layer's K micro-batches share them,
// and the backward's transposed codes are kept beside the forward's (a checkpointed
// backward recomputes the forward first). ForgetWeights when the weights may have changed.
//
// Not thread-safe: one per model, used on its stream.
#ifndef TIERD_TRAINER_REF_KERNELS_FP8_LINEAR_H_
#define TIERD_TRAINER_REF_KERNELS_FP8_LINEAR_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "trainer_ref/kernels/fp8_ops.h"
#include "trainer_ref/kernels/gemm.h"
#include "trainer_ref/kernels/gpu_ops.h"

namespace tierd::trainer::gpu {

// FP8 codes on the device and the scale that reads them back (value = code * *scale_inv).
struct Fp8Codes {
  const uint8_t* codes = nullptr;
  const float* scale_inv = nullptr;
  // A weight's codes only: the same codes transposed, (in, out), where their maker kept them
  // (the backward's product with the output gradient reads these); null: made here when needed.
  const uint8_t* transposed = nullptr;
};

struct Fp8ScalingOptions {
  bool delayed = true;  // false: current scaling
  int window = 16;      // delayed: steps of amax history
  int margin = 0;       // delayed: the scale is 2^-margin of what the history allows
  // > 0: fixed scaling (a debugging mode; `delayed` then does not matter): every E4M3 tensor
  // (weights, inputs) at fixed_scale, every E5M2 one (output gradients) at fixed_grad_scale,
  // for the whole run; amaxes are still recorded, so saturation and underflow are reported.
  float fixed_scale = 0, fixed_grad_scale = 0;
  bool fixed() const { return fixed_scale > 0; }
  // Not a scale, but the same recipe's: the forward's GEMMs with the tensor cores' fast
  // accumulation (Gemm::ForwardFp8's fast_accumulation); the backward's stay exact.
  bool fast_forward = false;
};

// What a tensor's scale did wrong, as of the last EndStep: its amax was not finite (an
// overflow upstream; cumulative), or, under delayed or fixed scaling, its values saturated the format
// or fell below its smallest normal value so many steps in a row.
struct Fp8Trouble {
  enum Role { kInput, kOutputGradient, kWeight };
  int layer = 0, index = 0;  // index: the linear map (for an input: the first map reading it)
  Role role = kInput;
  int non_finite = 0, saturated_in_a_row = 0, underflow_in_a_row = 0;
  float amax = 0, scale = 1;  // the last recorded amax and the scale it was stored at
};

class Fp8Linear {
 public:
  // The layer's weights, by index: (out features, in features) each.
  using Shapes = std::vector<std::pair<int, int>>;
  // Device bytes for up to `rows` rows and `layers` layers of these weights.
  static uint64_t BytesFor(int64_t rows, const Shapes& weights, int layers = 1, const Fp8ScalingOptions& scaling = {});
  // INVALID_ARGUMENT unless every dimension and `rows` is a multiple of 16 (FP8 tensor cores
  // take no other) and the window is 1..1024; RESOURCE_EXHAUSTED with the bytes when the
  // device has no room.
  static absl::StatusOr<std::unique_ptr<Fp8Linear>> Create(Gemm* gemm, int64_t rows, const Shapes& weights,
                                                           int layers = 1, const Fp8ScalingOptions& scaling = {});
  ~Fp8Linear();
  Fp8Linear(const Fp8Linear&) = delete;
  Fp8Linear& operator=(const Fp8Linear&) = delete;

  // The weights' codes are made again at their next use.
  void ForgetWeights();
  // `in` (rows x cols, bf16), the input of layer `layer`'s linear map `index` (and of the maps
  // after it that read the same tensor), as E4M3 codes for Forward, valid until the next
  // QuantizeInput or QuantizeInputTransposed (one buffer: a layer's forward and backward do
  // not overlap).
  Fp8Codes QuantizeInput(int layer, int index, const Bf16* in, int rows, int cols, cudaStream_t stream);
  // The same, transposed (cols x rows): what Backward's weight gradient reads.
  Fp8Codes QuantizeInputTransposed(int layer, int index, const Bf16* in, int rows, int cols, cudaStream_t stream);
  // QuantizeInput's codes, and from the same read the same codes transposed into `transposed`
  // (cols x rows, the caller's: a layer keeps them for its backward instead of the bf16 input).
  Fp8Codes QuantizeInputKeepingTransposed(int layer, int index, const Bf16* in, int rows, int cols,
                                          uint8_t* transposed, cudaStream_t stream);
  // InputCodes (written by the input's maker at InputTarget) transposed into `transposed`.
  void TransposeInputCodes(int rows, int cols, uint8_t* transposed, cudaStream_t stream);
  // Whether an input's scale stays as it is until EndStep (delayed scaling after its first
  // step, fixed scaling), so that codes kept from the forward read back with InputCodes'
  // scale_inv in the backward; otherwise each conversion sets it anew (current scaling) and
  // the keeper copies the scale_inv it was made at.
  bool InputScalesHoldWithinStep() const { return scaling_.fixed() || (scaling_.delayed && steps_ > 0); }
  // out (n, oc) = in x W^T, W weight `index` of layer `layer`, bf16 (oc, ic).
  absl::Status Forward(Bf16* out, Fp8Codes in, int layer, int index, const Bf16* weight, int n, int ic, int oc,
                       cudaStream_t stream);
  // din (n, ic, bf16) += dout x W (`accumulate_din` false: =) and dweight (oc, ic, fp32) +=
  // dout^T x in (`accumulate_dweight` false: =), either may be null; dout (n, oc) bf16,
  // converted to E5M2 here; in_t from QuantizeInputTransposed.
  absl::Status Backward(Bf16* din, float* dweight, const Bf16* dout, Fp8Codes in_t, int layer, int index,
                        const Bf16* weight, int n, int ic, int oc, cudaStream_t stream, bool accumulate_din = true,
                        bool accumulate_dweight = true);
  // Forward and Backward from a weight's codes made elsewhere instead of its bf16 values: E4M3,
  // (oc, ic), read back with *weight.scale_inv (the host's optimizer step writes them at
  // current scaling, fp8_codes.h, so the GPU fetches 1 byte a parameter instead of 2). The
  // weight's own scale is then not used or recorded. Backward reads weight.transposed where
  // given, else transposes the codes once per (layer, codes) until ForgetWeights, as it keeps
  // its own.
  absl::Status ForwardFromCodes(Bf16* out, Fp8Codes in, int layer, int index, Fp8Codes weight, int n, int ic, int oc,
                                cudaStream_t stream);
  absl::Status BackwardFromCodes(Bf16* din, float* dweight, const Bf16* dout, Fp8Codes in_t, int layer, int index,
                                 Fp8Codes weight, int n, int ic, int oc, cudaStream_t stream,
                                 bool accumulate_din = true, bool accumulate_dweight = true);
  // Where another kernel may write the E5M2 codes of layer `layer`'s map `index`'s output
  // gradient itself (SwiGluBackwardFp8): the scale to encode at and the step's running amax to
  // fold into (null while not recording). None while that scale comes from the tensor itself
  // (current scaling, and delayed scaling's first step, which has no history yet).
  struct EncodeTarget {
    const float* scale = nullptr;
    float* amax = nullptr;
    uint8_t* codes = nullptr;  // InputTarget's: where QuantizeInput would write them
  };
  std::optional<EncodeTarget> OutputGradientTarget(int layer, int index) const;
  // The same for the E4M3 codes of the input of layer `layer`'s maps from `index` on (what
  // QuantizeInput makes), written by the kernel that makes the input (gpu_ops.h: Fp8Out), and
  // then read as InputCodes: QuantizeInput's result, without its pass over the input.
  std::optional<EncodeTarget> InputTarget(int layer, int index) const;
  Fp8Codes InputCodes(int layer, int index) const;
  // Backward (weight: bf16) or BackwardFromCodes (weight.codes) from output-gradient codes
  // made at OutputGradientTarget's scale, dout_codes (n, oc): no conversion here, the codes
  // only transposed for the weight gradient, unless their maker wrote them transposed too
  // (dout_codes_t, (oc, n)).
  absl::Status BackwardFromOutputCodes(Bf16* din, float* dweight, const uint8_t* dout_codes, Fp8Codes in_t,
                                       int layer, int index, const Bf16* weight, Fp8Codes weight_codes, int n, int ic,
                                       int oc, cudaStream_t stream, bool accumulate_din = true,
                                       bool accumulate_dweight = true, const uint8_t* dout_codes_t = nullptr);
  // The end of a training step, after its last backward is queued: each tensor's largest |x|
  // of the step goes into its history and, under delayed scaling, sets the next step's scale;
  // the weights' codes are made anew (their scales may have changed). The states come back to
  // the host with the stream, for Trouble.
  void EndStep(cudaStream_t stream);
  // Off: conversions do not record amaxes (a validation pass must not steer the training's
  // scales). On by default.
  void set_recording(bool on) { recording_ = on; }
  // The tensors whose scaling went wrong `in_a_row` steps in a row as of the last EndStep (a
  // non-finite amax counts as soon as `in_a_row` of them were seen; saturation and underflow
  // only under delayed scaling, where the scale can fall behind the tensor). Waits for the
  // last EndStep's copy.
  std::vector<Fp8Trouble> Trouble(int in_a_row);
  const Fp8ScalingOptions& scaling() const { return scaling_; }
  // Steps recorded so far (EndStep calls); delayed scaling uses its history from the first.
  int64_t steps() const { return steps_; }
  // Every tensor's scaling state (history included) as bytes, for a checkpoint; waits for
  // the stream. RestoreState puts it back (INVALID_ARGUMENT for a state of another shape,
  // mode or window, saying which), so a resumed run converts with the same scales.
  absl::StatusOr<std::string> SaveState(cudaStream_t stream);
  absl::Status RestoreState(const std::string& bytes, cudaStream_t stream);

 private:
  Fp8Linear() = default;
  // A tensor's scale slot: scale_inv (16-byte aligned, as cuBLASLt wants it), scale, the
  // step's running amax, and this conversion's amax (current scaling).
  int SlotIndex(int layer, Fp8Trouble::Role role, int index) const {
    return (layer * 3 + static_cast<int>(role)) * static_cast<int>(weights_.size()) + index;
  }
  float* Slot(int i) const { return slots_ + 4 * i; }
  int Tensors() const { return layers_ * 3 * static_cast<int>(weights_.size()); }
  // OutputGradientTarget's and InputTarget's: the slot of (role, layer, index) while its scale
  // is known before the tensor, with the codes' place `codes`.
  std::optional<EncodeTarget> Target(Fp8Trouble::Role role, int layer, int index, uint8_t* codes) const;
  // Codes of `in` at its tensor's scale, into `out`, with slot `slot`: plain and/or transposed.
  Fp8Codes Quantize(uint8_t* plain, uint8_t* transposed, int slot, const Bf16* in, int rows, int cols, bool e5m2,
                    cudaStream_t stream);
  Fp8Codes WeightCodes(int layer, int index, const Bf16* weight, bool transposed, cudaStream_t stream);
  // The transposed codes of codes made elsewhere (ForwardFromCodes).
  Fp8Codes TransposedCodes(int layer, int index, Fp8Codes weight, cudaStream_t stream);
  // The backward's GEMMs once the weight's transposed codes `w` are known (unused without din).
  // dout (bf16, converted here) or dout_codes (OutputGradientTarget's) is the output gradient.
  absl::Status BackwardWith(Bf16* din, float* dweight, const Bf16* dout, const uint8_t* dout_codes, Fp8Codes in_t,
                            int layer, int index, Fp8Codes w, int n, int ic, int oc, cudaStream_t stream,
                            bool accumulate_din, bool accumulate_dweight, const uint8_t* dout_codes_t = nullptr);
  absl::Status CheckCall(const char* what, int layer, int index, int n, int ic, int oc) const;
  std::string StateHeader() const;
  const char* ModeName() const;  // delayed, current or fixed, as the state's header says

  Gemm* gemm_ = nullptr;
  int64_t rows_ = 0;
  int layers_ = 1;
  Fp8ScalingOptions scaling_;
  Shapes weights_;
  std::vector<uint64_t> weight_offset_;
  int64_t max_features_ = 0;
  std::vector<void*> allocations_;
  uint8_t *weight_codes_ = nullptr, *weight_codes_t_ = nullptr;  // one layer's weights', at weight_offset_
  uint8_t *in_ = nullptr, *dout_ = nullptr, *dout_t_ = nullptr;  // rows x max_features each
  float* slots_ = nullptr;
  float* history_ = nullptr;                // Tensors() x window
  Fp8ScalingState* states_ = nullptr;       // Tensors()
  Fp8ScalingState* host_states_ = nullptr;  // pinned, copied at EndStep
  cudaEvent_t states_copied_ = nullptr;
  bool recording_ = true;
  int64_t steps_ = 0;
  // Per weight and form (plain, transposed): the layer and tensor (bf16 weights, or codes made
  // elsewhere) its codes were made from.
  struct Made {
    int layer = -1;
    const void* from = nullptr;
  };
  std::vector<std::pair<Made, Made>> made_from_;
};

}  // namespace tierd::trainer::gpu

#endif  // TIERD_TRAINER_REF_KERNELS_FP8_LINEAR_H_
