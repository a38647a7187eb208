// The optimizer's CPU reference: AdamW with decoupled weight decay, clipping by the global
// gradient norm, and a warmup + cosine learning-rate schedule. (The vectorised, threaded
// AdamW on the DRAM tier is host_adamw.h; this is the plain oracle.)
#ifndef TIERD_TRAINER_REF_OPTIMIZER_H_
#define TIERD_TRAINER_REF_OPTIMIZER_H_

#include <cstddef>
#include <cstdint>

namespace tierd::trainer {

struct AdamWOptions {
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8, weight_decay = 0.1;
};

// One step on n parameters: m, v are the moments (fp32, as the master state), `step` counts
// from 1 (bias correction). Weight decay is decoupled: p -= lr * wd * p, not added to g.
// `decay` false for tensors that are not decayed (norm weights).
void AdamWStep(float* params, const float* grads, float* m, float* v, size_t n, double lr, int64_t step,
               const AdamWOptions& options, bool decay);

// Lion (Chen et al., 2023, "Symbolic Discovery of Optimization Algorithms"): one moment, and
// an update of the same size for every element, the sign of a mix of the moment and the
// gradient:  c = b1 m + (1 - b1) g;  p -= lr (sign(c) + wd p);  m = b2 m + (1 - b2) g.
// A step's size does not follow the gradient's scale, so an element whose gradient arrives
// in bursts (a sparse sync's residual, sent every few steps) moves as often as a dense one.
// Its learning rate is typically 3-10x below AdamW's, its weight decay as much above.
struct LionOptions {
  double beta1 = 0.9, beta2 = 0.99, weight_decay = 0.1;
};
void LionStep(float* params, const float* grads, float* m, size_t n, double lr, const LionOptions& options, bool decay);

// Adafactor (Shazeer & Stern, 2018) as its users run it with an external learning rate
// (Hugging Face's relative_step=False, scale_parameter=False, warmup_init=False): no first
// moment; the second moment of a matrix (rows x cols) kept factored, as running means of g^2
// over its rows (rows values) and over its columns (cols values), so the state of a matrix
// is rows + cols floats instead of rows x cols; a vector keeps its own (n values). Per step:
//   b2 = 1 - step^decay_rate;  a = g^2 + eps1
//   matrix: R = b2 R + (1 - b2) mean_j a;  C = b2 C + (1 - b2) mean_i a;
//           u = g / sqrt(R_i / mean(R) * C_j)        vector: V = b2 V + (1 - b2) a;  u = g / sqrt(V)
//   u /= max(1, RMS(u) / clip_threshold);  p -= lr wd p (decoupled, as AdamW's);  p -= lr u
// The update is as large as Adam's (g / its RMS), so Adam's learning rate suits it.
struct AdafactorOptions {
  double decay_rate = -0.8, eps1 = 1e-30, clip_threshold = 1.0, weight_decay = 0.1;
};
// The state's floats of a tensor of `rows` x `cols` (cols 0: a vector of `rows` values).
inline size_t AdafactorStateCount(size_t rows, size_t cols) { return cols == 0 ? rows : rows + cols; }
// One step; `state` holds AdafactorStateCount(rows, cols) floats (R then C, or V), zeros at first.
void AdafactorStep(float* params, const float* grads, float* state, size_t rows, size_t cols, double lr, int64_t step,
                   const AdafactorOptions& options, bool decay);

// The global L2 norm of all gradients, and the factor (<= 1) that brings it to max_norm
// (1 when it is already within; also 1 for max_norm <= 0, which turns clipping off).
double GlobalNorm(const float* grads, size_t n);
double ClipFactor(double norm, double max_norm);

// Linear warmup over warmup_steps to max_lr, then cosine decay to min_lr at total_steps.
// step counts from 0; beyond total_steps it stays at min_lr.
double LearningRate(int64_t step, int64_t warmup_steps, int64_t total_steps, double max_lr, double min_lr);

}  // namespace tierd::trainer

#endif  // TIERD_TRAINER_REF_OPTIMIZER_H_
