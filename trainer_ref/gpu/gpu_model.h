// The reference decoder on the GPU: the same layers, names and layout as trainer_ref/model
// (the CPU oracle), computed by the kernels of gpu_ops.h and cuBLASLt (gemm.h). Grouped-query
// attention runs the multi-head kernels over key/value heads repeated into the workspace (and
// sums each group's gradients back); a large vocabulary's logits are made a chunk of rows at a
// time and made again in the backward (HeadRows), so they never exist whole; with tied
// embeddings the head reads and trains the embedding group's matrix. Storage:
// weights bf16 (what the GEMMs read), fp32 master weights (norm weights are read from them
// directly), fp32 gradients and Adam moments; activations bf16 with fp32 statistics, kept
// per layer for backward. Everything on one stream; only Forward's loss waits for it.
//
// The compact state (StateOptions::compact) keeps bf16 gradients and no bf16 weight copy:
// each layer's gradients accumulate in an fp32 workspace and its weights are rounded from the
// master copy into another when it is used.
//
// The state (weights, master weights, gradients, moments, saved activations) lives in a
// GpuHome (gpu_home.h): plain buffers (the whole model in GPU memory), or leased from tierd
// group by group. The model acquires a group's parts just before it queues the group's
// kernels and releases them with the stream right after, without waiting, so the host runs
// ahead and tierd moves the next group while the GPU computes this one. What stays on the
// device outside the home: the workspace of one layer's forward/backward, the logits and a
// resident fp32 copy of the norm weights (read by forward and backward; refreshed from the
// master copy by the optimizer step).
#ifndef TIERD_TRAINER_REF_GPU_GPU_MODEL_H_
#define TIERD_TRAINER_REF_GPU_GPU_MODEL_H_

#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "comm/communicator.h"
#include "prefetcher/graph.h"
#include "trainer_ref/checkpoint.h"
#include "trainer_ref/gpu/gpu_home.h"
#include "trainer_ref/gpu/gpu_optimizer.h"
#include "trainer_ref/gpu/gpu_state_options.h"
#include "trainer_ref/kernels/fp8_linear.h"
#include "trainer_ref/kernels/gemm.h"
#include "trainer_ref/kernels/gpu_ops.h"
#include "trainer_ref/model.h"
#include "trainer_ref/optimizer.h"

namespace tierd::trainer::gpu {

class CudnnAttention;

class GpuModel {
 public:
  // The parts the model keeps in its home, by group (0 the embedding, 1..L the layers, L + 1
  // the final norm and the head), for the state kept as `state` says.
  static GpuHomeLayout HomeLayout(const ModelConfig& config, int batch, int seq, const StateOptions& state = {});
  // RESOURCE_EXHAUSTED with the bytes when the device has no room; FAILED_PRECONDITION
  // without a device; INVALID_ARGUMENT for a head size above 256. Without a home: plain
  // GPU buffers.
  static absl::StatusOr<std::unique_ptr<GpuModel>> Create(const ModelConfig& config, int batch, int seq,
                                                          std::unique_ptr<GpuHome> home = nullptr,
                                                          const StateOptions& state = {});
  ~GpuModel();
  GpuModel(const GpuModel&) = delete;
  GpuModel& operator=(const GpuModel&) = delete;

