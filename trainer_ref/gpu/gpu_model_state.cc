// The GPU model's state: making the model and its workspace, acquiring and releasing the
// home's parts around the kernels, and moving parameters in (initialisation) and out. The
// sizes and places of it all are gpu_model_layout.cc's.
#include "trainer_ref/gpu/gpu_model.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "absl/strings/str_format.h"
#include "base/units.h"
#include "trainer_ref/adamw8bit.h"
#ifdef TIERD_HAVE_CUDNN
#include "trainer_ref/kernels/cudnn_attention.h"
#endif
#include "trainer_ref/host_adamw.h"
#include "trainer_ref/parallel.h"
#include "trainer_ref/gpu/gpu_model_internal.h"

namespace tierd::trainer::gpu {

template <typename T>
absl::StatusOr<T*> GpuModel::Take(size_t count) {
  void* p = nullptr;
  const size_t bytes = std::max<size_t>(count, 1) * sizeof(T);
  if (cudaMalloc(&p, bytes) != cudaSuccess) {
    cudaGetLastError();
    size_t free_bytes = 0, total = 0;
    cudaMemGetInfo(&free_bytes, &total);
    return absl::ResourceExhaustedError(
        absl::StrFormat("the GPU model's workspace needs %s more (holds %s already); the device has %s free of %s",
                        FormatBytes(bytes), FormatBytes(device_bytes_), FormatBytes(free_bytes), FormatBytes(total)));
  }
  allocations_.push_back(p);
  device_bytes_ += bytes;
  return static_cast<T*>(p);
}

absl::StatusOr<std::unique_ptr<GpuModel>> GpuModel::Create(const ModelConfig& config, int batch, int seq,
                                                           std::unique_ptr<GpuHome> home, const StateOptions& state) {
  if (config.head_dim() > 256) {
    return absl::InvalidArgumentError(
        absl::StrFormat("head size %d: the attention kernel takes at most 256", config.head_dim()));
  }
  if (state.layer_major_micro_batches < 0) return absl::InvalidArgumentError("a negative number of micro-batches");
  if ((state.lion || state.adafactor) && state.moments_8bit) {
    return absl::InvalidArgumentError(
        "8-bit moments are AdamW's (--opt=adamw8bit): Lion keeps its one moment in fp32, Adafactor its factored "
        "second moment");
  }
  if (state.lion && state.adafactor) return absl::InvalidArgumentError("one optimizer: Lion or Adafactor");
  if (config.tied_embeddings && state.compact) {
    return absl::InvalidArgumentError(
        "the compact state takes one backward per group a step, and with tied embeddings the embedding's matrix "
        "has two (the head's and the embedding's): keep the full state (tied models are small; it fits)");
  }
  if (state.fp8_weight_codes && state.compact) {
    return absl::InvalidArgumentError(
        "FP8 weight codes are written by the host's optimizer beside the bf16 weights, which the compact state does "
        "not keep");
  }
  if (state.transposed_weight_codes && !state.fp8_weight_codes) {
    return absl::InvalidArgumentError(
        "transposed FP8 weight codes are written beside the codes themselves: they need FP8 weight codes "
        "(--fp8_weight_codes)");
  }
  std::unique_ptr<GpuModel> model(new GpuModel(config, batch, seq, state));
  if (home == nullptr) {
    auto plain = MakePlainGpuHome(HomeLayout(config, batch, seq, state));
    if (!plain.ok()) return plain.status();
    home = std::move(*plain);
  }
  // The home must be made for this model: the same groups and parts, in bytes.
  const GpuHomeLayout own = HomeLayout(config, batch, seq, state);
  if (home->layout().groups != own.groups || home->layout().bytes != own.bytes ||
      home->layout().act_slots != own.act_slots || home->layout().moments_8bit != own.moments_8bit ||
      home->layout().compact != own.compact) {
    return absl::InvalidArgumentError(
        absl::StrFormat("the home was made for another layout (%d groups, %s) than this model's (%d groups, %s)",
                        home->layout().groups.size(), FormatBytes(home->layout().Total()), own.groups.size(),
                        FormatBytes(own.Total())));
  }
  model->home_layout_ = home->layout();
  model->home_ = std::move(home);
  RETURN_IF_ERROR(model->Allocate());
  return model;
}

Fp8Linear::Shapes LinearShapes(const ModelConfig& config) {
  const int c = config.d_model, f = config.d_ff, qd = config.q_dim(), kd = config.kv_dim();
  Fp8Linear::Shapes shapes(kLinears);
  shapes[kLinearQ] = {qd, c};
  shapes[kLinearK] = shapes[kLinearV] = {kd, c};
  shapes[kLinearO] = {c, qd};
  shapes[kLinearGate] = shapes[kLinearUp] = {f, c};
  shapes[kLinearDown] = {c, f};
  return shapes;
}

bool GpuModel::MayUseCudnnAttention(const std::string& attention) {
#ifdef TIERD_HAVE_CUDNN
  return attention != "ours" && CudnnAttention::Loadable();
#else
  (void)attention;
  return false;
#endif
}

absl::Status GpuModel::ChooseAttention(int64_t workspace_bytes) {
  if (attention_mode_ != "auto" && attention_mode_ != "cudnn" && attention_mode_ != "cudnn-fast" &&
      attention_mode_ != "ours") {
    return absl::InvalidArgumentError("attention is auto, cudnn, cudnn-fast or ours, not '" + attention_mode_ + "'");
  }
  const std::string ours = "ours (FlashAttention-2-style, attention_tc)";
  if (attention_mode_ == "ours") {
    attention_note_ = ours;
    return absl::OkStatus();
  }
#ifdef TIERD_HAVE_CUDNN
  auto made = CudnnAttention::Create({.batch = batch_,
                                      .seq = seq_,
                                      .heads = config_.heads,
                                      .kv_heads = config_.kv_head_count(),
                                      .head_dim = config_.head_dim()},
                                     /*deterministic=*/attention_mode_ != "cudnn-fast");
  std::string why;
  if (!made.ok()) {
    why = std::string(made.status().message());
  } else if ((*made)->workspace_bytes() > workspace_bytes) {
    why = absl::StrFormat("cuDNN attention wants %s of workspace, more than ours' %s", FormatBytes((*made)->workspace_bytes()),
                          FormatBytes(workspace_bytes));
  } else {
    cudnn_attention_ = std::move(*made);
    attention_note_ = cudnn_attention_->Describe() +
                      (attention_mode_ == "cudnn-fast" ? " (non-deterministic backward: runs differ in their last bits)"
                                                       : " (deterministic backward)");
    return absl::OkStatus();
  }
#else
  const std::string why = "this build has no cuDNN (cudnn.h was not beside the CUDA toolkit's headers)";
#endif
  if (attention_mode_ != "auto") return absl::FailedPreconditionError("--attention=" + attention_mode_ + ": " + why);
  attention_note_ = ours + "; not cuDNN's: " + why;
  return absl::OkStatus();
}

absl::Status GpuModel::Allocate() {
  RETURN_IF_ERROR(Cuda(cudaStreamCreate(&stream_), "stream"));
  RETURN_IF_ERROR(Cuda(cudaStreamCreate(&host_stream_), "host optimizer stream"));
  auto gemm = Gemm::Create(
      {.workspace_bytes = gemm_workspace_, .candidates = gemm_candidates_, .cache_dir = gemm_cache_dir_});
  if (!gemm.ok()) return gemm.status();
  gemm_ = std::move(*gemm);
  device_bytes_ += gemm_workspace_;
  void** targets[] = {reinterpret_cast<void**>(&norms_),
                      reinterpret_cast<void**>(&tmp_),
                      reinterpret_cast<void**>(&xf_),
                      reinterpret_cast<void**>(&dx16_),
                      reinterpret_cast<void**>(&dxf_),
                      reinterpret_cast<void**>(&dh_),
                      reinterpret_cast<void**>(&da_),
                      reinterpret_cast<void**>(&dq_),
                      reinterpret_cast<void**>(&dk_),
                      reinterpret_cast<void**>(&dv_),
                      reinterpret_cast<void**>(&x_),
                      reinterpret_cast<void**>(&x_out_),
                      reinterpret_cast<void**>(&dx_),
                      reinterpret_cast<void**>(&ds_),
                      reinterpret_cast<void**>(&dg_),
                      reinterpret_cast<void**>(&du_),
                      reinterpret_cast<void**>(&logits_),
                      reinterpret_cast<void**>(&dlogits_),
                      reinterpret_cast<void**>(&rstd_f_),
                      reinterpret_cast<void**>(&losses_),
                      reinterpret_cast<void**>(&norm_),
                      reinterpret_cast<void**>(&attention_scratch_),
                      reinterpret_cast<void**>(&tokens_),
                      reinterpret_cast<void**>(&targets_),
                      reinterpret_cast<void**>(&scratch_),
                      reinterpret_cast<void**>(&token_index_),
                      reinterpret_cast<void**>(&k_full_),
                      reinterpret_cast<void**>(&v_full_),
                      reinterpret_cast<void**>(&dk_full_),
                      reinterpret_cast<void**>(&dv_full_),
                      &recompute_acts_,
                      reinterpret_cast<void**>(&xr_)};
  constexpr size_t kAttentionScratchIndex = 21;  // attention_scratch_'s place in targets[] below
  const bool lean_rooms = std::find(coded_rooms_.begin(), coded_rooms_.end(), true) != coded_rooms_.end();
  const auto plan = WorkspacePlan(config_, batch_, seq_, AnyRecomputes(), head_rows_,
                                  MayUseCudnnAttention(attention_mode_), lean_rooms);
  static_assert(sizeof(targets) / sizeof(targets[0]) == 32);
  if (plan.size() != (AnyRecomputes() || lean_rooms ? 32u : 30u) ||
      targets[kAttentionScratchIndex] != reinterpret_cast<void**>(&attention_scratch_))
    return absl::InternalError("the workspace plan and its buffers disagree");
  for (size_t i = 0; i < plan.size(); ++i) {
    auto p = Take<unsigned char>(plan[i].first * plan[i].second);
    if (!p.ok()) return p.status();
    *targets[i] = *p;
  }
  weights_amax_ = norm_ + 1;
  micro_batches_.resize(static_cast<size_t>(layer_major_));
  for (MicroBatch& mb : micro_batches_) {
    const auto plan = MicroBatchPlan(config_, batch_, seq_);
    void** targets[] = {reinterpret_cast<void**>(&mb.x), reinterpret_cast<void**>(&mb.dx),
                        reinterpret_cast<void**>(&mb.tokens), reinterpret_cast<void**>(&mb.targets),
                        reinterpret_cast<void**>(&mb.token_index)};
    for (size_t i = 0; i < plan.size(); ++i) {
      auto p = Take<unsigned char>(plan[i].first * plan[i].second);
      if (!p.ok()) return p.status();
      *targets[i] = *p;
    }
  }
  RETURN_IF_ERROR(ChooseAttention(static_cast<int64_t>(plan[kAttentionScratchIndex].first)));
  if (const int64_t floats = optimizer_->ScratchFloats(layout_); floats > 0) {
    auto scratch = Take<float>(static_cast<size_t>(floats));
    if (!scratch.ok()) return scratch.status();
    optimizer_scratch_ = *scratch;
  }
  if (compact_) {
    auto acc = Take<float>(MaxGroupCount());
    if (!acc.ok()) return acc.status();
    grad_acc_ = *acc;
    auto ws = Take<Bf16>(MaxGroupCount());
    if (!ws.ok()) return ws.status();
    weights_ws_ = *ws;
  }
  return ZeroGrads();
}

absl::Status GpuModel::Enter(int group, Part part, Access access, int chunk) {
  // The optimizer's step has updated the group: the CPU's waited for, the GPU's deferred
  // update queued before this use.
  RETURN_IF_ERROR(AwaitOptimizerUpdate(group));
  if (compact_ && part == Part::kWeights) return EnterDerivedWeights(group, access);
  const auto start = std::chrono::steady_clock::now();
  auto p = home_->Acquire(group, part, chunk, access);
  acquire_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!p.ok()) {
    return AcquireError(p.status(), group, part, chunk, "");
  }
  acquired_[group][static_cast<int>(part)] = *p;
  acquired_chunk_[group][static_cast<int>(part)] = chunk;
  // Weights acquired anew may be new weights (an optimizer step) at an old address.
  if ((part == Part::kWeights || part == Part::kWeightCodes) && fp8_ != nullptr) fp8_->ForgetWeights();
  // bf16 weights written here are no longer what the codes were made from.
  if (part == Part::kWeights && access != Access::kRead) codes_current_[group] = 0;
  return absl::OkStatus();
}

