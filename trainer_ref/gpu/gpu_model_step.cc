// The GPU model's optimizer step (AdamW on the GPU, or on the host in the home's DRAM tier)
// and the step as a graph for the planner.
#include "trainer_ref/gpu/gpu_model.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <functional>
#include <vector>

#include "absl/strings/str_format.h"
#include "trainer_ref/gpu/gpu_model_internal.h"
#include "trainer_ref/host_adamw.h"

namespace tierd::trainer::gpu {


uint32_t GpuModel::ForwardOp(int micro, int group) const {
  const int groups = Groups();
  if (!OptimizerInterleaved()) return static_cast<uint32_t>(micro * 2 * groups + group);
  if (micro == 0) return static_cast<uint32_t>(2 * group + 1);  // after the group's optimizer op
  return static_cast<uint32_t>(3 * groups + (micro - 1) * 2 * groups + group);
}

uint32_t GpuModel::BackwardOp(int micro, int index) const {
  const int groups = Groups();
  if (!OptimizerInterleaved()) return static_cast<uint32_t>(micro * 2 * groups + groups + index);
  if (micro == 0) return static_cast<uint32_t>(2 * groups + index);
  return static_cast<uint32_t>(3 * groups + (micro - 1) * 2 * groups + groups + index);
}

uint32_t GpuModel::OptimizerOp(int group, int micro_batches) const {
  if (layer_major_ > 0) return LayerMajorOptimizerOp(group);
  if (OptimizerInterleaved()) return static_cast<uint32_t>(2 * group);
  return static_cast<uint32_t>(micro_batches * 2 * Groups() + group);
}

absl::Status GpuModel::FinishOptimizerStep() { return AwaitOptimizerUpdate(-1); }

absl::Status GpuModel::ApplyPendingUpdates(int group) {
  if (group < 0) {
    for (int g = 0; g < static_cast<int>(pending_update_.size()); ++g) RETURN_IF_ERROR(ApplyPendingUpdates(g));
    return absl::OkStatus();
  }
  if (group >= static_cast<int>(pending_update_.size()) || !pending_update_[group]) return absl::OkStatus();
  pending_update_[group] = 0;  // first: the update's own acquires come through here
  Progress(OptimizerOp(group, registered_micro_batches_));
  return GpuAdamWGroup(group, pending_zero_grads_[group], pending_params_);
}

absl::Status GpuModel::AwaitOptimizerUpdate(int group) {
  // The GPU's deferred update, if one is pending, is queued here too: before the group's
  // forward reports its op, so the planner sees the optimizer's op first, as registered.
  RETURN_IF_ERROR(ApplyPendingUpdates(group));
  if (!host_thread_.joinable()) return absl::OkStatus();
  std::unique_lock<std::mutex> lock(host_mutex_);
  const int need = group < 0 ? Groups() : group + 1;
  if (host_groups_done_ < need && group >= 0 && micro_ == 0 && HostSteps(group)) {
    // The group's optimizer op is running (on the host): progress for the planner.
    lock.unlock();
    Progress(OptimizerOp(group, registered_micro_batches_));
    lock.lock();
  }
  host_done_.wait(lock, [&] { return host_groups_done_ >= need; });
  absl::Status status = host_status_;
  if (host_groups_done_ >= Groups()) {
    lock.unlock();
    host_thread_.join();
    host_status_ = absl::OkStatus();  // said once
  }
  return status;
}

void GpuModel::DeferGpuUpdates(int groups, const std::function<AdamWParams(size_t)>& params_for) {
  pending_params_ = params_for;
  pending_update_.assign(Groups(), 0);
  pending_zero_grads_.assign(Groups(), 0);
  for (int g = 0; g < groups; ++g) {
    pending_update_[g] = 1;
    pending_zero_grads_[g] = !grads_zeroed_[g];
  }
}

absl::Status GpuModel::AdamWStep(double lr, int64_t step, const AdamWOptions& options, double grad_scale) {
  RETURN_IF_ERROR(AwaitOptimizerUpdate(-1));  // the step before, if it is still running
  auto params_for = [this, lr, step, options, grad_scale](size_t e) {
    AdamWParams p;
    p.lr = static_cast<float>(lr);
    p.beta1 = static_cast<float>(options.beta1);
    p.beta2 = static_cast<float>(options.beta2);
    p.eps = static_cast<float>(options.eps);
    p.weight_decay = static_cast<float>(options.weight_decay);
    p.step = step;
    p.grad_scale = static_cast<float>(grad_scale);
    p.decay = layout_[e].shape.size() > 1;
    return p;
  };
  RETURN_IF_ERROR(ApplyPendingUpdates(-1));  // a step before that no forward followed
  if (host_optimizer_groups_ > 0) {
    if (!home_->HasHostTier()) return GpuHome::NoHostTier();
    if (compact_) {
      return absl::FailedPreconditionError(
          "the host's optimizer writes the bf16 weights the compact state does not keep: step it on the GPU");
    }
    // The host's groups in the background, group by group in forward order; the next forward
    // waits per group (AwaitOptimizerUpdate). The gradients to zero are this step's: taken now.
    // So are the groups whose FP8 weight codes it writes (fp8_layer_ may change between steps).
    // The GPU's groups (a split) are deferred to their next forward, as SetOptimizerDeferred's.
    const int first_host = Groups() - host_optimizer_groups_;
    std::vector<bool> zero_grads(Groups()), codes(Groups());
    for (int g = 0; g < Groups(); ++g) {
      zero_grads[g] = !grads_zeroed_[g];
      codes[g] = ReadsCodes(g);
    }
    DeferGpuUpdates(first_host, params_for);
    host_groups_done_ = first_host;  // the host's thread has nothing to do for the GPU's groups
    host_thread_ = std::thread([this, zero_grads, codes, params_for, first_host] {
      for (int g = first_host; g < Groups(); ++g) {
        const absl::Status s = HostAdamWStep(g, zero_grads[g], codes[g], params_for);
        std::lock_guard<std::mutex> lock(host_mutex_);
        if (!s.ok()) {
          host_status_ = s;
          host_groups_done_ = Groups();
        } else {
          host_groups_done_ = g + 1;
        }
        host_done_.notify_all();
        if (!s.ok()) return;
      }
    });
    return absl::OkStatus();
  }
  if (defer_gpu_update_) {
    DeferGpuUpdates(Groups(), params_for);
    return absl::OkStatus();
  }
  for (int g = 0; g < Groups(); ++g) {
    if (registered_) home_->home().OpBegin(OptimizerOp(g, registered_micro_batches_)).IgnoreError();
    RETURN_IF_ERROR(GpuAdamWGroup(g, !grads_zeroed_[g], params_for));
  }
  RETURN_IF_ERROR(Cuda(cudaGetLastError(), "adamw"));
  return Cuda(cudaStreamSynchronize(stream_), "adamw");
}

absl::Status GpuModel::GpuAdamWGroup(int g, bool zero_grads, const std::function<AdamWParams(size_t)>& params_for) {
  if (zero_grads) {  // no backward reached the group this step: its gradients are zeros
    RETURN_IF_ERROR(Enter(g, Part::kGrads, Access::kOverwrite));
    RETURN_IF_ERROR(Cuda(cudaMemsetAsync(acquired_[g][static_cast<int>(Part::kGrads)], 0,
                                         GroupCount(g) * (compact_ ? sizeof(Bf16) : sizeof(float)), stream_),
                         "zero grads"));
  } else {
    RETURN_IF_ERROR(Enter(g, Part::kGrads, Access::kRead));
  }
  RETURN_IF_ERROR(Enter(g, Part::kWeights, Access::kOverwrite));  // written whole from the master copy
  // The gradients as kept: fp32, or the compact state's bf16.
  void* grads = acquired_[g][static_cast<int>(Part::kGrads)];
  auto grads_of = [&](size_t e) { return layout_[e].offset - group_offset_[g]; };
  // A layer reading codes: the optimizer may take its matrices' largest |x| as it writes them.
  const bool codes = ReadsCodes(g);
  bool amax_folded = codes;
  std::vector<float*> amax_of(layout_.size(), nullptr);
  if (codes) {
    for (int k = 0; k < kLinears; ++k) {
      const size_t e = LinearEntry(g - 1, k);
      amax_folded = amax_folded && optimizer_->FoldsWeightsAmax(layout_[e]);
      amax_of[e] = weights_amax_ + k;
    }
    if (amax_folded) {
      RETURN_IF_ERROR(Cuda(cudaMemsetAsync(weights_amax_, 0, kLinears * sizeof(float), stream_), "zero amaxes"));
    }
  }
  // Chunk by chunk (sub-groups of the state): each chunk's kernels are queued as soon as
  // its parts are here, while the next chunk comes in.
  RETURN_IF_ERROR(ForEachStateChunk(
      g, Access::kWrite, [&](size_t first, size_t n, float* master, void* m, void* v) -> absl::Status {
        std::vector<TensorUpdate> updates;  // the chunk's tensors, queued together (StepGpuAll)
        struct Copy {
          float* to;
          const float* from;
          size_t count;
        };
        std::vector<Copy> norms;  // the norms' new weights, to where the forward reads them (fp32)
        for (size_t e : GroupEntries(g)) {
          const size_t begin = layout_[e].offset - group_offset_[g], end = begin + layout_[e].count;
          const size_t lo = std::max(begin, first), hi = std::min(end, first + n);
          if (lo >= hi) continue;  // the entry is in other chunks
          const size_t at = lo - first;
          // The values [lo, hi): the whole tensor where its state is at its offset (one chunk).
          TensorUpdate u;
          u.tensor = &layout_[e];
          u.count = static_cast<int64_t>(hi - lo);
          u.master = master + at;
          u.m = StateAt(m, e, at);
          u.v = StateAt(v, e, at);
          u.weights = W(e) + (lo - begin);
          const size_t from = grads_of(e) + (lo - begin);
          if (compact_) {
            u.grads_bf16 = static_cast<const Bf16*>(grads) + from;
          } else {
            u.grads = static_cast<const float*>(grads) + from;
          }
          u.params = params_for(e);
          if (amax_folded) u.weights_amax = amax_of[e];
          updates.push_back(u);
          if (layout_[e].shape.size() == 1) norms.push_back({N(e) + (lo - begin), master + at, hi - lo});
        }
        RETURN_IF_ERROR(Timed(kOptimizer, [&] {  // without --optimizer_one_launch: a call a tensor (the base's)
          return optimizer_one_launch_ ? optimizer_->StepGpuAll(updates, optimizer_scratch_, stream_)
                                       : optimizer_->GpuOptimizer::StepGpuAll(updates, optimizer_scratch_, stream_);
        }));
        for (const Copy& copy : norms) {
          RETURN_IF_ERROR(Cuda(
              cudaMemcpyAsync(copy.to, copy.from, copy.count * sizeof(float), cudaMemcpyDeviceToDevice, stream_),
              "norm weights"));
        }
        return absl::OkStatus();
      }));
  // A layer reading codes gets them from the new weights now, once for the step's micro-batches.
  if (codes) RETURN_IF_ERROR(EncodeWeightCodes(g, amax_folded));
  for (Part part : {Part::kGrads, Part::kWeights}) RETURN_IF_ERROR(Leave(g, part));
  if (codes) codes_current_[g] = 1;
  return Cuda(cudaGetLastError(), "adamw");
}

absl::Status GpuModel::HostAdamWStep(int g, bool zeros, bool codes,
                                     const std::function<AdamWParams(size_t)>& params_for) {
  // The group's parts in the DRAM tier: tierd brings the gradients down from the GPU (after
  // the kernels that wrote them: their release fence) and drops the GPU copies of what the
  // host writes, so the next forward fetches the new weights. On the optimizer's thread:
  // it touches no member the training thread changes meanwhile (`zeros`: no backward
  // reached the group this step).
  struct Held {
    Part part;
    int chunk;
  };
  std::vector<Held> held;
  auto release = [&](size_t from) {  // the parts taken since held[from], last first
    absl::Status first;
    while (held.size() > from) {
      const absl::Status r = home_->ReleaseHost(g, held.back().part, held.back().chunk);
      if (first.ok()) first = r;
      held.pop_back();
    }
    return first;
  };
  auto take = [&](Part part, int chunk, Access access) -> absl::StatusOr<void*> {
    auto p = home_->AcquireHost(g, part, chunk, access);
    if (!p.ok()) return AcquireError(p.status(), g, part, chunk, " on the host");
    held.push_back({part, chunk});
    return *p;
  };
  const size_t count = GroupCount(g);
  auto grads_or = take(Part::kGrads, 0, zeros ? Access::kOverwrite : Access::kRead);
  if (!grads_or.ok()) return grads_or.status();
  auto weights_or = take(Part::kWeights, 0, Access::kOverwrite);
  if (!weights_or.ok()) {
    release(0).IgnoreError();
    return weights_or.status();
  }
  auto* grads = static_cast<float*>(*grads_or);
  auto* weights = static_cast<Bf16*>(*weights_or);
  if (zeros) std::memset(grads, 0, count * sizeof(float));
  absl::Status s;
  // Chunk by chunk (sub-groups of the state), each released once it is updated.
  for (int c = 0; s.ok() && c < home_layout_.Chunks(g, Part::kMaster); ++c) {
    constexpr Part kState[3] = {Part::kMaster, Part::kAdamM, Part::kAdamV};
    void* state[3] = {};
    for (int i = 0; i < 3 && s.ok(); ++i) {
      if (home_layout_.bytes[g][static_cast<int>(kState[i])] == 0) continue;  // Lion's second moment
      auto p = take(kState[i], c, Access::kWrite);
      if (p.ok()) state[i] = *p;
      else s = p.status();
    }
    if (!s.ok()) break;
    auto* master = static_cast<float*>(state[0]);
    const GpuHomeLayout::Range range = home_layout_.Chunk(g, Part::kMaster, c);
    const size_t first = range.offset / sizeof(float), n = range.bytes / sizeof(float);
    const auto start = std::chrono::steady_clock::now();
    for (size_t e : GroupEntries(g)) {
      const size_t begin = layout_[e].offset - group_offset_[g], end = begin + layout_[e].count;
      const size_t lo = std::max(begin, first), hi = std::min(end, first + n);
      if (lo >= hi) continue;  // the entry is in other chunks
      const size_t at = lo - first;
      TensorUpdate u;
      u.tensor = &layout_[e];
      u.count = static_cast<int64_t>(hi - lo);
      u.master = master + at;
      u.m = StateAt(state[1], e, at);
      u.v = StateAt(state[2], e, at);
      u.weights = weights + lo;
      u.grads = grads + lo;
      u.params = params_for(e);
      optimizer_->StepHost(u);
      if (layout_[e].shape.size() == 1) {  // the resident copy the kernels read, after they are done with it
        s = Cuda(cudaMemcpyAsync(N(e) + (lo - begin), master + at, (hi - lo) * sizeof(float), cudaMemcpyHostToDevice,
                                 host_stream_),
                 "norm weights");
        if (!s.ok()) break;
      }
    }
    host_optimizer_nanos_ +=
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count();
    if (s.ok()) s = Cuda(cudaStreamSynchronize(host_stream_), "norm weights");  // before the host copy may move
    const absl::Status released = release(2);
    if (s.ok()) s = released;
  }
  if (s.ok() && codes) {  // from the new bf16 weights, whole (each matrix's scale from all of it)
    const auto start = std::chrono::steady_clock::now();
    s = EncodeWeightCodesOnHost(g, weights);
    const int64_t nanos =
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start).count();
    host_optimizer_nanos_ += nanos;
    host_codes_nanos_ += nanos;
  }
  const absl::Status released = release(0);
  return s.ok() ? released : s;
}

