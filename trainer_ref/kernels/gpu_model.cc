#include "trainer_ref/kernels/gpu_model.h"

#include <cmath>

#include "absl/strings/str_format.h"
#include "base/units.h"

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

GpuModel::GpuModel(const ModelConfig& config, int batch, int seq)
    : config_(config), batch_(batch), seq_(seq), layout_(ParamLayout(config)) {
  const ParamEntries entries = ParamEntriesOf(config);
  embed_ = entries.embed;
  layers_ = entries.layers;
  final_norm_ = entries.final_norm;
  head_ = entries.head;
  total_params_ = layout_.back().offset + layout_.back().count;
}

GpuModel::~GpuModel() {
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  gemm_.reset();
  for (void* p : allocations_) cudaFree(p);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
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
        "the GPU model needs %s more (holds %s already); the device has %s free of %s", FormatBytes(bytes),
        FormatBytes(device_bytes_), FormatBytes(free_bytes), FormatBytes(total)));
  }
  allocations_.push_back(p);
  device_bytes_ += bytes;
  return static_cast<T*>(p);
}

absl::StatusOr<std::unique_ptr<GpuModel>> GpuModel::Create(const ModelConfig& config, int batch, int seq) {
  if (config.head_dim() > 256) {
    return absl::InvalidArgumentError(absl::StrFormat("head size %d: the attention kernel takes at most 256",
                                                      config.head_dim()));
  }
  std::unique_ptr<GpuModel> model(new GpuModel(config, batch, seq));
  RETURN_IF_ERROR(model->Allocate());
  return model;
}

absl::Status GpuModel::Allocate() {
  RETURN_IF_ERROR(Cuda(cudaStreamCreate(&stream_), "stream"));
  auto gemm = Gemm::Create();
  if (!gemm.ok()) return gemm.status();
  gemm_ = std::move(*gemm);
  const size_t n = static_cast<size_t>(batch_) * seq_, c = config_.d_model, f = config_.d_ff, v = config_.vocab;
  const size_t lse = static_cast<size_t>(batch_) * config_.heads * seq_;
  auto bf = [this](size_t count, Bf16** out) -> absl::Status {
    auto p = Take<Bf16>(count);
    if (!p.ok()) return p.status();
    *out = *p;
    return absl::OkStatus();
  };
  auto fp = [this](size_t count, float** out) -> absl::Status {
    auto p = Take<float>(count);
    if (!p.ok()) return p.status();
    *out = *p;
    return absl::OkStatus();
  };
  RETURN_IF_ERROR(bf(total_params_, &weights_));
  for (float** p : {&master_, &grads_, &m_, &v_}) RETURN_IF_ERROR(fp(total_params_, p));
  acts_.resize(config_.layers);
  for (Acts& a : acts_) {
    for (Bf16** p : {&a.h1, &a.q, &a.k, &a.v, &a.a, &a.h2}) RETURN_IF_ERROR(bf(n * c, p));
    RETURN_IF_ERROR(fp(n * c, &a.x_in));
    RETURN_IF_ERROR(fp(n * c, &a.x_mid));
    for (Bf16** p : {&a.g, &a.u, &a.s}) RETURN_IF_ERROR(bf(n * f, p));
    RETURN_IF_ERROR(fp(n, &a.rstd1));
    RETURN_IF_ERROR(fp(n, &a.rstd2));
    RETURN_IF_ERROR(fp(lse, &a.lse));
  }
  for (Bf16** p : {&tmp_, &xf_, &dx16_, &dxf_, &dh_, &da_, &dq_, &dk_, &dv_}) RETURN_IF_ERROR(bf(n * c, p));
  for (float** p : {&x_, &x_out_, &dx_}) RETURN_IF_ERROR(fp(n * c, p));
  for (Bf16** p : {&ds_, &dg_, &du_}) RETURN_IF_ERROR(bf(n * f, p));
  RETURN_IF_ERROR(bf(n * v, &logits_));
  RETURN_IF_ERROR(bf(n * v, &dlogits_));
  RETURN_IF_ERROR(fp(n, &rstd_f_));
  RETURN_IF_ERROR(fp(n, &losses_));
  RETURN_IF_ERROR(fp(1, &norm_));
  RETURN_IF_ERROR(fp(lse, &delta_));
  for (int32_t** p : {&tokens_, &targets_}) {
    auto q = Take<int32_t>(n);
    if (!q.ok()) return q.status();
    *p = *q;
  }
  host_losses_.resize(n);
  RETURN_IF_ERROR(Cuda(cudaMemsetAsync(m_, 0, total_params_ * sizeof(float), stream_), "zero m"));
  RETURN_IF_ERROR(Cuda(cudaMemsetAsync(v_, 0, total_params_ * sizeof(float), stream_), "zero v"));
  return ZeroGrads();
}

