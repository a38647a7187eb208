#include "trainer_ref/model_config.h"

#include <cmath>
#include <regex>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tierd::trainer {

namespace {
// The layer's linear maps' parameters (q, k, v, o and the MLP's three).
uint64_t LinearParams(const ModelConfig& m) {
  const uint64_t c = m.d_model, f = m.d_ff, qd = m.q_dim(), kd = m.kv_dim();
  return 2 * qd * c + 2 * kd * c + 3 * c * f;
}
}  // namespace

uint64_t ModelConfig::LayerParams() const {
  const uint64_t c = d_model;
  return LinearParams(*this) + 2 * c + (qkv_bias ? static_cast<uint64_t>(q_dim()) + 2 * kv_dim() : 0);
}

uint64_t ModelConfig::RecomputedLayerParams() const {
  return LayerParams() - static_cast<uint64_t>(d_model) * d_ff;
}

uint64_t ModelConfig::Params() const {
  const uint64_t c = d_model, v = vocab;
  return layers * LayerParams() + (tied_embeddings ? 1 : 2) * v * c + c;
}

std::vector<double> RopeInverseFrequencies(const ModelConfig& config) {
  const int d = config.head_dim();
  std::vector<double> inv(d / 2);
  const RopeScaling& s = config.rope_scaling;
  for (int i = 0; i < d / 2; ++i) {
    const double f = std::pow(config.rope_theta, -2.0 * i / d);
    switch (s.type) {
      case RopeScaling::Type::kNone:
        inv[i] = f;
        break;
      case RopeScaling::Type::kLinear:
        inv[i] = f / s.factor;
        break;
      case RopeScaling::Type::kLlama3: {
        const double wavelength = 2 * M_PI / f;
        const double low_wavelength = s.original_max_position / s.low_freq_factor;
        const double high_wavelength = s.original_max_position / s.high_freq_factor;
        if (wavelength > low_wavelength) {
          inv[i] = f / s.factor;
        } else if (wavelength < high_wavelength) {
          inv[i] = f;
        } else {
          const double smooth =
              (s.original_max_position / wavelength - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
          inv[i] = (1 - smooth) * f / s.factor + smooth * f;
        }
        break;
      }
    }
  }
  return inv;
}

absl::StatusOr<ModelConfig> ModelPreset(const std::string& name) {
  // name, layers, C, H, F, V, T
  if (name == "tiny") return ModelConfig{name, 2, 64, 4, 176, 256, 64};
  if (name == "124m") return ModelConfig{name, 12, 768, 12, 2048, 32000, 2048};
  if (name == "350m") return ModelConfig{name, 24, 1024, 16, 2816, 32000, 2048};
  if (name == "1.3b") return ModelConfig{name, 24, 2048, 16, 5504, 32000, 2048};
  if (name == "7b") return ModelConfig{name, 32, 4096, 32, 11008, 32000, 4096};
  if (name == "13b") return ModelConfig{name, 40, 5120, 40, 13824, 32000, 4096};
  return absl::InvalidArgumentError(
      absl::StrFormat("unknown model size '%s'; use tiny, 124m, 350m, 1.3b, 7b or 13b", name));
}

absl::Status ValidateConfig(const ModelConfig& c) {
  if (c.layers <= 0 || c.d_model <= 0 || c.heads <= 0 || c.d_ff <= 0 || c.vocab <= 0 || c.max_seq <= 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "model '%s': every dimension must be positive (layers %d, d_model %d, heads %d, d_ff %d, vocab %d, seq %d)",
        c.name, c.layers, c.d_model, c.heads, c.d_ff, c.vocab, c.max_seq));
  }
  if (!(c.norm_eps > 0 && c.norm_eps < 1) || !(c.rope_theta > 1)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "model '%s': rms_norm_eps %g must be in (0, 1) and rope_theta %g above 1", c.name, c.norm_eps, c.rope_theta));
  }
  if (c.head_size < 0 || c.kv_heads < 0 || c.sliding_window < 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "model '%s': head_dim %d, num_key_value_heads %d and sliding_window %d must not be negative", c.name,
        c.head_size, c.kv_heads, c.sliding_window));
  }
  if (c.head_size == 0 && c.d_model % c.heads != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "model '%s': %d heads must divide d_model %d evenly (or head_dim be given)", c.name, c.heads, c.d_model));
  }
  if (c.head_dim() % 2 != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("model '%s': the head size %d must be even (RoPE rotates pairs)", c.name, c.head_dim()));
  }
  if (c.kv_head_count() > c.heads || c.heads % c.kv_head_count() != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "model '%s': %d key/value heads must divide the %d query heads (grouped-query attention shares each "
        "key/value head among an equal number of query heads)",
        c.name, c.kv_head_count(), c.heads));
  }
  const RopeScaling& r = c.rope_scaling;
  if (r.type != RopeScaling::Type::kNone && !(r.factor >= 1)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("model '%s': rope_scaling factor %g must be at least 1", c.name, r.factor));
  }
  if (r.type == RopeScaling::Type::kLlama3 &&
      !(r.low_freq_factor > 0 && r.high_freq_factor > r.low_freq_factor && r.original_max_position > 0)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "model '%s': llama3 rope_scaling needs 0 < low_freq_factor (%g) < high_freq_factor (%g) and "
        "original_max_position_embeddings (%d) > 0",
        c.name, r.low_freq_factor, r.high_freq_factor, r.original_max_position));
  }
  return absl::OkStatus();
}

