#include "trainer_ref/model.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "absl/strings/str_format.h"
#include "trainer_ref/cpu_ops.h"

namespace tierd::trainer {

std::vector<TensorLayout> ParamLayout(const ModelConfig& c) {
  std::vector<TensorLayout> out;
  size_t offset = 0;
  auto add = [&](const std::string& name, std::vector<int64_t> shape) {
    size_t count = 1;
    for (int64_t d : shape) count *= static_cast<size_t>(d);
    out.push_back({name, std::move(shape), offset, count});
    offset += count;
  };
  const int64_t cc = c.d_model, f = c.d_ff, v = c.vocab, qd = c.q_dim(), kd = c.kv_dim();
  add("embed.w", {v, cc});
  for (int l = 0; l < c.layers; ++l) {
    const std::string p = absl::StrFormat("layers.%d.", l);
    add(p + "attn_norm.w", {cc});
    add(p + "attn.wq", {qd, cc});
    add(p + "attn.wk", {kd, cc});
    add(p + "attn.wv", {kd, cc});
    if (c.qkv_bias) {
      add(p + "attn.bq", {qd});
      add(p + "attn.bk", {kd});
      add(p + "attn.bv", {kd});
    }
    add(p + "attn.wo", {cc, qd});
    add(p + "mlp_norm.w", {cc});
    add(p + "mlp.w1", {f, cc});
    add(p + "mlp.w3", {f, cc});
    add(p + "mlp.w2", {cc, f});
  }
  add("final_norm.w", {cc});
  if (!c.tied_embeddings) add("head.w", {v, cc});
  return out;
}

ParamEntries ParamEntriesOf(const ModelConfig& config) {
  // The order ParamLayout adds them in.
  ParamEntries out;
  size_t i = 0;
  out.embed = i++;
  for (int l = 0; l < config.layers; ++l) {
    LayerEntries layer;
    for (size_t* field : {&layer.attn_norm, &layer.wq, &layer.wk, &layer.wv}) *field = i++;
    if (config.qkv_bias) {
      for (size_t* field : {&layer.bq, &layer.bk, &layer.bv}) *field = i++;
    }
    for (size_t* field : {&layer.wo, &layer.mlp_norm, &layer.w1, &layer.w3, &layer.w2}) *field = i++;
    out.layers.push_back(layer);
  }
  out.final_norm = i++;
  out.head = config.tied_embeddings ? out.embed : i++;
  return out;
}

std::vector<ParamGroup> ParamGroups(const ModelConfig& config) {
  const ParamEntries e = ParamEntriesOf(config);
  const size_t entries = ParamLayout(config).size();
  std::vector<ParamGroup> out;
  auto range = [](size_t from, size_t to) {  // entries [from, to)
    std::vector<size_t> v;
    for (size_t i = from; i < to; ++i) v.push_back(i);
    return v;
  };
  out.push_back({"embed", {e.embed}});
  for (int l = 0; l < config.layers; ++l) {
    const size_t to = l + 1 < config.layers ? e.layers[l + 1].attn_norm : e.final_norm;
    out.push_back({absl::StrFormat("layers.%d", l), range(e.layers[l].attn_norm, to)});
  }
  out.push_back({"final", range(e.final_norm, entries)});  // the head too, untied
  return out;
}

bool IsBias(const TensorLayout& t) { return t.name.find(".attn.b") != std::string::npos; }

int HeadRowsAtOnce(const ModelConfig& config, int rows, size_t chunk_elements) {
  const size_t fit = std::max<size_t>(1, chunk_elements / static_cast<size_t>(config.vocab));
  return static_cast<int>(std::min<size_t>(static_cast<size_t>(rows), fit));
}

template <typename T>
Model<T>::Model(const ModelConfig& config, int batch, int seq, bool checkpointing, size_t logits_chunk_elements)
    : config_(config), batch_(batch), seq_(seq), layout_(ParamLayout(config)), checkpointing_(checkpointing) {
  const size_t total = layout_.back().offset + layout_.back().count;
  params_.assign(total, T(0));
  grads_.assign(total, T(0));
  const ParamEntries entries = ParamEntriesOf(config);
  embed_ = entries.embed;
  layers_ = entries.layers;
  final_norm_ = entries.final_norm;
  head_ = entries.head;
  groups_ = ParamGroups(config);
  for (const TensorLayout& t : layout_) {
    p_.push_back(params_.data() + t.offset);
    g_.push_back(grads_.data() + t.offset);
  }
  saved_layout_ = SavedLayout(config, batch, seq, checkpointing, logits_chunk_elements);
  for (const TensorLayout& t : saved_layout_) saved_storage_.emplace_back(t.count, T(0));
  for (auto& v : saved_storage_) saved_.push_back(v.data());
  if (checkpointing) recompute_.assign(LayerActsCount(), T(0));
  inv_freq_ = RopeInverseFrequencies(config);
  head_rows_ = HeadRowsAtOnce(config, batch * seq, logits_chunk_elements);
  if (head_rows_ < batch * seq) {
    logits_chunk_.assign(static_cast<size_t>(head_rows_) * config.vocab, T(0));
    dlogits_chunk_.assign(logits_chunk_.size(), T(0));
  }
}

namespace {
size_t LayerActsElements(const ModelConfig& config, int batch, int seq) {
  const size_t n = static_cast<size_t>(batch) * seq, c = config.d_model, f = config.d_ff;
  const size_t qd = config.q_dim(), kd = config.kv_dim();
  return 4 * n * c + 2 * n * qd + 2 * n * kd + 3 * n * f + 2 * n +
         static_cast<size_t>(batch) * config.heads * seq * seq;
}
}  // namespace

std::vector<TensorLayout> SavedLayout(const ModelConfig& config, int batch, int seq, bool checkpointing,
                                      size_t logits_chunk_elements) {
  const size_t n = static_cast<size_t>(batch) * seq, c = config.d_model;
  std::vector<TensorLayout> out;
  for (int l = 0; l < config.layers; ++l) {
    out.push_back({absl::StrFormat("act.layers.%d", l), {}, 0,
                   checkpointing ? n * c : LayerActsElements(config, batch, seq)});
  }
  const bool logits = HeadRowsAtOnce(config, static_cast<int>(n), logits_chunk_elements) == static_cast<int>(n);
  out.push_back({"act.head", {}, 0, 2 * n * c + n + (logits ? n * config.vocab : 0)});
  for (TensorLayout& t : out) t.shape = {static_cast<int64_t>(t.count)};
  return out;
}

template <typename T>
size_t Model<T>::LayerActsCount() const {
  return LayerActsElements(config_, batch_, seq_);
}

template <typename T>
typename Model<T>::LayerActs Model<T>::CarveLayer(T* base) const {
  const size_t n = static_cast<size_t>(batch_) * seq_, c = config_.d_model, f = config_.d_ff;
  const size_t qd = config_.q_dim(), kd = config_.kv_dim();
  auto take = [&base](size_t count) {
    T* p = base;
    base += count;
    return p;
  };
  LayerActs a;
  for (T** v : {&a.x_in, &a.h1, &a.x_mid, &a.h2}) *v = take(n * c);
  for (T** v : {&a.q, &a.a}) *v = take(n * qd);
  for (T** v : {&a.k, &a.v}) *v = take(n * kd);
  for (T** v : {&a.g, &a.u, &a.s}) *v = take(n * f);
  a.rstd1 = take(n);
  a.rstd2 = take(n);
  a.att = take(static_cast<size_t>(batch_) * config_.heads * seq_ * seq_);
  return a;
}

template <typename T>
typename Model<T>::HeadActs Model<T>::CarveHead(T* base) const {
  const size_t n = static_cast<size_t>(batch_) * seq_, c = config_.d_model;
  const bool logits = head_rows_ == batch_ * seq_;
  return HeadActs{base, base + n * c, base + 2 * n * c, logits ? base + 2 * n * c + n : nullptr};
}

template <typename T>
void Model<T>::InitParams(uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, 0.02);
  const double residual_scale = 1.0 / std::sqrt(2.0 * config_.layers);
  for (const TensorLayout& t : layout_) {
    const bool norm = t.shape.size() == 1;
    const bool residual_out = t.name.find("attn.wo") != std::string::npos || t.name.find("mlp.w2") != std::string::npos;
    const bool bias = IsBias(t);
    for (size_t i = 0; i < t.count; ++i) {
      params_[t.offset + i] = bias ? T(0) : norm ? T(1) : T(normal(rng) * (residual_out ? residual_scale : 1.0));
    }
  }
}