absl::Status GpuModel::SetParams(const std::vector<float>& params) {
  if (params.size() != total_params_) {
    return absl::InvalidArgumentError(absl::StrFormat("%d parameters given; the model has %d", params.size(),
                                                      total_params_));
  }
  std::vector<Bf16> bits(params.size());
  for (size_t i = 0; i < params.size(); ++i) bits[i] = ToBf16(params[i]);
  RETURN_IF_ERROR(Cuda(cudaMemcpyAsync(master_, params.data(), params.size() * sizeof(float), cudaMemcpyHostToDevice,
                                       stream_),
                       "upload master"));
  RETURN_IF_ERROR(Cuda(cudaMemcpyAsync(weights_, bits.data(), bits.size() * sizeof(Bf16), cudaMemcpyHostToDevice,
                                       stream_),
                       "upload weights"));
  return Cuda(cudaStreamSynchronize(stream_), "upload");
}

absl::Status GpuModel::GetParams(std::vector<float>* params) {
  params->resize(total_params_);
  RETURN_IF_ERROR(Cuda(cudaMemcpyAsync(params->data(), master_, total_params_ * sizeof(float), cudaMemcpyDeviceToHost,
                                       stream_),
                       "download master"));
  return Cuda(cudaStreamSynchronize(stream_), "download master");
}

absl::Status GpuModel::GetGrads(std::vector<float>* grads) {
  grads->resize(total_params_);
  RETURN_IF_ERROR(Cuda(cudaMemcpyAsync(grads->data(), grads_, total_params_ * sizeof(float), cudaMemcpyDeviceToHost,
                                       stream_),
                       "download grads"));
  return Cuda(cudaStreamSynchronize(stream_), "download grads");
}

absl::Status GpuModel::ZeroGrads() {
  return Cuda(cudaMemsetAsync(grads_, 0, total_params_ * sizeof(float), stream_), "zero grads");
}

