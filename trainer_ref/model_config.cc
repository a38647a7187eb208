#include "trainer_ref/model_config.h"

#include <regex>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tierd::trainer {

uint64_t ModelConfig::LayerParams() const {
  const uint64_t c = d_model, f = d_ff;
  return 4 * c * c + 3 * c * f + 2 * c;
}

uint64_t ModelConfig::Params() const {
  const uint64_t c = d_model, v = vocab;
  return layers * LayerParams() + 2 * v * c + c;
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
  if (c.d_model % c.heads != 0 || c.head_dim() % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "model '%s': %d heads must divide d_model %d into an even head size (RoPE rotates pairs)", c.name, c.heads,
        c.d_model));
  }
  return absl::OkStatus();
}

std::string DescribeConfig(const ModelConfig& c) {
  const double p = static_cast<double>(c.Params());
  const std::string params = p >= 1e9 ? absl::StrFormat("%.2fB", p / 1e9) : absl::StrFormat("%.3gM", p / 1e6);
  return absl::StrFormat("%s: %d layers, d_model %d, %d heads, d_ff %d, vocab %d, %s parameters", c.name, c.layers,
                         c.d_model, c.heads, c.d_ff, c.vocab, params);
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
  const uint64_t per_layer = checkpointing ? cc : 8 * cc + 3 * f;
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
  if (rows % 16 != 0 || config.d_model % 16 != 0 || config.d_ff % 16 != 0) {
    return {false, absl::StrFormat("bf16: FP8 tensor cores take dimensions in multiples of 16, and these are %d rows "
                                   "(batch x sequence), d_model %d, d_ff %d",
                                   rows, config.d_model, config.d_ff)};
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
  const double c = config.d_model, f = config.d_ff;
  const double linear = static_cast<double>(count) * (4 * c * c + 3 * c * f);
  const double all_linear = static_cast<double>(config.layers) * (4 * c * c + 3 * c * f);
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
