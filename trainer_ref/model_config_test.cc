#include "trainer_ref/model_config.h"

#include <gtest/gtest.h>

#include <string>

namespace tierd::trainer {
namespace {

TEST(ModelConfigTest, PresetsHaveTheKnownParameterCounts) {
  // Llama's published counts for its 7B and 13B shapes.
  EXPECT_EQ(ModelPreset("7b")->Params(), 6738415616u);
  EXPECT_EQ(ModelPreset("13b")->Params(), 13015864320u);
  for (const char* name : {"tiny", "124m", "350m", "1.3b", "7b", "13b"}) {
    auto config = ModelPreset(name);
    ASSERT_TRUE(config.ok()) << name;
    EXPECT_TRUE(ValidateConfig(*config).ok()) << name;
  }
  EXPECT_NEAR(ModelPreset("1.3b")->Params() / 1e9, 1.35, 0.02);
  EXPECT_LT(ModelPreset("tiny")->Params(), 200000u);  // seconds on two cores
}

TEST(ModelConfigTest, ARecomputeMultipliesByEveryLayerWeightButTheDownProjection) {
  // 7B: q, k, v, o (4 x 4096^2), gate and up (2 x 4096 x 11008) and the two norms (2 x 4096).
  EXPECT_EQ(ModelPreset("7b")->RecomputedLayerParams(), 4ull * 4096 * 4096 + 2ull * 4096 * 11008 + 2 * 4096);
  // Grouped keys and values and biases count as the layer's: only w2 (d_ff x d_model) is left out.
  ModelConfig gqa = *ModelPreset("1.3b");
  gqa.kv_heads = 4;
  gqa.qkv_bias = true;
  EXPECT_EQ(gqa.LayerParams() - gqa.RecomputedLayerParams(), static_cast<uint64_t>(gqa.d_model) * gqa.d_ff);
}

TEST(ModelConfigTest, BadNamesAndShapesAreExplained) {
  auto unknown = ModelPreset("70b");
  ASSERT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(unknown.status().message().find("tiny, 124m, 350m, 1.3b, 7b or 13b"), absl::string_view::npos);
  ModelConfig odd = *ModelPreset("tiny");
  odd.heads = 3;  // 64 / 3 does not divide
  EXPECT_EQ(ValidateConfig(odd).code(), absl::StatusCode::kInvalidArgument);
  odd.heads = 64;  // head size 1: RoPE needs pairs
  EXPECT_EQ(ValidateConfig(odd).code(), absl::StatusCode::kInvalidArgument);
  odd = *ModelPreset("tiny");
  odd.layers = 0;
  EXPECT_EQ(ValidateConfig(odd).code(), absl::StatusCode::kInvalidArgument);
}

TEST(ModelConfigTest, MemoryOfTrainingStateIsSixteenBytesPerParameter) {
  const ModelConfig c = *ModelPreset("7b");
  const MemoryEstimate full = EstimateMemory(c, 1, 2048, /*checkpointing=*/false);
  const MemoryEstimate ckpt = EstimateMemory(c, 1, 2048, /*checkpointing=*/true);
  EXPECT_EQ(full.weights_bytes + full.grads_bytes + full.master_bytes + full.adam_bytes, 16 * c.Params());
  EXPECT_LT(ckpt.activations_bytes, full.activations_bytes / 4);
  EXPECT_GT(full.total_bytes(), 100e9);  // a 7B step does not fit an 80 GB card without offload
}

TEST(ModelConfigTest, ThePrecisionPolicySaysWhatRunsInFp8AndItsShare) {
  const ModelConfig c = *ModelPreset("7b");
  const std::string fp8 = DescribePrecision(c, *Fp8Layers(c, ""));
  // 7B: 32 x (4 x 4096^2 + 3 x 4096 x 11008) = 6.48B of 6.74B parameters; the head 0.13B.
  EXPECT_NE(fp8.find("fp8 for the 32 layers' linear maps (96% of the parameters, 98% of the matmul FLOPs"),
            std::string::npos)
      << fp8;
  EXPECT_NE(fp8.find("bf16 for the embedding, the head"), std::string::npos) << fp8;
  const std::string bf16 = DescribePrecision(c, {});
  EXPECT_EQ(bf16.find("fp8 for"), std::string::npos) << bf16;
  EXPECT_NE(bf16.find("bf16 weights, activations and matmuls"), std::string::npos) << bf16;
}

TEST(ModelConfigTest, AutoPrecisionIsFp8WhereTheGpuAndTheShapesTakeIt) {
  const ModelConfig c = *ModelPreset("1.3b");
  AutoPrecision h200 = ChooseAutoPrecision(c, 4 * 2048, 9, 0);
  EXPECT_TRUE(h200.fp8);
  EXPECT_EQ(h200.why, "fp8 on this GPU (compute capability 9.0); --precision=bf16 keeps every matmul in bf16");
  EXPECT_TRUE(ChooseAutoPrecision(c, 4 * 2048, 8, 9).fp8) << "Ada (8.9) has FP8 tensor cores";
  const AutoPrecision a100 = ChooseAutoPrecision(c, 4 * 2048, 8, 0);
  EXPECT_FALSE(a100.fp8);
  EXPECT_EQ(a100.why, "bf16: this GPU (compute capability 8.0) has no FP8 tensor cores (8.9 or later)");
  const AutoPrecision odd_rows = ChooseAutoPrecision(c, 60, 9, 0);
  EXPECT_FALSE(odd_rows.fp8);
  EXPECT_NE(odd_rows.why.find("multiples of 16, and these are 60 rows (batch x sequence), d_model 2048, d_ff 5504"),
            std::string::npos)
      << odd_rows.why;
  ModelConfig odd_ff = c;
  odd_ff.d_ff = 5500;
  EXPECT_FALSE(ChooseAutoPrecision(odd_ff, 4 * 2048, 9, 0).fp8);
}

TEST(ModelConfigTest, Bf16LayersKeepTheLayersTheirRegexMatches) {
  const ModelConfig c = *ModelPreset("7b");
  auto ends = Fp8Layers(c, "layers\\.(0|31)");
  ASSERT_TRUE(ends.ok()) << ends.status();
  ASSERT_EQ(ends->size(), 32u);
  EXPECT_FALSE((*ends)[0]);
  EXPECT_FALSE((*ends)[31]);
  for (int l = 1; l < 31; ++l) EXPECT_TRUE((*ends)[l]) << l;
  EXPECT_TRUE((*Fp8Layers(c, "layers\\.3"))[30]) << "a full match: layers.30 is not layers.3";
  const std::string two = DescribePrecision(c, *ends);
  // 30 layers of 202.4M: 6.07B of 6.74B parameters.
  EXPECT_NE(two.find("fp8 for 30 of the 32 layers' linear maps (90% of the parameters"), std::string::npos) << two;
  EXPECT_NE(two.find("bf16 for layers.0, layers.31 (--bf16_layers), the embedding"), std::string::npos) << two;
  const std::string none = DescribePrecision(c, *Fp8Layers(c, "layers\\..*"));
  EXPECT_NE(none.find("--bf16_layers matches every layer"), std::string::npos) << none;
  const auto bad = Fp8Layers(c, "layers.(0");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("is not a regular expression"), absl::string_view::npos) << bad.status();
}

}  // namespace
}  // namespace tierd::trainer
