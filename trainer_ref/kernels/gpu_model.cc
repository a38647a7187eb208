#include "trainer_ref/kernels/gpu_model.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <thread>

#include "absl/strings/str_format.h"
#include "base/units.h"
#include "trainer_ref/host_adamw.h"

namespace tierd::trainer::gpu {
namespace {

constexpr float kNormEps = 1e-5f;     // as trainer_ref/model.cc
constexpr float kRopeBase = 10000.f;

absl::Status Cuda(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrFormat("CUDA %s: %s", what, cudaGetErrorString(error)));
}

#define RETURN_IF_ERROR(expr)                  \
  do {                                         \
    if (absl::Status _s = (expr); !_s.ok()) return _s; \
  } while (0)

enum Category { kGemm, kAttention, kElementwise, kLoss, kOptimizer, kCategories };
const char* const kCategoryNames[kCategories] = {"gemm", "attention", "norm+elementwise", "loss", "optimizer"};

}  // namespace

template <typename Fn>
auto GpuModel::Timed(int category, Fn&& fn) {
  if (!profiling_) return fn();
  Span span{category, nullptr, nullptr};
  cudaEventCreate(&span.start);
  cudaEventCreate(&span.end);
  cudaEventRecord(span.start, stream_);
  auto result = fn();
  cudaEventRecord(span.end, stream_);
  spans_.push_back(span);
  return result;
}

std::vector<std::pair<std::string, double>> GpuModel::TakeProfile() {
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
  std::vector<std::pair<std::string, double>> out;
  for (int c = 0; c < kCategories; ++c) out.push_back({kCategoryNames[c], ms[c]});
  return out;
}

GpuModel::GpuModel(const ModelConfig& config, int batch, int seq, bool checkpointing)
    : config_(config), batch_(batch), seq_(seq), checkpointing_(checkpointing), layout_(ParamLayout(config)) {
  const ParamEntries entries = ParamEntriesOf(config);
  embed_ = entries.embed;
  layers_ = entries.layers;
  final_norm_ = entries.final_norm;
  head_ = entries.head;
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
  grads_zeroed_.assign(Groups(), false);
  norm_offset_.assign(layout_.size(), 0);
  size_t norms = 0;
  for (size_t e = 0; e < layout_.size(); ++e) {
    if (layout_[e].shape.size() == 1) {
      norm_offset_[e] = norms;
      norms += layout_[e].count;
    }
  }
}

std::vector<size_t> GpuModel::GroupEntries(int group) const {
  if (group == 0) return {embed_};
  if (group == Groups() - 1) return {final_norm_, head_};
  const Layer& w = layers_[group - 1];
  return {w.attn_norm, w.wq, w.wk, w.wv, w.wo, w.mlp_norm, w.w1, w.w3, w.w2};
}