  // fp32 parameters in ParamLayout order: the master copy, and the bf16 weights from it.
  absl::Status SetParams(const std::vector<float>& params);
  absl::Status GetParams(std::vector<float>* params);  // the fp32 master copy
  // Parameters from elsewhere (--init_from's checkpoint), group by group: `read` gives entry e
  // of ParamLayout (its count floats); the master copy and bf16 weights are set from them,
  // the moments zeroed. One group's floats are in host memory at a time.
  absl::Status LoadParams(const std::function<absl::Status(size_t entry, float* out)>& read);
  // The fp32 master copy of one group's parameters (its entries back to back, in
  // ParamLayout order from the group's first), for an export a group at a time.
  absl::Status GroupParams(int group, std::vector<float>* out);
  int GroupOf(size_t entry) const { return group_of_[entry]; }
  size_t GroupFirst(int group) const { return group_offset_[group]; }
  // The CPU model's initial distribution (N(0, 0.02); attention and MLP output projections
  // scaled by 1 / sqrt(2 L); norm weights 1), not its values: made group by group on the
  // host's threads from per-slice counter-based streams, so a 7B model needs neither one
  // thread's minutes nor its whole state in host memory. Deterministic for a seed.
  absl::Status InitParams(uint64_t seed);
  // A step: ZeroGrads, then Forward and Backward per micro-batch, then GradNorm and
  // AdamWStep. ZeroGrads zeroes nothing at once: each group's gradients are overwritten
  // with zeros when its first backward of the step reaches it (nothing fetched for them).
  absl::Status ZeroGrads();
  // The mean loss over the counted targets; keeps what backward needs (and dlogits).
  absl::StatusOr<double> Forward(const int32_t* tokens, const int32_t* targets);
  // Forward without waiting for the GPU: the micro-batch's row losses come back into pinned
  // host memory with the stream and are read at TakeLoss, so the host goes on queueing the
  // backward (and the next micro-batch) while the GPU computes; a wait per micro-batch
  // drained the GPU's queue each time. The same arithmetic as Forward.
  absl::Status ForwardQueued(const int32_t* tokens, const int32_t* targets);
  // Waits for the GPU: the mean of the losses of the micro-batches forwarded since ZeroGrads
  // (each the mean over its counted rows, summed in micro-batch order as loss += l / K).
  absl::StatusOr<double> TakeLoss();
  absl::Status Backward();  // adds into the gradients
  // A whole step's forward and backward over the K micro-batches the model was made for
  // (tokens and targets: K x batch x seq), layer-major: each group's forward for every
  // micro-batch before the next group's (its weights acquired once), the head's forward and
  // backward per micro-batch, then each layer's backward for every micro-batch, its
  // gradients accumulating on the GPU and released once. So per step the weights are
  // acquired twice and the gradients once, whatever K. The same losses and gradients, bit
  // for bit, as K Forward/Backward pairs (every gradient accumulates in micro-batch order).
  // After ZeroGrads; returns the mean of the micro-batches' losses (as the step loop sums
  // them: loss += l / K).
  absl::StatusOr<double> ForwardBackwardLayerMajor(const int32_t* tokens, const int32_t* targets);
  int layer_major_micro_batches() const { return layer_major_; }
  absl::Status GetGrads(std::vector<float>* grads);  // fp32, ParamLayout order
  // The last Forward's logits (N x V, from bf16), when they were made whole (not chunked).
  absl::Status LastLogits(std::vector<float>* out);
  // The state a step needs — bf16 weights, fp32 master weights, both moments — group by
  // group into checkpoint records (and a "model" record of the shape), wherever the home
  // keeps it; the host's optimizer step in flight is finished first. LoadState reads the
  // same back (INVALID_ARGUMENT for a checkpoint of another shape; DATA_LOSS for a damaged
  // one) and the next step continues bit for bit.
  absl::Status SaveState(CheckpointWriter& writer);
  absl::Status LoadState(CheckpointReader& reader);
  // The L2 norm of all gradients after the step's last Backward (the last of SetDataParallel's
  // micro-batches; FailedPrecondition before it): each group's sum of squares is taken in that
  // backward, while its gradients are on the GPU anyway, so this is one small read.
  absl::StatusOr<double> GradNorm();
  // The planner: registers the step (ZeroGrads, `micro_batches` x (Forward, Backward),
  // AdamWStep) as ops over the home's part names, then reports each op as it is queued.
  // Returns the planner's prediction in words ("" for a home without one).
  absl::StatusOr<std::string> RegisterStep(int micro_batches);
  prefetcher::Graph StepGraph(int micro_batches) const;
  Home& home() { return home_->home(); }
  // Host seconds spent waiting in the home's Acquire (tierd fetching a part that was not
  // on the GPU yet), since the model was made.
  double AcquireSeconds() const { return acquire_seconds_; }
  // ... and in its Release (tierd answering; it may wait for the part's earlier GPU work).
  double ReleaseSeconds() const { return release_seconds_; }
  // AdamW on every tensor (norm weights not decayed), gradients scaled by grad_scale first.
  absl::Status AdamWStep(double lr, int64_t step, const AdamWOptions& options, double grad_scale);
  // Where AdamWStep runs: on the GPU (the state comes to the GPU and goes back), or on the
  // host's threads in the home's DRAM tier (the gradients come down, the new bf16 weights
  // go up at the next forward; the master weights and moments never leave DRAM). The CPU
  // needs a home with a host tier (tierd). Set before RegisterStep (the plan differs).
  // On the CPU, AdamWStep returns at once: a background thread updates the groups in
  // forward order while the next forward queues each group's kernels as soon as its update
  // is done (the optimizer overlaps the GPU's forward). Any later use of a group's state
  // waits for its update; an error of the background step comes back from that wait.
  void SetOptimizerOnCpu(bool on) { host_optimizer_groups_ = on ? Groups() : 0; }
  // Split between the two: the last `groups` groups (the head first, then the last layers)
  // stepped on the host as above, their master weights and moments never on the GPU; the
  // others on the GPU, each group's update queued just before its next forward (as
  // SetOptimizerDeferred). For state a little larger than the GPU's quota: the part that
  // cannot stay stays in DRAM instead of crossing PCIe twice a step. 0: all on the GPU;
  // Groups(): all on the host. Set before RegisterStep.
  void SetHostOptimizerGroups(int groups) { host_optimizer_groups_ = std::clamp(groups, 0, Groups()); }
  int HostOptimizerGroups() const { return host_optimizer_groups_; }
  cudaStream_t stream() const { return stream_; }
  // Data-parallel GPU ranks (comm: NCCL, device memory): after the last of a step's
  // `micro_batches` backwards reaches a group, the group's gradient becomes the sum over the
  // ranks (an all-reduce queued on the model's stream), before its norm is taken and it is
  // stepped or leaves the GPU; the step's scale divides by ranks x micro-batches. Null: one rank.
  void SetDataParallel(comm::Communicator* comm, int micro_batches) {
    dp_ = comm != nullptr && comm->size() > 1 ? comm : nullptr;
    dp_micro_batches_ = std::max(1, micro_batches);
  }
  // The GPU's AdamWStep deferred: it only records the step, and each group's update is
  // queued just before the group's next use (its next forward), so under tierd the state
  // of group g streams in while the groups before it compute, instead of the whole state
  // crossing PCIe at the end of the step with little to overlap. The same arithmetic, the
  // same bits. Set before RegisterStep (the plan's op order differs).
  void SetOptimizerDeferred(bool on) { defer_gpu_update_ = on; }
  // Finishes the optimizer's step in flight: the CPU's (waited for), or the GPU's deferred
  // updates (queued now). Nothing to do without one.
  absl::Status FinishOptimizerStep();
  // Host seconds spent in the CPU optimizer's arithmetic (not waiting for tierd).
  double HostOptimizerSeconds() const { return host_optimizer_nanos_.load() * 1e-9; }
  // ... of it writing FP8 weight codes (StateOptions::fp8_weight_codes).
  double HostCodesSeconds() const { return host_codes_nanos_.load() * 1e-9; }
  // Where the GPU time goes: with profiling on, each kernel or GEMM is bracketed by CUDA
  // events (costly; for measurement runs) and TakeProfile returns, per category since the
  // last call ("gemm", "attention", "norm+elementwise", "loss", "optimizer", "fp8 casts",
  // "comm"), the milliseconds and the floating-point operations of the GEMMs and attention
  // queued in them (the work done, recomputed forwards included; 0 for the others).
  void EnableProfile(bool on) { profiling_ = on; }
  // The GEMM shapes planned so far and how each algorithm was chosen (Gemm::DescribePlans).
  std::vector<std::string> GemmPlans() const { return gemm_->DescribePlans(); }
  // Which attention kernels run, and why (StateOptions::attention).
  const std::string& attention_note() const { return attention_note_; }
  struct ProfileEntry {
    std::string name;
    double ms = 0, flops = 0;
  };
  std::vector<ProfileEntry> TakeProfile();
  // The decoder layers' seven linear maps in FP8 (fp8_linear.h: E4M3 weights and inputs,
  // E5M2 output gradients, each tensor of each layer at its own scale, delayed or current)
  // instead of bf16; the embedding, the norms, attention, the element-wise kernels and the
  // head stay bf16 with fp32 statistics, the master weights, gradients and optimizer fp32.
  // Before the first step. INVALID_ARGUMENT for shapes FP8 tensor cores do not take
  // (dimensions and batch x seq multiples of 16) or a bad window; RESOURCE_EXHAUSTED without
  // room for its buffers (Fp8WorkspaceBytesFor). `layers`: which decoder layers (Fp8Layers;
  // empty: all).
  absl::Status UseFp8(std::vector<bool> layers = {}, const Fp8ScalingOptions& scaling = {});
  bool fp8() const { return fp8_ != nullptr; }
  static uint64_t Fp8WorkspaceBytesFor(const ModelConfig& config, int batch, int seq,
                                       const Fp8ScalingOptions& scaling = {});
  // The end of a step's forward and backward (before AdamWStep): each FP8 tensor's largest
  // |x| of the step goes into its history and (delayed scaling) sets the next step's scale.
  // Nothing without FP8. A step loop that never calls it keeps converting at current scales.
  void EndFp8Step();
  // The FP8 layers whose tensors' scaling went wrong `in_a_row` steps in a row as of the last
  // EndFp8Step (Fp8Linear::Trouble) fall back to bf16 from the next step on, for the rest of
  // the run (a checkpoint keeps the choice); one line each says which layer and why. Waits for
  // the last EndFp8Step's state to reach the host (one small copy, queued with it).
  std::vector<std::string> Fp8FallBack(int in_a_row);
  // Which decoder layers run their matmuls in FP8 now (empty without FP8).
  const std::vector<bool>& fp8_layers() const { return fp8_layer_; }
  // How many layers' matmuls read FP8 codes of their weights (StateOptions::fp8_weight_codes).
  int LayersReadingWeightCodes() const;
  // Whether the state has FP8 weight codes parts (StateOptions::fp8_weight_codes).
  bool WeightCodesOn() const { return weight_codes_; }
  // The bytes of a layer's codes part (StateOptions::fp8_weight_codes).
  // transposed: with each matrix's codes transposed too (StateOptions::transposed_weight_codes).
  static uint64_t WeightCodesBytes(const ModelConfig& config, bool transposed = false);
  // Off: FP8 conversions do not feed the scales' history (forward-only validation passes).
  void SetFp8Recording(bool on) {
    if (fp8_ != nullptr) fp8_->set_recording(on);
  }
  // Device bytes this model holds: the home's own (plain: all the state) and the workspace.
  uint64_t DeviceBytes() const { return device_bytes_ + home_->home().OwnDeviceBytes(); }
  uint64_t WorkspaceBytes() const { return device_bytes_; }
  // The same before the model exists (to size a GPU budget's share for tierd).
  static uint64_t WorkspaceBytesFor(const ModelConfig& config, int batch, int seq, const StateOptions& state = {});

