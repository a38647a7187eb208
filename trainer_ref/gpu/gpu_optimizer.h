// The GPU trainer's optimizers behind one interface: what state each keeps for a tensor (in
// the group's two state parts, kAdamM and kAdamV), how the GPU and the host step a tensor's
// values (the same bits either way, but for Adafactor's matrices: their row and column sums
// run in another order, a few ulps apart), and what the checkpoint's shape record says of it. One
// file each: AdamW (fp32 moments), AdamW with 8-bit moments, Lion, Adafactor. GpuModel holds
// one and never asks which it is.
#ifndef TIERD_TRAINER_REF_GPU_GPU_OPTIMIZER_H_
#define TIERD_TRAINER_REF_GPU_GPU_OPTIMIZER_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "trainer_ref/kernels/gpu_ops.h"
#include "trainer_ref/model.h"

namespace tierd::trainer::gpu {

// A tensor's values to update and its state: device pointers for StepGpu (the gradients fp32,
// or the compact state's bf16 in grads_bf16), host pointers for StepHost (fp32 gradients).
struct TensorUpdate {
  const TensorLayout* tensor = nullptr;
  int64_t count = 0;  // the values to update; the whole tensor where StateAtTensorOffsets
  float* master = nullptr;
  void* m = nullptr;  // the state in the first part for these values (GpuModel::StateAt)
  void* v = nullptr;  // in the second part; null where the optimizer keeps none
  Bf16* weights = nullptr;  // receives the new master rounded to bf16
  // Where FoldsWeightsAmax: the largest |x| of the bf16 weights written, folded in (AbsMax's
  // bits; zeroed by the caller, shared by the tensor's chunks).
  float* weights_amax = nullptr;
  const float* grads = nullptr;
  const Bf16* grads_bf16 = nullptr;
  AdamWParams params;  // the step's: learning rate, betas, decay, the clip factor, the step count
};

class GpuOptimizer {
 public:
  virtual ~GpuOptimizer() = default;
  // The bytes of a tensor's state in the first part; the second holds as many where
  // HasSecondPart, none otherwise.
  virtual uint64_t StateBytes(const TensorLayout& t) const = 0;
  virtual bool HasSecondPart() const = 0;
  // Each tensor's state whole at its own offset in the group's parts (8-bit codes, factored
  // moments): a group's state is one lease and a tensor is stepped whole. Otherwise the state
  // is indexed as the master weights are, and may be leased in sub-groups.
  virtual bool StateAtTensorOffsets() const = 0;
  // Device floats of scratch the GPU step needs for these tensors (0: none).
  virtual int64_t ScratchFloats(const std::vector<TensorLayout>&) const { return 0; }
  // Whether StepGpu folds the new weights' largest |x| into TensorUpdate::weights_amax for
  // this tensor (else the caller takes it from the weights in a pass of its own).
  virtual bool FoldsWeightsAmax(const TensorLayout&) const { return false; }
  // Queues the update on `stream`; the launch's error.
  virtual absl::Status StepGpu(const TensorUpdate& u, float* scratch, cudaStream_t stream) const = 0;
  // Several tensors' updates (a group's, or a chunk's), each StepGpu's bits; an optimizer may
  // queue them in fewer launches. This one queues a StepGpu each, in turn on `stream`, so each
  // tensor's use of `scratch` ends before the next one's begins.
  virtual absl::Status StepGpuAll(const std::vector<TensorUpdate>& us, float* scratch, cudaStream_t stream) const {
    for (const TensorUpdate& u : us) {
      if (absl::Status s = StepGpu(u, scratch, stream); !s.ok()) return s;
    }
    return absl::OkStatus();
  }
  // The same update on the host: the same bits (Adafactor's matrices: a few ulps apart).
  virtual void StepHost(const TensorUpdate& u) const = 0;
  // What the checkpoint's shape record says of the state's format and of the optimizer; both
  // "" for AdamW with fp32 moments. (Two pieces: the record puts the compact state between.)
  virtual std::string MomentsRecord() const { return ""; }
  virtual std::string OptimizerRecord() const { return ""; }
};

struct OptimizerKind {
  bool lion = false, adafactor = false, moments_8bit = false;
  int64_t moments_8bit_min = 0;  // 8-bit moments: smaller tensors keep fp32 ones
};
std::unique_ptr<GpuOptimizer> MakeGpuOptimizer(const OptimizerKind& choice);

// The tensor as a matrix: rows, cols (cols 0: a vector of rows), Adafactor's factors.
std::pair<int64_t, int64_t> FactoredShape(const TensorLayout& t);

// The individual optimizers (gpu_optimizer_*.cc).
std::unique_ptr<GpuOptimizer> MakeAdamW();
std::unique_ptr<GpuOptimizer> MakeAdamW8bit(int64_t fp32_under);
std::unique_ptr<GpuOptimizer> MakeLion();
std::unique_ptr<GpuOptimizer> MakeAdafactor();

}  // namespace tierd::trainer::gpu

#endif  // TIERD_TRAINER_REF_GPU_GPU_OPTIMIZER_H_
