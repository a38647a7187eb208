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
// `scratch`: AttentionBackwardScratchBytes (gpu_ops.h) bytes or more; the backward runs as
// many sequences at a time as their dS^T fits in.
cudaError_t AttentionBackwardTc(Bf16* dq, Bf16* dk, Bf16* dv, const Bf16* dout, const Bf16* out, const float* lse,
                                void* scratch, int64_t scratch_bytes, const Bf16* q, const Bf16* k, const Bf16* v,
                                int b, int t, int h, int d, cudaStream_t stream);

// The backward's kernels one at a time, for attention_bench's breakdown of where its time
// goes: delta = rowsum(dO * O); the key kernel (dK, dV, and dS^T into the scratch); the dQ
// kernel (dQ = dS K). With `recompute_dq` the key kernel writes no dS^T and the query kernel
// computes S and dP again (the previous design, 7 matmuls of the forward's size instead of 5).
// A part reads what the parts before it wrote: to time kQueries alone, give scratch for the
// whole batch's dS^T.
enum class AttentionBackwardPart { kDelta, kKeys, kQueries };
cudaError_t AttentionBackwardPartTc(AttentionBackwardPart part, bool recompute_dq, Bf16* dq, Bf16* dk, Bf16* dv,
                                    const Bf16* dout, const Bf16* out, const float* lse, void* scratch,
                                    int64_t scratch_bytes, const Bf16* q, const Bf16* k, const Bf16* v, int b, int t,
                                    int h, int d, cudaStream_t stream);

}  // namespace tierd::trainer::gpu

#endif  // TIERD_TRAINER_REF_KERNELS_ATTENTION_TC_H_