 private:
  GpuModel(const ModelConfig& config, int batch, int seq, const StateOptions& state);
  size_t MaxGroupCount() const;  // the most parameters of one group (the compact state's workspaces)
  // A moment of the group's tensors: its bytes (fp32, or Moment8bitBytes) and where they
  // start within the group's moment part.
  uint64_t MomentBytes(size_t entry) const;
  uint64_t MomentOffset(size_t entry) const;
  absl::Status Allocate();
  // `recompute`: some layer recomputes (the workspace holds one layer's activations for it);
  // else `lean_rooms`: the workspace holds LeanRoomsBytes (AnyCodedRooms).
  static std::vector<std::pair<size_t, size_t>> WorkspacePlan(const ModelConfig& config, int batch, int seq,
                                                              bool recompute, int head_rows, bool cudnn_attention,
                                                              bool lean_rooms = false);
  // Layer-major: per micro-batch its residual stream and gradient (fp32 N x C each), tokens,
  // targets (N each) and token index (3 N + 1), all int32 or fp32: element counts and sizes.
  static std::vector<std::pair<size_t, size_t>> MicroBatchPlan(const ModelConfig& config, int batch, int seq);
  // The head's logits for this many rows at a time: all N = batch x seq when N x V bf16 values
  // fit kWholeLogitsBytes (the forward keeps them and their gradient for the backward), else
  // multiples of 64 rows within kLogitsChunkBytes (the backward makes them again).
  static constexpr uint64_t kWholeLogitsBytes = uint64_t{1} << 30, kLogitsChunkBytes = uint64_t{256} << 20;
  static int HeadRows(const ModelConfig& config, int batch, int seq, int asked = 0);
  bool HeadChunked() const { return head_rows_ < batch_ * seq_; }
  // The head over a micro-batch's last residual stream x (N x C, fp32): the final norm into
  // xf_ (kept for the backward), then each row's loss into losses_, a chunk of rows at a time;
  // unchunked, dlogits_ too. The head's weights acquired. `pending` (bf16, N x C): the last
  // layer's down projection, not yet added into x: the norm adds it (into x) on its way;
  // `x_out`: x (after that add) copied there for the backward, by the norm too.
  absl::Status HeadForward(float* x, const int32_t* targets, int counted, const Bf16* pending = nullptr,
                           float* x_out = nullptr);
  // The group whose weights part holds the head's matrix: the last, or with tied embeddings 0.
  int HeadWeightsGroup() const { return config_.tied_embeddings ? 0 : Groups() - 1; }
  // With tied embeddings, the head also holds the embedding group's weights (and gradients in
  // a backward) around its kernels.
  absl::Status EnterTiedHead(bool backward);
  absl::Status LeaveTiedHead(bool backward);
  template <typename T>
  absl::StatusOr<T*> Take(size_t count);
  // The pointers of an entry inside its group's acquired parts (weights, gradients).
  Bf16* W(size_t entry) const;
  float* G(size_t entry) const;  // fp32, where the backward accumulates them
  // The group's gradients as accumulated (fp32): its part, or the compact state's workspace.
  float* GradsOf(int group) const;
  // The compact state: the group's weights, its master copy rounded into weights_ws_ (not
  // again while weights_group_ is the group; kOverwrite: the caller writes them whole).
  absl::Status EnterDerivedWeights(int group, Access access);
  float* N(size_t entry) const { return norms_ + norm_offset_[entry]; }  // resident norm weights
  // Acquires chunk `chunk` of the part (0 for one-lease parts; optimizer state in
  // sub-groups: GpuHomeLayout::Chunk) into acquired_; one chunk of a part at a time.
  absl::Status Enter(int group, Part part, Access access, int chunk = 0);
  // `why` an acquire failed, naming the part ("acquiring act.layers.3<where>: ...").
  absl::Status AcquireError(const absl::Status& why, int group, Part part, int chunk, const char* where) const;
  absl::Status Leave(int group, Part part);
  // kWrite, or the step's first touch: kOverwrite + zeros. With `fresh` (a decoder layer's
  // group): *fresh says whether this is that first touch, and then the layer's linear maps'
  // gradients are not zeroed, as the caller writes them (the GEMMs' beta 0) rather than adds.
  absl::Status EnterGrads(int group, bool* fresh = nullptr);
  // Zeroes the group's gradients at `grads` but for its linear maps' (a layer's group).
  absl::Status ZeroGradsBesideLinears(int group, float* grads);
  void Progress(uint32_t op);
  int Groups() const { return config_.layers + 2; }
  std::vector<size_t> GroupEntries(int group) const;          // as Model::GroupEntries
  size_t GroupCount(int group) const;                         // its parameters
  absl::Status SetGroup(int group, const float* params);      // master, weights; moments zeroed
  absl::Status Download(Part part, std::vector<float>* out);  // an fp32 part, ParamLayout order
  std::string ShapeRecord() const;
  // The "fp8" record after the groups', if the checkpoint has one (FP8 layers and scales).
  absl::Status LoadFp8State(CheckpointReader& reader);
  absl::Status ForEachPiece(int g, Part part, int chunk, bool to_host, void* staging,
                            const std::function<absl::Status(void*, uint64_t, uint64_t)>& fn);
  absl::Status RefreshNorms(int g, uint64_t at, const void* p, uint64_t n);
  // `codes`: the group's FP8 weight codes are written too (EncodeWeightCodesOnHost).
  absl::Status HostAdamWStep(int group, bool zero_grads, bool codes,
                             const std::function<AdamWParams(size_t)>& params_for);
  // One group's AdamW on the GPU (zero_grads: no backward reached it, its gradients are 0).
  absl::Status GpuAdamWGroup(int group, bool zero_grads, const std::function<AdamWParams(size_t)>& params_for);
  // The GPU's update of the first `groups` groups deferred to each one's next forward (the
  // step's parameters and which gradients are zeros, taken now); ApplyPendingUpdates queues it.
  void DeferGpuUpdates(int groups, const std::function<AdamWParams(size_t)>& params_for);
  // The GPU's deferred update of `group` (-1: every group), if one is pending: queued now.
  absl::Status ApplyPendingUpdates(int group);
  // The optimizer's op of a group comes just before the group's first forward op (the host
  // step, or the deferred GPU update), not after the last backward.
  bool OptimizerInterleaved() const { return host_optimizer_groups_ > 0 || defer_gpu_update_; }
  // Whether `group`'s optimizer step runs on the host (SetHostOptimizerGroups).
  bool HostSteps(int group) const { return group >= Groups() - host_optimizer_groups_; }
  // Until the optimizer's step has updated `group` (-1: every group): the GPU's deferred
  // update is queued, the CPU's step in flight waited for (-1: its thread joined); either
  // reports its op as progress first. The step's error, if any.
  absl::Status AwaitOptimizerUpdate(int group);
  // The step's op indices in the registered graph. On the GPU: per micro-batch its forward
  // ops, then its backward ops, then the optimizer's. On the CPU, the optimizer's op of a
  // group comes just before the first forward op of that group (it runs then, overlapped).
  uint32_t ForwardOp(int micro, int group) const;
  uint32_t BackwardOp(int micro, int index) const;  // index: 0 for the head, Groups()-1 for the embedding
  uint32_t OptimizerOp(int group, int micro_batches) const;

