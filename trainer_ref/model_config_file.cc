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

// Keys whose value this decoder cannot honour: refused, with what it computes instead.
absl::Status RefuseUnsupported(const YAML::Node& root, const ModelConfig& c, const std::string& where) {
  if (const YAML::Node kv = root["num_key_value_heads"]; kv && !kv.IsNull()) {
    long long heads = 0;
    if (!YAML::convert<long long>::decode(kv, heads) || heads != c.heads) {
      return Bad(where, absl::StrFormat("num_key_value_heads %s differs from num_attention_heads %d: grouped-query "
                                        "attention is not implemented (every head has its own keys and values)",
                                        kv.Scalar(), c.heads));
    }
  }
  for (const char* key : {"tie_word_embeddings", "attention_bias", "mlp_bias"}) {
    const YAML::Node node = root[key];
    bool on = false;
    if (node && !node.IsNull() && YAML::convert<bool>::decode(node, on) && on) {
      return Bad(where, absl::StrFormat("'%s' is true; this decoder has an untied output head and no biases", key));
    }
  }
  for (const char* key : {"hidden_act", "hidden_activation"}) {
    const YAML::Node node = root[key];
    if (node && node.IsScalar() && node.Scalar() != "silu" && node.Scalar() != "swiglu") {
      return Bad(where, absl::StrFormat("%s '%s': the MLP is SwiGLU (silu)", key, node.Scalar()));
    }
  }
  if (const YAML::Node scaling = root["rope_scaling"]; scaling && !scaling.IsNull()) {
    return Bad(where, "rope_scaling is set; RoPE is computed unscaled (rope_theta is honoured)");
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
  if (absl::Status s = RefuseUnsupported(root, c, where); !s.ok()) return s;
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
  if (o.layers < 0 || o.d_model < 0 || o.heads < 0 || o.d_ff < 0 || o.vocab < 0 || o.max_seq < 0) {
    return absl::InvalidArgumentError("model dimensions given by flag must be positive (0: the preset's or file's)");
  }
  apply(o.layers, &config->layers, "num_hidden_layers");
  apply(o.d_model, &config->d_model, "hidden_size");
  apply(o.heads, &config->heads, "num_attention_heads");
  apply(o.d_ff, &config->d_ff, "intermediate_size");
  apply(o.vocab, &config->vocab, "vocab_size");
  apply(o.max_seq, &config->max_seq, "max_position_embeddings");
  if (!changed.empty()) config->name += "+" + absl::StrJoin(changed, ",");
  if (absl::Status s = ValidateConfig(*config); !s.ok()) return s;
  return config;
}

}  // namespace tierd::trainer
