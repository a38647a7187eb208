#include "trainer_ref/model_config_file.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>

namespace tierd::trainer {
namespace {

// Llama-2-7b's config.json as published (the keys that matter and the ones around them).
constexpr char kLlama7b[] = R"({
  "_name_or_path": "meta-llama/Llama-2-7b-hf",
  "architectures": ["LlamaForCausalLM"],
  "bos_token_id": 1,
  "eos_token_id": 2,
  "hidden_act": "silu",
  "hidden_size": 4096,
  "initializer_range": 0.02,
  "intermediate_size": 11008,
  "max_position_embeddings": 4096,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 32,
  "num_key_value_heads": 32,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": null,
  "tie_word_embeddings": false,
  "torch_dtype": "float16",
  "transformers_version": "4.31.0.dev0",
  "use_cache": true,
  "vocab_size": 32000
})";

TEST(ModelConfigFileTest, AHuggingFaceConfigGivesThePresetsShape) {
  auto config = ModelConfigFromJson(kLlama7b, "llama");
  ASSERT_TRUE(config.ok()) << config.status();
  const ModelConfig preset = *ModelPreset("7b");
  EXPECT_EQ(config->layers, preset.layers);
  EXPECT_EQ(config->d_model, preset.d_model);
  EXPECT_EQ(config->heads, preset.heads);
  EXPECT_EQ(config->d_ff, preset.d_ff);
  EXPECT_EQ(config->vocab, preset.vocab);
  EXPECT_EQ(config->max_seq, preset.max_seq);
  EXPECT_EQ(config->Params(), preset.Params());
  EXPECT_DOUBLE_EQ(config->norm_eps, 1e-5);
  EXPECT_DOUBLE_EQ(config->rope_theta, 10000.0);
}

TEST(ModelConfigFileTest, EpsilonAndRopeBaseAreRead) {
  auto config = ModelConfigFromJson(
      R"({"hidden_size": 96, "num_hidden_layers": 3, "num_attention_heads": 6, "intermediate_size": 256,
          "vocab_size": 300, "max_position_embeddings": 128, "rms_norm_eps": 1e-6, "rope_theta": 500000.0})",
      "x");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->head_dim(), 16);
  EXPECT_DOUBLE_EQ(config->norm_eps, 1e-6);
  EXPECT_DOUBLE_EQ(config->rope_theta, 500000.0);
}

TEST(ModelConfigFileTest, WhatCannotBeComputedIsRefusedByName) {
  const std::string base =
      R"("hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 176,
         "vocab_size": 256, "max_position_embeddings": 64)";
  struct Case {
    std::string extra, says;
  };
  for (const Case& c :
       {Case{R"("num_key_value_heads": 3)", "3 key/value heads must divide the 4 query heads"},
        Case{R"("hidden_act": "gelu")", "hidden_act 'gelu'"},
        Case{R"("rope_scaling": {"type": "yarn", "factor": 2.0})", "RoPE scaling of type 'yarn' is not computed"},
        Case{R"("rope_parameters": {"rope_type": "dynamic", "factor": 2.0})", "type 'dynamic'"},
        Case{R"("rope_scaling": {"rope_type": "llama3", "factor": 8.0})", "original_max_position_embeddings"},
        Case{R"("rope_scaling": {"rope_type": "linear"})", "needs a 'factor'"},
        Case{R"("model_type": "gemma")", "model_type 'gemma' is not computed"},
        Case{R"("partial_rotary_factor": 0.5)", "partial_rotary_factor 0.5"},
        Case{R"("mlp_bias": true)", "mlp_bias"},
        Case{R"("attention_bias": true)", "attention_bias"}}) {
    auto config = ModelConfigFromJson("{" + base + ", " + c.extra + "}", "f.json");
    ASSERT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument) << c.extra;
    EXPECT_NE(config.status().message().find(c.says), absl::string_view::npos) << config.status();
    EXPECT_NE(config.status().message().find("f.json"), absl::string_view::npos) << config.status();
  }
  EXPECT_TRUE(ModelConfigFromJson("{" + base + R"(, "num_key_value_heads": 4})", "f").ok());
}