  using Layer = LayerEntries;
  struct Acts {           // per layer, kept from forward for backward (one part of the home)
    float *x_in, *x_mid;  // the residual stream, fp32
    Bf16* x_in_bf16 = nullptr;  // set: the layer's input is kept here, rounded, not in x_in
    Bf16 *h1, *q, *k, *v, *a, *h2, *g, *u, *s;
    float *rstd1, *rstd2, *lse;
    // Set (an FP8 layer that keeps its element-wise outputs): h1, h2 and s hold their E4M3
    // codes transposed (C x N, F x N bytes, the start of their rooms), what the backward's
    // weight gradients read, made in the forward from the codes its matmuls take; the
    // backward converts nothing again. in_scale_inv[kScaleStride * i], i = 0..2: the scale_inv
    // each was made at, copied where the scales may change within a step
    // (Fp8Linear::InputScalesHoldWithinStep); 16 bytes apart, as cuBLASLt reads scales.
    bool inputs_transposed = false;
    float* in_scale_inv = nullptr;
    static constexpr int kScaleStride = 4;
  };
  // lean: a lean layer's, what it keeps at `base` and its element-wise outputs (h1, h2, s) in
  // the recompute workspace (LeanWork). coded: h1, h2 and s in rooms of a byte an element.
  Acts ActsAt(void* base, bool lean = false, bool coded = false) const;
  // What layer l's forward writes into: its saved part (kActs lease) and the workspace.
  Acts ActsForForward(int layer, void* saved) const;
  // One layer's forward from the residual stream `x` (updated in place), saving into `a`.
  // `recompute`: the backward's pass, for `a` alone: it stops at the down projection's input
  // (its codes kept), since nothing the backward reads comes after it (the projection's output
  // and the residual add only make the next layer's input, which was saved).
  // Carry (fused norms, a micro-batch's forward through every layer): the residual stream's
  // last add of a layer, x + its down projection (in tmp_), left for the next layer's first norm
  // to make on its way (`pending_in`), the sum going straight to that layer's saved input, and
  // its second norm reading it there and writing x anew (`defer_out`: this layer leaves its own
  // last add in tmp_ so). The same bits; 8 bytes an element a layer less than adding in place.
  struct Carry {  // {}: neither (no member initializers: a default argument of the class's own)
    bool pending_in, defer_out;
  };
  absl::Status LayerForward(int layer, const Acts& a, float* x, bool recompute = false, Carry carry = {});
  // Layer l's backward from `a`: dx from the gradient of its output to that of its input.
  // `fresh_grads`: its linear maps' gradients are written (=), the step's first, not added.
  absl::Status LayerBackward(int layer, const Acts& a, float* dx, bool fresh_grads = false);
  // The activations layer l's backward reads: what it saved, or recomputed from its input.
  absl::StatusOr<Acts> ActsForBackward(int layer, void* saved);
  // The head's backward (the final norm's input x_out, the micro-batch's targets and counted
  // rows): from dlogits_, or unchunked the logits again chunk by chunk; dx written.
  absl::Status HeadBackward(const float* x_out, float* dx, const int32_t* targets, int counted);
  // The group's (acquired) gradients' sum of squares into norm_.
  void AddSumOfSquares(int group);
  // Data-parallel: the group's gradient summed over the ranks, when `last` is the step's last
  // backward over it (SetDataParallel). Nothing with one rank.
  absl::Status SumOverRanks(int group, bool last);
  // Layer-major op indices: forward of groups 0..L, the head (forward and backward), then
  // backward of layers L-1..0 and the embedding, then the optimizer's ops (on the host,
  // each group's comes just before its forward).
  uint32_t LayerMajorForwardOp(int group) const;
  uint32_t LayerMajorBackwardOp(int group) const;  // the head's op for group L + 1
  uint32_t LayerMajorOptimizerOp(int group) const;
  absl::Status UploadMicroBatches(const int32_t* tokens, const int32_t* targets, std::vector<int>* counted);
  static uint64_t ActsBytes(const ModelConfig& config, int batch, int seq);
  static uint64_t LeanActsBytes(const ModelConfig& config, int batch, int seq);
  static uint64_t CodedActsBytes(const ModelConfig& config, int batch, int seq);  // CodedRooms' layers

