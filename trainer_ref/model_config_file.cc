#include "trainer_ref/model_config_file.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace tierd::trainer {
namespace {

absl::Status Bad(const std::string& where, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrFormat("model config %s: %s", where, what));
}

// A positive integer under `key`; absent: `*out` unchanged and `required` decides.
absl::Status ReadDimension(const YAML::Node& root, const char* key, bool required, const std::string& where, int* out) {
  const YAML::Node node = root[key];
  if (!node || node.IsNull()) {
    return required ? Bad(where, absl::StrFormat("'%s' is missing (the shape needs hidden_size, num_hidden_layers, "
                                                 "num_attention_heads, intermediate_size, vocab_size and "
                                                 "max_position_embeddings)",
                                                 key))
                    : absl::OkStatus();
  }
  long long value = 0;
  if (!node.IsScalar() || !YAML::convert<long long>::decode(node, value) || value <= 0 || value > (1 << 30)) {
    return Bad(where, absl::StrFormat("'%s' must be a positive whole number, not '%s'", key,
                                      node.IsScalar() ? node.Scalar() : std::string("a list or object")));
  }
  *out = static_cast<int>(value);
  return absl::OkStatus();
}

absl::Status ReadReal(const YAML::Node& root, const char* key, const std::string& where, double* out) {
  const YAML::Node node = root[key];
  if (!node || node.IsNull()) return absl::OkStatus();
  double value = 0;
  if (!node.IsScalar() || !YAML::convert<double>::decode(node, value)) {
    return Bad(where, absl::StrFormat("'%s' must be a number, not '%s'", key, node.IsScalar() ? node.Scalar() : "?"));
  }
  *out = value;
  return absl::OkStatus();
}

bool ReadBool(const YAML::Node& root, const char* key, bool otherwise) {
  const YAML::Node node = root[key];
  bool value = otherwise;
  if (node && !node.IsNull()) YAML::convert<bool>::decode(node, value);
  return value;
}

std::string ReadString(const YAML::Node& node, const char* key) {
  const YAML::Node value = node[key];
  return value && value.IsScalar() ? value.Scalar() : "";
}

// RoPE: Hugging Face writes it two ways. Checkpoints on the Hub: "rope_theta" beside
// "rope_scaling": {"rope_type" (or "type"): ..., "factor": ...}; transformers 5 writes
// "rope_parameters": {"rope_type": ..., "rope_theta": ..., ...}. Types this decoder does not
// compute (yarn, dynamic, longrope, ...) are refused by name.
absl::Status ReadRope(const YAML::Node& root, const std::string& where, ModelConfig* c) {
  // (yaml-cpp: assigning a Node writes into the tree, so each is its own variable.)
  const YAML::Node v5 = root["rope_parameters"], hub = root["rope_scaling"];
  const bool from_v5 = v5 && !v5.IsNull();
  if (!from_v5 && (!hub || hub.IsNull())) return absl::OkStatus();
  const YAML::Node params = from_v5 ? v5 : hub;
  if (!params.IsMap()) {
    return Bad(where, absl::StrFormat("'%s' must be an object", from_v5 ? "rope_parameters" : "rope_scaling"));
  }
  if (from_v5) {
    if (absl::Status s = ReadReal(params, "rope_theta", where, &c->rope_theta); !s.ok()) return s;
  }
  std::string type = ReadString(params, "rope_type");
  if (type.empty()) type = ReadString(params, "type");
  RopeScaling& r = c->rope_scaling;
  if (type.empty() || type == "default") return absl::OkStatus();
  if (type == "linear") {
    r.type = RopeScaling::Type::kLinear;
  } else if (type == "llama3") {
    r.type = RopeScaling::Type::kLlama3;
    if (absl::Status s = ReadReal(params, "low_freq_factor", where, &r.low_freq_factor); !s.ok()) return s;
    if (absl::Status s = ReadReal(params, "high_freq_factor", where, &r.high_freq_factor); !s.ok()) return s;
    if (!params["original_max_position_embeddings"]) {
      return Bad(where, "llama3 RoPE scaling needs 'original_max_position_embeddings'");
    }
    if (absl::Status s = ReadDimension(params, "original_max_position_embeddings", /*required=*/false, where,
                                       &r.original_max_position);
        !s.ok()) {
      return s;
    }
  } else {
    return Bad(where, absl::StrFormat("RoPE scaling of type '%s' is not computed (default, linear and llama3 are)",
                                      type));
  }
  if (!params["factor"]) return Bad(where, absl::StrFormat("RoPE scaling '%s' needs a 'factor'", type));
  return ReadReal(params, "factor", where, &r.factor);
}