template <typename T>
void Model<T>::LastLogits(std::vector<T>* out) {
  const int n = batch_ * seq_, last = config_.layers + 1;
  out->assign(static_cast<size_t>(n) * config_.vocab, T(0));
  Enter(last, false);
  const HeadActs hd = CarveHead(saved_[SavedOf(last)]);
  cpu::MatmulForward(out->data(), hd.xf, P(head_), n, config_.d_model, config_.vocab);
  Leave(last, false);
}

template <typename T>
void Model<T>::ZeroGrads() {
  std::fill(grads_.begin(), grads_.end(), T(0));
}

template <typename T>
void Model<T>::LayerForward(const Layer& w, const LayerActs& a, std::vector<T>& x, std::vector<T>& tmp) {
  const int n = batch_ * seq_, c = config_.d_model, f = config_.d_ff, h = config_.heads, d = config_.head_dim();
  const int kvh = config_.kv_head_count(), qd = config_.q_dim(), kd = config_.kv_dim();
  std::copy(x.begin(), x.end(), a.x_in);
  cpu::RmsNormForward(a.h1, a.rstd1, x.data(), P(w.attn_norm), n, c, T(config_.norm_eps));
  cpu::MatmulForward(a.q, a.h1, P(w.wq), n, c, qd);
  cpu::MatmulForward(a.k, a.h1, P(w.wk), n, c, kd);
  cpu::MatmulForward(a.v, a.h1, P(w.wv), n, c, kd);
  if (config_.qkv_bias) {
    cpu::BiasForward(a.q, P(w.bq), n, qd);
    cpu::BiasForward(a.k, P(w.bk), n, kd);
    cpu::BiasForward(a.v, P(w.bv), n, kd);
  }
  cpu::RopeForward(a.q, batch_, seq_, h, d, inv_freq_.data());
  cpu::RopeForward(a.k, batch_, seq_, kvh, d, inv_freq_.data());
  cpu::AttentionForward(a.a, a.att, a.q, a.k, a.v, batch_, seq_, h, kvh, d);
  cpu::MatmulForward(tmp.data(), a.a, P(w.wo), n, qd, c);
  for (size_t i = 0; i < x.size(); ++i) x[i] += tmp[i];
  std::copy(x.begin(), x.end(), a.x_mid);
  cpu::RmsNormForward(a.h2, a.rstd2, x.data(), P(w.mlp_norm), n, c, T(config_.norm_eps));
  cpu::MatmulForward(a.g, a.h2, P(w.w1), n, c, f);
  cpu::MatmulForward(a.u, a.h2, P(w.w3), n, c, f);
  cpu::SwiGluForward(a.s, a.g, a.u, n, f);
  cpu::MatmulForward(tmp.data(), a.s, P(w.w2), n, f, c);
  for (size_t i = 0; i < x.size(); ++i) x[i] += tmp[i];
}