// Llama-3.1-8B's config.json as published on the Hub (rope_scaling with rope_theta beside it).
constexpr char kLlama31_8b[] = R"({
  "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
  "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "hidden_act": "silu",
  "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 14336,
  "max_position_embeddings": 131072, "mlp_bias": false, "model_type": "llama",
  "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8, "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                   "original_max_position_embeddings": 8192, "rope_type": "llama3"},
  "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
  "transformers_version": "4.43.0.dev0", "use_cache": true, "vocab_size": 128256
})";

TEST(ModelConfigFileTest, Llama31GroupedQueryAttentionAndItsRopeScaling) {
  auto config = ModelConfigFromJson(kLlama31_8b, "llama-3.1-8b");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->kv_head_count(), 8);
  EXPECT_EQ(config->head_dim(), 128);
  EXPECT_EQ(config->q_dim(), 4096);
  EXPECT_EQ(config->kv_dim(), 1024);
  EXPECT_EQ(config->vocab, 128256);
  EXPECT_DOUBLE_EQ(config->rope_theta, 500000.0);
  EXPECT_EQ(config->rope_scaling.type, RopeScaling::Type::kLlama3);
  EXPECT_DOUBLE_EQ(config->rope_scaling.factor, 8.0);
  EXPECT_EQ(config->rope_scaling.original_max_position, 8192);
  EXPECT_FALSE(config->tied_embeddings);
  EXPECT_FALSE(config->qkv_bias);
  EXPECT_EQ(config->Params(), 8030261248u);  // Meta's published count for Llama 3.1 8B
}

TEST(ModelConfigFileTest, TransformersFiveRopeParametersQwen2BiasesAndTiedEmbeddings) {
  // Qwen2.5-0.5B's shape as transformers 5 writes it: rope_parameters, q/k/v biases by model_type.
  auto qwen = ModelConfigFromJson(
      R"({"model_type": "qwen2", "hidden_size": 896, "intermediate_size": 4864, "num_attention_heads": 14,
          "num_hidden_layers": 24, "num_key_value_heads": 2, "max_position_embeddings": 32768,
          "rms_norm_eps": 1e-06, "tie_word_embeddings": true, "vocab_size": 151936, "sliding_window": 32768,
          "use_sliding_window": false, "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"}})",
      "qwen");
  ASSERT_TRUE(qwen.ok()) << qwen.status();
  EXPECT_TRUE(qwen->qkv_bias);
  EXPECT_TRUE(qwen->tied_embeddings);
  EXPECT_EQ(qwen->kv_head_count(), 2);
  EXPECT_EQ(qwen->head_dim(), 64);
  EXPECT_DOUBLE_EQ(qwen->rope_theta, 1e6);
  EXPECT_EQ(qwen->rope_scaling.type, RopeScaling::Type::kNone);
  EXPECT_EQ(qwen->sliding_window, 0) << "use_sliding_window is false";
  EXPECT_EQ(qwen->Params(), 494032768u);  // Qwen2.5-0.5B's parameters, embedding counted once
  // Mistral v0.1: a sliding window of 4096 on every layer; a head size given separately.
  auto mistral = ModelConfigFromJson(
      R"({"model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336, "num_attention_heads": 32,
          "num_hidden_layers": 32, "num_key_value_heads": 8, "max_position_embeddings": 32768,
          "vocab_size": 32000, "sliding_window": 4096, "head_dim": 128, "rope_theta": 10000.0})",
      "mistral");
  ASSERT_TRUE(mistral.ok()) << mistral.status();
  EXPECT_EQ(mistral->sliding_window, 4096);
  EXPECT_EQ(mistral->head_size, 0) << "128 is hidden_size / heads: kept canonical";
  EXPECT_EQ(mistral->Params(), 7241732096u);  // Mistral-7B-v0.1's count
  // A head size that is not hidden_size / heads (as Qwen3 and Gemma have).
  auto wide = ModelConfigFromJson(
      R"({"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
          "head_dim": 32, "intermediate_size": 176, "vocab_size": 256, "max_position_embeddings": 64,
          "rope_scaling": {"type": "linear", "factor": 4.0}})",
      "wide");
  ASSERT_TRUE(wide.ok()) << wide.status();
  EXPECT_EQ(wide->q_dim(), 128);
  EXPECT_EQ(wide->kv_dim(), 64);
  EXPECT_EQ(wide->rope_scaling.type, RopeScaling::Type::kLinear);
  EXPECT_DOUBLE_EQ(wide->rope_scaling.factor, 4.0);
}