// The family's keys: grouped-query attention, head size, tied embeddings, biases, RoPE,
// sliding windows. What would change the math in a way this decoder does not compute is
// refused by name.
absl::Status ReadFamily(const YAML::Node& root, const std::string& where, ModelConfig* c) {
  const std::string model_type = ReadString(root, "model_type");
  if (!model_type.empty() && model_type != "llama" && model_type != "mistral" && model_type != "qwen2") {
    return Bad(where, absl::StrFormat("model_type '%s' is not computed (llama, mistral and qwen2 are)", model_type));
  }
  if (absl::Status s = ReadDimension(root, "num_key_value_heads", /*required=*/false, where, &c->kv_heads); !s.ok()) {
    return s;
  }
  if (absl::Status s = ReadDimension(root, "head_dim", /*required=*/false, where, &c->head_size); !s.ok()) return s;
  c->tied_embeddings = ReadBool(root, "tie_word_embeddings", false);
  // Qwen2 has q/k/v biases by construction (no key says so); Llama's attention_bias puts one
  // on o_proj too.
  c->qkv_bias = model_type == "qwen2";
  if (ReadBool(root, "attention_bias", false)) {
    return Bad(where, "'attention_bias' is true: biases on q, k, v and o; this decoder computes q/k/v biases only "
                      "(Qwen2's)");
  }
  if (ReadBool(root, "mlp_bias", false)) return Bad(where, "'mlp_bias' is true; the MLP here has no biases");
  for (const char* key : {"hidden_act", "hidden_activation"}) {
    const YAML::Node node = root[key];
    if (node && node.IsScalar() && node.Scalar() != "silu" && node.Scalar() != "swiglu") {
      return Bad(where, absl::StrFormat("%s '%s': the MLP is SwiGLU (silu)", key, node.Scalar()));
    }
  }
  double partial = 1;
  if (absl::Status s = ReadReal(root, "partial_rotary_factor", where, &partial); !s.ok()) return s;
  if (partial != 1) {
    return Bad(where, absl::StrFormat("partial_rotary_factor %g: RoPE turns every pair of a head here", partial));
  }
  if (absl::Status s = ReadRope(root, where, c); !s.ok()) return s;
  // The canonical form: 0 where the value is what it would be anyway (so a flag that changes
  // the heads or the width keeps plain multi-head attention plain).
  if (c->kv_heads == c->heads) c->kv_heads = 0;
  if (c->head_size > 0 && c->head_size * c->heads == c->d_model) c->head_size = 0;
  // Mistral's window applies to every layer; Qwen2's only with use_sliding_window.
  const bool window = model_type == "qwen2" ? ReadBool(root, "use_sliding_window", false) : true;
  if (window) {
    if (absl::Status s = ReadDimension(root, "sliding_window", /*required=*/false, where, &c->sliding_window);
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ModelConfig> ModelConfigFromJson(const std::string& text, const std::string& where) {
  std::string json = text;
  std::replace(json.begin(), json.end(), '\t', ' ');  // YAML (which parses JSON) refuses tabs
  YAML::Node root;
  try {
    root = YAML::Load(json);
  } catch (const YAML::Exception& e) {
    return Bad(where,
               absl::StrFormat("not valid JSON at line %d, column %d: %s", e.mark.line + 1, e.mark.column + 1, e.msg));
  }
  if (!root.IsMap()) return Bad(where, "expected a JSON object ({\"hidden_size\": ..., ...})");
  ModelConfig c;
  struct Key {
    const char* name;
    int* field;
  };
  for (const Key& k :
       {Key{"hidden_size", &c.d_model}, Key{"num_hidden_layers", &c.layers}, Key{"num_attention_heads", &c.heads},
        Key{"intermediate_size", &c.d_ff}, Key{"vocab_size", &c.vocab}, Key{"max_position_embeddings", &c.max_seq}}) {
    if (absl::Status s = ReadDimension(root, k.name, /*required=*/true, where, k.field); !s.ok()) return s;
  }
  if (absl::Status s = ReadReal(root, "rms_norm_eps", where, &c.norm_eps); !s.ok()) return s;
  if (absl::Status s = ReadReal(root, "rope_theta", where, &c.rope_theta); !s.ok()) return s;
  if (absl::Status s = ReadFamily(root, where, &c); !s.ok()) return s;
  c.name = "custom";
  if (absl::Status s = ValidateConfig(c); !s.ok()) return Bad(where, std::string(s.message()));
  return c;
}

absl::StatusOr<ModelConfig> ModelConfigFromFile(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrFormat("model config '%s' cannot be read (no such file?)", path));
  std::stringstream text;
  text << in.rdbuf();
  auto config = ModelConfigFromJson(text.str(), "'" + path + "'");
  if (!config.ok()) return config.status();
  std::string stem = path.substr(path.find_last_of('/') + 1);
  if (const size_t dot = stem.rfind('.'); dot != std::string::npos && dot > 0) stem.resize(dot);
  config->name = stem.empty() ? "custom" : stem;
  return config;
}

absl::StatusOr<ModelConfig> ResolveModelConfig(const std::string& preset, const std::string& config_file,
                                               const ShapeOverrides& o) {
  absl::StatusOr<ModelConfig> config = config_file.empty() ? ModelPreset(preset) : ModelConfigFromFile(config_file);
  if (!config.ok()) return config.status();
  std::vector<std::string> changed;
  auto apply = [&](int value, int* field, const char* flag) {
    if (value == 0 || value == *field) return;
    changed.push_back(absl::StrFormat("%s=%d", flag, value));
    *field = value;
  };
  if (o.layers < 0 || o.d_model < 0 || o.heads < 0 || o.d_ff < 0 || o.vocab < 0 || o.max_seq < 0 ||
      o.kv_heads < 0 || o.head_dim < 0) {
    return absl::InvalidArgumentError("model dimensions given by flag must be positive (0: the preset's or file's)");
  }
  apply(o.layers, &config->layers, "num_hidden_layers");
  apply(o.d_model, &config->d_model, "hidden_size");
  apply(o.heads, &config->heads, "num_attention_heads");
  apply(o.kv_heads, &config->kv_heads, "num_key_value_heads");
  apply(o.head_dim, &config->head_size, "head_dim");
  apply(o.d_ff, &config->d_ff, "intermediate_size");
  apply(o.vocab, &config->vocab, "vocab_size");
  apply(o.max_seq, &config->max_seq, "max_position_embeddings");
  if (!changed.empty()) config->name += "+" + absl::StrJoin(changed, ",");
  if (absl::Status s = ValidateConfig(*config); !s.ok()) return s;
  return config;
}

}  // namespace tierd::trainer
