// The reference trainer's ops on the CPU, forward and backward, written plainly (the oracle
// the CUDA kernels are checked against, like llm.c's train_gpt2.c). Row-major; shapes in
// the comments: N = B*T rows, C channels, H query heads and KV key/value heads of D each
// (grouped-query attention: query head h reads key/value head h / (H / KV)), F MLP width,
// V vocabulary.
// Backward functions ADD into the gradients they produce (so gradients accumulate over
// micro-batches and over the several uses of a tensor); callers zero them when they start.
// Instantiated for float (training) and double (gradient checks).
#ifndef TIERD_TRAINER_REF_CPU_OPS_H_
#define TIERD_TRAINER_REF_CPU_OPS_H_

#include <cstdint>

namespace tierd::trainer::cpu {

// out (N, C) = wte[tokens] with wte (V, C).
template <typename T>
void EmbeddingForward(T* out, const int32_t* tokens, const T* wte, int n, int c);
template <typename T>
void EmbeddingBackward(T* dwte, const T* dout, const int32_t* tokens, int n, int c);

// out (N, C) = in * rstd * weight, rstd (N) = 1 / sqrt(mean(in^2) + eps), kept for backward.
template <typename T>
void RmsNormForward(T* out, T* rstd, const T* in, const T* weight, int n, int c, T eps);
template <typename T>
void RmsNormBackward(T* din, T* dweight, const T* dout, const T* in, const T* weight, const T* rstd, int n, int c);

// out (N, OC) = in (N, IC) x weight^T, weight (OC, IC) (nn.Linear without bias).
template <typename T>
void MatmulForward(T* out, const T* in, const T* weight, int n, int ic, int oc);
template <typename T>
void MatmulBackward(T* din, T* dweight, const T* dout, const T* in, const T* weight, int n, int ic, int oc);

// out (N, OC) += bias (OC) on every row; backward: dbias += dout summed over the rows.
template <typename T>
void BiasForward(T* out, const T* bias, int n, int oc);
template <typename T>
void BiasBackward(T* dbias, const T* dout, int n, int oc);

// Rotary position embedding in place on x (B*T, H, D): the pair (2i, 2i+1) of every head
// turns by t * inv_freq[i] (D/2 of them: RopeInverseFrequencies), t the row's position in its
// sequence (row % T). Backward turns the gradient back.
template <typename T>
void RopeForward(T* x, int b, int t, int h, int d, const double* inv_freq);
template <typename T>
void RopeBackward(T* dx, int b, int t, int h, int d, const double* inv_freq);

// Causal attention. q, out: (B, T, H*D); k, v: (B, T, KV*D), KV dividing H; att (B, H, T, T):
// the softmax probabilities, kept for backward (rows beyond the diagonal are zero).
template <typename T>
void AttentionForward(T* out, T* att, const T* q, const T* k, const T* v, int b, int t, int h, int kv, int d);
template <typename T>
void AttentionBackward(T* dq, T* dk, T* dv, const T* dout, const T* att, const T* q, const T* k, const T* v, int b,
                       int t, int h, int kv, int d);

// SwiGLU: out (N, F) = silu(gate) * up.
template <typename T>
void SwiGluForward(T* out, const T* gate, const T* up, int n, int f);
template <typename T>
void SwiGluBackward(T* dgate, T* dup, const T* dout, const T* gate, const T* up, int n, int f);

// Mean cross-entropy of logits (N, V) against targets (N); a negative target is ignored.
// Returns the loss; backward writes (not adds) dlogits = (softmax - onehot) / counted rows.
template <typename T>
T CrossEntropyForward(const T* logits, const int32_t* targets, int n, int v);
template <typename T>
void CrossEntropyBackward(T* dlogits, const T* logits, const int32_t* targets, int n, int v);
// The same a block of rows at a time (the head's logits in chunks): `total` plus each counted
// row's loss, in row order; dlogits written for the block with `counted` the divisor (the
// rows counted over the whole batch).
template <typename T>
T CrossEntropySum(const T* logits, const int32_t* targets, int n, int v, T total);
template <typename T>
void CrossEntropyBackward(T* dlogits, const T* logits, const int32_t* targets, int n, int v, int counted);

}  // namespace tierd::trainer::cpu

#endif  // TIERD_TRAINER_REF_CPU_OPS_H_