absl::Status GpuModel::EnterDerivedWeights(int group, Access access) {
  if (access != Access::kOverwrite && weights_group_ != group) {
    weights_group_ = -1;  // overwritten from here on
    for (int c = 0; c < home_layout_.Chunks(group, Part::kMaster); ++c) {
      RETURN_IF_ERROR(Enter(group, Part::kMaster, Access::kRead, c));
      const GpuHomeLayout::Range range = home_layout_.Chunk(group, Part::kMaster, c);
      Timed(kElementwise, [&] {
        ToBf16(weights_ws_ + range.offset / sizeof(float),
               static_cast<float*>(acquired_[group][static_cast<int>(Part::kMaster)]),
               static_cast<int64_t>(range.bytes / sizeof(float)), stream_);
        return 0;
      });
      RETURN_IF_ERROR(Leave(group, Part::kMaster));
    }
  }
  weights_group_ = group;
  acquired_[group][static_cast<int>(Part::kWeights)] = weights_ws_;
  acquired_chunk_[group][static_cast<int>(Part::kWeights)] = 0;
  if (fp8_ != nullptr) fp8_->ForgetWeights();  // the same address, other weights
  return absl::OkStatus();
}

absl::Status GpuModel::AcquireError(const absl::Status& why, int group, Part part, int chunk, const char* where) const {
  return absl::Status(why.code(), absl::StrFormat("acquiring %s%s: %s", PartName(home_layout_, group, part, chunk),
                                                  where, why.message()));
}

