// Shapes of the reference trainer's GPT-style decoder (Llama-style: RMSNorm, RoPE, causal
// multi-head attention, SwiGLU MLP, untied output head) and what they cost in memory.
#ifndef TIERD_TRAINER_REF_MODEL_CONFIG_H_
#define TIERD_TRAINER_REF_MODEL_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tierd::trainer {

struct ModelConfig {
  std::string name;
  int layers = 0;
  int d_model = 0;  // C
  int heads = 0;    // H; head size C / H
  int d_ff = 0;     // the MLP's hidden width (SwiGLU: two up projections of this width)
  int vocab = 0;    // V
  int max_seq = 0;  // T at most (RoPE needs no table of positions)
  double norm_eps = 1e-5;       // RMSNorm's epsilon
  double rope_theta = 10000.0;  // RoPE's base

  int head_dim() const { return d_model / heads; }
  // Per layer: attention (wq, wk, wv, wo: 4 C^2), MLP (w1, w3: C x F up, w2: F x C down),
  // two RMSNorm weights (2 C). Plus token embedding (V C), final norm (C), head (V C).
  uint64_t LayerParams() const;
  uint64_t Params() const;
};

// tiny (runs in seconds on two cores; byte-level vocabulary), 124m, 350m, 1.3b, 7b, 13b.
// INVALID_ARGUMENT naming the presets otherwise.
absl::StatusOr<ModelConfig> ModelPreset(const std::string& name);
// INVALID_ARGUMENT when a dimension is not positive or the heads do not divide d_model
// evenly into an even head size (RoPE rotates pairs).
absl::Status ValidateConfig(const ModelConfig& config);

// A one-line description: "1.3b: 24 layers, d_model 2048, 16 heads, d_ff 5504, vocab 32000, 1.35B parameters".
std::string DescribeConfig(const ModelConfig& config);

// Which decoder layers run their linear maps in FP8 under --precision=fp8: all but those
// whose name ("layers.0" ... "layers.<L-1>") fully matches `bf16_layers` (ECMAScript regex;
// "" matches none), e.g. "layers\.(0|23)" keeps the first and last of 24 in bf16.
// INVALID_ARGUMENT for a regex that does not parse.
absl::StatusOr<std::vector<bool>> Fp8Layers(const ModelConfig& config, const std::string& bf16_layers);

// --precision=auto on a GPU: FP8 for the layers' matmuls where the GPU has FP8 tensor cores
// (compute capability 8.9 or later) and every matmul dimension is a multiple of 16 (`rows`:
// batch x sequence), else bf16; `why` says which held, in words for the precision line.
struct AutoPrecision {
  bool fp8 = false;
  std::string why;
};
AutoPrecision ChooseAutoPrecision(const ModelConfig& config, int64_t rows, int cc_major, int cc_minor);

// The precision policy in one line: which tensors compute at which precision. With
// `fp8_layers` (Fp8Layers; empty: bf16 throughout): those layers' linear maps (their share
// of the parameters and of the matmul FLOPs said) in FP8, the layers kept in bf16 named,
// everything else bf16 with fp32 statistics, master weights, gradients and optimizer state.
// `scaling`: how the FP8 tensors are scaled, in words.
std::string DescribePrecision(const ModelConfig& config, const std::vector<bool>& fp8_layers,
                              const std::string& scaling = "each tensor at its current scale");

// Bytes of training state, mixed precision as the GPU trainer keeps it: bf16 weights and
// gradients, fp32 master weights and two Adam moments (16 B/param); activations for one
// micro-batch of `batch` x `seq` tokens, with or without activation checkpointing.
struct MemoryEstimate {
  uint64_t weights_bytes = 0, grads_bytes = 0, master_bytes = 0, adam_bytes = 0;
  uint64_t activations_bytes = 0;
  uint64_t total_bytes() const {
    return weights_bytes + grads_bytes + master_bytes + adam_bytes + activations_bytes;
  }
};
MemoryEstimate EstimateMemory(const ModelConfig& config, int batch, int seq, bool checkpointing);

}  // namespace tierd::trainer

#endif  // TIERD_TRAINER_REF_MODEL_CONFIG_H_
