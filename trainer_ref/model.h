// The reference trainer's decoder on the CPU: forward to the loss and backward to every
// parameter's gradient, composed from cpu_ops.h. Parameters and gradients live in one flat
// buffer each, laid out by ParamLayout (named tensors, in the names tierd leases them by:
// "embed.w", "layers.3.attn.wq", "final_norm.w", "head.w", ...).
//
// Per layer (pre-norm):  h = rmsnorm(x) ; q,k,v = h Wq^T, h Wk^T, h Wv^T ; rope(q, k)
//                        x += attention(q, k, v) Wo^T
//                        h = rmsnorm(x) ; x += (silu(h W1^T) * h W3^T) W2^T
// Then loss = cross_entropy(rmsnorm(x) Head^T, targets).
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

template <typename T>
class Model {
 public:
  // For micro-batches of `batch` sequences of `seq` tokens (seq <= config.max_seq).
  Model(const ModelConfig& config, int batch, int seq);

  // Weights ~ N(0, 0.02) (output projections scaled by 1/sqrt(2 layers)), norms 1.
  void InitParams(uint64_t seed);
  // The mean loss over the batch's counted targets (negative targets are ignored);
  // keeps what backward needs.
  T Forward(const int32_t* tokens, const int32_t* targets);
  // Adds d(loss)/d(param) into grads(), for the last Forward.
  void Backward();
  void ZeroGrads();

  // Where the tensors live. By default in params()/grads(), the flat buffers. A caller
  // that keeps them elsewhere (tierd's tiers) hooks each group of tensors — 0: the
  // embedding, 1..layers: a layer, layers + 1: the final norm and the head — as forward
  // and backward reach and leave it, and binds each entry's pointers in its `enter` hook.
  using GroupHook = std::function<void(int group, bool backward)>;
  void SetGroupHooks(GroupHook enter, GroupHook leave) {
    enter_ = std::move(enter);
    leave_ = std::move(leave);
  }
  std::vector<size_t> GroupEntries(int group) const;  // indices into layout()
  void Bind(size_t entry, T* param, T* grad);

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

  struct Layer {  // one layer's tensors: indices into layout_
    size_t attn_norm, wq, wk, wv, wo, mlp_norm, w1, w3, w2;
  };
  struct LayerActs {  // kept from forward for backward; N = batch * seq rows
    std::vector<T> x_in, h1, rstd1, q, k, v, att, a, x_mid, h2, rstd2, g, u, s;
  };

  ModelConfig config_;
  int batch_, seq_;
  std::vector<TensorLayout> layout_;
  std::vector<T> params_, grads_;
  std::vector<T*> p_, g_;  // per layout entry: where its parameter and gradient are now
  GroupHook enter_, leave_;
  size_t embed_ = 0, final_norm_ = 0, head_ = 0;
  std::vector<Layer> layers_;
  std::vector<LayerActs> acts_;
  std::vector<int32_t> tokens_, targets_;
  std::vector<T> x_out_, xf_, rstd_f_, logits_;
};

extern template class Model<float>;
extern template class Model<double>;

}  // namespace tierd::trainer

#endif  // TIERD_TRAINER_REF_MODEL_H_
