// The GPU model's sizes and places: a layer's saved activations (full, lean, or its input),
// the home's layout by group and part, each tensor's moments within its group, and the
// workspace's buffers. Host-side arithmetic only: a model made for its tables (HomeLayout)
// allocates nothing.
#include <algorithm>

#include "trainer_ref/adamw8bit.h"
#include "trainer_ref/gpu/gpu_model.h"
#include "trainer_ref/gpu/gpu_model_internal.h"

namespace tierd::trainer::gpu {

namespace {
constexpr uint64_t kAlign = 256;
uint64_t Aligned(uint64_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }
}  // namespace

uint64_t GpuModel::ActsBytes(const ModelConfig& config, int batch, int seq) {
  const uint64_t n = static_cast<uint64_t>(batch) * seq, c = config.d_model, f = config.d_ff;
  const uint64_t qd = config.q_dim(), kd = config.kv_dim();
  const uint64_t lse = static_cast<uint64_t>(batch) * config.heads * seq;
  return 2 * Aligned(n * c * 2) + 2 * Aligned(n * qd * 2) + 2 * Aligned(n * kd * 2) + 2 * Aligned(n * c * 4) +
         3 * Aligned(n * f * 2) + 2 * Aligned(n * 4) + Aligned(lse * 4) + Aligned(3 * Acts::kScaleStride * 4);
}

// Without h1, h2 and s (bf16: two n x c, one n x f).
uint64_t GpuModel::LeanActsBytes(const ModelConfig& config, int batch, int seq) {
  const uint64_t n = static_cast<uint64_t>(batch) * seq, c = config.d_model, f = config.d_ff;
  return ActsBytes(config, batch, seq) - 2 * Aligned(n * c * 2) - Aligned(n * f * 2);
}

// h1, h2 and s as codes: a byte an element instead of two.
uint64_t GpuModel::CodedActsBytes(const ModelConfig& config, int batch, int seq) {
  const uint64_t n = static_cast<uint64_t>(batch) * seq, c = config.d_model, f = config.d_ff;
  return LeanActsBytes(config, batch, seq) + 2 * Aligned(n * c) + Aligned(n * f);
}

// h1, h2, s (bf16) and the two norms' statistics.
uint64_t GpuModel::LeanRoomsBytes(const ModelConfig& config, int batch, int seq) {
  const uint64_t n = static_cast<uint64_t>(batch) * seq, c = config.d_model, f = config.d_ff;
  return 2 * Aligned(n * c * 2) + Aligned(n * f * 2) + 2 * Aligned(n * 4);
}

bool GpuModel::CodedRooms(const ModelConfig& config, const StateOptions& state, int l) {
  if (static_cast<int>(state.fp8_layers.size()) != config.layers || !state.fp8_layers[l]) return false;
  if (!state.checkpointing) return true;
  // The last kept_layers keep everything (GpuModel's Recomputes and Lean, from the same clamps).
  return l >= config.layers - std::clamp(state.kept_layers, 0, config.layers);
}

bool GpuModel::AnyCodedRooms(const ModelConfig& config, const StateOptions& state) {
  for (int l = 0; l < config.layers; ++l) {
    if (CodedRooms(config, state, l)) return true;
  }
  return false;
}

GpuModel::Acts GpuModel::LeanWork() const {
  if (AnyRecomputes()) return ActsAt(recompute_acts_);
  const uint64_t n = static_cast<uint64_t>(batch_) * seq_, c = config_.d_model, f = config_.d_ff;
  auto* at = static_cast<unsigned char*>(recompute_acts_);
  auto take = [&at](uint64_t bytes) {
    void* p = at;
    at += Aligned(bytes);
    return p;
  };
  Acts a{};
  a.h1 = static_cast<Bf16*>(take(n * c * 2));
  a.h2 = static_cast<Bf16*>(take(n * c * 2));
  a.s = static_cast<Bf16*>(take(n * f * 2));
  a.rstd1 = static_cast<float*>(take(n * 4));
  a.rstd2 = static_cast<float*>(take(n * 4));
  return a;
}

GpuModel::Acts GpuModel::ActsAt(void* base, bool lean, bool coded) const {
  const uint64_t n = static_cast<uint64_t>(batch_) * seq_, c = config_.d_model, f = config_.d_ff;
  const uint64_t qd = config_.q_dim(), kd = config_.kv_dim();
  auto* at = static_cast<unsigned char*>(base);
  auto take = [&at](uint64_t bytes) {
    void* p = at;
    at += Aligned(bytes);
    return p;
  };
  // A lean layer's element-wise outputs are in the recompute workspace, not with what it keeps.
  const Acts work = lean ? LeanWork() : Acts{};
  auto bf16 = [&](Bf16** p, uint64_t count, Bf16* elsewhere) {
    *p = elsewhere != nullptr ? elsewhere : static_cast<Bf16*>(take(count * 2));
  };
  // h1, h2 and s: their codes' rooms where coded.
  auto room = [&](Bf16** p, uint64_t count, Bf16* elsewhere) {
    *p = elsewhere != nullptr ? elsewhere : static_cast<Bf16*>(take(count * (coded ? 1 : 2)));
  };
  Acts a;
  room(&a.h1, n * c, work.h1);
  bf16(&a.q, n * qd, nullptr);
  for (Bf16** p : {&a.k, &a.v}) bf16(p, n * kd, nullptr);
  bf16(&a.a, n * qd, nullptr);
  room(&a.h2, n * c, work.h2);
  for (float** p : {&a.x_in, &a.x_mid}) *p = static_cast<float*>(take(n * c * 4));
  for (Bf16** p : {&a.g, &a.u}) bf16(p, n * f, nullptr);
  room(&a.s, n * f, work.s);
  for (float** p : {&a.rstd1, &a.rstd2}) *p = static_cast<float*>(take(n * 4));
  a.lse = static_cast<float*>(take(static_cast<uint64_t>(batch_) * config_.heads * seq_ * 4));
  a.in_scale_inv = static_cast<float*>(take(3 * Acts::kScaleStride * 4));
  return a;
}

GpuHomeLayout GpuModel::HomeLayout(const ModelConfig& config, int batch, int seq, const StateOptions& state) {
  GpuModel shape(config, batch, seq, state);  // host-side tables only
  GpuHomeLayout out;
  out.act_slots = std::max(1, state.layer_major_micro_batches);
  out.moments_8bit = state.moments_8bit;
  out.compact = state.compact;
  for (int g = 0; g < shape.Groups(); ++g) {
    uint64_t params = 0, moment = 0;
    for (size_t e : shape.GroupEntries(g)) {
      params += shape.layout_[e].count;
      moment += shape.MomentBytes(e);
    }
    out.groups.push_back(shape.groups_[g].name);
    const bool layer = g >= 1 && g <= config.layers;
    const uint64_t saved = layer && shape.Recomputes(g - 1)
                               ? Aligned(static_cast<uint64_t>(batch) * seq * config.d_model *
                                         (state.bf16_checkpoints ? 2 : 4))
                           : layer && shape.Lean(g - 1)        ? LeanActsBytes(config, batch, seq)
                           : layer && shape.coded_rooms_[g - 1] ? CodedActsBytes(config, batch, seq)
                                                                : ActsBytes(config, batch, seq);
    const uint64_t weights = state.compact ? 0 : params * 2, grads = params * (state.compact ? 2 : 4);
    const uint64_t codes = layer && state.fp8_weight_codes && !state.compact
                               ? WeightCodesBytes(config, state.transposed_weight_codes)
                               : 0;
    out.bytes.push_back({weights, params * 4, grads, moment, shape.optimizer_->HasSecondPart() ? moment : 0,
                         layer ? saved * static_cast<uint64_t>(out.act_slots) : 0, codes});
  }
  return out;
}

uint64_t GpuModel::MomentBytes(size_t entry) const { return optimizer_->StateBytes(layout_[entry]); }

uint64_t GpuModel::MomentOffset(size_t entry) const {
  uint64_t at = 0;
  for (size_t e : GroupEntries(group_of_[entry])) {
    if (e == entry) return at;
    at += MomentBytes(e);
  }
  return at;
}

std::vector<std::pair<size_t, size_t>> GpuModel::WorkspacePlan(const ModelConfig& config, int batch, int seq,
                                                               bool recompute, int head_rows_asked,
                                                               bool cudnn_attention, bool lean_rooms) {
  const size_t n = static_cast<size_t>(batch) * seq, c = config.d_model, f = config.d_ff, v = config.vocab;
  const size_t qd = config.q_dim(), kd = config.kv_dim();
  size_t norms = 0;
  for (const TensorLayout& t : ParamLayout(config)) norms += t.shape.size() == 1 ? t.count : 0;
  std::vector<std::pair<size_t, size_t>> plan = {{norms, 4}};  // norms_
  for (int i = 0; i < 5; ++i) plan.push_back({n * c, 2});      // tmp_, xf_, dx16_, dxf_, dh_
  for (int i = 0; i < 2; ++i) plan.push_back({n * qd, 2});     // da_, dq_
  for (int i = 0; i < 2; ++i) plan.push_back({n * kd, 2});     // dk_, dv_
  for (int i = 0; i < 3; ++i) plan.push_back({n * c, 4});      // x_, x_out_, dx_
  for (int i = 0; i < 3; ++i) plan.push_back({n * f, 2});      // ds_, dg_, du_
  const size_t head_rows = static_cast<size_t>(HeadRows(config, batch, seq, head_rows_asked));
  for (int i = 0; i < 2; ++i) plan.push_back({head_rows * v, 2});  // logits_, dlogits_
  for (int i = 0; i < 2; ++i) plan.push_back({n, 4});              // rstd_f_, losses_
  plan.push_back({1 + kLinears, 4});  // norm_, then weights_amax_ (an FP8 layer's new weights' largest |x|)
  // attention_scratch_: ours' backward scratch, or room for cuDNN's workspace, which its
  // deterministic backward sizes at up to 8 times dQ in fp32 (H200, cuDNN 9.19: 2.6x at 300
  // tokens, 5x at 2 x 512, 8x at 1.3B's 2 x 2048; ChooseAttention keeps ours when it wants more).
  const size_t cudnn_room = cudnn_attention ? 8 * n * qd * 4 + (size_t{8} << 20) : 0;
  plan.push_back({std::max(static_cast<size_t>(AttentionBackwardScratchBytes(batch, seq, config.heads,
                                                                             config.head_dim())),
                           cudnn_room),
                  1});
  for (int i = 0; i < 2; ++i) plan.push_back({n, 4});              // tokens_, targets_
  const auto rows = static_cast<int>(n);
  plan.push_back({std::max<size_t>({static_cast<size_t>(RmsNormScratchFloats(rows, static_cast<int>(c))),
                                    static_cast<size_t>(BiasScratchFloats(rows, static_cast<int>(qd))),
                                    static_cast<size_t>(kSumSquaresScratch)}),
                  4});             // scratch_
  plan.push_back({3 * n + 1, 4});  // token_index_
  const bool grouped = config.kv_head_count() != config.heads;
  for (int i = 0; i < 4; ++i) plan.push_back({grouped ? n * qd : 0, 2});  // k_full_, v_full_, dk_full_, dv_full_
  if (recompute) {
    plan.push_back({ActsBytes(config, batch, seq), 1});  // recompute_acts_
    plan.push_back({n * c, 4});                          // xr_
  } else if (lean_rooms) {
    plan.push_back({LeanRoomsBytes(config, batch, seq), 1});  // recompute_acts_, for lean layers only
    plan.push_back({0, 4});                                   // xr_ (unused)
  }
  return plan;
}

std::vector<std::pair<size_t, size_t>> GpuModel::MicroBatchPlan(const ModelConfig& config, int batch, int seq) {
  const size_t n = static_cast<size_t>(batch) * seq, c = config.d_model;
  return {{n * c, 4}, {n * c, 4}, {n, 4}, {n, 4}, {3 * n + 1, 4}};  // x, dx, tokens, targets, token index
}

uint64_t GpuModel::WorkspaceBytesFor(const ModelConfig& config, int batch, int seq, const StateOptions& state) {
  uint64_t bytes = state.gemm_workspace_bytes;
  for (const auto& [count, size] : WorkspacePlan(config, batch, seq, AnyRecomputes(config, state), state.head_rows,
                                                 MayUseCudnnAttention(state.attention),
                                                 AnyCodedRooms(config, state))) {
    bytes += std::max<size_t>(count * size, 1);
  }
  for (const auto& [count, size] : MicroBatchPlan(config, batch, seq)) {
    bytes += static_cast<uint64_t>(state.layer_major_micro_batches) * count * size;
  }
  if (state.compact) {  // grad_acc_ (fp32) and weights_ws_ (bf16), one group each
    bytes += GpuModel(config, batch, seq, state).MaxGroupCount() * (sizeof(float) + sizeof(Bf16));
  }
  return bytes;
}

size_t GpuModel::MaxGroupCount() const {
  size_t most = 0;
  for (int g = 0; g < Groups(); ++g) most = std::max(most, GroupCount(g));
  return most;
}

}  // namespace tierd::trainer::gpu
