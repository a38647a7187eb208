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
  for (const Case& c : {Case{R"("num_key_value_heads": 2)", "grouped-query attention"},
                        Case{R"("tie_word_embeddings": true)", "tie_word_embeddings"},
                        Case{R"("hidden_act": "gelu")", "hidden_act 'gelu'"},
                        Case{R"("rope_scaling": {"type": "linear", "factor": 2.0})", "rope_scaling"},
                        Case{R"("attention_bias": true)", "attention_bias"}}) {
    auto config = ModelConfigFromJson("{" + base + ", " + c.extra + "}", "f.json");
    ASSERT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument) << c.extra;
    EXPECT_NE(config.status().message().find(c.says), absl::string_view::npos) << config.status();
    EXPECT_NE(config.status().message().find("f.json"), absl::string_view::npos) << config.status();
  }
  EXPECT_TRUE(ModelConfigFromJson("{" + base + R"(, "num_key_value_heads": 4})", "f").ok());
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