absl::Status GpuModel::Leave(int group, Part part) {
  if (compact_ && part == Part::kWeights) {  // the workspace: nothing leased
    acquired_[group][static_cast<int>(part)] = nullptr;
    return absl::OkStatus();
  }
  if (compact_ && part == Part::kGrads && accumulating_group_ == group) {
    // The group's backward is done: its gradients are kept as bf16, rounded once.
    Timed(kElementwise, [&] {
      ToBf16(static_cast<Bf16*>(acquired_[group][static_cast<int>(part)]), grad_acc_,
             static_cast<int64_t>(GroupCount(group)), stream_);
      return 0;
    });
    accumulating_group_ = -1;
  }
  acquired_[group][static_cast<int>(part)] = nullptr;
  const auto start = std::chrono::steady_clock::now();
  absl::Status released = home_->Release(group, part, acquired_chunk_[group][static_cast<int>(part)], stream_);
  release_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return released;
}

absl::Status GpuModel::ForEachStateChunk(int g, Access access,
                                         const std::function<absl::Status(size_t, size_t, float*, void*, void*)>& fn) {
  constexpr Part kState[] = {Part::kMaster, Part::kAdamM, Part::kAdamV};
  // Lion's second-moment part is empty: not held, passed as null.
  auto kept = [&](Part part) { return home_layout_.bytes[g][static_cast<int>(part)] > 0; };
  for (int c = 0; c < home_layout_.Chunks(g, Part::kMaster); ++c) {
    for (Part part : kState) {
      if (kept(part)) RETURN_IF_ERROR(Enter(g, part, access, c));
    }
    const GpuHomeLayout::Range range = home_layout_.Chunk(g, Part::kMaster, c);
    auto at = [&](Part part) { return kept(part) ? acquired_[g][static_cast<int>(part)] : nullptr; };
    const absl::Status s = fn(range.offset / sizeof(float), range.bytes / sizeof(float),
                              static_cast<float*>(at(Part::kMaster)), at(Part::kAdamM), at(Part::kAdamV));
    for (Part part : kState) {
      if (!kept(part)) continue;
      const absl::Status left = Leave(g, part);
      if (s.ok() && !left.ok()) return left;
    }
    RETURN_IF_ERROR(s);
  }
  return absl::OkStatus();
}