template <typename T>
T Model<T>::Forward(const int32_t* tokens, const int32_t* targets) {
  const int n = batch_ * seq_, c = config_.d_model;
  tokens_.assign(tokens, tokens + n);
  targets_.assign(targets, targets + n);
  std::vector<T> x(static_cast<size_t>(n) * c), tmp(static_cast<size_t>(n) * c);
  Enter(0, false);
  cpu::EmbeddingForward(x.data(), tokens, P(embed_), n, c);
  Leave(0, false);
  for (int l = 0; l < config_.layers; ++l) {
    Enter(l + 1, false);
    T* saved = saved_[SavedOf(l + 1)];
    if (checkpointing_) {
      std::copy(x.begin(), x.end(), saved);  // the layer's input is all it keeps
      LayerForward(layers_[l], CarveLayer(recompute_.data()), x, tmp);
    } else {
      LayerForward(layers_[l], CarveLayer(saved), x, tmp);
    }
    Leave(l + 1, false);
  }
  const int last = config_.layers + 1;
  Enter(last, false);
  const HeadActs hd = CarveHead(saved_[SavedOf(last)]);
  std::copy(x.begin(), x.end(), hd.x_out);
  cpu::RmsNormForward(hd.xf, hd.rstd_f, x.data(), P(final_norm_), n, c, T(config_.norm_eps));
  const T loss = HeadLoss(hd, targets);
  Leave(last, false);
  return loss;
}