std::string FamilyRecord(const ModelConfig& c) {
  std::string out;
  if (c.kv_head_count() != c.heads) absl::StrAppend(&out, " kv_heads=", c.kv_head_count());
  if (c.head_size > 0 && c.head_size * c.heads != c.d_model) absl::StrAppend(&out, " head_dim=", c.head_size);
  if (c.qkv_bias) out += " qkv_bias";
  if (c.tied_embeddings) out += " tied";
  const RopeScaling& r = c.rope_scaling;
  if (r.type == RopeScaling::Type::kLinear) absl::StrAppend(&out, absl::StrFormat(" rope=linear,%.9g", r.factor));
  if (r.type == RopeScaling::Type::kLlama3) {
    absl::StrAppend(&out, absl::StrFormat(" rope=llama3,%.9g,%.9g,%.9g,%d", r.factor, r.low_freq_factor,
                                          r.high_freq_factor, r.original_max_position));
  }
  return out;
}

std::string DescribeConfig(const ModelConfig& c) {
  const double p = static_cast<double>(c.Params());
  const std::string params = p >= 1e9 ? absl::StrFormat("%.2fB", p / 1e9) : absl::StrFormat("%.3gM", p / 1e6);
  std::string heads = absl::StrFormat("%d heads", c.heads);
  if (c.kv_head_count() != c.heads) absl::StrAppend(&heads, absl::StrFormat(" (%d key/value)", c.kv_head_count()));
  if (c.head_size > 0 && c.head_size * c.heads != c.d_model) absl::StrAppend(&heads, " of ", c.head_size);
  std::string extras;
  if (c.qkv_bias) extras += ", q/k/v biases";
  if (c.tied_embeddings) extras += ", tied embeddings";
  if (c.rope_scaling.type == RopeScaling::Type::kLinear) {
    extras += absl::StrFormat(", RoPE linear x%g", c.rope_scaling.factor);
  } else if (c.rope_scaling.type == RopeScaling::Type::kLlama3) {
    extras += absl::StrFormat(", RoPE llama3 x%g", c.rope_scaling.factor);
  }
  return absl::StrFormat("%s: %d layers, d_model %d, %s, d_ff %d, vocab %d%s, %s parameters", c.name, c.layers,
                         c.d_model, heads, c.d_ff, c.vocab, extras, params);
}