absl::Status GpuModel::ZeroMoments(int g, size_t n, void* m, void* v) {
  // All-zero bytes are a zero moment either way (8-bit: codes 0 scaled by an absmax of 0).
  const uint64_t bytes =
      optimizer_->StateAtTensorOffsets() ? home_layout_.bytes[g][static_cast<int>(Part::kAdamM)] : n * sizeof(float);
  for (void* moment : {m, v}) {
    if (moment != nullptr) RETURN_IF_ERROR(Cuda(cudaMemsetAsync(moment, 0, bytes, stream_), "zero moments"));
  }
  return absl::OkStatus();
}

absl::Status GpuModel::EnterGrads(int group, bool* fresh) {
  if (fresh != nullptr) *fresh = !grads_zeroed_[group];
  if (compact_) {
    if (grads_zeroed_[group]) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "the compact state keeps %s's gradients as bf16 once its backward is done, so it takes one backward per "
          "group a step: step layer-major (--step_order=layer) or with one micro-batch, or keep the full state",
          home_layout_.groups[group]));
    }
    RETURN_IF_ERROR(Enter(group, Part::kGrads, Access::kOverwrite));  // written whole when the backward is done
    grads_zeroed_[group] = true;
    accumulating_group_ = group;
    if (fresh != nullptr) return ZeroGradsBesideLinears(group, grad_acc_);
    return Cuda(cudaMemsetAsync(grad_acc_, 0, GroupCount(group) * sizeof(float), stream_), "zero grads");
  }
  if (grads_zeroed_[group]) return Enter(group, Part::kGrads, Access::kWrite);
  RETURN_IF_ERROR(Enter(group, Part::kGrads, Access::kOverwrite));
  grads_zeroed_[group] = true;
  auto* grads = static_cast<float*>(acquired_[group][static_cast<int>(Part::kGrads)]);
  if (fresh != nullptr) return ZeroGradsBesideLinears(group, grads);
  return Cuda(cudaMemsetAsync(grads, 0, GroupCount(group) * sizeof(float), stream_), "zero grads");
}