absl::StatusOr<double> GpuModel::Forward(const int32_t* tokens, const int32_t* targets) {
  const int n = batch_ * seq_, c = config_.d_model, f = config_.d_ff, h = config_.heads, d = config_.head_dim();
  const size_t nc = static_cast<size_t>(n) * c;
  RETURN_IF_ERROR(Cuda(cudaMemcpyAsync(tokens_, tokens, n * sizeof(int32_t), cudaMemcpyHostToDevice, stream_), "tokens"));
  RETURN_IF_ERROR(Cuda(cudaMemcpyAsync(targets_, targets, n * sizeof(int32_t), cudaMemcpyHostToDevice, stream_),
                       "targets"));
  int counted = 0;
  for (int i = 0; i < n; ++i) counted += targets[i] >= 0;
  Timed(kElementwise, [&] { EmbeddingForward(x_, tokens_, W(embed_), n, c, config_.vocab, stream_); return 0; });
  for (int l = 0; l < config_.layers; ++l) {
    const Layer& w = layers_[l];
    const Acts& a = acts_[l];
    RETURN_IF_ERROR(Cuda(cudaMemcpyAsync(a.x_in, x_, nc * sizeof(float), cudaMemcpyDeviceToDevice, stream_), "x_in"));
    Timed(kElementwise, [&] { RmsNormForward(a.h1, a.rstd1, x_, M(w.attn_norm), n, c, kNormEps, stream_); return 0; });
    RETURN_IF_ERROR(Timed(kGemm, [&] { return gemm_->Forward(a.q, a.h1, W(w.wq), n, c, c, stream_); }));
    RETURN_IF_ERROR(Timed(kGemm, [&] { return gemm_->Forward(a.k, a.h1, W(w.wk), n, c, c, stream_); }));
    RETURN_IF_ERROR(Timed(kGemm, [&] { return gemm_->Forward(a.v, a.h1, W(w.wv), n, c, c, stream_); }));
    Timed(kElementwise, [&] { RopeForward(a.q, batch_, seq_, h, d, kRopeBase, stream_); return 0; });
    Timed(kElementwise, [&] { RopeForward(a.k, batch_, seq_, h, d, kRopeBase, stream_); return 0; });
    RETURN_IF_ERROR(Timed(kAttention, [&] {
      return Cuda(AttentionForward(a.a, a.lse, a.q, a.k, a.v, batch_, seq_, h, d, stream_), "attention forward");
    }));
    RETURN_IF_ERROR(Timed(kGemm, [&] { return gemm_->Forward(tmp_, a.a, W(w.wo), n, c, c, stream_); }));
    Timed(kElementwise, [&] { AddInto(x_, tmp_, static_cast<int64_t>(nc), stream_); return 0; });
    RETURN_IF_ERROR(Cuda(cudaMemcpyAsync(a.x_mid, x_, nc * sizeof(float), cudaMemcpyDeviceToDevice, stream_), "x_mid"));
    Timed(kElementwise, [&] { RmsNormForward(a.h2, a.rstd2, x_, M(w.mlp_norm), n, c, kNormEps, stream_); return 0; });
    RETURN_IF_ERROR(Timed(kGemm, [&] { return gemm_->Forward(a.g, a.h2, W(w.w1), n, c, f, stream_); }));
    RETURN_IF_ERROR(Timed(kGemm, [&] { return gemm_->Forward(a.u, a.h2, W(w.w3), n, c, f, stream_); }));
    Timed(kElementwise, [&] { SwiGluForward(a.s, a.g, a.u, n, f, stream_); return 0; });
    RETURN_IF_ERROR(Timed(kGemm, [&] { return gemm_->Forward(tmp_, a.s, W(w.w2), n, f, c, stream_); }));
    Timed(kElementwise, [&] { AddInto(x_, tmp_, static_cast<int64_t>(nc), stream_); return 0; });
  }
  RETURN_IF_ERROR(Cuda(cudaMemcpyAsync(x_out_, x_, nc * sizeof(float), cudaMemcpyDeviceToDevice, stream_), "x_out"));
  Timed(kElementwise, [&] { RmsNormForward(xf_, rstd_f_, x_, M(final_norm_), n, c, kNormEps, stream_); return 0; });
  RETURN_IF_ERROR(Timed(kGemm, [&] { return gemm_->Forward(logits_, xf_, W(head_), n, c, config_.vocab, stream_); }));
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
  auto zero = [this](Bf16* p, size_t count) { return Cuda(cudaMemsetAsync(p, 0, count * sizeof(Bf16), stream_), "zero"); };
  RETURN_IF_ERROR(zero(dxf_, nc));
  RETURN_IF_ERROR(Timed(kGemm, [&] { return gemm_->Backward(dxf_, G(head_), dlogits_, xf_, W(head_), n, c, config_.vocab, stream_); }));
  RETURN_IF_ERROR(Cuda(cudaMemsetAsync(dx_, 0, nc * sizeof(float), stream_), "zero dx"));
  Timed(kElementwise, [&] { RmsNormBackward(dx_, G(final_norm_), dxf_, x_out_, M(final_norm_), rstd_f_, n, c, stream_); return 0; });
  for (int l = config_.layers; l-- > 0;) {
    const Layer& w = layers_[l];
    const Acts& a = acts_[l];
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
    Timed(kElementwise, [&] { RmsNormBackward(dx_, G(w.mlp_norm), dh_, a.x_mid, M(w.mlp_norm), a.rstd2, n, c, stream_); return 0; });
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
    Timed(kElementwise, [&] { RmsNormBackward(dx_, G(w.attn_norm), dh_, a.x_in, M(w.attn_norm), a.rstd1, n, c, stream_); return 0; });
  }
  Timed(kElementwise, [&] { EmbeddingBackward(G(embed_), dx_, tokens_, n, c, config_.vocab, stream_); return 0; });
  RETURN_IF_ERROR(Cuda(cudaGetLastError(), "backward kernels"));
  return Cuda(cudaStreamSynchronize(stream_), "backward");
}

absl::StatusOr<double> GpuModel::GradNorm() {
  RETURN_IF_ERROR(Cuda(cudaMemsetAsync(norm_, 0, sizeof(float), stream_), "zero norm"));
  SumSquares(grads_, static_cast<int64_t>(total_params_), norm_, stream_);
  float sum = 0;
  RETURN_IF_ERROR(Cuda(cudaMemcpyAsync(&sum, norm_, sizeof(float), cudaMemcpyDeviceToHost, stream_), "norm"));
  RETURN_IF_ERROR(Cuda(cudaStreamSynchronize(stream_), "norm"));
  return std::sqrt(static_cast<double>(sum));
}

absl::Status GpuModel::AdamWStep(double lr, int64_t step, const AdamWOptions& options, double grad_scale) {
  for (size_t e = 0; e < layout_.size(); ++e) {
    AdamWParams p;
    p.lr = static_cast<float>(lr);
    p.beta1 = static_cast<float>(options.beta1);
    p.beta2 = static_cast<float>(options.beta2);
    p.eps = static_cast<float>(options.eps);
    p.weight_decay = static_cast<float>(options.weight_decay);
    p.step = step;
    p.grad_scale = static_cast<float>(grad_scale);
    p.decay = layout_[e].shape.size() > 1;
    const size_t off = layout_[e].offset;
    Timed(kOptimizer, [&] { AdamW(master_ + off, m_ + off, v_ + off, weights_ + off, grads_ + off, static_cast<int64_t>(layout_[e].count), p,
          stream_); return 0; });
  }
  RETURN_IF_ERROR(Cuda(cudaGetLastError(), "adamw"));
  return Cuda(cudaStreamSynchronize(stream_), "adamw");
}

}  // namespace tierd::trainer::gpu
