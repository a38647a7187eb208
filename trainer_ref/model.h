// The reference trainer's decoder on the CPU: forward to the loss and backward to every
// parameter's gradient, composed from cpu_ops.h. Parameters and gradients live in one flat
// buffer each, laid out by ParamLayout (named tensors, in the names tierd leases them by:
// "embed.w", "layers.3.attn.wq", "final_norm.w", "head.w", ...).
//
// Per layer (pre-norm):  h = rmsnorm(x) ; q,k,v = h Wq^T (+ bq), h Wk^T (+ bk), h Wv^T (+ bv)
//                        rope(q, k) ; x += attention(q, k, v) Wo^T
//                        h = rmsnorm(x) ; x += (silu(h W1^T) * h W3^T) W2^T
// Then loss = cross_entropy(rmsnorm(x) Head^T, targets), Head the embedding's matrix when the
// config ties them. q has H heads, k and v KV heads (grouped-query attention).
//
// RoPE rotates the pairs (2i, 2i+1) of a head; Hugging Face's Llama rotates (i, i + D/2), which
// is the same map once each head's rows of Wq and Wk (and bq, bk) are permuted: the loader and
// exporter (trainer_ref/hf) permute them, and the attention scores do not change.
//
// What forward keeps for backward (saved activations) is tensors too, one per group that
// has any, named like the parameters: "act.layers.3" (everything layer 3's backward reads;
// with activation checkpointing only its input, and backward recomputes the rest from it)
// and "act.head" (the final norm's input and output, and the logits). SavedLayout() lists
// them; by default they live in the model, or a caller binds them like the parameters.
#ifndef TIERD_TRAINER_REF_MODEL_H_
#define TIERD_TRAINER_REF_MODEL_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "trainer_ref/model_config.h"

namespace tierd::trainer {

struct TensorLayout {
  std::string name;
  std::vector<int64_t> shape;
  size_t offset = 0;  // in elements, into the flat buffer
  size_t count = 0;
};
std::vector<TensorLayout> ParamLayout(const ModelConfig& config);
// Where each tensor is in ParamLayout's order: indices into it, per layer and for the rest.
// bq, bk, bv are kNoEntry without biases; head is embed when the embeddings are tied.
constexpr size_t kNoEntry = ~size_t{0};
struct LayerEntries {
  size_t attn_norm, wq, wk, wv, wo, mlp_norm, w1, w3, w2;
  size_t bq = kNoEntry, bk = kNoEntry, bv = kNoEntry;
};
struct ParamEntries {
  size_t embed = 0, final_norm = 0, head = 0;
  std::vector<LayerEntries> layers;
};
// The head's logits are computed this many rows at a time (all of them when they fit
// kLogitsChunkElements), so a large vocabulary's logits never exist whole.
constexpr size_t kLogitsChunkElements = size_t{1} << 24;
int HeadRowsAtOnce(const ModelConfig& config, int rows, size_t chunk_elements = kLogitsChunkElements);
ParamEntries ParamEntriesOf(const ModelConfig& config);
// The parameters in the groups the trainers lease, step and checkpoint them by: 0 the
// embedding ("embed"), 1..L the layers ("layers.N"), L + 1 the final norm and the head
// ("final"; tied, the head's matrix is the embedding's and group 0 holds it). Each group's
// entries are ParamLayout's, in its order and contiguous.
struct ParamGroup {
  std::string name;
  std::vector<size_t> entries;
};
std::vector<ParamGroup> ParamGroups(const ModelConfig& config);

// A q/k/v bias ("layers.3.attn.bq"): 1-D like the norm weights, but initialised to zeros.
bool IsBias(const TensorLayout& t);
// The saved activations of a model for micro-batches of `batch` x `seq` (offsets are 0:
// each is its own tensor): "act.layers.0" .. "act.layers.{L-1}", then "act.head".
std::vector<TensorLayout> SavedLayout(const ModelConfig& config, int batch, int seq, bool checkpointing,
                                      size_t logits_chunk_elements = kLogitsChunkElements);

template <typename T>
class Model {
 public:
  // For micro-batches of `batch` sequences of `seq` tokens (seq <= config.max_seq).
  // `checkpointing`: keep only each layer's input; backward recomputes the layer's forward.
  // `logits_chunk_elements`: the head's logits a chunk of rows of at most this many at a time
  // (smaller in tests, to see the chunks).
  Model(const ModelConfig& config, int batch, int seq, bool checkpointing = false,
        size_t logits_chunk_elements = kLogitsChunkElements);

  // Weights ~ N(0, 0.02) (output projections scaled by 1/sqrt(2 layers)), norms 1.
  void InitParams(uint64_t seed);
  // The mean loss over the batch's counted targets (negative targets are ignored);
  // keeps what backward needs.
  T Forward(const int32_t* tokens, const int32_t* targets);
  // Adds d(loss)/d(param) into grads(), for the last Forward.
  void Backward();
  // `micro_batches` micro-batches (tokens and targets: micro_batches x batch x seq), layer
  // by layer: every micro-batch's forward through a group before the next group's, the
  // head's forward and backward per micro-batch, then every micro-batch's backward through
  // a layer before the layer below it. Each group is entered once per pass, whatever the
  // number of micro-batches. Adds the gradients into grads() exactly as micro_batches
  // Forward/Backward pairs do (each tensor's gradient accumulates in micro-batch order, the
  // same operations in the same order: the same bits); returns each micro-batch's loss.
  // Keeps every micro-batch's layer inputs (checkpointing) or activations meanwhile.
  std::vector<T> ForwardBackwardLayerMajor(const int32_t* tokens, const int32_t* targets, int micro_batches);
  void ZeroGrads();
  // The logits (N x V) of the last Forward, made again from its saved head input.
  void LastLogits(std::vector<T>* out);