absl::Status GpuModel::ZeroGradsBesideLinears(int group, float* grads) {
  // The linear maps hold nearly all of a layer's parameters: zeroing them only for the first
  // micro-batch's GEMMs to add into would write and read them once more a step. The rest (norm
  // weights, biases, any gap between entries, which the gradient norm also reads) gets zeros.
  std::vector<std::pair<size_t, size_t>> linears;  // [begin, end) within the group
  for (int k = 0; k < kLinears; ++k) {
    const size_t e = LinearEntry(group - 1, k);
    const size_t begin = layout_[e].offset - group_offset_[group];
    linears.emplace_back(begin, begin + layout_[e].count);
  }
  std::sort(linears.begin(), linears.end());
  auto zero = [&](size_t from, size_t to) {
    return from < to ? Cuda(cudaMemsetAsync(grads + from, 0, (to - from) * sizeof(float), stream_), "zero grads")
                     : absl::OkStatus();
  };
  size_t at = 0;
  for (const auto& [begin, end] : linears) {
    RETURN_IF_ERROR(zero(at, begin));
    at = std::max(at, end);
  }
  return zero(at, GroupCount(group));
}

Bf16* GpuModel::W(size_t entry) const {
  const int g = group_of_[entry];
  return Inside<Bf16>(acquired_[g][static_cast<int>(Part::kWeights)], layout_[entry].offset - group_offset_[g],
                      "weights", layout_[entry].name);
}
float* GpuModel::G(size_t entry) const {
  const int g = group_of_[entry];
  return Inside<float>(GradsOf(g), layout_[entry].offset - group_offset_[g], "gradients", layout_[entry].name);
}

float* GpuModel::GradsOf(int group) const {
  if (compact_) return accumulating_group_ == group ? grad_acc_ : nullptr;
  return static_cast<float*>(acquired_[group][static_cast<int>(Part::kGrads)]);
}

size_t GpuModel::GroupCount(int group) const {
  size_t count = 0;
  for (size_t e : GroupEntries(group)) count += layout_[e].count;
  return count;
}