GpuModel::~GpuModel() {
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  for (int g = 0; g < static_cast<int>(acquired_.size()); ++g) {
    for (int k = 0; k < kParts; ++k) {
      if (acquired_[g][k] != nullptr) Leave(g, Part(k)).IgnoreError();
    }
  }
  gemm_.reset();
  home_.reset();
  for (void* p : allocations_) cudaFree(p);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

namespace {
constexpr uint64_t kAlign = 256;
uint64_t Aligned(uint64_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }
}  // namespace

uint64_t GpuModel::ActsBytes(const ModelConfig& config, int batch, int seq) {
  const uint64_t n = static_cast<uint64_t>(batch) * seq, c = config.d_model, f = config.d_ff;
  const uint64_t lse = static_cast<uint64_t>(batch) * config.heads * seq;
  return 6 * Aligned(n * c * 2) + 2 * Aligned(n * c * 4) + 3 * Aligned(n * f * 2) + 2 * Aligned(n * 4) +
         Aligned(lse * 4);
}

GpuModel::Acts GpuModel::ActsAt(void* base) const {
  const uint64_t n = static_cast<uint64_t>(batch_) * seq_, c = config_.d_model, f = config_.d_ff;
  auto* at = static_cast<unsigned char*>(base);
  auto take = [&at](uint64_t bytes) {
    void* p = at;
    at += Aligned(bytes);
    return p;
  };
  Acts a;
  for (Bf16** p : {&a.h1, &a.q, &a.k, &a.v, &a.a, &a.h2}) *p = static_cast<Bf16*>(take(n * c * 2));
  for (float** p : {&a.x_in, &a.x_mid}) *p = static_cast<float*>(take(n * c * 4));
  for (Bf16** p : {&a.g, &a.u, &a.s}) *p = static_cast<Bf16*>(take(n * f * 2));
  for (float** p : {&a.rstd1, &a.rstd2}) *p = static_cast<float*>(take(n * 4));
  a.lse = static_cast<float*>(take(static_cast<uint64_t>(batch_) * config_.heads * seq_ * 4));
  return a;
}

GpuHomeLayout GpuModel::HomeLayout(const ModelConfig& config, int batch, int seq, bool checkpointing) {
  GpuModel shape(config, batch, seq, checkpointing);  // host-side tables only
  GpuHomeLayout out;
  for (int g = 0; g < shape.Groups(); ++g) {
    uint64_t params = 0;
    for (size_t e : shape.GroupEntries(g)) params += shape.layout_[e].count;
    out.groups.push_back(g == 0 ? "embed" : g == shape.Groups() - 1 ? "final" : absl::StrFormat("layers.%d", g - 1));
    const bool layer = g >= 1 && g <= config.layers;
    const uint64_t saved = checkpointing ? Aligned(static_cast<uint64_t>(batch) * seq * config.d_model * 4)
                                         : ActsBytes(config, batch, seq);
    out.bytes.push_back({params * 2, params * 4, params * 4, params * 4, params * 4, layer ? saved : 0});
  }
  return out;
}

template <typename T>
absl::StatusOr<T*> GpuModel::Take(size_t count) {
  void* p = nullptr;
  const size_t bytes = std::max<size_t>(count, 1) * sizeof(T);
  if (cudaMalloc(&p, bytes) != cudaSuccess) {
    cudaGetLastError();
    size_t free_bytes = 0, total = 0;
    cudaMemGetInfo(&free_bytes, &total);
    return absl::ResourceExhaustedError(absl::StrFormat(
        "the GPU model's workspace needs %s more (holds %s already); the device has %s free of %s",
        FormatBytes(bytes), FormatBytes(device_bytes_), FormatBytes(free_bytes), FormatBytes(total)));
  }
  allocations_.push_back(p);
  device_bytes_ += bytes;
  return static_cast<T*>(p);
}

absl::StatusOr<std::unique_ptr<GpuModel>> GpuModel::Create(const ModelConfig& config, int batch, int seq,
                                                           std::unique_ptr<GpuHome> home, bool checkpointing) {
  if (config.head_dim() > 256) {
    return absl::InvalidArgumentError(absl::StrFormat("head size %d: the attention kernel takes at most 256",
                                                      config.head_dim()));
  }
  std::unique_ptr<GpuModel> model(new GpuModel(config, batch, seq, checkpointing));
  if (home == nullptr) {
    auto plain = MakePlainGpuHome(HomeLayout(config, batch, seq, checkpointing));
    if (!plain.ok()) return plain.status();
    home = std::move(*plain);
  }
  model->home_ = std::move(home);
  RETURN_IF_ERROR(model->Allocate());
  return model;
}

// The workspace, in the order Allocate takes it: element count and size of each buffer.
std::vector<std::pair<size_t, size_t>> GpuModel::WorkspacePlan(const ModelConfig& config, int batch, int seq,
                                                               bool checkpointing) {
  const size_t n = static_cast<size_t>(batch) * seq, c = config.d_model, f = config.d_ff, v = config.vocab;
  const size_t lse = static_cast<size_t>(batch) * config.heads * seq;
  size_t norms = 0;
  for (const TensorLayout& t : ParamLayout(config)) norms += t.shape.size() == 1 ? t.count : 0;
  std::vector<std::pair<size_t, size_t>> plan = {{norms, 4}};      // norms_
  for (int i = 0; i < 9; ++i) plan.push_back({n * c, 2});          // tmp_ .. dv_
  for (int i = 0; i < 3; ++i) plan.push_back({n * c, 4});          // x_, x_out_, dx_
  for (int i = 0; i < 3; ++i) plan.push_back({n * f, 2});          // ds_, dg_, du_
  for (int i = 0; i < 2; ++i) plan.push_back({n * v, 2});          // logits_, dlogits_
  for (int i = 0; i < 2; ++i) plan.push_back({n, 4});              // rstd_f_, losses_
  plan.push_back({1, 4});                                          // norm_
  plan.push_back({lse, 4});                                        // delta_
  for (int i = 0; i < 2; ++i) plan.push_back({n, 4});              // tokens_, targets_
  if (checkpointing) {
    plan.push_back({ActsBytes(config, batch, seq), 1});            // recompute_acts_
    plan.push_back({n * c, 4});                                    // xr_
  }
  return plan;
}

uint64_t GpuModel::WorkspaceBytesFor(const ModelConfig& config, int batch, int seq, bool checkpointing) {
  uint64_t bytes = kGemmWorkspace;
  for (const auto& [count, size] : WorkspacePlan(config, batch, seq, checkpointing)) bytes += std::max<size_t>(count * size, 1);
  return bytes;
}

absl::Status GpuModel::Allocate() {
  RETURN_IF_ERROR(Cuda(cudaStreamCreate(&stream_), "stream"));
  auto gemm = Gemm::Create(kGemmWorkspace);
  if (!gemm.ok()) return gemm.status();
  gemm_ = std::move(*gemm);
  device_bytes_ += kGemmWorkspace;
  void** targets[] = {reinterpret_cast<void**>(&norms_), reinterpret_cast<void**>(&tmp_),
                      reinterpret_cast<void**>(&xf_),    reinterpret_cast<void**>(&dx16_),
                      reinterpret_cast<void**>(&dxf_),   reinterpret_cast<void**>(&dh_),
                      reinterpret_cast<void**>(&da_),    reinterpret_cast<void**>(&dq_),
                      reinterpret_cast<void**>(&dk_),    reinterpret_cast<void**>(&dv_),
                      reinterpret_cast<void**>(&x_),     reinterpret_cast<void**>(&x_out_),
                      reinterpret_cast<void**>(&dx_),    reinterpret_cast<void**>(&ds_),
                      reinterpret_cast<void**>(&dg_),    reinterpret_cast<void**>(&du_),
                      reinterpret_cast<void**>(&logits_), reinterpret_cast<void**>(&dlogits_),
                      reinterpret_cast<void**>(&rstd_f_), reinterpret_cast<void**>(&losses_),
                      reinterpret_cast<void**>(&norm_),  reinterpret_cast<void**>(&delta_),
                      reinterpret_cast<void**>(&tokens_), reinterpret_cast<void**>(&targets_),
                      &recompute_acts_,                    reinterpret_cast<void**>(&xr_)};
  const auto plan = WorkspacePlan(config_, batch_, seq_, checkpointing_);
  static_assert(sizeof(targets) / sizeof(targets[0]) == 26);
  if (plan.size() != (checkpointing_ ? 26u : 24u)) return absl::InternalError("the workspace plan and its buffers disagree");
  for (size_t i = 0; i < plan.size(); ++i) {
    auto p = Take<unsigned char>(plan[i].first * plan[i].second);
    if (!p.ok()) return p.status();
    *targets[i] = *p;
  }
  host_losses_.resize(static_cast<size_t>(batch_) * seq_);
  return ZeroGrads();
}

absl::Status GpuModel::Enter(int group, Part part, Access access) {
  const auto start = std::chrono::steady_clock::now();
  auto p = home_->Acquire(group, part, access);
  acquire_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!p.ok()) {
    return absl::Status(p.status().code(), absl::StrFormat("acquiring %s: %s",
                                                           PartName(HomeLayout(config_, batch_, seq_, checkpointing_), group, part),
                                                           p.status().message()));
  }
  acquired_[group][static_cast<int>(part)] = *p;
  return absl::OkStatus();
}