prefetcher::Graph GpuModel::StepGraph(int micro_batches) const {
  namespace tp = prefetcher;
  const GpuHomeLayout& home = home_layout_;
  tp::Graph graph;
  // group -> part -> its leases' tensors (one, or the chunks of optimizer state)
  std::vector<std::array<std::vector<tp::TensorIndex>, kParts>> index(Groups());
  for (int g = 0; g < Groups(); ++g) {
    for (int k = 0; k < kParts; ++k) {
      if (home.bytes[g][k] == 0) continue;
      for (int c = 0; c < home.Chunks(g, Part(k)); ++c) {
        index[g][k].push_back(static_cast<tp::TensorIndex>(graph.tensors.size()));
        graph.tensors.push_back({PartName(home, g, Part(k), c), home.Chunk(g, Part(k), c).bytes, false});
      }
    }
  }
  auto at = [&index](int g, Part part) { return index[g][static_cast<int>(part)].front(); };
  // What a use of a group's weights reads: its weights part, its FP8 codes part (a layer
  // reading codes), or (the compact state) its master copy, rounded on the GPU.
  auto weights = [&index, this](int g) {
    if (ReadsCodes(g)) return std::vector<tp::TensorIndex>{index[g][static_cast<int>(Part::kWeightCodes)].front()};
    return compact_ ? index[g][static_cast<int>(Part::kMaster)]
                    : std::vector<tp::TensorIndex>{index[g][static_cast<int>(Part::kWeights)].front()};
  };
  auto state = [&index](int g) {  // master weights and moments, every chunk
    std::vector<tp::TensorIndex> all;
    for (Part part : {Part::kMaster, Part::kAdamM, Part::kAdamV}) {
      const auto& chunks = index[g][static_cast<int>(part)];
      all.insert(all.end(), chunks.begin(), chunks.end());
    }
    return all;
  };
  // Estimated seconds (measured times replace them in the daemon): the GEMM and attention
  // flops at 300 TFLOP/s, the optimizer's bytes at 3 TB/s.
  const double tokens = static_cast<double>(batch_) * seq_;
  const int last = Groups() - 1;
  const bool tied = config_.tied_embeddings;
  auto forward_seconds = [&](int g) {
    const double params = static_cast<double>(GroupCount(g)) +
                          (g == last && tied ? static_cast<double>(config_.vocab) * config_.d_model : 0.0);
    if (g == 0) return tokens * config_.d_model * 4 / 3e12;
    const double attention = g == Groups() - 1 ? 0.0 : 2.0 * tokens * seq_ * config_.d_model;
    return (2 * tokens * params + attention) / 300e12;
  };
  const auto acts = [&](int g) { return index[g][static_cast<int>(Part::kActs)]; };
  // A layer's backward is two of its forwards, and where it recomputes its activations the
  // forward again up to the down projection (LayerForward's `recompute`).
  const double recompute_share =
      (2 * tokens * static_cast<double>(config_.RecomputedLayerParams()) + 2.0 * tokens * seq_ * config_.d_model) /
      (2 * tokens * static_cast<double>(config_.LayerParams()) + 2.0 * tokens * seq_ * config_.d_model);
  const auto backward_forwards = [&](int g) {
    return g >= 1 && g <= config_.layers && Recomputes(g - 1) ? 2.0 + recompute_share : 2.0;
  };
  if (layer_major_ > 0) {
    // Layer-major (ForwardBackwardLayerMajor): each group's forward for every micro-batch,
    // the head's forward and backward, each group's backward; then the optimizer's ops.
    const double k = layer_major_;
    graph.ops.resize(static_cast<size_t>(3 * Groups() - 1));
    for (int g = 0; g + 1 < Groups(); ++g) {
      tp::GraphOp op{absl::StrFormat("%s.fwd", home.groups[g]), weights(g), {}, k * forward_seconds(g), {}};
      if (g > 0) op.overwrites = acts(g);
      graph.ops[LayerMajorForwardOp(g)] = std::move(op);
      tp::GraphOp back{
          absl::StrFormat("%s.bwd", home.groups[g]), {}, {}, k * backward_forwards(g) * forward_seconds(g), {}};
      if (g > 0) {
        back.reads = acts(g);
        for (tp::TensorIndex t : weights(g)) back.reads.push_back(t);
      }
      // Tied: the head's backward touched the embedding's gradients first.
      (g == 0 && tied ? back.writes : back.overwrites).push_back(at(g, Part::kGrads));
      graph.ops[LayerMajorBackwardOp(g)] = std::move(back);
    }
    tp::GraphOp head{absl::StrFormat("%s.fwd+bwd", home.groups[last]), weights(last), {}, 3 * k * forward_seconds(last),
                     {at(last, Part::kGrads)}};
    if (tied) {
      for (tp::TensorIndex t : weights(0)) head.reads.push_back(t);
      head.overwrites.push_back(at(0, Part::kGrads));
    }
    graph.ops[LayerMajorForwardOp(last)] = std::move(head);
  } else {
    // Each op at its index (ForwardOp, BackwardOp, OptimizerOp: the order they run in).
    graph.ops.resize(static_cast<size_t>(Groups()) * (2 * micro_batches + 1));
    for (int micro = 0; micro < micro_batches; ++micro) {
      for (int g = 0; g < Groups(); ++g) {
        tp::GraphOp op{absl::StrFormat("mb%d.%s.fwd", micro, home.groups[g]), weights(g), {}, forward_seconds(g), {}};
        if (g == last && tied) {
          for (tp::TensorIndex t : weights(0)) op.reads.push_back(t);
        }
        if (home.bytes[g][static_cast<int>(Part::kActs)] > 0) op.overwrites.push_back(at(g, Part::kActs));
        graph.ops[ForwardOp(micro, g)] = std::move(op);
      }
      for (int g = Groups(); g-- > 0;) {
        tp::GraphOp op{absl::StrFormat("mb%d.%s.bwd", micro, home.groups[g]),
                       {},
                       {},
                       backward_forwards(g) * forward_seconds(g),
                       {}};
        if (g > 0) {
          for (tp::TensorIndex t : weights(g)) op.reads.push_back(t);
        }
        if (home.bytes[g][static_cast<int>(Part::kActs)] > 0) op.reads.push_back(at(g, Part::kActs));
        // Tied: the head's backward touches the embedding's gradients first, then the embedding's.
        const bool first_touch = micro == 0 && !(g == 0 && tied);
        (first_touch ? op.overwrites : op.writes).push_back(at(g, Part::kGrads));
        if (g == last && tied) {
          for (tp::TensorIndex t : weights(0)) op.reads.push_back(t);
          (micro == 0 ? op.overwrites : op.writes).push_back(at(0, Part::kGrads));
        }
        graph.ops[BackwardOp(micro, Groups() - 1 - g)] = std::move(op);
      }
    }
  }
  for (int g = 0; g < Groups(); ++g) {
    const uint64_t bytes = home.bytes[g][static_cast<int>(Part::kMaster)];
    tp::GraphOp& op = graph.ops[OptimizerOp(g, micro_batches)];
    if (HostSteps(g)) {
      // On the host, on the DRAM copies, before the group's next forward (overlapping the
      // forward of the groups before it): the gradients come down (written back after the
      // backward), master and moments are updated where they live, and the bf16 weights
      // (and FP8 codes) are written whole (their GPU copy dropped; the forward loads the new ones).
      // A layer reading codes never reads its bf16 weights in the step, which the plan would
      // then take for dead between the host's writes; they are kept (a checkpoint, a fall back
      // to bf16 and remaking the codes read them): "written", not "overwritten".
      op = {absl::StrFormat("adamw.cpu.%s", home.groups[g]), {}, {}, bytes / 4 / 2e9, {}};
      op.host_reads = {at(g, Part::kGrads)};
      op.host_writes = state(g);
      if (ReadsCodes(g)) {
        op.host_writes.push_back(at(g, Part::kWeights));
        op.host_overwrites = {at(g, Part::kWeightCodes)};
      } else {
        op.host_overwrites = {at(g, Part::kWeights)};
      }
      continue;
    }
    op = {absl::StrFormat("adamw.%s", home.groups[g]), {at(g, Part::kGrads)}, state(g), 7.5 * bytes / 3e12, {}};
    if (!compact_) op.overwrites.push_back(at(g, Part::kWeights));  // compact: into the workspace
    // The codes from the new weights, in the same op: the forwards read only them, and the
    // bf16 weights are dead until the next update (WeightsAreScratch).
    if (ReadsCodes(g)) op.overwrites.push_back(at(g, Part::kWeightCodes));
  }
  return graph;
}

absl::StatusOr<std::string> GpuModel::RegisterStep(int micro_batches) {
  auto note = home_->home().RegisterGraph(StepGraph(micro_batches));
  if (!note.ok()) return note.status();
  registered_ = !note->empty();
  registered_micro_batches_ = micro_batches;
  return note;
}

}  // namespace tierd::trainer::gpu