absl::Status GpuModel::SetGroup(int g, const float* params) {
  const size_t count = GroupCount(g);
  std::vector<Bf16> bits(count);
  ParallelFor(static_cast<int64_t>(count), static_cast<double>(count), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) bits[i] = Bf16Bits(params[i]);  // the device's rounding
  });
  RETURN_IF_ERROR(Enter(g, Part::kWeights, Access::kOverwrite));
  RETURN_IF_ERROR(Cuda(cudaMemcpyAsync(acquired_[g][static_cast<int>(Part::kWeights)], bits.data(),
                                       count * sizeof(Bf16), cudaMemcpyHostToDevice, stream_),
                       "upload weights"));
  RETURN_IF_ERROR(ForEachStateChunk(
      g, Access::kOverwrite, [&](size_t first, size_t n, float* master, void* m, void* v) -> absl::Status {
        RETURN_IF_ERROR(
            Cuda(cudaMemcpyAsync(master, params + first, n * sizeof(float), cudaMemcpyHostToDevice, stream_),
                 "upload master"));
        return ZeroMoments(g, n, m, v);
      }));
  for (size_t e : GroupEntries(g)) {
    if (layout_[e].shape.size() != 1) continue;
    RETURN_IF_ERROR(Cuda(cudaMemcpyAsync(N(e), params + (layout_[e].offset - group_offset_[g]),
                                         layout_[e].count * sizeof(float), cudaMemcpyHostToDevice, stream_),
                         "upload norm weights"));
  }
  RETURN_IF_ERROR(Cuda(cudaStreamSynchronize(stream_), "upload"));  // the host buffers are read by now
  return Leave(g, Part::kWeights);
}

absl::Status GpuModel::SetParams(const std::vector<float>& params) {
  if (params.size() != total_params_) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%d parameters given; the model has %d", params.size(), total_params_));
  }
  for (int g = 0; g < Groups(); ++g) RETURN_IF_ERROR(SetGroup(g, params.data() + group_offset_[g]));
  return absl::OkStatus();
}

absl::Status GpuModel::InitParams(uint64_t seed) {
  // Made where the state is used, on the GPU, element by element from counter-based
  // streams (init_normal.h): no host arithmetic, nothing uploaded (a 7B model's state is
  // ~100 GB; made on the host it took minutes).
  const std::vector<float> ones(static_cast<size_t>(config_.d_model), 1.f);
  const std::vector<float> zeros(static_cast<size_t>(std::max(config_.q_dim(), config_.kv_dim())), 0.f);
  for (int g = 0; g < Groups(); ++g) {
    RETURN_IF_ERROR(Enter(g, Part::kWeights, Access::kOverwrite));
    Bf16* weights = static_cast<Bf16*>(acquired_[g][static_cast<int>(Part::kWeights)]);
    const std::vector<size_t> entries = GroupEntries(g);
    RETURN_IF_ERROR(ForEachStateChunk(
        g, Access::kOverwrite, [&](size_t first, size_t n, float* master, void* m, void* v) -> absl::Status {
          for (size_t e : entries) {
            const TensorLayout& t = layout_[e];
            const size_t lo = t.offset - group_offset_[g], from = std::max(lo, first),
                         to = std::min(lo + t.count, first + n);
            if (from >= to) continue;
            if (t.shape.size() == 1) {  // norm weights 1, biases 0
              InitConstant(master + (from - first), weights + from, static_cast<int64_t>(to - from),
                           IsBias(t) ? 0.f : 1.f, stream_);
              continue;
            }
            const bool residual_out =
                t.name.find("attn.wo") != std::string::npos || t.name.find("mlp.w2") != std::string::npos;
            const double sigma = 0.02 * (residual_out ? 1.0 / std::sqrt(2.0 * config_.layers) : 1.0);
            InitNormal(master + (from - first), weights + from, static_cast<int64_t>(from - lo),
                       static_cast<int64_t>(to - from), seed, e, sigma, stream_);
          }
          RETURN_IF_ERROR(ZeroMoments(g, n, m, v));
          return Cuda(cudaGetLastError(), "initial weights");
        }));
    for (size_t e : entries) {  // the resident norm weights and biases: ones and zeros, as their master
      if (layout_[e].shape.size() != 1) continue;
      const float* values = IsBias(layout_[e]) ? zeros.data() : ones.data();
      RETURN_IF_ERROR(
          Cuda(cudaMemcpyAsync(N(e), values, layout_[e].count * sizeof(float), cudaMemcpyHostToDevice, stream_),
               "norm weights"));
    }
    RETURN_IF_ERROR(Leave(g, Part::kWeights));
  }
  return Cuda(cudaStreamSynchronize(stream_), "initial weights");  // `ones` and `zeros` are read by now
}