TEST(ModelConfigFileTest, MalformedFilesAreExplained) {
  auto missing = ModelConfigFromJson(R"({"hidden_size": 64, "num_hidden_layers": 2})", "f");
  ASSERT_EQ(missing.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(missing.status().message().find("'num_attention_heads' is missing"), absl::string_view::npos)
      << missing.status();
  auto text = ModelConfigFromJson(R"({"hidden_size": "big", "num_hidden_layers": 2})", "f");
  EXPECT_NE(text.status().message().find("'hidden_size' must be a positive whole number, not 'big'"),
            absl::string_view::npos)
      << text.status();
  auto broken = ModelConfigFromJson("{\"hidden_size\": 64,\n  \"num_hidden_layers\": [2,\n}", "f");
  EXPECT_NE(broken.status().message().find("not valid JSON at line"), absl::string_view::npos) << broken.status();
  auto list = ModelConfigFromJson("[1, 2]", "f");
  EXPECT_NE(list.status().message().find("expected a JSON object"), absl::string_view::npos) << list.status();
  auto odd = ModelConfigFromJson(
      R"({"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 3, "intermediate_size": 176,
          "vocab_size": 256, "max_position_embeddings": 64})",
      "f");
  EXPECT_NE(odd.status().message().find("3 heads must divide d_model 64"), absl::string_view::npos) << odd.status();
  auto absent = ModelConfigFromFile("/nonexistent/config.json");
  EXPECT_EQ(absent.status().code(), absl::StatusCode::kNotFound);
}

TEST(ModelConfigFileTest, AFileNamesTheModelAndFlagsOverrideDimensions) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(tmp ? tmp : "/tmp") + "/llama-7b." + std::to_string(getpid()) + ".json";
  std::ofstream(path) << kLlama7b;
  auto from_file = ResolveModelConfig("tiny", path, {});
  ASSERT_TRUE(from_file.ok()) << from_file.status();
  EXPECT_EQ(from_file->name.rfind("llama-7b", 0), 0u) << from_file->name;
  EXPECT_EQ(from_file->d_model, 4096);
  ShapeOverrides smaller;
  smaller.layers = 2;
  smaller.d_model = 256;
  smaller.heads = 4;
  auto overridden = ResolveModelConfig("tiny", path, smaller);
  ASSERT_TRUE(overridden.ok()) << overridden.status();
  EXPECT_EQ(overridden->layers, 2);
  EXPECT_EQ(overridden->d_model, 256);
  EXPECT_EQ(overridden->d_ff, 11008);
  EXPECT_NE(overridden->name.find("num_hidden_layers=2"), std::string::npos) << overridden->name;
  ShapeOverrides bad;
  bad.heads = 5;  // 64 / 5
  EXPECT_EQ(ResolveModelConfig("tiny", "", bad).status().code(), absl::StatusCode::kInvalidArgument);
  auto preset = ResolveModelConfig("124m", "", {});
  ASSERT_TRUE(preset.ok());
  EXPECT_EQ(preset->name, "124m");
  unlink(path.c_str());
}

}  // namespace
}  // namespace tierd::trainer
