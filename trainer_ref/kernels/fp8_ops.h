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
// *scale_inv = 1 / *scale, on the device (nothing for the host to wait on).
void ScaleFromAmax(float* scale, float* scale_inv, const float* amax, bool e5m2, cudaStream_t stream);
// out[i] = the FP8 code of in[i] * *scale (round to nearest even, saturating to the largest
// finite value, NaN kept): E4M3, or E5M2 with `e5m2`.
void QuantizeFp8(uint8_t* out, const Bf16* in, int64_t n, const float* scale, bool e5m2, cudaStream_t stream);
// The same for a row-major (rows, cols) matrix, written transposed: out (cols, rows). The
// backward GEMMs read weights, inputs and output gradients transposed, and FP8 tensor cores
// take only the transposed-A, plain-B form, so these copies are made as the codes are. With
// `plain`, the untransposed codes too (QuantizeFp8's), from the same read of the input.
void QuantizeFp8Transposed(uint8_t* out, const Bf16* in, int rows, int cols, const float* scale, bool e5m2,
                           cudaStream_t stream, uint8_t* plain = nullptr);

}  // namespace tierd::trainer::gpu

#endif  // TIERD_TRAINER_REF_KERNELS_FP8_OPS_H_
