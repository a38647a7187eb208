// A decoder layer's linear maps (nn.Linear without bias) in FP8: the precision policy's
// lowest level, for the GEMMs that carry almost all of a step's FLOPs. Weights and inputs go
// in as E4M3, output gradients as E5M2; outputs stay bf16 and weight gradients fp32
// (accumulated over micro-batches, as Gemm::Backward). Each tensor is scaled by its own
// largest |x| just before it is converted (current scaling: AbsMax, ScaleFromAmax and
// Quantize on the stream), so no scale history is kept and the host never waits.
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
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "trainer_ref/kernels/gemm.h"
#include "trainer_ref/kernels/gpu_ops.h"

namespace tierd::trainer::gpu {

// FP8 codes on the device and the scale that reads them back (value = code * *scale_inv).
struct Fp8Codes {
  const uint8_t* codes = nullptr;
  const float* scale_inv = nullptr;
};

class Fp8Linear {
 public:
  // The layer's weights, by index: (out features, in features) each.
  using Shapes = std::vector<std::pair<int, int>>;
  // Device bytes for up to `rows` rows and layers of these weights.
  static uint64_t BytesFor(int64_t rows, const Shapes& weights);
  // INVALID_ARGUMENT unless every dimension and `rows` is a multiple of 16 (FP8 tensor cores
  // take no other); RESOURCE_EXHAUSTED with the bytes when the device has no room.
  static absl::StatusOr<std::unique_ptr<Fp8Linear>> Create(Gemm* gemm, int64_t rows, const Shapes& weights);
  ~Fp8Linear();
  Fp8Linear(const Fp8Linear&) = delete;
  Fp8Linear& operator=(const Fp8Linear&) = delete;

  // The weights' codes are made again at their next use.
  void ForgetWeights();
  // `in` (rows x cols, bf16) as E4M3 codes for Forward, valid until the next QuantizeInput
  // or QuantizeInputTransposed (one buffer: a layer's forward and backward do not overlap).
  Fp8Codes QuantizeInput(const Bf16* in, int rows, int cols, cudaStream_t stream);
  // The same, transposed (cols x rows): what Backward's weight gradient reads.
  Fp8Codes QuantizeInputTransposed(const Bf16* in, int rows, int cols, cudaStream_t stream);
  // out (n, oc) = in x W^T, W weight `index` of the layer, bf16 (oc, ic).
  absl::Status Forward(Bf16* out, Fp8Codes in, int index, const Bf16* weight, int n, int ic, int oc,
                       cudaStream_t stream);
  // din (n, ic, bf16) += dout x W (`accumulate_din` false: =) and dweight (oc, ic, fp32) +=
  // dout^T x in, either may be null; dout (n, oc) bf16, converted to E5M2 here; in_t from
  // QuantizeInputTransposed.
  absl::Status Backward(Bf16* din, float* dweight, const Bf16* dout, Fp8Codes in_t, int index, const Bf16* weight,
                        int n, int ic, int oc, cudaStream_t stream, bool accumulate_din = true);

 private:
  Fp8Linear() = default;
  // A scale slot: scale_inv (16-byte aligned, as cuBLASLt wants it), scale, amax, padding.
  float* Slot(int i) const { return slots_ + 4 * i; }
  // Codes of `in` at its current scale, into `out`, with slot `slot`: plain and/or transposed.
  Fp8Codes Quantize(uint8_t* plain, uint8_t* transposed, int slot, const Bf16* in, int rows, int cols, bool e5m2,
                    cudaStream_t stream);
  Fp8Codes WeightCodes(int index, const Bf16* weight, bool transposed, cudaStream_t stream);

  Gemm* gemm_ = nullptr;
  int64_t rows_ = 0;
  Shapes weights_;
  std::vector<uint64_t> weight_offset_;
  int64_t max_features_ = 0;
  std::vector<void*> allocations_;
  uint8_t *weight_codes_ = nullptr, *weight_codes_t_ = nullptr;  // every weight's, at weight_offset_
  uint8_t *in_ = nullptr, *dout_ = nullptr, *dout_t_ = nullptr;  // rows x max_features each
  float* slots_ = nullptr;
  // Per weight and form (plain, transposed): the bf16 tensor its codes were made from.
  std::vector<std::pair<const Bf16*, const Bf16*>> made_from_;
};

}  // namespace tierd::trainer::gpu

#endif  // TIERD_TRAINER_REF_KERNELS_FP8_LINEAR_H_
