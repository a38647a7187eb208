// The reference decoder on the GPU: the same layers, names and layout as trainer_ref/model
// (the CPU oracle), computed by the kernels of gpu_ops.h and cuBLASLt (gemm.h). Storage:
// weights bf16 (what the GEMMs read), fp32 master weights (norm weights are read from them
// directly), fp32 gradients and Adam moments; activations bf16 with fp32 statistics, kept
// per layer for backward. Everything on one stream; only Forward's loss waits for it.
//
// This is the whole model in GPU memory (the `--offload_policy=none` path); leasing its
// tensors from tierd is built on top of it.
#ifndef TIERD_TRAINER_REF_KERNELS_GPU_MODEL_H_
#define TIERD_TRAINER_REF_KERNELS_GPU_MODEL_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "trainer_ref/kernels/gemm.h"
#include "trainer_ref/kernels/gpu_ops.h"
#include "trainer_ref/model.h"
#include "trainer_ref/optimizer.h"

namespace tierd::trainer::gpu {

class GpuModel {
 public:
  // RESOURCE_EXHAUSTED with the bytes when the device has no room; FAILED_PRECONDITION
  // without a device; INVALID_ARGUMENT for a head size above 256.
  static absl::StatusOr<std::unique_ptr<GpuModel>> Create(const ModelConfig& config, int batch, int seq);
  ~GpuModel();
  GpuModel(const GpuModel&) = delete;
  GpuModel& operator=(const GpuModel&) = delete;

  // fp32 parameters in ParamLayout order: the master copy, and the bf16 weights from it.
  absl::Status SetParams(const std::vector<float>& params);
  absl::Status GetParams(std::vector<float>* params);  // the fp32 master copy
  // The mean loss over the counted targets; keeps what backward needs (and dlogits).
  absl::StatusOr<double> Forward(const int32_t* tokens, const int32_t* targets);
  absl::Status Backward();  // adds into the gradients
  absl::Status ZeroGrads();
  absl::Status GetGrads(std::vector<float>* grads);  // fp32, ParamLayout order
  // The L2 norm of all gradients (one reduction on the device, then a wait).
  absl::StatusOr<double> GradNorm();
  // AdamW on every tensor (norm weights not decayed), gradients scaled by grad_scale first.
  absl::Status AdamWStep(double lr, int64_t step, const AdamWOptions& options, double grad_scale);
  // Where the GPU time goes: with profiling on, each kernel or GEMM is bracketed by CUDA
  // events (costly; for measurement runs) and TakeProfile returns the milliseconds per
  // category since the last call: "gemm", "attention", "norm+elementwise", "loss",
  // "optimizer".
  void EnableProfile(bool on) { profiling_ = on; }
  std::vector<std::pair<std::string, double>> TakeProfile();
  // Device bytes this model holds (parameters, state, activations, workspace).
  uint64_t DeviceBytes() const { return device_bytes_; }

 private:
  GpuModel(const ModelConfig& config, int batch, int seq);
  absl::Status Allocate();
  template <typename T>
  absl::StatusOr<T*> Take(size_t count);
  Bf16* W(size_t entry) const { return weights_ + layout_[entry].offset; }
  float* M(size_t entry) const { return master_ + layout_[entry].offset; }
  float* G(size_t entry) const { return grads_ + layout_[entry].offset; }

  using Layer = LayerEntries;
  struct Acts {  // per layer, kept from forward for backward
    float *x_in, *x_mid;  // the residual stream, fp32
    Bf16 *h1, *q, *k, *v, *a, *h2, *g, *u, *s;
    float *rstd1, *rstd2, *lse;
  };

  ModelConfig config_;
  int batch_, seq_;
  std::vector<TensorLayout> layout_;
  std::vector<Layer> layers_;
  size_t embed_ = 0, final_norm_ = 0, head_ = 0;
  std::unique_ptr<Gemm> gemm_;
  cudaStream_t stream_ = nullptr;
  std::vector<void*> allocations_;
  uint64_t device_bytes_ = 0;
  size_t total_params_ = 0;
  Bf16* weights_ = nullptr;
  float *master_ = nullptr, *grads_ = nullptr, *m_ = nullptr, *v_ = nullptr;
  std::vector<Acts> acts_;
  float *x_ = nullptr, *x_out_ = nullptr, *dx_ = nullptr;  // residual stream and its gradient, fp32
  Bf16 *tmp_ = nullptr, *xf_ = nullptr, *logits_ = nullptr, *dlogits_ = nullptr, *dx16_ = nullptr;
  float *rstd_f_ = nullptr, *losses_ = nullptr, *norm_ = nullptr, *delta_ = nullptr;
  Bf16 *dxf_ = nullptr, *dh_ = nullptr, *da_ = nullptr, *dq_ = nullptr, *dk_ = nullptr, *dv_ = nullptr, *ds_ = nullptr,
       *dg_ = nullptr, *du_ = nullptr;
  int32_t *tokens_ = nullptr, *targets_ = nullptr;
  std::vector<float> host_losses_;
  template <typename Fn>
  auto Timed(int category, Fn&& fn);
  bool profiling_ = false;
  struct Span {
    int category;
    cudaEvent_t start, end;
  };
  std::vector<Span> spans_;
};

}  // namespace tierd::trainer::gpu

#endif  // TIERD_TRAINER_REF_KERNELS_GPU_MODEL_H_
