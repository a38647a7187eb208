// FP8 on the GPU: a tensor's largest |x| and its conversion to FP8 codes at a per-tensor
// scale, as trainer_ref/fp8.h does on the CPU (the reference they are tested against, bit
// for bit). The FP8 GEMM is Gemm::ForwardFp8 (gemm.h). All pointers are device pointers;
// each function only queues work on `stream`.
#ifndef TIERD_TRAINER_REF_KERNELS_FP8_OPS_H_
#define TIERD_TRAINER_REF_KERNELS_FP8_OPS_H_

#include <cuda_runtime_api.h>

#include <cstdint>

#include "trainer_ref/kernels/gpu_ops.h"

namespace tierd::trainer::gpu {

// *amax = max |in[i]| over n bf16 values (0 for n = 0; NaN if any is NaN). Order-free, so
// deterministic.
void AbsMax(float* amax, const Bf16* in, int64_t n, cudaStream_t stream);
// Current scaling: *scale = fp8::CurrentScale(*amax) (E4M3, or E5M2 with `e5m2`) and
// *scale_inv = 1 / *scale, on the device (nothing for the host to wait on). With
// `running_amax`, *amax is also folded into it (a step's running amax, as QuantizeFp8 folds).
void ScaleFromAmax(float* scale, float* scale_inv, const float* amax, bool e5m2, cudaStream_t stream,
                   float* running_amax = nullptr);
// The same for `count` tensors in one launch: slot t, at slots + t * stride floats, gets
// {scale_inv, scale, amax} from amax[t] (E4M3, or E5M2 with `e5m2`).
void ScalesFromAmaxes(float* slots, int stride, const float* amax, int count, bool e5m2, cudaStream_t stream);
// out[i] = the FP8 code of in[i] * *scale (round to nearest even, saturating to the largest
// finite value, NaN kept): E4M3, or E5M2 with `e5m2`. With `amax`, the input's largest |x| is
// taken from the same reads and folded into *amax (max with what is there: a step's running
// amax, as delayed scaling records it).
void QuantizeFp8(uint8_t* out, const Bf16* in, int64_t n, const float* scale, bool e5m2, cudaStream_t stream,
                 float* amax = nullptr);
// The same for a row-major (rows, cols) matrix, written transposed: out (cols, rows). The
// backward GEMMs read weights, inputs and output gradients transposed, and FP8 tensor cores
// take only the transposed-A, plain-B form, so these copies are made as the codes are. With
// `plain`, the untransposed codes too (QuantizeFp8's), from the same read of the input.
void QuantizeFp8Transposed(uint8_t* out, const Bf16* in, int rows, int cols, const float* scale, bool e5m2,
                           cudaStream_t stream, uint8_t* plain = nullptr, float* amax = nullptr);

// SwiGluBackward's dgate and dup (gpu_ops.h) as E5M2 codes at *scale_gate and *scale_up,
// without the bf16 tensors: the codes QuantizeFp8 makes of SwiGluBackward's outputs, bit for
// bit, and their largest |x| folded into *amax_gate and *amax_up (either null: not). What a
// layer's backward writes when the scales are known before the gradients are (delayed
// scaling): one pass instead of SwiGluBackward's write and the conversions' reads.
void SwiGluBackwardFp8(uint8_t* dgate, uint8_t* dup, const Bf16* dout, const Bf16* gate, const Bf16* up, int64_t count,
                       const float* scale_gate, const float* scale_up, float* amax_gate, float* amax_up,
                       cudaStream_t stream);
// The same over (rows, cols), also writing both gradients' codes transposed, (cols, rows) into
// dgate_t and dup_t: what their weight gradients' GEMMs read, with no byte transpose after. The
// same codes and amaxes as SwiGluBackwardFp8. Only for rows and cols multiples of 64 and every
// pointer 16-byte aligned (8 for the codes): false, and nothing written, otherwise.
bool SwiGluBackwardFp8Transposed(uint8_t* dgate, uint8_t* dup, uint8_t* dgate_t, uint8_t* dup_t, const Bf16* dout,
                                 const Bf16* gate, const Bf16* up, int rows, int cols, const float* scale_gate,
                                 const float* scale_up, float* amax_gate, float* amax_up, cudaStream_t stream);
// SwiGLU's forward (gpu_ops.h: SwiGluForward) over (rows, cols) straight to the E4M3 codes of
// its output at *scale, plain (rows, cols) and transposed (cols, rows), its largest |x| folded
// into *amax (null: not): the codes SwiGluForward's Fp8Out makes, then those transposed, and no
// bf16 output. Only for rows and cols multiples of 64, gate, up and `transposed` 16-byte
// aligned and `plain` 8-byte: false, and nothing written, otherwise.
bool SwiGluForwardFp8Transposed(uint8_t* plain, uint8_t* transposed, const Bf16* gate, const Bf16* up, int rows,
                                int cols, const float* scale, float* amax, cudaStream_t stream);

// RopeBackward of dx (B*T, H, D) as FP8 codes at *scale (E5M2 with `e5m2`), plain (B*T, H*D)
// and transposed (H*D, B*T), its largest |x| folded into *amax (null: not), without writing
// the turned bf16 values: the codes QuantizeFp8Transposed makes of RopeBackward's output, bit
// for bit, in one pass over dx instead of RoPE's read and write and the conversion's read. For
// B*T and H*D multiples of 64, D of 8, dx and `transposed` 16-byte aligned, `plain` 8: false,
// and nothing written, otherwise.
bool RopeBackwardFp8Transposed(uint8_t* plain, uint8_t* transposed, const Bf16* dx, int b, int t, int h, int d,
                               const RopeFrequencies& freq, const float* scale, bool e5m2, float* amax,
                               cudaStream_t stream);

// out (cols, rows) = in (rows, cols) transposed, as bytes: the transposed FP8 codes the
// backward reads, made from plain ones another party encoded (the host's optimizer step).
void TransposeFp8(uint8_t* out, const uint8_t* in, int rows, int cols, cudaStream_t stream);

// Delayed scaling's state of one tensor on the device, as fp8::DelayedScaling keeps it: the
// scale the window's amaxes give (1 until has_scale), where the next amax goes in the ring of
// the last `window`, and what a precision policy reads (overflows, saturation, underflow).
struct Fp8ScalingState {
  float scale = 1.0f;
  float last_amax = 0.0f;  // the amax recorded last
  int32_t count = 0, next = 0;
  int32_t non_finite = 0, saturated_in_a_row = 0, underflow_in_a_row = 0;
  int32_t has_scale = 0;
  int32_t e5m2 = 0;  // the tensor's format (E4M3 otherwise)
};

// The end of a step for `tensors` tensors: tensor t's running amax (slots[4 t + 2], reset to 0
// here) is recorded in its state and its history (`window` floats at history + t * window), as
// fp8::DelayedScaling::Record does, bit for bit. With `set_scales` each tensor with a scale has
// it written to its slot for the next step's conversions (slots[4 t + 1] = scale, slots[4 t] =
// 1 / scale: delayed scaling); without, the slots are left to the conversions' own (current
// scaling), and the states only count. With `fixed_scales` no state's scale moves (the caller
// set them: fp8::DelayedScaling::Fixed); the history and the counts are kept as ever.
void UpdateDelayedScaling(float* slots, float* history, Fp8ScalingState* states, int tensors, int window, int margin,
                          bool set_scales, cudaStream_t stream, bool fixed_scales = false);

}  // namespace tierd::trainer::gpu

#endif  // TIERD_TRAINER_REF_KERNELS_FP8_OPS_H_
