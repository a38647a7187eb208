// Shapes of the reference trainer's GPT-style decoder (the Llama family: RMSNorm, RoPE, causal
// attention with grouped-query heads, SwiGLU MLP; optionally q/k/v biases as Qwen2 has them
// and an output head tied to the embedding) and what they cost in memory.
#ifndef TIERD_TRAINER_REF_MODEL_CONFIG_H_
#define TIERD_TRAINER_REF_MODEL_CONFIG_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace tierd::trainer {

// How RoPE's frequencies are rescaled for long contexts (Hugging Face's rope_scaling):
//   linear: every frequency divided by `factor` (positions interpolated);
//   llama3: Llama 3.1's: wavelengths above original_max_position / low_freq_factor divided
//           by `factor`, below original_max_position / high_freq_factor kept, a smooth blend
//           between.
struct RopeScaling {
  enum class Type { kNone, kLinear, kLlama3 };
  Type type = Type::kNone;
  double factor = 1.0;
  double low_freq_factor = 1.0, high_freq_factor = 4.0;
  int original_max_position = 8192;
};

struct ModelConfig {
  std::string name;
  int layers = 0;
  int d_model = 0;  // C
  int heads = 0;    // H query heads of head_dim() each
  int d_ff = 0;     // the MLP's hidden width (SwiGLU: two up projections of this width)
  int vocab = 0;    // V
  int max_seq = 0;  // T at most (RoPE needs no table of positions)
  double norm_eps = 1e-5;       // RMSNorm's epsilon
  double rope_theta = 10000.0;  // RoPE's base
  // Grouped-query attention: KV heads of keys and values, each shared by H / KV query heads
  // (1: multi-query). 0: as many as the query heads.
  int kv_heads = 0;
  // The head size when it is not C / H (Hugging Face's head_dim). 0: C / H.
  int head_size = 0;
  bool tied_embeddings = false;  // the head reads (and trains) the embedding's matrix
  bool qkv_bias = false;         // q, k and v projections with biases (Qwen2)
  RopeScaling rope_scaling;
  // Attention restricted to the last `sliding_window` positions (Mistral v0.1); 0: none.
  // The decoder computes full causal attention, so sequences longer than it are refused.
  int sliding_window = 0;

  int head_dim() const { return head_size > 0 ? head_size : d_model / heads; }
  int kv_head_count() const { return kv_heads > 0 ? kv_heads : heads; }
  int q_dim() const { return heads * head_dim(); }          // width of q and of attention's output
  int kv_dim() const { return kv_head_count() * head_dim(); }  // width of k and v
  // Per layer: attention (wq: QD x C, wk and wv: KD x C, wo: C x QD, and with biases QD + 2 KD),
  // MLP (w1, w3: F x C up, w2: C x F down), two RMSNorm weights (2 C). Plus the token embedding
  // (V C), the final norm (C) and, untied, the head (V C).
  uint64_t LayerParams() const;
  // The weights a layer's recomputed forward multiplies by: all but the down projection (w2),
  // whose output the backward does not read (GpuModel::LayerForward's `recompute`).
  uint64_t RecomputedLayerParams() const;
  uint64_t Params() const;
};

// RoPE's inverse frequencies, head_dim() / 2 of them: theta^(-2i / D), rescaled as
// rope_scaling says. Pair i of each head turns by position x inv_freq[i].
std::vector<double> RopeInverseFrequencies(const ModelConfig& config);

// tiny (runs in seconds on two cores; byte-level vocabulary), 124m, 350m, 1.3b, 7b, 13b.
// INVALID_ARGUMENT naming the presets otherwise.
absl::StatusOr<ModelConfig> ModelPreset(const std::string& name);
// INVALID_ARGUMENT when a dimension is not positive, the head size is odd (RoPE rotates
// pairs), KV heads do not divide the heads, or the RoPE scaling is out of range.
absl::Status ValidateConfig(const ModelConfig& config);

// The family's choices beyond the base shape, for checkpoints' shape records: "" for a plain
// Llama-style model, else e.g. " kv_heads=8 head_dim=128 qkv_bias tied rope=llama3,8,1,4,8192".
std::string FamilyRecord(const ModelConfig& config);

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