template <typename T>
T Model<T>::HeadLoss(const HeadActs& hd, const int32_t* targets) {
  const int n = batch_ * seq_, c = config_.d_model, v = config_.vocab;
  int counted = 0;
  for (int i = 0; i < n; ++i) counted += targets[i] >= 0;
  T total = 0;
  for (int row = 0; row < n; row += head_rows_) {
    const int rows = std::min(head_rows_, n - row);
    T* logits = hd.logits != nullptr ? hd.logits : logits_chunk_.data();
    cpu::MatmulForward(logits, hd.xf + static_cast<size_t>(row) * c, P(head_), rows, c, v);
    total = cpu::CrossEntropySum(logits, targets + row, rows, v, total);
  }
  return counted == 0 ? T(0) : total / counted;
}

template <typename T>
Model<T>::BackwardScratch::BackwardScratch(size_t nc, size_t nf, size_t nq, size_t nk)
    : ds(nf), dg(nf), du(nf), dh(nc), da(nq), dq(nq), dk(nk), dv(nk), x(nc), tmp(nc) {}

template <typename T>
void Model<T>::HeadBackward(const HeadActs& hd, const int32_t* targets, std::vector<T>& dx) {
  const int n = batch_ * seq_, c = config_.d_model, v = config_.vocab;
  std::vector<T> dxf(static_cast<size_t>(n) * c, T(0));
  std::fill(dx.begin(), dx.end(), T(0));
  int counted = 0;
  for (int i = 0; i < n; ++i) counted += targets[i] >= 0;
  if (hd.logits != nullptr) {  // kept whole by the forward
    std::vector<T> dlogits(static_cast<size_t>(n) * v);
    cpu::CrossEntropyBackward(dlogits.data(), hd.logits, targets, n, v, counted);
    cpu::MatmulBackward(dxf.data(), G(head_), dlogits.data(), hd.xf, P(head_), n, c, v);
  } else {  // the logits again, a chunk of rows at a time (the rows' order, the same sums)
    for (int row = 0; row < n; row += head_rows_) {
      const int rows = std::min(head_rows_, n - row);
      const T* xf = hd.xf + static_cast<size_t>(row) * c;
      cpu::MatmulForward(logits_chunk_.data(), xf, P(head_), rows, c, v);
      cpu::CrossEntropyBackward(dlogits_chunk_.data(), logits_chunk_.data(), targets + row, rows, v, counted);
      cpu::MatmulBackward(dxf.data() + static_cast<size_t>(row) * c, G(head_), dlogits_chunk_.data(), xf, P(head_),
                          rows, c, v);
    }
  }
  cpu::RmsNormBackward(dx.data(), G(final_norm_), dxf.data(), hd.x_out, P(final_norm_), hd.rstd_f, n, c);
}