absl::Status GpuModel::Leave(int group, Part part) {
  acquired_[group][static_cast<int>(part)] = nullptr;
  return home_->Release(group, part, stream_);
}

absl::Status GpuModel::EnterGrads(int group) {
  if (grads_zeroed_[group]) return Enter(group, Part::kGrads, Access::kWrite);
  RETURN_IF_ERROR(Enter(group, Part::kGrads, Access::kOverwrite));
  grads_zeroed_[group] = true;
  return Cuda(cudaMemsetAsync(acquired_[group][static_cast<int>(Part::kGrads)], 0, GroupCount(group) * sizeof(float),
                              stream_),
              "zero grads");
}

namespace {
template <typename T>
T* Inside(void* base, size_t offset, const char* what, const std::string& name) {
  if (base == nullptr) {
    std::fprintf(stderr, "GpuModel: %s of %s used without being acquired\n", what, name.c_str());
    std::abort();
  }
  return static_cast<T*>(base) + offset;
}
}  // namespace

Bf16* GpuModel::W(size_t entry) const {
  const int g = group_of_[entry];
  return Inside<Bf16>(acquired_[g][static_cast<int>(Part::kWeights)], layout_[entry].offset - group_offset_[g],
                      "weights", layout_[entry].name);
}
float* GpuModel::M(size_t entry) const {
  const int g = group_of_[entry];
  return Inside<float>(acquired_[g][static_cast<int>(Part::kMaster)], layout_[entry].offset - group_offset_[g],
                       "master weights", layout_[entry].name);
}
float* GpuModel::G(size_t entry) const {
  const int g = group_of_[entry];
  return Inside<float>(acquired_[g][static_cast<int>(Part::kGrads)], layout_[entry].offset - group_offset_[g],
                       "gradients", layout_[entry].name);
}

size_t GpuModel::GroupCount(int group) const {
  size_t count = 0;
  for (size_t e : GroupEntries(group)) count += layout_[e].count;
  return count;
}

absl::Status GpuModel::SetGroup(int g, const float* params) {
  const size_t count = GroupCount(g);
  std::vector<Bf16> bits(count);
  for (size_t i = 0; i < count; ++i) bits[i] = ToBf16(params[i]);
  for (Part part : {Part::kWeights, Part::kMaster, Part::kAdamM, Part::kAdamV}) {
    RETURN_IF_ERROR(Enter(g, part, Access::kOverwrite));
  }
  void** parts = acquired_[g].data();
  RETURN_IF_ERROR(Cuda(cudaMemcpyAsync(parts[static_cast<int>(Part::kMaster)], params, count * sizeof(float),
                                       cudaMemcpyHostToDevice, stream_),
                       "upload master"));
  RETURN_IF_ERROR(Cuda(cudaMemcpyAsync(parts[static_cast<int>(Part::kWeights)], bits.data(), count * sizeof(Bf16),
                                       cudaMemcpyHostToDevice, stream_),
                       "upload weights"));
  for (Part part : {Part::kAdamM, Part::kAdamV}) {
    RETURN_IF_ERROR(Cuda(cudaMemsetAsync(parts[static_cast<int>(part)], 0, count * sizeof(float), stream_),
                         "zero moments"));
  }
  for (size_t e : GroupEntries(g)) {
    if (layout_[e].shape.size() != 1) continue;
    RETURN_IF_ERROR(Cuda(cudaMemcpyAsync(N(e), params + (layout_[e].offset - group_offset_[g]),
                                         layout_[e].count * sizeof(float), cudaMemcpyHostToDevice, stream_),
                         "upload norm weights"));
  }
  RETURN_IF_ERROR(Cuda(cudaStreamSynchronize(stream_), "upload"));  // the host buffers are read by now
  for (Part part : {Part::kWeights, Part::kMaster, Part::kAdamM, Part::kAdamV}) RETURN_IF_ERROR(Leave(g, part));
  return absl::OkStatus();
}