  // Where the tensors live. By default in params()/grads(), the flat buffers. A caller
  // that keeps them elsewhere (tierd's tiers) hooks each group of tensors — 0: the
  // embedding, 1..layers: a layer, layers + 1: the final norm and the head (the embedding's
  // matrix when tied) — as forward and backward reach and leave it, and binds each entry's
  // pointers in its `enter` hook. GroupEntries are the tensors a group's computation uses:
  // ParamGroups' entries, and for the head's group with tied embeddings the embedding's matrix.
  using GroupHook = std::function<void(int group, bool backward)>;
  void SetGroupHooks(GroupHook enter, GroupHook leave) {
    enter_ = std::move(enter);
    leave_ = std::move(leave);
  }
  std::vector<size_t> GroupEntries(int group) const;  // indices into layout()
  void Bind(size_t entry, T* param, T* grad);
  // Saved activations: one tensor per group with any (offsets are into no buffer; 0).
  // Forward writes a group's tensor whole without reading it; backward reads it.
  const std::vector<TensorLayout>& saved_layout() const { return saved_layout_; }
  // The index into saved_layout() of `group`'s saved tensor, or -1 (the embedding).
  int SavedOf(int group) const { return group >= 1 ? group - 1 : -1; }
  void BindSaved(size_t index, T* data) { saved_[index] = data; }

  std::vector<T>& params() { return params_; }
  const std::vector<T>& params() const { return params_; }
  std::vector<T>& grads() { return grads_; }
  const std::vector<TensorLayout>& layout() const { return layout_; }
  const ModelConfig& config() const { return config_; }

 private:
  T* P(size_t entry) const { return p_[entry]; }
  T* G(size_t entry) const { return g_[entry]; }
  void Enter(int group, bool backward) {
    if (enter_) enter_(group, backward);
  }
  void Leave(int group, bool backward) {
    if (leave_) leave_(group, backward);
  }

  using Layer = LayerEntries;  // one layer's tensors: indices into layout_
  struct LayerActs {  // what a layer's backward reads; N = batch * seq rows
    T *x_in, *h1, *rstd1, *q, *k, *v, *att, *a, *x_mid, *h2, *rstd2, *g, *u, *s;
  };
  struct HeadActs {
    T *x_out, *xf, *rstd_f;
    T* logits;  // all rows' when they fit one chunk (HeadRowsAtOnce), else null: recomputed
  };
  // The head from its saved input: the loss over the micro-batch (chunk by chunk).
  T HeadLoss(const HeadActs& hd, const int32_t* targets);
  size_t LayerActsCount() const;
  LayerActs CarveLayer(T* base) const;
  HeadActs CarveHead(T* base) const;
  // One layer's forward from `x` (updated in place to the layer's output) into `a`.
  void LayerForward(const Layer& w, const LayerActs& a, std::vector<T>& x, std::vector<T>& tmp);
  // Buffers of one layer's backward.
  struct BackwardScratch {
    BackwardScratch(size_t nc, size_t nf, size_t nq, size_t nk);
    std::vector<T> ds, dg, du, dh, da, dq, dk, dv, x, tmp;
  };
  // dx (the gradient of the head's input) from the head's saved activations; adds into the
  // final norm's and the head's gradients.
  void HeadBackward(const HeadActs& hd, const int32_t* targets, std::vector<T>& dx);
  // Layer l's backward from what it saved (its input with checkpointing: recomputed first):
  // dx turns from the gradient of its output into that of its input; adds into its gradients.
  void LayerBackward(int l, T* saved, std::vector<T>& dx, BackwardScratch& scratch);

  ModelConfig config_;
  int batch_, seq_;
  std::vector<TensorLayout> layout_;
  std::vector<T> params_, grads_;
  std::vector<T*> p_, g_;  // per layout entry: where its parameter and gradient are now
  GroupHook enter_, leave_;
  size_t embed_ = 0, final_norm_ = 0, head_ = 0;
  std::vector<Layer> layers_;
  std::vector<ParamGroup> groups_;  // ParamGroups
  bool checkpointing_ = false;
  std::vector<TensorLayout> saved_layout_;
  std::vector<std::vector<T>> saved_storage_;  // the default home of the saved tensors
  std::vector<T*> saved_;                      // where each is now
  std::vector<T> recompute_;                   // one layer's activations, recomputed (checkpointing)
  std::vector<double> inv_freq_;               // RoPE's (RopeInverseFrequencies)
  int head_rows_ = 0;                          // HeadRowsAtOnce
  std::vector<T> logits_chunk_, dlogits_chunk_;  // head_rows_ x V
  std::vector<int32_t> tokens_, targets_;
};

extern template class Model<float>;
extern template class Model<double>;

}  // namespace tierd::trainer

#endif  // TIERD_TRAINER_REF_MODEL_H_