MemoryEstimate EstimateMemory(const ModelConfig& c, int batch, int seq, bool checkpointing) {
  MemoryEstimate m;
  const uint64_t p = c.Params();
  m.weights_bytes = 2 * p;
  m.grads_bytes = 2 * p;
  m.master_bytes = 4 * p;
  m.adam_bytes = 8 * p;
  const uint64_t tokens = static_cast<uint64_t>(batch) * seq, cc = c.d_model, f = c.d_ff;
  // bf16 per layer kept for backward: norm outputs (2 C), q k v (3 C), attention out (C),
  // MLP up (2 F) and its activation (F), residual inputs (2 C); the attention scores are
  // not kept (a fused kernel recomputes them). With checkpointing: the layer input only.
  const uint64_t qd = c.q_dim(), kd = c.kv_dim();
  const uint64_t per_layer = checkpointing ? cc : 4 * cc + 2 * qd + 2 * kd + 3 * f;
  m.activations_bytes = 2 * tokens * (c.layers * per_layer + cc) + 4 * tokens * c.vocab;  // + fp32 logits
  return m;
}

absl::StatusOr<std::vector<bool>> Fp8Layers(const ModelConfig& config, const std::string& bf16_layers) {
  std::vector<bool> fp8(config.layers, true);
  if (bf16_layers.empty()) return fp8;
  std::regex pattern;
  try {
    pattern = std::regex(bf16_layers, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--bf16_layers='%s' is not a regular expression (%s)", bf16_layers, e.what()));
  }
  for (int l = 0; l < config.layers; ++l) fp8[l] = !std::regex_match("layers." + std::to_string(l), pattern);
  return fp8;
}

AutoPrecision ChooseAutoPrecision(const ModelConfig& config, int64_t rows, int cc_major, int cc_minor) {
  if (cc_major * 10 + cc_minor < 89) {
    return {false, absl::StrFormat("bf16: this GPU (compute capability %d.%d) has no FP8 tensor cores (8.9 or later)",
                                   cc_major, cc_minor)};
  }
  if (rows % 16 != 0 || config.d_model % 16 != 0 || config.d_ff % 16 != 0 || config.q_dim() % 16 != 0 ||
      config.kv_dim() % 16 != 0) {
    return {false, absl::StrFormat("bf16: FP8 tensor cores take dimensions in multiples of 16, and these are %d rows "
                                   "(batch x sequence), d_model %d, d_ff %d, q width %d, k/v width %d",
                                   rows, config.d_model, config.d_ff, config.q_dim(), config.kv_dim())};
  }
  return {true, absl::StrFormat("fp8 on this GPU (compute capability %d.%d); --precision=bf16 keeps every matmul in "
                                "bf16",
                                cc_major, cc_minor)};
}

std::string DescribePrecision(const ModelConfig& config, const std::vector<bool>& fp8_layers,
                              const std::string& scaling) {
  const std::string rest = "fp32 master weights, gradients, optimizer state, norms' statistics, softmax and loss";
  int count = 0;
  std::string kept;
  for (int l = 0; l < static_cast<int>(fp8_layers.size()); ++l) {
    if (fp8_layers[l]) {
      ++count;
    } else {
      absl::StrAppend(&kept, kept.empty() ? "" : ", ", "layers.", l);
    }
  }
  if (count == 0) {
    return "bf16 weights, activations and matmuls (fp32 accumulation); " + rest +
           (fp8_layers.empty() ? " (--precision=fp8: FP8 matmuls)" : " (--bf16_layers matches every layer)");
  }
  const double c = config.d_model;
  const double linear = static_cast<double>(count) * static_cast<double>(LinearParams(config));
  const double all_linear = static_cast<double>(config.layers) * static_cast<double>(LinearParams(config));
  const double head = c * config.vocab;  // the embedding is a lookup, not a matmul
  const std::string layers = count == config.layers ? absl::StrFormat("the %d layers'", count)
                                                    : absl::StrFormat("%d of the %d layers'", count, config.layers);
  return absl::StrFormat(
      "fp8 for %s linear maps (%.0f%% of the parameters, %.0f%% of the matmul FLOPs outside attention; "
      "E4M3 weights and activations, E5M2 gradients, %s); bf16 for %sthe embedding, the head, attention and the "
      "element-wise kernels; %s",
      layers, 100.0 * linear / static_cast<double>(config.Params()), 100.0 * linear / (all_linear + head), scaling,
      kept.empty() ? "" : kept + " (--bf16_layers), ", rest.c_str());
}

}  // namespace tierd::trainer