absl::Status GpuModel::SetParams(const std::vector<float>& params) {
  if (params.size() != total_params_) {
    return absl::InvalidArgumentError(absl::StrFormat("%d parameters given; the model has %d", params.size(),
                                                      total_params_));
  }
  for (int g = 0; g < Groups(); ++g) RETURN_IF_ERROR(SetGroup(g, params.data() + group_offset_[g]));
  return absl::OkStatus();
}

namespace {
uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// One slice of a tensor's initial values from its own stream.
void InitTensor(float* out, const TensorLayout& t, size_t entry, int layers, uint64_t seed) {
  if (t.shape.size() == 1) {
    std::fill(out, out + t.count, 1.f);
    return;
  }
  const bool residual_out = t.name.find("attn.wo") != std::string::npos || t.name.find("mlp.w2") != std::string::npos;
  const double sigma = 0.02 * (residual_out ? 1.0 / std::sqrt(2.0 * layers) : 1.0);
  uint64_t state = seed * 0x100000001B3ull + entry * 0x9E3779B97F4A7C15ull;
  for (size_t i = 0; i < t.count; i += 2) {  // Box-Muller: two normals per pair of uniforms
    const double u1 = (static_cast<double>(SplitMix64(state) >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]
    const double u2 = static_cast<double>(SplitMix64(state) >> 11) * 0x1.0p-53;
    const double r = sigma * std::sqrt(-2.0 * std::log(u1)), angle = 2.0 * M_PI * u2;
    out[i] = static_cast<float>(r * std::cos(angle));
    if (i + 1 < t.count) out[i + 1] = static_cast<float>(r * std::sin(angle));
  }
}
}  // namespace

absl::Status GpuModel::InitParams(uint64_t seed) {
  const unsigned threads = std::max(1u, std::min(16u, std::thread::hardware_concurrency()));
  for (int g = 0; g < Groups(); ++g) {
    std::vector<float> params(GroupCount(g));
    const std::vector<size_t> entries = GroupEntries(g);
    // Each tensor from its own stream, so the threads split the rows of every tensor.
    std::vector<std::thread> pool;
    for (unsigned w = 0; w < threads; ++w) {
      pool.emplace_back([&, w] {
        for (size_t e : entries) {
          const TensorLayout& t = layout_[e];
          // Slices of 2^16 values (an even count, so Box-Muller pairs stay inside one).
          const size_t slice = size_t{1} << 16, slices = (t.count + slice - 1) / slice;
          for (size_t k = w; k < slices; k += threads) {
            TensorLayout part = t;
            part.count = std::min(slice, t.count - k * slice);
            InitTensor(params.data() + (t.offset - group_offset_[g]) + k * slice, part, e * 1000003 + k,
                       config_.layers, seed);
          }
        }
      });
    }
    for (std::thread& t : pool) t.join();
    RETURN_IF_ERROR(SetGroup(g, params.data()));
  }
  return absl::OkStatus();
}

absl::Status GpuModel::Download(Part part, std::vector<float>* out) {
  out->assign(total_params_, 0.f);
  for (int g = 0; g < Groups(); ++g) {
    if (part == Part::kGrads && !grads_zeroed_[g]) continue;  // no backward reached it this step: zeros
    RETURN_IF_ERROR(Enter(g, part, Access::kRead));
    RETURN_IF_ERROR(Cuda(cudaMemcpyAsync(out->data() + group_offset_[g], acquired_[g][static_cast<int>(part)],
                                         GroupCount(g) * sizeof(float), cudaMemcpyDeviceToHost, stream_),
                         "download"));
    RETURN_IF_ERROR(Cuda(cudaStreamSynchronize(stream_), "download"));
    RETURN_IF_ERROR(Leave(g, part));
  }
  return absl::OkStatus();
}

absl::Status GpuModel::GetParams(std::vector<float>* params) { return Download(Part::kMaster, params); }

absl::Status GpuModel::GetGrads(std::vector<float>* grads) { return Download(Part::kGrads, grads); }

absl::Status GpuModel::ZeroGrads() {
  grads_zeroed_.assign(Groups(), false);
  micro_ = 0;
  return absl::OkStatus();
}

void GpuModel::Progress(uint32_t op) {
  // Progress only steers the moves: a lost message costs a demand fetch, not a value.
  if (registered_ && micro_ < registered_micro_batches_) home_->OpBegin(op).IgnoreError();
}

absl::Status GpuModel::LayerForward(int l, const Acts& a, float* x) {
  const int n = batch_ * seq_, c = config_.d_model, f = config_.d_ff, h = config_.heads, d = config_.head_dim();
  const size_t nc = static_cast<size_t>(n) * c;
  const Layer& w = layers_[l];
  RETURN_IF_ERROR(Cuda(cudaMemcpyAsync(a.x_in, x, nc * sizeof(float), cudaMemcpyDeviceToDevice, stream_), "x_in"));
  Timed(kElementwise, [&] { RmsNormForward(a.h1, a.rstd1, x, N(w.attn_norm), n, c, kNormEps, stream_); return 0; });
  RETURN_IF_ERROR(Timed(kGemm, [&] { return gemm_->Forward(a.q, a.h1, W(w.wq), n, c, c, stream_); }));
  RETURN_IF_ERROR(Timed(kGemm, [&] { return gemm_->Forward(a.k, a.h1, W(w.wk), n, c, c, stream_); }));
  RETURN_IF_ERROR(Timed(kGemm, [&] { return gemm_->Forward(a.v, a.h1, W(w.wv), n, c, c, stream_); }));
  Timed(kElementwise, [&] { RopeForward(a.q, batch_, seq_, h, d, kRopeBase, stream_); return 0; });
  Timed(kElementwise, [&] { RopeForward(a.k, batch_, seq_, h, d, kRopeBase, stream_); return 0; });
  RETURN_IF_ERROR(Timed(kAttention, [&] {
    return Cuda(AttentionForward(a.a, a.lse, a.q, a.k, a.v, batch_, seq_, h, d, stream_), "attention forward");
  }));
  RETURN_IF_ERROR(Timed(kGemm, [&] { return gemm_->Forward(tmp_, a.a, W(w.wo), n, c, c, stream_); }));
  Timed(kElementwise, [&] { AddInto(x, tmp_, static_cast<int64_t>(nc), stream_); return 0; });
  RETURN_IF_ERROR(Cuda(cudaMemcpyAsync(a.x_mid, x, nc * sizeof(float), cudaMemcpyDeviceToDevice, stream_), "x_mid"));
  Timed(kElementwise, [&] { RmsNormForward(a.h2, a.rstd2, x, N(w.mlp_norm), n, c, kNormEps, stream_); return 0; });
  RETURN_IF_ERROR(Timed(kGemm, [&] { return gemm_->Forward(a.g, a.h2, W(w.w1), n, c, f, stream_); }));
  RETURN_IF_ERROR(Timed(kGemm, [&] { return gemm_->Forward(a.u, a.h2, W(w.w3), n, c, f, stream_); }));
  Timed(kElementwise, [&] { SwiGluForward(a.s, a.g, a.u, n, f, stream_); return 0; });
  RETURN_IF_ERROR(Timed(kGemm, [&] { return gemm_->Forward(tmp_, a.s, W(w.w2), n, f, c, stream_); }));
  Timed(kElementwise, [&] { AddInto(x, tmp_, static_cast<int64_t>(nc), stream_); return 0; });
  return absl::OkStatus();
}

absl::StatusOr<double> GpuModel::Forward(const int32_t* tokens, const int32_t* targets) {
  const int n = batch_ * seq_, c = config_.d_model;
  const size_t nc = static_cast<size_t>(n) * c;
  const uint32_t op0 = static_cast<uint32_t>(micro_ * 2 * Groups());
  RETURN_IF_ERROR(Cuda(cudaMemcpyAsync(tokens_, tokens, n * sizeof(int32_t), cudaMemcpyHostToDevice, stream_), "tokens"));
  RETURN_IF_ERROR(Cuda(cudaMemcpyAsync(targets_, targets, n * sizeof(int32_t), cudaMemcpyHostToDevice, stream_),
                       "targets"));
  int counted = 0;
  for (int i = 0; i < n; ++i) counted += targets[i] >= 0;
  Progress(op0);
  RETURN_IF_ERROR(Enter(0, Part::kWeights, Access::kRead));
  Timed(kElementwise, [&] { EmbeddingForward(x_, tokens_, W(embed_), n, c, config_.vocab, stream_); return 0; });
  RETURN_IF_ERROR(Leave(0, Part::kWeights));
  for (int l = 0; l < config_.layers; ++l) {
    const int group = l + 1;
    Progress(op0 + group);
    RETURN_IF_ERROR(Enter(group, Part::kWeights, Access::kRead));
    RETURN_IF_ERROR(Enter(group, Part::kActs, Access::kOverwrite));
    void* saved = acquired_[group][static_cast<int>(Part::kActs)];
    Acts a = ActsAt(checkpointing_ ? recompute_acts_ : saved);
    if (checkpointing_) a.x_in = static_cast<float*>(saved);  // the layer's input is all it keeps
    RETURN_IF_ERROR(LayerForward(l, a, x_));
    RETURN_IF_ERROR(Leave(group, Part::kWeights));
    RETURN_IF_ERROR(Leave(group, Part::kActs));
  }
  const int last = Groups() - 1;
  Progress(op0 + last);
  RETURN_IF_ERROR(Enter(last, Part::kWeights, Access::kRead));
  RETURN_IF_ERROR(Cuda(cudaMemcpyAsync(x_out_, x_, nc * sizeof(float), cudaMemcpyDeviceToDevice, stream_), "x_out"));
  Timed(kElementwise, [&] { RmsNormForward(xf_, rstd_f_, x_, N(final_norm_), n, c, kNormEps, stream_); return 0; });
  RETURN_IF_ERROR(Timed(kGemm, [&] { return gemm_->Forward(logits_, xf_, W(head_), n, c, config_.vocab, stream_); }));
  RETURN_IF_ERROR(Leave(last, Part::kWeights));
  Timed(kLoss, [&] { CrossEntropy(losses_, dlogits_, logits_, targets_, n, config_.vocab, counted, stream_); return 0; });
  RETURN_IF_ERROR(Cuda(cudaGetLastError(), "forward kernels"));
  RETURN_IF_ERROR(Cuda(cudaMemcpyAsync(host_losses_.data(), losses_, n * sizeof(float), cudaMemcpyDeviceToHost, stream_),
                       "losses"));
  RETURN_IF_ERROR(Cuda(cudaStreamSynchronize(stream_), "forward"));
  double sum = 0;
  for (int i = 0; i < n; ++i) sum += host_losses_[i];
  return counted > 0 ? sum / counted : 0.0;
}

absl::Status GpuModel::Backward() {
  const int n = batch_ * seq_, c = config_.d_model, f = config_.d_ff, h = config_.heads, d = config_.head_dim();
  const size_t nc = static_cast<size_t>(n) * c, nf = static_cast<size_t>(n) * f;
  const uint32_t op0 = static_cast<uint32_t>(micro_ * 2 * Groups() + Groups());  // backward's first op
  auto zero = [this](Bf16* p, size_t count) { return Cuda(cudaMemsetAsync(p, 0, count * sizeof(Bf16), stream_), "zero"); };
  // Each group's sum of squared gradients, taken right after its backward (the norm).
  auto sum_squares = [&](int group) {
    Timed(kOptimizer, [&] {
      SumSquares(static_cast<float*>(acquired_[group][static_cast<int>(Part::kGrads)]),
                 static_cast<int64_t>(GroupCount(group)), norm_, stream_);
      return 0;
    });
  };
  RETURN_IF_ERROR(Cuda(cudaMemsetAsync(norm_, 0, sizeof(float), stream_), "zero norm"));
  const int last = Groups() - 1;
  Progress(op0);
  RETURN_IF_ERROR(Enter(last, Part::kWeights, Access::kRead));
  RETURN_IF_ERROR(EnterGrads(last));
  RETURN_IF_ERROR(zero(dxf_, nc));
  RETURN_IF_ERROR(Timed(kGemm, [&] { return gemm_->Backward(dxf_, G(head_), dlogits_, xf_, W(head_), n, c, config_.vocab, stream_); }));
  RETURN_IF_ERROR(Cuda(cudaMemsetAsync(dx_, 0, nc * sizeof(float), stream_), "zero dx"));
  Timed(kElementwise, [&] { RmsNormBackward(dx_, G(final_norm_), dxf_, x_out_, N(final_norm_), rstd_f_, n, c, stream_); return 0; });
  sum_squares(last);
  RETURN_IF_ERROR(Leave(last, Part::kWeights));
  RETURN_IF_ERROR(Leave(last, Part::kGrads));
  for (int l = config_.layers; l-- > 0;) {
    const int group = l + 1;
    Progress(op0 + (last - group));
    RETURN_IF_ERROR(Enter(group, Part::kWeights, Access::kRead));
    RETURN_IF_ERROR(Enter(group, Part::kActs, Access::kRead));
    RETURN_IF_ERROR(EnterGrads(group));
    const Layer& w = layers_[l];
    void* saved = acquired_[group][static_cast<int>(Part::kActs)];
    const Acts a = ActsAt(checkpointing_ ? recompute_acts_ : saved);
    if (checkpointing_) {  // the layer's forward again, from its saved input, into the workspace
      RETURN_IF_ERROR(Cuda(cudaMemcpyAsync(xr_, saved, nc * sizeof(float), cudaMemcpyDeviceToDevice, stream_),
                           "recompute input"));
      RETURN_IF_ERROR(LayerForward(l, a, xr_));
    }
    // x_out = x_mid + swiglu(h2 W1^T, h2 W3^T) W2^T
    Timed(kElementwise, [&] { ToBf16(dx16_, dx_, static_cast<int64_t>(nc), stream_); return 0; });
    RETURN_IF_ERROR(zero(ds_, nf));
    RETURN_IF_ERROR(Timed(kGemm, [&] { return gemm_->Backward(ds_, G(w.w2), dx16_, a.s, W(w.w2), n, f, c, stream_); }));
    RETURN_IF_ERROR(zero(dg_, nf));
    RETURN_IF_ERROR(zero(du_, nf));
    Timed(kElementwise, [&] { SwiGluBackward(dg_, du_, ds_, a.g, a.u, n, f, stream_); return 0; });
    RETURN_IF_ERROR(zero(dh_, nc));
    RETURN_IF_ERROR(Timed(kGemm, [&] { return gemm_->Backward(dh_, G(w.w1), dg_, a.h2, W(w.w1), n, c, f, stream_); }));
    RETURN_IF_ERROR(Timed(kGemm, [&] { return gemm_->Backward(dh_, G(w.w3), du_, a.h2, W(w.w3), n, c, f, stream_); }));
    Timed(kElementwise, [&] { RmsNormBackward(dx_, G(w.mlp_norm), dh_, a.x_mid, N(w.mlp_norm), a.rstd2, n, c, stream_); return 0; });
    // x_mid = x_in + attention(rope(h1 Wq^T), rope(h1 Wk^T), h1 Wv^T) Wo^T
    Timed(kElementwise, [&] { ToBf16(dx16_, dx_, static_cast<int64_t>(nc), stream_); return 0; });
    RETURN_IF_ERROR(zero(da_, nc));
    RETURN_IF_ERROR(Timed(kGemm, [&] { return gemm_->Backward(da_, G(w.wo), dx16_, a.a, W(w.wo), n, c, c, stream_); }));
    for (Bf16* p : {dq_, dk_, dv_}) RETURN_IF_ERROR(zero(p, nc));
    RETURN_IF_ERROR(Timed(kAttention, [&] {
      return Cuda(AttentionBackward(dq_, dk_, dv_, da_, a.a, a.lse, delta_, a.q, a.k, a.v, batch_, seq_, h, d, stream_),
                  "attention backward");
    }));
    Timed(kElementwise, [&] { RopeBackward(dq_, batch_, seq_, h, d, kRopeBase, stream_); return 0; });
    Timed(kElementwise, [&] { RopeBackward(dk_, batch_, seq_, h, d, kRopeBase, stream_); return 0; });
    RETURN_IF_ERROR(zero(dh_, nc));
    RETURN_IF_ERROR(Timed(kGemm, [&] { return gemm_->Backward(dh_, G(w.wq), dq_, a.h1, W(w.wq), n, c, c, stream_); }));
    RETURN_IF_ERROR(Timed(kGemm, [&] { return gemm_->Backward(dh_, G(w.wk), dk_, a.h1, W(w.wk), n, c, c, stream_); }));
    RETURN_IF_ERROR(Timed(kGemm, [&] { return gemm_->Backward(dh_, G(w.wv), dv_, a.h1, W(w.wv), n, c, c, stream_); }));
    Timed(kElementwise, [&] { RmsNormBackward(dx_, G(w.attn_norm), dh_, a.x_in, N(w.attn_norm), a.rstd1, n, c, stream_); return 0; });
    sum_squares(group);
    RETURN_IF_ERROR(Leave(group, Part::kWeights));
    RETURN_IF_ERROR(Leave(group, Part::kActs));
    RETURN_IF_ERROR(Leave(group, Part::kGrads));
  }
  Progress(op0 + last);
  RETURN_IF_ERROR(EnterGrads(0));
  Timed(kElementwise, [&] { EmbeddingBackward(G(embed_), dx_, tokens_, n, c, config_.vocab, stream_); return 0; });
  sum_squares(0);
  RETURN_IF_ERROR(Leave(0, Part::kGrads));
  ++micro_;
  return Cuda(cudaGetLastError(), "backward kernels");
}

absl::StatusOr<double> GpuModel::GradNorm() {
  float sum = 0;
  RETURN_IF_ERROR(Cuda(cudaMemcpyAsync(&sum, norm_, sizeof(float), cudaMemcpyDeviceToHost, stream_), "norm"));
  RETURN_IF_ERROR(Cuda(cudaStreamSynchronize(stream_), "norm"));
  return std::sqrt(static_cast<double>(sum));
}

absl::Status GpuModel::AdamWStep(double lr, int64_t step, const AdamWOptions& options, double grad_scale) {
  const uint32_t op0 = static_cast<uint32_t>(registered_micro_batches_ * 2 * Groups());
  auto params_for = [&](size_t e) {
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
  for (int g = 0; g < Groups(); ++g) {
    if (registered_) home_->OpBegin(op0 + g).IgnoreError();
    if (optimizer_on_cpu_) {
      RETURN_IF_ERROR(HostAdamWStep(g, params_for));
      continue;
    }
    RETURN_IF_ERROR(EnterGrads(g));  // a group no backward reached this step has zero gradients
    for (Part part : {Part::kMaster, Part::kAdamM, Part::kAdamV}) RETURN_IF_ERROR(Enter(g, part, Access::kWrite));
    RETURN_IF_ERROR(Enter(g, Part::kWeights, Access::kOverwrite));  // written whole from the master copy
    auto* m = static_cast<float*>(acquired_[g][static_cast<int>(Part::kAdamM)]);
    auto* v = static_cast<float*>(acquired_[g][static_cast<int>(Part::kAdamV)]);
    for (size_t e : GroupEntries(g)) {
      const size_t off = layout_[e].offset - group_offset_[g];
      Timed(kOptimizer, [&] {
        AdamW(M(e), m + off, v + off, W(e), G(e), static_cast<int64_t>(layout_[e].count), params_for(e), stream_);
        return 0;
      });
      if (layout_[e].shape.size() == 1) {
        RETURN_IF_ERROR(Cuda(cudaMemcpyAsync(N(e), M(e), layout_[e].count * sizeof(float), cudaMemcpyDeviceToDevice,
                                             stream_),
                             "norm weights"));
      }
    }
    for (Part part : {Part::kGrads, Part::kMaster, Part::kAdamM, Part::kAdamV, Part::kWeights}) {
      RETURN_IF_ERROR(Leave(g, part));
    }
  }
  RETURN_IF_ERROR(Cuda(cudaGetLastError(), "adamw"));
  return Cuda(cudaStreamSynchronize(stream_), "adamw");
}

absl::Status GpuModel::HostAdamWStep(int g, const std::function<AdamWParams(size_t)>& params_for) {
  // The group's parts in the DRAM tier: tierd brings the gradients down from the GPU (after
  // the kernels that wrote them: their release fence) and drops the GPU copies of what the
  // host writes, so the next forward fetches the new weights.
  void* host[kParts] = {};
  std::vector<Part> held;
  auto release_all = [&] {
    for (Part part : held) home_->ReleaseHost(g, part).IgnoreError();
  };
  auto take = [&](Part part, Access access) -> absl::Status {
    auto p = home_->AcquireHost(g, part, access);
    if (!p.ok()) {
      return absl::Status(p.status().code(), absl::StrFormat("acquiring %s on the host: %s",
                                                             PartName(HomeLayout(config_, batch_, seq_,
                                                                                 checkpointing_),
                                                                      g, part),
                                                             p.status().message()));
    }
    host[static_cast<int>(part)] = *p;
    held.push_back(part);
    return absl::OkStatus();
  };
  const size_t count = GroupCount(g);
  const bool zeros = !grads_zeroed_[g];  // no backward reached it this step
  absl::Status s = take(Part::kGrads, zeros ? Access::kOverwrite : Access::kRead);
  for (Part part : {Part::kMaster, Part::kAdamM, Part::kAdamV}) {
    if (s.ok()) s = take(part, Access::kWrite);
  }
  if (s.ok()) s = take(Part::kWeights, Access::kOverwrite);
  if (!s.ok()) {
    release_all();
    return s;
  }
  auto* grads = static_cast<float*>(host[static_cast<int>(Part::kGrads)]);
  if (zeros) {
    std::memset(grads, 0, count * sizeof(float));
    grads_zeroed_[g] = true;
  }
  auto* master = static_cast<float*>(host[static_cast<int>(Part::kMaster)]);
  auto* m = static_cast<float*>(host[static_cast<int>(Part::kAdamM)]);
  auto* v = static_cast<float*>(host[static_cast<int>(Part::kAdamV)]);
  auto* weights = static_cast<Bf16*>(host[static_cast<int>(Part::kWeights)]);
  const auto start = std::chrono::steady_clock::now();
  for (size_t e : GroupEntries(g)) {
    const size_t off = layout_[e].offset - group_offset_[g];
    HostAdamW(master + off, m + off, v + off, weights + off, grads + off, static_cast<int64_t>(layout_[e].count),
              params_for(e));
    if (layout_[e].shape.size() == 1) {  // the resident copy the kernels read, after they are done with it
      s = Cuda(cudaMemcpyAsync(N(e), master + off, layout_[e].count * sizeof(float), cudaMemcpyHostToDevice, stream_),
               "norm weights");
      if (!s.ok()) break;
    }
  }
  host_optimizer_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (s.ok()) s = Cuda(cudaStreamSynchronize(stream_), "norm weights");  // before the host copy may move
  release_all();
  return s;
}

prefetcher::Graph GpuModel::StepGraph(int micro_batches) const {
  namespace tp = prefetcher;
  const GpuHomeLayout home = HomeLayout(config_, batch_, seq_, checkpointing_);
  tp::Graph graph;
  std::vector<std::array<tp::TensorIndex, kParts>> index(Groups());
  for (int g = 0; g < Groups(); ++g) {
    for (int k = 0; k < kParts; ++k) {
      if (home.bytes[g][k] == 0) continue;
      index[g][k] = static_cast<tp::TensorIndex>(graph.tensors.size());
      graph.tensors.push_back({PartName(home, g, Part(k)), home.bytes[g][k], false});
    }
  }
  auto at = [&index](int g, Part part) { return index[g][static_cast<int>(part)]; };
  // Estimated seconds (measured times replace them in the daemon): the GEMM and attention
  // flops at 300 TFLOP/s, the optimizer's bytes at 3 TB/s.
  const double tokens = static_cast<double>(batch_) * seq_;
  auto forward_seconds = [&](int g) {
    const double params = static_cast<double>(GroupCount(g));
    if (g == 0) return tokens * config_.d_model * 4 / 3e12;
    const double attention = g == Groups() - 1 ? 0.0 : 2.0 * tokens * seq_ * config_.d_model;
    return (2 * tokens * params + attention) / 300e12;
  };
  for (int micro = 0; micro < micro_batches; ++micro) {
    for (int g = 0; g < Groups(); ++g) {
      tp::GraphOp op{absl::StrFormat("mb%d.%s.fwd", micro, home.groups[g]), {at(g, Part::kWeights)}, {},
                     forward_seconds(g), {}};
      if (home.bytes[g][static_cast<int>(Part::kActs)] > 0) op.overwrites.push_back(at(g, Part::kActs));
      graph.ops.push_back(std::move(op));
    }
    for (int g = Groups(); g-- > 0;) {
      tp::GraphOp op{absl::StrFormat("mb%d.%s.bwd", micro, home.groups[g]), {}, {}, 2 * forward_seconds(g), {}};
      if (g > 0) op.reads.push_back(at(g, Part::kWeights));
      if (home.bytes[g][static_cast<int>(Part::kActs)] > 0) op.reads.push_back(at(g, Part::kActs));
      (micro == 0 ? op.overwrites : op.writes).push_back(at(g, Part::kGrads));
      graph.ops.push_back(std::move(op));
    }
  }
  for (int g = 0; g < Groups(); ++g) {
    const uint64_t bytes = home.bytes[g][static_cast<int>(Part::kMaster)];
    if (optimizer_on_cpu_) {
      // On the host: nothing of it is needed on the GPU. (The plan does not model host ops:
      // the state stays where the tiers keep it, in DRAM while there is room, and the
      // weights the host rewrote come back as the next forward asks for them.)
      graph.ops.push_back({absl::StrFormat("adamw.cpu.%s", home.groups[g]), {}, {}, bytes / 4 / 2e9, {}});
      continue;
    }
    graph.ops.push_back({absl::StrFormat("adamw.%s", home.groups[g]),
                         {at(g, Part::kGrads)},
                         {at(g, Part::kMaster), at(g, Part::kAdamM), at(g, Part::kAdamV)},
                         7.5 * bytes / 3e12,
                         {at(g, Part::kWeights)}});
  }
  return graph;
}

absl::StatusOr<std::string> GpuModel::RegisterStep(int micro_batches) {
  auto note = home_->RegisterGraph(StepGraph(micro_batches));
  if (!note.ok()) return note.status();
  registered_ = !note->empty();
  registered_micro_batches_ = micro_batches;
  return note;
}

}  // namespace tierd::trainer::gpu
