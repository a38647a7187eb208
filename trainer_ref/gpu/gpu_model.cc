// The GPU model's computation: forward, backward (with recomputation under activation
// checkpointing), the gradient norm, and the profile of where the time went.
#include "trainer_ref/gpu/gpu_model.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <vector>

#include "absl/strings/str_format.h"
#include "trainer_ref/gpu/gpu_model_internal.h"
#ifdef TIERD_HAVE_CUDNN
#include "trainer_ref/kernels/cudnn_attention.h"
#endif

namespace tierd::trainer::gpu {

std::vector<GpuModel::ProfileEntry> GpuModel::TakeProfile() {
  cudaStreamSynchronize(stream_);
  double ms[kCategories] = {};
  for (const Span& s : spans_) {
    float t = 0;
    cudaEventElapsedTime(&t, s.start, s.end);
    ms[s.category] += t;
    cudaEventDestroy(s.start);
    cudaEventDestroy(s.end);
  }
  spans_.clear();
  flops_.resize(kCategories, 0.0);
  std::vector<ProfileEntry> out;
  for (int c = 0; c < kCategories; ++c) out.push_back({kCategoryNames[c], ms[c], flops_[c]});
  flops_.assign(kCategories, 0.0);
  return out;
}

GpuModel::GpuModel(const ModelConfig& config, int batch, int seq, const StateOptions& state)
    : config_(config),
      batch_(batch),
      seq_(seq),
      checkpointing_(state.checkpointing),
      kept_layers_(std::clamp(state.kept_layers, 0, config.layers)),
      lean_layers_(std::clamp(state.lean_layers, 0, config.layers - kept_layers_)),
      layout_(ParamLayout(config)),
      layer_major_(state.layer_major_micro_batches),
      optimizer_(MakeGpuOptimizer({.lion = state.lion,
                                   .adafactor = state.adafactor,
                                   .moments_8bit = state.moments_8bit,
                                   .moments_8bit_min = state.moments_8bit_min})),
      compact_(state.compact),
      gemm_candidates_(state.gemm_candidates),
      gemm_workspace_(state.gemm_workspace_bytes),
      gemm_cache_dir_(state.gemm_cache_dir),
      attention_mode_(state.attention) {
  const ParamEntries entries = ParamEntriesOf(config);
  embed_ = entries.embed;
  layers_ = entries.layers;
  final_norm_ = entries.final_norm;
  head_ = entries.head;
  groups_ = ParamGroups(config);
  total_params_ = layout_.back().offset + layout_.back().count;
  group_of_.assign(layout_.size(), 0);
  group_offset_.assign(Groups(), 0);
  for (int g = 0; g < Groups(); ++g) {
    const std::vector<size_t> members = GroupEntries(g);
    size_t first = layout_[members[0]].offset;
    for (size_t e : members) {
      group_of_[e] = g;
      first = std::min(first, layout_[e].offset);
    }
    group_offset_[g] = first;
  }
  acquired_.assign(Groups(), {});
  acquired_chunk_.assign(Groups(), {});
  grads_zeroed_.assign(Groups(), false);
  weight_codes_ = state.fp8_weight_codes;
  transposed_codes_ = state.fp8_weight_codes && state.transposed_weight_codes;
  for (bool transposed : {false, true}) {
    for (int k = 0; k < kLinears; ++k) codes_offset_.push_back(WeightCodesOffset(config, k, transposed));
  }
  fused_norms_ = state.fused_norms;
  optimizer_one_launch_ = state.optimizer_one_launch;
  bf16_checkpoints_ = state.checkpointing && state.bf16_checkpoints;
  codes_current_.assign(Groups(), 0);
  coded_rooms_.assign(config.layers, false);
  for (int l = 0; l < config.layers; ++l) coded_rooms_[l] = CodedRooms(config, state, l);
  head_rows_ = HeadRows(config, batch, seq, state.head_rows);
  rope_ = RopeFrequenciesOf(RopeInverseFrequencies(config));
  norm_offset_.assign(layout_.size(), 0);
  size_t norms = 0;
  for (size_t e = 0; e < layout_.size(); ++e) {
    if (layout_[e].shape.size() == 1) {
      norm_offset_[e] = norms;
      norms += layout_[e].count;
    }
  }
}

std::vector<size_t> GpuModel::GroupEntries(int group) const { return groups_[group].entries; }

int GpuModel::HeadRows(const ModelConfig& config, int batch, int seq, int asked) {
  const uint64_t n = static_cast<uint64_t>(batch) * seq, row_bytes = uint64_t{2} * config.vocab;
  if (asked > 0) return static_cast<int>(std::min<uint64_t>(static_cast<uint64_t>(asked), n));
  if (n * row_bytes <= kWholeLogitsBytes) return static_cast<int>(n);
  const uint64_t rows = std::max<uint64_t>(64, kLogitsChunkBytes / row_bytes / 64 * 64);
  return static_cast<int>(std::min(rows, n));
}

absl::Status GpuModel::EnterTiedHead(bool backward) {
  if (!config_.tied_embeddings) return absl::OkStatus();
  RETURN_IF_ERROR(Enter(0, Part::kWeights, Access::kRead));
  return backward ? EnterGrads(0) : absl::OkStatus();
}

absl::Status GpuModel::LeaveTiedHead(bool backward) {
  if (!config_.tied_embeddings) return absl::OkStatus();
  RETURN_IF_ERROR(Leave(0, Part::kWeights));
  return backward ? Leave(0, Part::kGrads) : absl::OkStatus();
}

GpuModel::~GpuModel() {
  pending_update_.clear();  // a deferred GPU update nobody will read is not queued
  AwaitOptimizerUpdate(-1).IgnoreError();
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  for (int g = 0; g < static_cast<int>(acquired_.size()); ++g) {
    for (int k = 0; k < kParts; ++k) {
      if (acquired_[g][k] != nullptr) Leave(g, Part(k)).IgnoreError();
    }
  }
  gemm_.reset();
  cudnn_attention_.reset();
  home_.reset();
  for (void* p : allocations_) cudaFree(p);
  for (float* p : loss_rows_) cudaFreeHost(p);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
  if (host_stream_ != nullptr) cudaStreamDestroy(host_stream_);
}

absl::Status GpuModel::ZeroGrads() {
  grads_zeroed_.assign(Groups(), false);
  dx16_holds_ = nullptr;
  micro_ = 0;
  losses_queued_ = 0;
  return absl::OkStatus();
}

void GpuModel::Progress(uint32_t op) {
  // Progress only steers the moves: a lost message costs a demand fetch, not a value.
  if (registered_ && micro_ < registered_micro_batches_) home_->home().OpBegin(op).IgnoreError();
}

absl::Status GpuModel::LayerForward(int l, const Acts& a, float* x, bool recompute, Carry carry) {
  [[maybe_unused]] const auto [n, c, f, h, d, kvh, qd, kd, nc] = DimsOf(config_, batch_ * seq_);
  const Layer& w = layers_[l];
  // out = in x W^T, in bf16 or (an FP8 layer) from the codes of the last `cast` input and
  // those of the weights (made from the bf16 ones, or read from the codes part).
  Fp8Linear* fp8 = LayerFp8(l);
  const bool codes = fp8 != nullptr && ReadsCodes(l + 1);
  Fp8Codes in8;
  // Under delayed scaling an input's scale is known before the input is: the norm or SwiGLU
  // kernel that makes it writes its E4M3 codes too (`out_codes`, for the maps from `first` on),
  // and `cast` takes those instead of reading the input again.
  bool encoded = false;
  auto out_codes = [&](LinearIndex first) -> Fp8Out {
    const auto target = fp8 != nullptr ? fp8->InputTarget(l, first) : std::nullopt;
    encoded = target.has_value();
    return encoded ? Fp8Out{target->codes, target->scale, target->amax} : Fp8Out{};
  };
  // An FP8 layer keeps h1, h2 and s as their codes transposed, in their rooms (Acts::
  // inputs_transposed); their bf16 values, where a conversion reads them, go to workspace the
  // forward does not use (the backward's), and under delayed scaling nowhere.
  const bool keep_t = a.inputs_transposed;
  Bf16* const h1 = keep_t ? dh_ : a.h1;
  Bf16* const h2 = keep_t ? dh_ : a.h2;
  Bf16* const s = keep_t ? ds_ : a.s;
  auto bf16_out = [&](Bf16* out) { return keep_t && encoded ? nullptr : out; };
  // `first`: the first linear map reading `in` (its scale is the input's). `kept` (with
  // keep_t): the room for the codes transposed, and `i` the input's index in in_scale_inv;
  // `kept_made`: the input's maker wrote them there already.
  auto cast = [&](const Bf16* in, LinearIndex first, int cols, Bf16* kept = nullptr, int i = 0,
                  bool kept_made = false) -> absl::Status {
    if (fp8 == nullptr) return absl::OkStatus();
    uint8_t* const keep = keep_t && kept != nullptr ? reinterpret_cast<uint8_t*>(kept) : nullptr;
    Timed(kFp8Cast, [&] {
      if (!encoded) {
        in8 = keep != nullptr ? fp8->QuantizeInputKeepingTransposed(l, first, in, n, cols, keep, stream_)
                              : fp8->QuantizeInput(l, first, in, n, cols, stream_);
        return 0;
      }
      in8 = fp8->InputCodes(l, first);
      encoded = false;
      if (keep != nullptr && !kept_made) fp8->TransposeInputCodes(n, cols, keep, stream_);
      return 0;
    });
    if (keep == nullptr || fp8->InputScalesHoldWithinStep()) return absl::OkStatus();
    return Cuda(cudaMemcpyAsync(a.in_scale_inv + Acts::kScaleStride * i, in8.scale_inv, sizeof(float),
                                cudaMemcpyDeviceToDevice, stream_),
                "kept input's scale");
  };
  auto linear = [&](Bf16* out, const Bf16* in, size_t e, LinearIndex k, int ic, int oc) {
    return TimedFlops(kGemm, 2.0 * n * ic * oc, [&] {
      return codes            ? fp8->ForwardFromCodes(out, in8, l, k, CodesOf(l, k), n, ic, oc, stream_)
             : fp8 != nullptr ? fp8->Forward(out, in8, l, k, W(e), n, ic, oc, stream_)
                              : gemm_->Forward(out, in, W(e), n, ic, oc, stream_);
    });
  };
  const float eps = static_cast<float>(config_.norm_eps);
  // The carried add made by the first norm, into x_in: the second norm then reads x_in, not x.
  const bool summed_in = carry.pending_in && fused_norms_ && a.x_in_bf16 == nullptr;
  if (carry.pending_in && !summed_in) {
    Timed(kElementwise, [&] {
      AddInto(x, tmp_, static_cast<int64_t>(nc), stream_);
      return 0;
    });
  }
  if (a.x_in_bf16 != nullptr) {  // a bf16 checkpoint: the input rounded is all the layer keeps
    Timed(kElementwise, [&] {
      ToBf16(a.x_in_bf16, x, static_cast<int64_t>(nc), stream_);
      RmsNormForward(h1, a.rstd1, x, N(w.attn_norm), n, c, eps, stream_);
      return 0;
    });
  } else if (fused_norms_) {
    const Fp8Out q = out_codes(kLinearQ);
    Timed(kElementwise, [&] {
      if (summed_in) {
        SumRmsNormForward(bf16_out(h1), a.rstd1, x, tmp_, nullptr, a.x_in, N(w.attn_norm), n, c, eps, stream_, q);
      } else {
        ResidualRmsNormForward(bf16_out(h1), a.rstd1, x, nullptr, a.x_in, N(w.attn_norm), n, c, eps, stream_, q);
      }
      return 0;
    });
  } else {
    RETURN_IF_ERROR(Cuda(cudaMemcpyAsync(a.x_in, x, nc * sizeof(float), cudaMemcpyDeviceToDevice, stream_), "x_in"));
    Timed(kElementwise, [&] {
      RmsNormForward(h1, a.rstd1, x, N(w.attn_norm), n, c, eps, stream_);
      return 0;
    });
  }
  RETURN_IF_ERROR(cast(h1, kLinearQ, c, a.h1, 0));
  RETURN_IF_ERROR(linear(a.q, h1, w.wq, kLinearQ, c, qd));
  RETURN_IF_ERROR(linear(a.k, h1, w.wk, kLinearK, c, kd));
  RETURN_IF_ERROR(linear(a.v, h1, w.wv, kLinearV, c, kd));
  if (config_.qkv_bias) {
    Timed(kElementwise, [&] {
      BiasForward(a.q, N(w.bq), n, qd, stream_);
      BiasForward(a.k, N(w.bk), n, kd, stream_);
      BiasForward(a.v, N(w.bv), n, kd, stream_);
      return 0;
    });
  }
  Timed(kElementwise, [&] {
    RopeForwardPair(a.q, h, a.k, kvh, batch_, seq_, d, rope_, stream_);
    return 0;
  });
  RETURN_IF_ERROR(TimedFlops(kAttention, AttentionFlops(batch_, seq_, h, d, false), [&] {
    if (cudnn_attention_ != nullptr) {  // its workspace: ours' backward scratch, free in the forward
      return cudnn_attention_->Forward(a.a, a.lse, a.q, a.k, a.v, attention_scratch_, stream_);
    }
    if (!Grouped()) {
      return Cuda(AttentionForward(a.a, a.lse, a.q, a.k, a.v, batch_, seq_, h, d, stream_), "attention forward");
    }
    RepeatKvHeads(k_full_, a.k, n, h, kvh, d, stream_);
    RepeatKvHeads(v_full_, a.v, n, h, kvh, d, stream_);
    return Cuda(AttentionForward(a.a, a.lse, a.q, k_full_, v_full_, batch_, seq_, h, d, stream_), "attention forward");
  }));
  RETURN_IF_ERROR(cast(a.a, kLinearO, qd));
  RETURN_IF_ERROR(linear(tmp_, a.a, w.wo, kLinearO, qd, c));
  if (fused_norms_) {
    const Fp8Out q = out_codes(kLinearGate);
    Timed(kElementwise, [&] {
      if (summed_in) {
        SumRmsNormForward(bf16_out(h2), a.rstd2, a.x_in, tmp_, x, a.x_mid, N(w.mlp_norm), n, c, eps, stream_, q);
      } else {
        ResidualRmsNormForward(bf16_out(h2), a.rstd2, x, tmp_, a.x_mid, N(w.mlp_norm), n, c, eps, stream_, q);
      }
      return 0;
    });
  } else {
    Timed(kElementwise, [&] {
      AddInto(x, tmp_, static_cast<int64_t>(nc), stream_);
      return 0;
    });
    RETURN_IF_ERROR(Cuda(cudaMemcpyAsync(a.x_mid, x, nc * sizeof(float), cudaMemcpyDeviceToDevice, stream_), "x_mid"));
    Timed(kElementwise, [&] {
      RmsNormForward(h2, a.rstd2, x, N(w.mlp_norm), n, c, eps, stream_);
      return 0;
    });
  }
  RETURN_IF_ERROR(cast(h2, kLinearGate, c, a.h2, 1));
  RETURN_IF_ERROR(linear(a.g, h2, w.w1, kLinearGate, c, f));
  RETURN_IF_ERROR(linear(a.u, h2, w.w3, kLinearUp, c, f));
  const Fp8Out q = out_codes(kLinearDown);
  bool s_kept = false;  // the codes transposed too, by the same kernel
  Timed(kElementwise, [&] {
    s_kept = keep_t && encoded &&
             SwiGluForwardFp8Transposed(q.codes, reinterpret_cast<uint8_t*>(a.s), a.g, a.u, n, f, q.scale, q.amax,
                                        stream_);
    if (!s_kept) SwiGluForward(bf16_out(s), a.g, a.u, n, f, stream_, q);
    return 0;
  });
  RETURN_IF_ERROR(cast(s, kLinearDown, f, a.s, 2, s_kept));
  if (recompute) return absl::OkStatus();
  RETURN_IF_ERROR(linear(tmp_, s, w.w2, kLinearDown, f, c));
  if (carry.defer_out) return absl::OkStatus();  // the next norm adds tmp_
  Timed(kElementwise, [&] {
    AddInto(x, tmp_, static_cast<int64_t>(nc), stream_);
    return 0;
  });
  return absl::OkStatus();
}

absl::StatusOr<double> GpuModel::Forward(const int32_t* tokens, const int32_t* targets) {
  RETURN_IF_ERROR(ForwardQueued(tokens, targets));
  RETURN_IF_ERROR(Cuda(cudaStreamSynchronize(stream_), "forward"));
  return MicroBatchLoss(micro_);
}

absl::StatusOr<float*> GpuModel::LossSlot(int micro) {
  const size_t n = static_cast<size_t>(batch_) * seq_;
  while (static_cast<int>(loss_rows_.size()) <= micro) {
    void* p = nullptr;
    RETURN_IF_ERROR(Cuda(cudaMallocHost(&p, n * sizeof(float)), "pinned losses"));
    loss_rows_.push_back(static_cast<float*>(p));
    loss_counted_.push_back(0);
  }
  return loss_rows_[micro];
}

double GpuModel::MicroBatchLoss(int micro) const {
  const int n = batch_ * seq_;
  double sum = 0;
  for (int i = 0; i < n; ++i) sum += loss_rows_[micro][i];
  return loss_counted_[micro] > 0 ? sum / loss_counted_[micro] : 0.0;
}

absl::StatusOr<double> GpuModel::TakeLoss() {
  RETURN_IF_ERROR(Cuda(cudaStreamSynchronize(stream_), "losses"));
  double loss = 0;
  for (int m = 0; m < losses_queued_; ++m) loss += MicroBatchLoss(m) / losses_queued_;
  return loss;
}

absl::Status GpuModel::ForwardQueued(const int32_t* tokens, const int32_t* targets) {
  const int n = batch_ * seq_, c = config_.d_model;
  const size_t nc = static_cast<size_t>(n) * c;
  RETURN_IF_ERROR(
      Cuda(cudaMemcpyAsync(tokens_, tokens, n * sizeof(int32_t), cudaMemcpyHostToDevice, stream_), "tokens"));
  RETURN_IF_ERROR(
      Cuda(cudaMemcpyAsync(targets_, targets, n * sizeof(int32_t), cudaMemcpyHostToDevice, stream_), "targets"));
  token_segments_ = SegmentTokens(tokens, n, config_.vocab);  // for the embedding's backward
  RETURN_IF_ERROR(Cuda(cudaMemcpyAsync(token_index_, token_segments_.index.data(),
                                       token_segments_.index.size() * sizeof(int32_t), cudaMemcpyHostToDevice, stream_),
                       "token index"));
  int counted = 0;
  for (int i = 0; i < n; ++i) counted += targets[i] >= 0;
  head_counted_ = counted;
  RETURN_IF_ERROR(AwaitOptimizerUpdate(0));  // (reports the optimizer's op before this one)
  Progress(ForwardOp(micro_, 0));
  RETURN_IF_ERROR(Enter(0, Part::kWeights, Access::kRead));
  Timed(kElementwise, [&] {
    EmbeddingForward(x_, tokens_, W(embed_), n, c, config_.vocab, stream_);
    return 0;
  });
  RETURN_IF_ERROR(Leave(0, Part::kWeights));
  for (int l = 0; l < config_.layers; ++l) {
    const int group = l + 1;
    RETURN_IF_ERROR(AwaitOptimizerUpdate(group));
    Progress(ForwardOp(micro_, group));
    RETURN_IF_ERROR(EnterLayerWeights(group));
    RETURN_IF_ERROR(Enter(group, Part::kActs, Access::kOverwrite));
    RETURN_IF_ERROR(LayerForward(l, ActsForForward(l, acquired_[group][static_cast<int>(Part::kActs)]), x_,
                                 /*recompute=*/false, {.pending_in = fused_norms_ && l > 0, .defer_out = fused_norms_}));
    RETURN_IF_ERROR(LeaveLayerWeights(group));
    RETURN_IF_ERROR(Leave(group, Part::kActs));
  }
  const int last = Groups() - 1;
  RETURN_IF_ERROR(AwaitOptimizerUpdate(last));
  Progress(ForwardOp(micro_, last));
  RETURN_IF_ERROR(Enter(last, Part::kWeights, Access::kRead));
  RETURN_IF_ERROR(EnterTiedHead(/*backward=*/false));
  if (fused_norms_) {  // the last layer's add, the copy for the backward and the final norm in one pass
    RETURN_IF_ERROR(HeadForward(x_, targets_, counted, config_.layers > 0 ? tmp_ : nullptr, x_out_));
  } else {
    RETURN_IF_ERROR(Cuda(cudaMemcpyAsync(x_out_, x_, nc * sizeof(float), cudaMemcpyDeviceToDevice, stream_), "x_out"));
    RETURN_IF_ERROR(HeadForward(x_, targets_, counted));
  }
  RETURN_IF_ERROR(LeaveTiedHead(/*backward=*/false));
  RETURN_IF_ERROR(Leave(last, Part::kWeights));
  RETURN_IF_ERROR(Cuda(cudaGetLastError(), "forward kernels"));
  auto slot = LossSlot(micro_);
  if (!slot.ok()) return slot.status();
  loss_counted_[micro_] = counted;
  losses_queued_ = std::max(losses_queued_, micro_ + 1);
  return Cuda(cudaMemcpyAsync(*slot, losses_, n * sizeof(float), cudaMemcpyDeviceToHost, stream_), "losses");
}

absl::Status GpuModel::HeadForward(float* x, const int32_t* targets, int counted, const Bf16* pending, float* x_out) {
  const int n = batch_ * seq_, c = config_.d_model, v = config_.vocab;
  const float eps = static_cast<float>(config_.norm_eps);
  Timed(kElementwise, [&] {
    if (pending != nullptr || x_out != nullptr) {
      ResidualRmsNormForward(xf_, rstd_f_, x, pending, x_out, N(final_norm_), n, c, eps, stream_);
    } else {
      RmsNormForward(xf_, rstd_f_, x, N(final_norm_), n, c, eps, stream_);
    }
    return 0;
  });
  for (int row = 0; row < n; row += head_rows_) {
    const int rows = std::min(head_rows_, n - row);
    RETURN_IF_ERROR(TimedFlops(kGemm, 2.0 * rows * c * v, [&] {
      return gemm_->Forward(logits_, xf_ + static_cast<size_t>(row) * c, W(head_), rows, c, v, stream_);
    }));
    Timed(kLoss, [&] {  // unchunked, the gradient too (the backward's); chunked, it is made there
      CrossEntropy(losses_ + row, HeadChunked() ? nullptr : dlogits_, logits_, targets + row, rows, v, counted,
                   stream_);
      return 0;
    });
  }
  return absl::OkStatus();
}

absl::Status GpuModel::SumOverRanks(int group, bool last) {
  if (dp_ == nullptr || !last) return absl::OkStatus();
  return Timed(kComm, [&] { return dp_->AllReduce(GradsOf(group), static_cast<int64_t>(GroupCount(group))); });
}

void GpuModel::AddSumOfSquares(int group) {
  Timed(kOptimizer, [&] {
    SumSquares(GradsOf(group), static_cast<int64_t>(GroupCount(group)), norm_, scratch_, stream_);
    return 0;
  });
}

GpuModel::Acts GpuModel::ActsForForward(int l, void* saved) const {
  if (LeanNow(l)) return ActsAt(saved, /*lean=*/true);
  if (!Recomputes(l)) {
    Acts a = ActsAt(saved, /*lean=*/false, coded_rooms_[l]);
    a.inputs_transposed = KeepsInputsTransposed(l);
    return a;
  }
  // The workspace's values are not read: the backward recomputes them (ActsForBackward).
  Acts a = ActsAt(recompute_acts_);
  if (bf16_checkpoints_) {
    a.x_in_bf16 = static_cast<Bf16*>(saved);
  } else {
    a.x_in = static_cast<float*>(saved);  // the layer's input is all it keeps
  }
  return a;
}

absl::StatusOr<GpuModel::Acts> GpuModel::ActsForBackward(int l, void* saved) {
  if (LeanNow(l)) {
    // The element-wise outputs again, by the forward's kernels from the forward's inputs: the
    // same bits. The norms' statistics are kept; their recomputed copies go to the workspace.
    const int n = batch_ * seq_, c = config_.d_model, f = config_.d_ff;
    const Layer& w = layers_[l];
    const Acts a = ActsAt(saved, /*lean=*/true);
    const Acts scratch = LeanWork();
    Timed(kElementwise, [&] {
      RmsNormForward(a.h1, scratch.rstd1, a.x_in, N(w.attn_norm), n, c, static_cast<float>(config_.norm_eps), stream_);
      RmsNormForward(a.h2, scratch.rstd2, a.x_mid, N(w.mlp_norm), n, c, static_cast<float>(config_.norm_eps), stream_);
      SwiGluForward(a.s, a.g, a.u, n, f, stream_);
      return 0;
    });
    return a;
  }
  Acts a = Recomputes(l) ? ActsAt(recompute_acts_) : ActsAt(saved, /*lean=*/false, coded_rooms_[l]);
  a.inputs_transposed = KeepsInputsTransposed(l);
  if (!Recomputes(l)) return a;
  // The layer's forward again, from its saved input, into the workspace.
  const size_t nc = static_cast<size_t>(batch_) * seq_ * config_.d_model;
  if (bf16_checkpoints_) {  // the rounded input, exactly: 0 + a bf16 value
    RETURN_IF_ERROR(Cuda(cudaMemsetAsync(xr_, 0, nc * sizeof(float), stream_), "recompute input"));
    Timed(kElementwise, [&] {
      AddInto(xr_, static_cast<const Bf16*>(saved), static_cast<int64_t>(nc), stream_);
      return 0;
    });
  } else {
    RETURN_IF_ERROR(
        Cuda(cudaMemcpyAsync(xr_, saved, nc * sizeof(float), cudaMemcpyDeviceToDevice, stream_), "recompute input"));
  }
  RETURN_IF_ERROR(LayerForward(l, a, xr_, /*recompute=*/true));
  return a;
}

absl::Status GpuModel::HeadBackward(const float* x_out, float* dx, const int32_t* targets, int counted) {
  const int n = batch_ * seq_, c = config_.d_model, v = config_.vocab;
  const size_t nc = static_cast<size_t>(n) * c;
  if (!HeadChunked()) {
    RETURN_IF_ERROR(Cuda(cudaMemsetAsync(dxf_, 0, nc * sizeof(Bf16), stream_), "zero"));
    RETURN_IF_ERROR(
        TimedFlops(kGemm, 4.0 * n * c * v,
                   [&] { return gemm_->Backward(dxf_, G(head_), dlogits_, xf_, W(head_), n, c, v, stream_); }));
  } else {
    // The logits again, a chunk of rows at a time: its gradient, then its rows of dxf (written)
    // and its share of the head's gradient (added, in the rows' order).
    for (int row = 0; row < n; row += head_rows_) {
      const int rows = std::min(head_rows_, n - row);
      const Bf16* xf = xf_ + static_cast<size_t>(row) * c;
      RETURN_IF_ERROR(TimedFlops(kGemm, 2.0 * rows * c * v,
                                 [&] { return gemm_->Forward(logits_, xf, W(head_), rows, c, v, stream_); }));
      Timed(kLoss, [&] {
        CrossEntropy(losses_ + row, dlogits_, logits_, targets + row, rows, v, counted, stream_);
        return 0;
      });
      RETURN_IF_ERROR(TimedFlops(kGemm, 4.0 * rows * c * v, [&] {
        return gemm_->Backward(dxf_ + static_cast<size_t>(row) * c, G(head_), dlogits_, xf, W(head_), rows, c, v,
                               stream_, /*accumulate_din=*/false);
      }));
    }
  }
  RETURN_IF_ERROR(Cuda(cudaMemsetAsync(dx, 0, nc * sizeof(float), stream_), "zero dx"));
  Timed(kElementwise, [&] {  // dx16_ = dx in bf16 too, for the last layer's backward
    RmsNormBackward(dx, G(final_norm_), dxf_, x_out, N(final_norm_), rstd_f_, n, c, scratch_, stream_, dx16_);
    return 0;
  });
  dx16_holds_ = dx;
  return absl::OkStatus();
}

absl::Status GpuModel::Backward() {
  // Each group's sum of squared gradients (the norm) is taken right after its backward in the
  // step's last micro-batch, when the group's gradient is whole: the earlier micro-batches'
  // sums would be of partial gradients and thrown away (3 of 4 passes over the gradients, 6 ms
  // of a 1.3B step on the H100).
  const bool last_micro_batch = micro_ + 1 >= dp_micro_batches_;
  if (last_micro_batch) RETURN_IF_ERROR(Cuda(cudaMemsetAsync(norm_, 0, sizeof(float), stream_), "zero norm"));
  const int last = Groups() - 1;
  RETURN_IF_ERROR(AwaitOptimizerUpdate(-1));  // (a backward without its forward: the step done first)
  Progress(BackwardOp(micro_, 0));
  RETURN_IF_ERROR(Enter(last, Part::kWeights, Access::kRead));
  RETURN_IF_ERROR(EnterGrads(last));
  RETURN_IF_ERROR(EnterTiedHead(/*backward=*/true));
  RETURN_IF_ERROR(HeadBackward(x_out_, dx_, targets_, head_counted_));
  RETURN_IF_ERROR(LeaveTiedHead(/*backward=*/true));
  RETURN_IF_ERROR(SumOverRanks(last, last_micro_batch));
  if (last_micro_batch) AddSumOfSquares(last);
  RETURN_IF_ERROR(Leave(last, Part::kWeights));
  RETURN_IF_ERROR(Leave(last, Part::kGrads));
  for (int l = config_.layers; l-- > 0;) {
    const int group = l + 1;
    Progress(BackwardOp(micro_, last - group));
    RETURN_IF_ERROR(EnterLayerWeights(group));
    RETURN_IF_ERROR(Enter(group, Part::kActs, Access::kRead));
    bool fresh = false;
    RETURN_IF_ERROR(EnterGrads(group, &fresh));
    auto a = ActsForBackward(l, acquired_[group][static_cast<int>(Part::kActs)]);
    if (!a.ok()) return a.status();
    RETURN_IF_ERROR(LayerBackward(l, *a, dx_, fresh));
    RETURN_IF_ERROR(SumOverRanks(group, last_micro_batch));
    if (last_micro_batch) AddSumOfSquares(group);
    RETURN_IF_ERROR(LeaveLayerWeights(group));
    RETURN_IF_ERROR(Leave(group, Part::kActs));
    RETURN_IF_ERROR(Leave(group, Part::kGrads));
  }
  Progress(BackwardOp(micro_, last));
  RETURN_IF_ERROR(EnterGrads(0));
  Timed(kElementwise, [&] {
    EmbeddingBackward(G(embed_), dx_, token_index_, token_segments_.rows, token_segments_.segments, config_.d_model,
                      stream_);
    return 0;
  });
  RETURN_IF_ERROR(SumOverRanks(0, last_micro_batch));
  if (last_micro_batch) AddSumOfSquares(0);
  RETURN_IF_ERROR(Leave(0, Part::kGrads));
  ++micro_;
  return Cuda(cudaGetLastError(), "backward kernels");
}

absl::Status GpuModel::LastLogits(std::vector<float>* out) {
  if (HeadChunked()) return absl::FailedPreconditionError("the logits were made in chunks, never whole");
  const size_t count = static_cast<size_t>(batch_) * seq_ * config_.vocab;
  std::vector<Bf16> bits(count);
  RETURN_IF_ERROR(Cuda(cudaMemcpyAsync(bits.data(), logits_, count * sizeof(Bf16), cudaMemcpyDeviceToHost, stream_),
                       "logits"));
  RETURN_IF_ERROR(Cuda(cudaStreamSynchronize(stream_), "logits"));
  out->resize(count);
  for (size_t i = 0; i < count; ++i) (*out)[i] = FromBf16(bits[i]);
  return absl::OkStatus();
}

absl::StatusOr<double> GpuModel::GradNorm() {
  if (micro_ < dp_micro_batches_) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "the gradient norm is taken in the step's last micro-batch: %d of %d backwards done", micro_,
        dp_micro_batches_));
  }
  float sum = 0;
  RETURN_IF_ERROR(Cuda(cudaMemcpyAsync(&sum, norm_, sizeof(float), cudaMemcpyDeviceToHost, stream_), "norm"));
  RETURN_IF_ERROR(Cuda(cudaStreamSynchronize(stream_), "norm"));
  return std::sqrt(static_cast<double>(sum));
}

}  // namespace tierd::trainer::gpu