  ModelConfig config_;
  int batch_, seq_;
  bool checkpointing_;
  int kept_layers_ = 0, lean_layers_ = 0;
  comm::Communicator* dp_ = nullptr;
  int dp_micro_batches_ = 1;
  // Whether layer l keeps only its input and recomputes the rest in its backward.
  bool Recomputes(int l) const { return checkpointing_ && l < config_.layers - kept_layers_ - lean_layers_; }
  // Whether layer l keeps all but its element-wise outputs (recomputed in its backward).
  bool Lean(int l) const { return checkpointing_ && !Recomputes(l) && l < config_.layers - kept_layers_; }
  // Whether layer l's activations keep h1, h2 and s as transposed codes (Acts::inputs_transposed).
  bool KeepsInputsTransposed(int l) const { return LayerFp8(l) != nullptr && !LeanNow(l); }
  // Whether layer l's saved rooms for h1, h2 and s are a byte an element (StateOptions::
  // fp8_layers): it keeps all its activations and starts in FP8.
  static bool CodedRooms(const ModelConfig& config, const StateOptions& state, int l);
  static bool AnyCodedRooms(const ModelConfig& config, const StateOptions& state);
  // Lean, or a layer with rooms for codes running bf16 (not given to UseFp8, or fallen back):
  // its element-wise outputs go to the workspace and its backward recomputes them.
  bool LeanNow(int l) const { return Lean(l) || (coded_rooms_[l] && LayerFp8(l) == nullptr); }
  std::vector<bool> coded_rooms_;  // per layer: CodedRooms
  // Where a lean layer's element-wise outputs (h1, h2, s) and the recomputed norms' statistics
  // go: the recompute workspace's, or (no layer recomputing) LeanRoomsBytes of their own.
  Acts LeanWork() const;
  static uint64_t LeanRoomsBytes(const ModelConfig& config, int batch, int seq);
  // Some layer recomputes something: the workspace holds a layer's activations for it.
  bool AnyRecomputes() const {
    return AnyRecomputes(config_, {.checkpointing = checkpointing_, .kept_layers = kept_layers_});
  }
  static bool AnyRecomputes(const ModelConfig& config, const StateOptions& state) {
    return state.checkpointing && state.kept_layers < config.layers;
  }
  // FP8 weight codes (StateOptions::fp8_weight_codes). A layer's codes part: a 16-byte slot
  // per linear map (scale_inv, scale, amax; cuBLASLt reads scale_inv 16-byte aligned), then
  // each map's codes, 256-byte aligned, in LinearIndex order. `index` -1: the part's bytes.
  // transposed: where map `index`'s transposed codes are (StateOptions::transposed_weight_codes),
  // after every map's plain codes, in the same order.
  static uint64_t WeightCodesOffset(const ModelConfig& config, int index, bool transposed = false);
  bool weight_codes_ = false;
  bool transposed_codes_ = false;  // StateOptions::transposed_weight_codes
  // WeightCodesOffset of each map, plain then transposed (made once: read for every FP8 matmul).
  std::vector<uint64_t> codes_offset_;
  uint8_t* CodesAt(unsigned char* base, int index, bool transposed = false) const {
    return base + codes_offset_[static_cast<size_t>(transposed) * codes_offset_.size() / 2 + index];
  }
  bool fused_norms_ = false;  // StateOptions::fused_norms
  bool optimizer_one_launch_ = true;  // StateOptions::optimizer_one_launch
  bool bf16_checkpoints_ = false;  // StateOptions::bf16_checkpoints, with checkpointing
  // Per group: its codes part holds the codes of its bf16 weights as they are now. Written by
  // the host's optimizer thread for the groups it steps (read after AwaitOptimizerUpdate).
  std::vector<char> codes_current_;
  // Whether the group's matmuls read its codes part now (an FP8 layer with a codes part).
  bool ReadsCodes(int group) const;
  // Layer l's FP8 linear maps, or null for a bf16 layer.
  Fp8Linear* LayerFp8(int l) const { return fp8_ != nullptr && fp8_layer_[l] ? fp8_.get() : nullptr; }
  size_t LinearEntry(int layer, int index) const;  // the parameter entry of linear map `index`
  Fp8Codes CodesOf(int layer, int index) const;    // in the acquired codes part
  // A layer's weights for its matmuls (the bf16 part, or the codes part, made first if stale).
  absl::Status EnterLayerWeights(int group);
  absl::Status LeaveLayerWeights(int group);
  // The group's codes from its bf16 part, on the GPU (AbsMax, ScaleFromAmax, QuantizeFp8):
  // MakeWeightCodes acquires the bf16 part, EncodeWeightCodes reads it as its caller holds it.
  absl::Status MakeWeightCodes(int group);
  // `amax_folded`: the optimizer step that wrote the weights left their largest |x| in
  // weights_amax_ (GpuOptimizer::FoldsWeightsAmax), so only the codes remain to be written.
  absl::Status EncodeWeightCodes(int group, bool amax_folded = false);
  // Whether the GPU's optimizer steps `group` and makes its codes: then nothing in the step
  // reads the group's bf16 part after the update, and the plan drops it (tierd frees it
  // unwritten and refuses to read it), so the part is the codes' scratch and whatever needs
  // the bf16 weights outside the step (a checkpoint, the codes after new parameters or a
  // load) takes them from the master copy instead (WeightsFromMasterOnHost).
  bool WeightsAreScratch(int group) const { return ReadsCodes(group) && !HostSteps(group) && home_->HasHostTier(); }
  // The group's bf16 weights from its master copy in the DRAM tier (round to nearest even, as
  // the optimizer writes them), piece by piece in parameter order: fn(bf16 values, count).
  absl::Status WeightsFromMasterOnHost(int group, const std::function<absl::Status(const Bf16*, size_t)>& fn);
  // The host's optimizer step: the group's codes from its new bf16 weights (host pointers).
  absl::Status EncodeWeightCodesOnHost(int group, const Bf16* weights);
  void* recompute_acts_ = nullptr;  // checkpointing: one layer's activations, recomputed (or LeanRoomsBytes)
  float* xr_ = nullptr;             // checkpointing: the recomputed layer's residual stream
  std::vector<TensorLayout> layout_;
  std::vector<Layer> layers_;
  std::vector<ParamGroup> groups_;  // ParamGroups: each group's entries and name
  size_t embed_ = 0, final_norm_ = 0, head_ = 0;
  std::unique_ptr<GpuHome> home_;
  std::vector<int> group_of_;                            // entry -> group
  std::vector<size_t> group_offset_;                     // group -> its first parameter's offset
  std::vector<std::array<void*, kParts>> acquired_;      // group -> part -> pointer (null: not held)
  std::vector<std::array<int, kParts>> acquired_chunk_;  // group -> part -> the chunk held
  // The home's layout (the model's own, in the home's sub-groups of optimizer state).
  GpuHomeLayout home_layout_;
  // The optimizer state of group g, chunk by chunk: fn(first element, element count, master,
  // m, v) with the chunk's three parts acquired for the call (`access`) and released after.
  // m and v: fp32 from `first`, or (8-bit moments, one chunk) the group's moment bytes.
  absl::Status ForEachStateChunk(int g, Access access,
                                 const std::function<absl::Status(size_t, size_t, float*, void*, void*)>& fn);
  // Zeroes a state chunk's moments (fn's m and v for n elements) on the stream.
  absl::Status ZeroMoments(int g, size_t n, void* m, void* v);
  std::vector<bool> grads_zeroed_;   // group -> gradients already zeroed this step
  std::vector<size_t> norm_offset_;  // entry -> offset in norms_ (norm weights only)
  float* norms_ = nullptr;
  int micro_ = 0;        // micro-batches done this step
  int head_rows_ = 0;    // HeadRows
  int head_counted_ = 0;  // the last ForwardQueued's counted rows (its backward's divisor)
  RopeFrequencies rope_;  // RoPE's inverse frequencies (RopeInverseFrequencies)
  // Grouped-query attention (KV < H): keys and values repeated to H heads, and their
  // gradients over H heads before each group is summed (N x H*D, bf16 each); null otherwise.
  Bf16 *k_full_ = nullptr, *v_full_ = nullptr, *dk_full_ = nullptr, *dv_full_ = nullptr;
  bool Grouped() const { return config_.kv_head_count() != config_.heads; }
  int layer_major_ = 0;  // K micro-batches a step, layer-major; 0: one at a time
  // The optimizer (gpu_optimizer.h): its state's bytes and places, its GPU and host steps.
  std::unique_ptr<GpuOptimizer> optimizer_;
  // Entry e's state within a chunk of its group's state part `part` (null: none), the
  // chunk's values starting at `at`: indexed as the master weights, or the tensor's own at
  // its offset (GpuOptimizer::StateAtTensorOffsets).
  void* StateAt(void* part, size_t e, size_t at) const {
    if (part == nullptr) return nullptr;
    if (!optimizer_->StateAtTensorOffsets()) return static_cast<float*>(part) + at;
    return static_cast<unsigned char*>(part) + MomentOffset(e);
  }
  bool compact_ = false;
  int gemm_candidates_ = 1;
  size_t gemm_workspace_ = 0;  // StateOptions::gemm_workspace_bytes
  std::string gemm_cache_dir_;
  std::string attention_mode_;
  std::string attention_note_;
  std::unique_ptr<CudnnAttention> cudnn_attention_;  // null: ours
  absl::Status ChooseAttention(int64_t workspace_bytes);
  // Whether the workspace makes room for cuDNN's attention: not "ours", and libcudnn.so.9 opens.
  static bool MayUseCudnnAttention(const std::string& attention);
  float* optimizer_scratch_ = nullptr;  // GpuOptimizer::ScratchFloats
  // The compact state's workspaces (one group each): the gradients of the group whose
  // backward is running (accumulating_group_, fp32), and the bf16 weights of weights_group_.
  float* grad_acc_ = nullptr;
  Bf16* weights_ws_ = nullptr;
  int accumulating_group_ = -1, weights_group_ = -1;
  struct MicroBatch {                   // layer-major: one micro-batch's buffers
    float *x = nullptr, *dx = nullptr;  // its residual stream and its gradient (N x C)
    int32_t *tokens = nullptr, *targets = nullptr, *token_index = nullptr;
    TokenSegments segments;  // the token index's host side
  };
  std::vector<MicroBatch> micro_batches_;
  double acquire_seconds_ = 0, release_seconds_ = 0;
  int host_optimizer_groups_ = 0;  // the last this many groups step on the host
  bool defer_gpu_update_ = false;
  // The GPU's deferred step: per group whether its update is pending and whether its
  // gradients are zeros (taken at AdamWStep), and the step's parameters.
  std::vector<char> pending_update_, pending_zero_grads_;
  std::function<AdamWParams(size_t)> pending_params_;
  std::atomic<int64_t> host_optimizer_nanos_{0}, host_codes_nanos_{0};
  // The CPU optimizer's step in flight: its thread, how many groups it has updated, its
  // status. Guarded by host_mutex_.
  std::thread host_thread_;
  std::mutex host_mutex_;
  std::condition_variable host_done_;
  int host_groups_done_ = 0;
  absl::Status host_status_;
  cudaStream_t host_stream_ = nullptr;  // its uploads of norm weights
  bool registered_ = false;
  int registered_micro_batches_ = 0;
  std::unique_ptr<Gemm> gemm_;
  std::unique_ptr<Fp8Linear> fp8_;  // null: the layers' matmuls in bf16
  std::vector<bool> fp8_layer_;     // with fp8_: which layers use it
  cudaStream_t stream_ = nullptr;
  std::vector<void*> allocations_;
  uint64_t device_bytes_ = 0;
  size_t total_params_ = 0;
  float *x_ = nullptr, *x_out_ = nullptr, *dx_ = nullptr;  // residual stream and its gradient, fp32
  Bf16 *tmp_ = nullptr, *xf_ = nullptr, *logits_ = nullptr, *dlogits_ = nullptr, *dx16_ = nullptr;
  const float* dx16_holds_ = nullptr;  // whose bf16 copy dx16_ holds (LayerBackward converts others)
  float *rstd_f_ = nullptr, *losses_ = nullptr, *norm_ = nullptr;
  // A layer's linear maps' new bf16 weights' largest |x|, as the optimizer step wrote them
  // (GpuOptimizer::FoldsWeightsAmax), for their FP8 codes' scales: kLinears, after norm_.
  float* weights_amax_ = nullptr;
  unsigned char* attention_scratch_ = nullptr;  // AttentionBackwardScratchBytes: delta, dS
  float* scratch_ = nullptr;        // the deterministic reductions' partial sums
  int32_t* token_index_ = nullptr;  // this micro-batch's rows grouped by token (SegmentTokens)
  TokenSegments token_segments_;    // its host side (kept until the upload is done)
  Bf16 *dxf_ = nullptr, *dh_ = nullptr, *da_ = nullptr, *dq_ = nullptr, *dk_ = nullptr, *dv_ = nullptr, *ds_ = nullptr,
       *dg_ = nullptr, *du_ = nullptr;
  int32_t *tokens_ = nullptr, *targets_ = nullptr;
  // Per micro-batch of a step, its rows' losses (pinned, N floats, read back with the stream)
  // and its counted targets; losses_queued_ of them hold this step's.
  std::vector<float*> loss_rows_;
  std::vector<int> loss_counted_;
  int losses_queued_ = 0;
  absl::StatusOr<float*> LossSlot(int micro);  // pinned, made on first use
  double MicroBatchLoss(int micro) const;      // after the stream's wait
  template <typename Fn>
  auto Timed(int category, Fn&& fn);
  // Timed, counting `flops` to the category (a GEMM's 2mnk, attention's matmuls).
  template <typename Fn>
  auto TimedFlops(int category, double flops, Fn&& fn);
  bool profiling_ = false;
  std::vector<double> flops_;  // by category, since the last TakeProfile
  struct Span {
    int category;
    cudaEvent_t start, end;
  };
  std::vector<Span> spans_;
};

}  // namespace tierd::trainer::gpu

#endif  // TIERD_TRAINER_REF_GPU_GPU_MODEL_H_