template <typename T>
void Model<T>::LayerBackward(int l, T* saved, std::vector<T>& dx, BackwardScratch& s) {
  const int n = batch_ * seq_, c = config_.d_model, f = config_.d_ff, h = config_.heads, d = config_.head_dim();
  const int kvh = config_.kv_head_count(), qd = config_.q_dim(), kd = config_.kv_dim();
  const Layer& w = layers_[l];
  LayerActs a;
  if (checkpointing_) {  // recompute the layer's forward from its input
    std::copy(saved, saved + s.x.size(), s.x.begin());
    a = CarveLayer(recompute_.data());
    LayerForward(w, a, s.x, s.tmp);
  } else {
    a = CarveLayer(saved);
  }
  // x_out = x_mid + swiglu(h2 W1^T, h2 W3^T) W2^T
  std::fill(s.ds.begin(), s.ds.end(), T(0));
  cpu::MatmulBackward(s.ds.data(), G(w.w2), dx.data(), a.s, P(w.w2), n, f, c);
  std::fill(s.dg.begin(), s.dg.end(), T(0));
  std::fill(s.du.begin(), s.du.end(), T(0));
  cpu::SwiGluBackward(s.dg.data(), s.du.data(), s.ds.data(), a.g, a.u, n, f);
  std::fill(s.dh.begin(), s.dh.end(), T(0));
  cpu::MatmulBackward(s.dh.data(), G(w.w1), s.dg.data(), a.h2, P(w.w1), n, c, f);
  cpu::MatmulBackward(s.dh.data(), G(w.w3), s.du.data(), a.h2, P(w.w3), n, c, f);
  cpu::RmsNormBackward(dx.data(), G(w.mlp_norm), s.dh.data(), a.x_mid, P(w.mlp_norm), a.rstd2, n, c);
  // x_mid = x_in + attention(rope(h1 Wq^T), rope(h1 Wk^T), h1 Wv^T) Wo^T
  std::fill(s.da.begin(), s.da.end(), T(0));
  cpu::MatmulBackward(s.da.data(), G(w.wo), dx.data(), a.a, P(w.wo), n, qd, c);
  for (auto* v : {&s.dq, &s.dk, &s.dv}) std::fill(v->begin(), v->end(), T(0));
  cpu::AttentionBackward(s.dq.data(), s.dk.data(), s.dv.data(), s.da.data(), a.att, a.q, a.k, a.v, batch_, seq_, h,
                         kvh, d);
  cpu::RopeBackward(s.dq.data(), batch_, seq_, h, d, inv_freq_.data());
  cpu::RopeBackward(s.dk.data(), batch_, seq_, kvh, d, inv_freq_.data());
  if (config_.qkv_bias) {
    cpu::BiasBackward(G(w.bq), s.dq.data(), n, qd);
    cpu::BiasBackward(G(w.bk), s.dk.data(), n, kd);
    cpu::BiasBackward(G(w.bv), s.dv.data(), n, kd);
  }
  std::fill(s.dh.begin(), s.dh.end(), T(0));
  cpu::MatmulBackward(s.dh.data(), G(w.wq), s.dq.data(), a.h1, P(w.wq), n, c, qd);
  cpu::MatmulBackward(s.dh.data(), G(w.wk), s.dk.data(), a.h1, P(w.wk), n, c, kd);
  cpu::MatmulBackward(s.dh.data(), G(w.wv), s.dv.data(), a.h1, P(w.wv), n, c, kd);
  cpu::RmsNormBackward(dx.data(), G(w.attn_norm), s.dh.data(), a.x_in, P(w.attn_norm), a.rstd1, n, c);
}

