// Model shapes from a config file, as model configs are commonly written.
#ifndef TIERD_TRAINER_REF_MODEL_CONFIG_FILE_H_
#define TIERD_TRAINER_REF_MODEL_CONFIG_FILE_H_

#include <string>

#include "absl/status/statusor.h"
#include "trainer_ref/model_config.h"

namespace tierd::trainer {

// The shape from a model config file as they are commonly written (JSON, Hugging Face's
// names, the Llama family: model_type llama, mistral or qwen2): hidden_size,
// num_hidden_layers, num_attention_heads, intermediate_size, vocab_size,
// max_position_embeddings; optionally rms_norm_eps, rope_theta, num_key_value_heads,
// head_dim, tie_word_embeddings, rope_scaling (or transformers 5's rope_parameters) of type
// linear or llama3, sliding_window. Qwen2 has q/k/v biases. Keys that would change the math
// in a way this decoder does not compute (another model_type, another activation, o_proj or
// MLP biases, other RoPE scalings, partial rotary) are refused by name; other keys (token
// ids, dtype, architectures...) are ignored. The name is the file's stem.
// NOT_FOUND, or INVALID_ARGUMENT with the file, the key and what was expected.
absl::StatusOr<ModelConfig> ModelConfigFromFile(const std::string& path);
// The same from the text itself; `where` names it in errors.
absl::StatusOr<ModelConfig> ModelConfigFromJson(const std::string& text, const std::string& where);

// The trainer's shape: a preset by name, or a config file, then single dimensions
// overridden (0: keep). The result is validated.
struct ShapeOverrides {
  int layers = 0, d_model = 0, heads = 0, d_ff = 0, vocab = 0, max_seq = 0, kv_heads = 0, head_dim = 0;
};
absl::StatusOr<ModelConfig> ResolveModelConfig(const std::string& preset, const std::string& config_file,
                                               const ShapeOverrides& overrides);

}  // namespace tierd::trainer

#endif  // TIERD_TRAINER_REF_MODEL_CONFIG_FILE_H_
