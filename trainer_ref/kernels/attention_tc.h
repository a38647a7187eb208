// Tensor-core causal attention (attention_tc.cu): the same contract as AttentionForward and
// AttentionBackward in gpu_ops.h, for head sizes 64 and 128; gpu_ops routes to it.
#ifndef TIERD_TRAINER_REF_KERNELS_ATTENTION_TC_H_
#define TIERD_TRAINER_REF_KERNELS_ATTENTION_TC_H_

#include <cuda_runtime_api.h>

#include "trainer_ref/kernels/gpu_ops.h"

namespace tierd::trainer::gpu {

bool TensorCoreAttention(int d);
cudaError_t AttentionForwardTc(Bf16* out, float* lse, const Bf16* q, const Bf16* k, const Bf16* v, int b, int t,
                               int h, int d, cudaStream_t stream);
// `delta` (B, H, T, fp32): scratch for rowsum(dO * O).
cudaError_t AttentionBackwardTc(Bf16* dq, Bf16* dk, Bf16* dv, const Bf16* dout, const Bf16* out, const float* lse,
                                float* delta, const Bf16* q, const Bf16* k, const Bf16* v, int b, int t, int h, int d,
                                cudaStream_t stream);

}  // namespace tierd::trainer::gpu

#endif  // TIERD_TRAINER_REF_KERNELS_ATTENTION_TC_H_
