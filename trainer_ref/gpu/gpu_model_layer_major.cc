// The GPU model's step in layer-major order (GpuModel::ForwardBackwardLayerMajor): the K
// micro-batches of a step go through one group before the next, so each group's weights
// are acquired twice per step (forward, backward) and its gradients once, whatever K is —
// instead of K times each. What a layer keeps for its backward is kept per micro-batch (K
// slots of its activations part: with checkpointing, K layer inputs), which tierd moves to
// DRAM and back like any other part.
#include <cuda_runtime_api.h>

#include "absl/strings/str_format.h"
#include "trainer_ref/gpu/gpu_model.h"
#include "trainer_ref/gpu/gpu_model_internal.h"

namespace tierd::trainer::gpu {

uint32_t GpuModel::LayerMajorForwardOp(int group) const {
  return static_cast<uint32_t>(OptimizerInterleaved() ? 2 * group + 1 : group);
}

uint32_t GpuModel::LayerMajorBackwardOp(int group) const {
  const int groups = Groups();
  if (group == groups - 1) return LayerMajorForwardOp(group);  // the head: forward and backward in one op
  return static_cast<uint32_t>((OptimizerInterleaved() ? 2 * groups : groups) + (groups - 2 - group));
}

uint32_t GpuModel::LayerMajorOptimizerOp(int group) const {
  return static_cast<uint32_t>(OptimizerInterleaved() ? 2 * group : 2 * Groups() - 1 + group);
}

absl::Status GpuModel::UploadMicroBatches(const int32_t* tokens, const int32_t* targets, std::vector<int>* counted) {
  const int n = batch_ * seq_;
  counted->assign(layer_major_, 0);
  for (int m = 0; m < layer_major_; ++m) {
    MicroBatch& mb = micro_batches_[m];
    const int32_t* in = tokens + static_cast<size_t>(m) * n;
    const int32_t* out = targets + static_cast<size_t>(m) * n;
    RETURN_IF_ERROR(
        Cuda(cudaMemcpyAsync(mb.tokens, in, n * sizeof(int32_t), cudaMemcpyHostToDevice, stream_), "tokens"));
    RETURN_IF_ERROR(
        Cuda(cudaMemcpyAsync(mb.targets, out, n * sizeof(int32_t), cudaMemcpyHostToDevice, stream_), "targets"));
    mb.segments = SegmentTokens(in, n, config_.vocab);  // for the embedding's backward
    RETURN_IF_ERROR(Cuda(cudaMemcpyAsync(mb.token_index, mb.segments.index.data(),
                                         mb.segments.index.size() * sizeof(int32_t), cudaMemcpyHostToDevice, stream_),
                         "token index"));
    for (int i = 0; i < n; ++i) (*counted)[m] += out[i] >= 0;
  }
  return absl::OkStatus();
}

absl::StatusOr<double> GpuModel::ForwardBackwardLayerMajor(const int32_t* tokens, const int32_t* targets) {
  if (layer_major_ == 0) {
    return absl::FailedPreconditionError("this GpuModel was made for one micro-batch at a time (Forward, Backward)");
  }
  const int n = batch_ * seq_, c = config_.d_model, last = Groups() - 1;
  std::vector<int> counted;
  RETURN_IF_ERROR(UploadMicroBatches(tokens, targets, &counted));
  for (int m = 0; m < layer_major_; ++m) {
    auto slot = LossSlot(m);
    if (!slot.ok()) return slot.status();
    loss_counted_[m] = counted[m];
  }
  losses_queued_ = layer_major_;
  RETURN_IF_ERROR(Cuda(cudaMemsetAsync(norm_, 0, sizeof(float), stream_), "zero norm"));
  // Forward: the embedding, then each layer, every micro-batch.
  RETURN_IF_ERROR(AwaitOptimizerUpdate(0));
  Progress(LayerMajorForwardOp(0));
  RETURN_IF_ERROR(Enter(0, Part::kWeights, Access::kRead));
  for (MicroBatch& mb : micro_batches_) {
    Timed(kElementwise, [&] {
      EmbeddingForward(mb.x, mb.tokens, W(embed_), n, c, config_.vocab, stream_);
      return 0;
    });
  }
  RETURN_IF_ERROR(Leave(0, Part::kWeights));
  for (int l = 0; l < config_.layers; ++l) {
    const int group = l + 1;
    RETURN_IF_ERROR(AwaitOptimizerUpdate(group));
    Progress(LayerMajorForwardOp(group));
    RETURN_IF_ERROR(EnterLayerWeights(group));
    for (int m = 0; m < layer_major_; ++m) {
      RETURN_IF_ERROR(Enter(group, Part::kActs, Access::kOverwrite, m));
      RETURN_IF_ERROR(
          LayerForward(l, ActsForForward(l, acquired_[group][static_cast<int>(Part::kActs)]), micro_batches_[m].x));
      RETURN_IF_ERROR(Leave(group, Part::kActs));
    }
    RETURN_IF_ERROR(LeaveLayerWeights(group));
  }
  // The head: forward, loss and backward, a micro-batch at a time.
  RETURN_IF_ERROR(AwaitOptimizerUpdate(last));
  Progress(LayerMajorForwardOp(last));
  RETURN_IF_ERROR(Enter(last, Part::kWeights, Access::kRead));
  RETURN_IF_ERROR(EnterGrads(last));
  RETURN_IF_ERROR(EnterTiedHead(/*backward=*/true));
  for (int m = 0; m < layer_major_; ++m) {
    MicroBatch& mb = micro_batches_[m];
    RETURN_IF_ERROR(HeadForward(mb.x, mb.targets, counted[m]));
    RETURN_IF_ERROR(
        Cuda(cudaMemcpyAsync(loss_rows_[m], losses_, n * sizeof(float), cudaMemcpyDeviceToHost, stream_), "losses"));
    RETURN_IF_ERROR(HeadBackward(mb.x, mb.dx, mb.targets, counted[m]));
  }
  RETURN_IF_ERROR(LeaveTiedHead(/*backward=*/true));
  RETURN_IF_ERROR(SumOverRanks(last, /*last=*/true));
  AddSumOfSquares(last);
  RETURN_IF_ERROR(Leave(last, Part::kWeights));
  RETURN_IF_ERROR(Leave(last, Part::kGrads));
  // Backward: each layer, every micro-batch, its gradients accumulating in micro-batch order.
  for (int l = config_.layers; l-- > 0;) {
    const int group = l + 1;
    Progress(LayerMajorBackwardOp(group));
    RETURN_IF_ERROR(EnterLayerWeights(group));
    bool fresh = false;
    RETURN_IF_ERROR(EnterGrads(group, &fresh));
    for (int m = 0; m < layer_major_; ++m) {
      RETURN_IF_ERROR(Enter(group, Part::kActs, Access::kRead, m));
      auto a = ActsForBackward(l, acquired_[group][static_cast<int>(Part::kActs)]);
      if (!a.ok()) return a.status();
      RETURN_IF_ERROR(LayerBackward(l, *a, micro_batches_[m].dx, fresh && m == 0));
      RETURN_IF_ERROR(Leave(group, Part::kActs));
    }
    RETURN_IF_ERROR(SumOverRanks(group, /*last=*/true));
    AddSumOfSquares(group);
    RETURN_IF_ERROR(LeaveLayerWeights(group));
    RETURN_IF_ERROR(Leave(group, Part::kGrads));
  }
  Progress(LayerMajorBackwardOp(0));
  RETURN_IF_ERROR(EnterGrads(0));
  for (MicroBatch& mb : micro_batches_) {
    Timed(kElementwise, [&] {
      EmbeddingBackward(G(embed_), mb.dx, mb.token_index, mb.segments.rows, mb.segments.segments, c, stream_);
      return 0;
    });
  }
  RETURN_IF_ERROR(SumOverRanks(0, /*last=*/true));
  AddSumOfSquares(0);
  RETURN_IF_ERROR(Leave(0, Part::kGrads));
  micro_ = layer_major_;
  RETURN_IF_ERROR(Cuda(cudaGetLastError(), "layer-major step"));
  return TakeLoss();  // as the one-at-a-time loop sums it
}

}  // namespace tierd::trainer::gpu