absl::Status GpuModel::Download(Part part, std::vector<float>* out) {
  out->assign(total_params_, 0.f);
  for (int g = 0; g < Groups(); ++g) {
    if (part == Part::kGrads && !grads_zeroed_[g]) continue;  // no backward reached it this step: zeros
    if (compact_ && part == Part::kGrads) {                   // bf16
      std::vector<Bf16> bits(GroupCount(g));
      RETURN_IF_ERROR(Enter(g, part, Access::kRead));
      RETURN_IF_ERROR(Cuda(cudaMemcpyAsync(bits.data(), acquired_[g][static_cast<int>(part)],
                                           bits.size() * sizeof(Bf16), cudaMemcpyDeviceToHost, stream_),
                           "download"));
      RETURN_IF_ERROR(Cuda(cudaStreamSynchronize(stream_), "download"));
      RETURN_IF_ERROR(Leave(g, part));
      for (size_t i = 0; i < bits.size(); ++i) (*out)[group_offset_[g] + i] = FromBf16(bits[i]);
      continue;
    }
    for (int c = 0; c < home_layout_.Chunks(g, part); ++c) {
      const GpuHomeLayout::Range range = home_layout_.Chunk(g, part, c);
      RETURN_IF_ERROR(Enter(g, part, Access::kRead, c));
      RETURN_IF_ERROR(
          Cuda(cudaMemcpyAsync(out->data() + group_offset_[g] + range.offset / sizeof(float),
                               acquired_[g][static_cast<int>(part)], range.bytes, cudaMemcpyDeviceToHost, stream_),
               "download"));
      RETURN_IF_ERROR(Cuda(cudaStreamSynchronize(stream_), "download"));
      RETURN_IF_ERROR(Leave(g, part));
    }
  }
  return absl::OkStatus();
}

absl::Status GpuModel::GetParams(std::vector<float>* params) { return Download(Part::kMaster, params); }

absl::Status GpuModel::LoadParams(const std::function<absl::Status(size_t entry, float* out)>& read) {
  std::vector<float> values;
  for (int g = 0; g < Groups(); ++g) {
    values.assign(GroupCount(g), 0.f);
    for (size_t e : GroupEntries(g)) RETURN_IF_ERROR(read(e, values.data() + (layout_[e].offset - group_offset_[g])));
    RETURN_IF_ERROR(SetGroup(g, values.data()));
  }
  return absl::OkStatus();
}

absl::Status GpuModel::GroupParams(int g, std::vector<float>* out) {
  RETURN_IF_ERROR(AwaitOptimizerUpdate(-1));
  out->assign(GroupCount(g), 0.f);
  for (int c = 0; c < home_layout_.Chunks(g, Part::kMaster); ++c) {
    const GpuHomeLayout::Range range = home_layout_.Chunk(g, Part::kMaster, c);
    RETURN_IF_ERROR(Enter(g, Part::kMaster, Access::kRead, c));
    RETURN_IF_ERROR(Cuda(cudaMemcpyAsync(out->data() + range.offset / sizeof(float),
                                         acquired_[g][static_cast<int>(Part::kMaster)], range.bytes,
                                         cudaMemcpyDeviceToHost, stream_),
                         "download"));
    RETURN_IF_ERROR(Cuda(cudaStreamSynchronize(stream_), "download"));
    RETURN_IF_ERROR(Leave(g, Part::kMaster));
  }
  return absl::OkStatus();
}

absl::Status GpuModel::GetGrads(std::vector<float>* grads) { return Download(Part::kGrads, grads); }

}  // namespace tierd::trainer::gpu
