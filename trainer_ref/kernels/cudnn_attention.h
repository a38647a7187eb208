// Causal attention through cuDNN's fused scaled-dot-product attention (its Hopper kernels:
// PyTorch's SDPA picks them on an H200), forward and backward, bf16 in and out, fp32
// softmax statistics. cuDNN is opened at run time (libcudnn.so.9 on the library path): a
// machine without it keeps our own kernels (attention_tc.h), and nothing links against it.
// The same layout as ours: q, out, dq (B, T, H, D) rows; k, v, dk, dv (B, T, KV, D) with
// KV key/value heads (grouped-query attention when KV < H, no repeated heads needed);
// stats B * H * T floats, written by Forward for Backward (cuDNN's own convention: use the
// two together, not with ours).
#ifndef TIERD_TRAINER_REF_KERNELS_CUDNN_ATTENTION_H_
#define TIERD_TRAINER_REF_KERNELS_CUDNN_ATTENTION_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "trainer_ref/kernels/gpu_ops.h"

namespace tierd::trainer::gpu {

class CudnnAttention {
 public:
  struct Shape {
    int batch = 0, seq = 0, heads = 0, kv_heads = 0, head_dim = 0;
  };
  // UNAVAILABLE, saying why, when libcudnn.so.9 cannot be opened, or cuDNN has no fused
  // attention for this shape on this GPU (its graphs are built here, once per shape).
  // `deterministic`: the backward's deterministic algorithm (the same bits run to run).
  // `all_plans`: every plan cuDNN's heuristics and fallback list offer for each pass is built,
  // for Autotune to time (until then the heuristics' first runs, as without).
  static absl::StatusOr<std::unique_ptr<CudnnAttention>> Create(const Shape& shape, bool deterministic = true,
                                                                bool all_plans = false);
  // Whether libcudnn.so.9 opens here (opened once and kept; the reason when not).
  static bool Loadable(std::string* why = nullptr);
  ~CudnnAttention();
  CudnnAttention(const CudnnAttention&) = delete;
  CudnnAttention& operator=(const CudnnAttention&) = delete;

  // Device bytes the calls need as `workspace` (the larger of the two passes'; may be 0).
  int64_t workspace_bytes() const;
  // "cuDNN 9.x.y", for the run's report.
  std::string Describe() const;

  absl::Status Forward(Bf16* out, float* stats, const Bf16* q, const Bf16* k, const Bf16* v, void* workspace,
                       cudaStream_t stream);
  absl::Status Backward(Bf16* dq, Bf16* dk, Bf16* dv, const Bf16* dout, const Bf16* out, const float* stats,
                        const Bf16* q, const Bf16* k, const Bf16* v, void* workspace, cudaStream_t stream);
  // Made with all_plans: each pass's plans timed on these buffers (out, stats, dq, dk, dv are
  // written, the device synchronized), the fastest kept for every later call. Returns each
  // pass's plan count and the chosen plan's name.
  absl::StatusOr<std::string> Autotune(Bf16* out, float* stats, Bf16* dq, Bf16* dk, Bf16* dv, const Bf16* dout,
                                       const Bf16* q, const Bf16* k, const Bf16* v, void* workspace,
                                       cudaStream_t stream);
  // The plan each pass runs, by cuDNN's name ("forward: <name>; backward: <name>").
  std::string PlanNames() const;

 private:
  struct Impl;
  explicit CudnnAttention(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace tierd::trainer::gpu

#endif  // TIERD_TRAINER_REF_KERNELS_CUDNN_ATTENTION_H_
