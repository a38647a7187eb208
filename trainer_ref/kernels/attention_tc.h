// Tensor-core causal attention (attention_tc.cu): the same contract as AttentionForward and
// AttentionBackward in gpu_ops.h, for head sizes 64 and 128; gpu_ops routes to it.
#ifndef TIERD_TRAINER_REF_KERNELS_ATTENTION_TC_H_
#define TIERD_TRAINER_REF_KERNELS_ATTENTION_TC_H_

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>

#include "trainer_ref/kernels/gpu_ops.h"

namespace tierd::trainer::gpu {

bool TensorCoreAttention(int d);
cudaError_t AttentionForwardTc(Bf16* out, float* lse, const Bf16* q, const Bf16* k, const Bf16* v, int b, int t,
                               int h, int d, cudaStream_t stream);
// `delta`: AttentionTcScratchFloats(b, t, h, d) floats of scratch: rowsum(dO * O) (B, H, T),
// and for the fused backward an fp32 dQ accumulator (B, H, T, D) and its step counters.
size_t AttentionTcScratchFloats(int b, int t, int h, int d);
// Which backward runs: "split" (a key kernel for dK, dV and a query kernel for dQ, S and dP
// computed in both) or "fused" (one kernel, dQ summed across key tiles in a fixed order). The
// same contract and both deterministic. TIERD_ATTENTION_BACKWARD picks it for a run;
// UseAttentionBackwardPath for tests and benchmarks, not while a backward is queued.
const char* AttentionBackwardPath();
const char* UseAttentionBackwardPath(const std::string& want);
cudaError_t AttentionBackwardTc(Bf16* dq, Bf16* dk, Bf16* dv, const Bf16* dout, const Bf16* out, const float* lse,
                                float* delta, const Bf16* q, const Bf16* k, const Bf16* v, int b, int t, int h, int d,
                                cudaStream_t stream);

}  // namespace tierd::trainer::gpu

#endif  // TIERD_TRAINER_REF_KERNELS_ATTENTION_TC_H_