template <typename T>
void Model<T>::Backward() {
  const int n = batch_ * seq_, c = config_.d_model, f = config_.d_ff;
  std::vector<T> dx(static_cast<size_t>(n) * c, T(0));
  const int last = config_.layers + 1;
  Enter(last, true);
  HeadBackward(CarveHead(saved_[SavedOf(last)]), targets_.data(), dx);
  Leave(last, true);
  BackwardScratch scratch(dx.size(), static_cast<size_t>(n) * f, static_cast<size_t>(n) * config_.q_dim(),
                          static_cast<size_t>(n) * config_.kv_dim());
  for (int l = config_.layers; l-- > 0;) {
    Enter(l + 1, true);
    LayerBackward(l, saved_[SavedOf(l + 1)], dx, scratch);
    Leave(l + 1, true);
  }
  Enter(0, true);
  cpu::EmbeddingBackward(G(embed_), dx.data(), tokens_.data(), n, c);
  Leave(0, true);
}

template <typename T>
std::vector<T> Model<T>::ForwardBackwardLayerMajor(const int32_t* tokens, const int32_t* targets, int micro_batches) {
  const int n = batch_ * seq_, c = config_.d_model, f = config_.d_ff, last = config_.layers + 1;
  const size_t nc = static_cast<size_t>(n) * c;
  // Per micro-batch: its residual stream, then its gradient; each layer's input (all that
  // is kept with checkpointing; without it, every activation the layer's backward reads).
  std::vector<std::vector<T>> x(micro_batches, std::vector<T>(nc)), dx(micro_batches, std::vector<T>(nc));
  const size_t kept = checkpointing_ ? nc : LayerActsCount();
  std::vector<std::vector<T>> saved(static_cast<size_t>(config_.layers) * micro_batches, std::vector<T>(kept));
  std::vector<T> tmp(nc);
  Enter(0, false);
  for (int m = 0; m < micro_batches; ++m) cpu::EmbeddingForward(x[m].data(), tokens + m * n, P(embed_), n, c);
  Leave(0, false);
  for (int l = 0; l < config_.layers; ++l) {
    Enter(l + 1, false);
    for (int m = 0; m < micro_batches; ++m) {
      T* keep = saved[static_cast<size_t>(l) * micro_batches + m].data();
      if (checkpointing_) std::copy(x[m].begin(), x[m].end(), keep);
      LayerForward(layers_[l], CarveLayer(checkpointing_ ? recompute_.data() : keep), x[m], tmp);
    }
    Leave(l + 1, false);
  }
  // The head, forward and backward, one micro-batch at a time (its activations are reused).
  std::vector<T> losses(micro_batches);
  Enter(last, true);
  const HeadActs hd = CarveHead(saved_[SavedOf(last)]);
  for (int m = 0; m < micro_batches; ++m) {
    std::copy(x[m].begin(), x[m].end(), hd.x_out);
    cpu::RmsNormForward(hd.xf, hd.rstd_f, x[m].data(), P(final_norm_), n, c, T(config_.norm_eps));
    losses[m] = HeadLoss(hd, targets + m * n);
    HeadBackward(hd, targets + m * n, dx[m]);
  }
  Leave(last, true);
  BackwardScratch scratch(nc, static_cast<size_t>(n) * f, static_cast<size_t>(n) * config_.q_dim(),
                          static_cast<size_t>(n) * config_.kv_dim());
  for (int l = config_.layers; l-- > 0;) {
    Enter(l + 1, true);
    for (int m = 0; m < micro_batches; ++m) {
      LayerBackward(l, saved[static_cast<size_t>(l) * micro_batches + m].data(), dx[m], scratch);
    }
    Leave(l + 1, true);
  }
  Enter(0, true);
  for (int m = 0; m < micro_batches; ++m) cpu::EmbeddingBackward(G(embed_), dx[m].data(), tokens + m * n, n, c);
  Leave(0, true);
  return losses;
}

template <typename T>
std::vector<size_t> Model<T>::GroupEntries(int group) const {
  std::vector<size_t> entries = groups_[group].entries;
  if (group == config_.layers + 1 && config_.tied_embeddings) entries.push_back(embed_);  // the head reads it
  return entries;
}

template <typename T>
void Model<T>::Bind(size_t entry, T* param, T* grad) {
  p_[entry] = param;
  g_[entry] = grad;
}

template class Model<float>;
template class Model<double>;

}  // namespace tierd::trainer
