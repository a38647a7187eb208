// The Llama family's variations on the GPU against the CPU model: grouped-query attention, a
// head size other than C / H, q/k/v biases, tied embeddings, llama3-scaled RoPE; the head's
// logits in chunks; one micro-batch at a time, layer-major, and FP8. And checkpoints made by
// transformers (tests/data/hf) loaded into the GPU model: its loss and logits are transformers'
// to bf16's rounding. Part of gpu_model_test; needs a CUDA device.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "trainer_ref/gpu/gpu_model.h"
#include "trainer_ref/gpu/gpu_model_test_oracle.h"
#include "trainer_ref/hf/hf_checkpoint.h"
#include "trainer_ref/hf/json.h"
#include "trainer_ref/hf/safetensors.h"
#include "trainer_ref/kernels/gpu_test_util.h"
#include "trainer_ref/model.h"
#include "trainer_ref/model_config_file.h"

namespace tierd::trainer::gpu {
namespace {

using testing::Batch;
using testing::ExpectTrainingTracksTheCpu;
using testing::HaveGpu;
using testing::InitWithBf16Matrices;
using testing::RandomBatch;

// 64 wide, 4 query heads of 32 (q 128 wide) over 2 key/value heads, biases, tied, llama3 RoPE;
// every matmul dimension a multiple of 16 (FP8 takes it).
ModelConfig Family() {
  ModelConfig c{"family", 2, 64, 4, 128, 320, 64};
  c.kv_heads = 2;
  c.head_size = 32;
  c.qkv_bias = true;
  c.tied_embeddings = true;
  c.rope_theta = 500000;
  c.rope_scaling = {RopeScaling::Type::kLlama3, 8.0, 1.0, 4.0, 16};
  return c;
}

// The CPU's parameters with bf16 matrices, and the 1-D tensors (norms, biases) moved off
// their 1 and 0 so their paths carry signal.
void InitFamily(Model<float>& cpu, uint64_t seed) {
  InitWithBf16Matrices(cpu, seed);
  std::mt19937_64 rng(seed + 1);
  std::normal_distribution<float> normal(0.f, 0.1f);
  for (const TensorLayout& t : cpu.layout()) {
    if (t.shape.size() != 1) continue;
    for (size_t i = 0; i < t.count; ++i) cpu.params()[t.offset + i] += normal(rng);
  }
}

// Per tensor relative L2 error of the GPU's gradients against the CPU's; the worst. A bias's
// gradient is a sum over the rows of a bf16 gradient whose terms largely cancel, so its
// relative error is that of a small sum of rounded terms: twice the bound.
double WorstGradientError(const Model<float>& cpu, const std::vector<float>& grads, double bound) {
  double worst = 0;
  for (const TensorLayout& t : cpu.layout()) {
    double diff = 0, norm = 0;
    for (size_t i = 0; i < t.count; ++i) {
      const double g = const_cast<Model<float>&>(cpu).grads()[t.offset + i], x = grads[t.offset + i];
      diff += (x - g) * (x - g);
      norm += g * g;
    }
    EXPECT_GT(norm, 0) << t.name << ": the CPU gradient is zero, so the check would be empty";
    const double rel = std::sqrt(diff / std::max(norm, 1e-30));
    worst = std::max(worst, rel);
    EXPECT_LT(rel, IsBias(t) ? 2 * bound : bound) << t.name;
  }
  return worst;
}

struct Variant {
  const char* name;
  int head_rows;     // 0: whole logits
  int layer_major;   // K micro-batches layer-major, 0: one at a time
};

class GpuFamilyModelTest : public ::testing::TestWithParam<Variant> {};

// Loss within 1%, each tensor's gradient within 5% relative L2 of the CPU's (bf16 activations),
// 8 AdamW steps within 3%.
TEST_P(GpuFamilyModelTest, TracksTheCpuModel) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device here: the GPU model is checked on the lent GPU machine";
  const Variant v = GetParam();
  const ModelConfig config = Family();
  const int batch = 2, seq = 48, n = batch * seq, k = std::max(1, v.layer_major);
  Model<float> cpu(config, batch, seq);
  InitFamily(cpu, 21);
  StateOptions state;
  state.head_rows = v.head_rows;
  state.layer_major_micro_batches = v.layer_major;
  auto gpu = GpuModel::Create(config, batch, seq, nullptr, state);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  ASSERT_TRUE((*gpu)->SetParams(cpu.params()).ok());
  std::mt19937_64 rng(22);
  std::vector<int32_t> tokens, targets;
  for (int m = 0; m < k; ++m) {
    const Batch b = RandomBatch(n, config.vocab, rng);
    tokens.insert(tokens.end(), b.tokens.begin(), b.tokens.end());
    targets.insert(targets.end(), b.targets.begin(), b.targets.end());
  }
  cpu.ZeroGrads();
  double cpu_loss = 0;
  for (int m = 0; m < k; ++m) {
    cpu_loss += cpu.Forward(tokens.data() + m * n, targets.data() + m * n) / k;
    cpu.Backward();
  }
  ASSERT_TRUE((*gpu)->ZeroGrads().ok());
  double gpu_loss = 0;
  if (v.layer_major > 0) {
    auto loss = (*gpu)->ForwardBackwardLayerMajor(tokens.data(), targets.data());
    ASSERT_TRUE(loss.ok()) << loss.status();
    gpu_loss = *loss;
  } else {
    auto loss = (*gpu)->Forward(tokens.data(), targets.data());
    ASSERT_TRUE(loss.ok()) << loss.status();
    ASSERT_TRUE((*gpu)->Backward().ok());
    gpu_loss = *loss;
  }
  EXPECT_NEAR(gpu_loss, cpu_loss, 0.01 * cpu_loss) << v.name;
  std::vector<float> grads;
  ASSERT_TRUE((*gpu)->GetGrads(&grads).ok());
  const double worst = WorstGradientError(cpu, grads, 0.05);
  std::printf("%s: loss cpu %.6f gpu %.6f; worst gradient relative L2 error %.4f over %zu tensors\n", v.name, cpu_loss,
              gpu_loss, worst, cpu.layout().size());
  if (v.layer_major == 0) ExpectTrainingTracksTheCpu(cpu, **gpu, n, rng, 0.03, v.name);
}

INSTANTIATE_TEST_SUITE_P(
    Family, GpuFamilyModelTest,
    ::testing::Values(Variant{"whole logits", 0, 0}, Variant{"logits in chunks of 32 rows", 32, 0},
                      Variant{"layer-major over 2, chunks of 64 rows", 64, 2}),
    [](const ::testing::TestParamInfo<Variant>& info) {
      return std::string(info.param.head_rows > 0 ? "Chunked" : "Whole") +
             (info.param.layer_major > 0 ? "LayerMajor" : "");
    });

// The head's logits in chunks give the whole head's loss and gradients (the same GEMMs on row
// blocks; the head's weight gradient summed over the blocks): within fp32 rounding.
TEST(GpuFamilyModelTest, ChunkedLogitsGiveTheWholeHeadsResults) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device here: the GPU model is checked on the lent GPU machine";
  const ModelConfig config = Family();
  const int batch = 2, seq = 48, n = batch * seq;
  Model<float> cpu(config, batch, seq);
  InitFamily(cpu, 31);
  StateOptions chunked;
  chunked.head_rows = 16;
  auto whole = GpuModel::Create(config, batch, seq);
  auto parts = GpuModel::Create(config, batch, seq, nullptr, chunked);
  ASSERT_TRUE(whole.ok() && parts.ok());
  std::mt19937_64 rng(32);
  const Batch b = RandomBatch(n, config.vocab, rng);
  std::vector<float> g_whole, g_parts;
  double loss[2] = {};
  int i = 0;
  for (GpuModel* m : {whole->get(), parts->get()}) {
    ASSERT_TRUE(m->SetParams(cpu.params()).ok());
    ASSERT_TRUE(m->ZeroGrads().ok());
    auto l = m->Forward(b.tokens.data(), b.targets.data());
    ASSERT_TRUE(l.ok()) << l.status();
    loss[i++] = *l;
    ASSERT_TRUE(m->Backward().ok());
    ASSERT_TRUE(m->GetGrads(m == whole->get() ? &g_whole : &g_parts).ok());
  }
  EXPECT_EQ(loss[0], loss[1]) << "each row's loss is the same kernel's on the same logits";
  double diff = 0, norm = 0;
  for (size_t j = 0; j < g_whole.size(); ++j) {
    diff += (g_whole[j] - g_parts[j]) * double(g_whole[j] - g_parts[j]);
    norm += double(g_whole[j]) * g_whole[j];
  }
  EXPECT_LT(std::sqrt(diff / norm), 1e-3);
  std::vector<float> logits;
  EXPECT_EQ((*parts)->LastLogits(&logits).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(GpuFamilyModelTest, Fp8LayersOfTheFamilyTrackTheCpuModel) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device here: the GPU model is checked on the lent GPU machine";
  const ModelConfig config = Family();
  const int batch = 2, seq = 48, n = batch * seq;
  Model<float> cpu(config, batch, seq);
  InitFamily(cpu, 41);
  auto gpu = GpuModel::Create(config, batch, seq);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  ASSERT_TRUE((*gpu)->UseFp8().ok());
  ASSERT_TRUE((*gpu)->SetParams(cpu.params()).ok());
  std::mt19937_64 rng(42);
  // FP8's bounds (gpu_model_fp8_test.cc): 8 AdamW steps within 5% of the CPU's losses.
  ExpectTrainingTracksTheCpu(cpu, **gpu, n, rng, 0.05, "fp8 family ");
}

// --- Checkpoints made by transformers, on the GPU ---

std::string FixtureDir(const std::string& name) {
  if (const char* dir = std::getenv("TIERD_HF_FIXTURES")) return std::string(dir) + "/" + name;
  if (const char* src = std::getenv("TEST_SRCDIR")) return std::string(src) + "/tierd/tests/data/hf/" + name;
  return "tests/data/hf/" + name;  // from the repository's root (the lent machine's checks)
}

std::string Slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The GPU model (bf16 weights and activations, fp32 statistics) with a transformers checkpoint:
// the loss within 1% of transformers' fp32 loss, each logit within 0.05 + 2% of its size.
class GpuHfFixtureTest : public ::testing::TestWithParam<std::string> {};

TEST_P(GpuHfFixtureTest, LossAndLogitsAreTransformersToBf16) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device here: the GPU model is checked on the lent GPU machine";
  const std::string dir = FixtureDir(GetParam());
  auto config = ModelConfigFromFile(dir + "/config.json");
  ASSERT_TRUE(config.ok()) << config.status();
  auto reader = hf::HfCheckpointReader::Open(dir, *config);
  ASSERT_TRUE(reader.ok()) << reader.status();
  auto json = hf::ParseJson(Slurp(dir + "/fixture.json"));
  ASSERT_TRUE(json.ok()) << json.status();
  std::vector<int32_t> inputs, targets;
  int batch = 0, seq = 0;
  for (const char* key : {"inputs", "targets"}) {
    const hf::JsonValue* rows = json->Find(key);
    batch = static_cast<int>(rows->items.size());
    seq = static_cast<int>(rows->items[0].items.size());
    for (const hf::JsonValue& row : rows->items) {
      for (const hf::JsonValue& x : row.items) (key[0] == 'i' ? inputs : targets).push_back(static_cast<int32_t>(x.number));
    }
  }
  auto gpu = GpuModel::Create(*config, batch, seq);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  ASSERT_TRUE((*gpu)->LoadParams([&](size_t e, float* out) { return (*reader)->Read(e, out); }).ok());
  auto loss = (*gpu)->Forward(inputs.data(), targets.data());
  ASSERT_TRUE(loss.ok()) << loss.status();
  const double want = json->Find("loss")->number;
  EXPECT_NEAR(*loss, want, 0.01 * want);
  std::vector<float> logits, expected;
  ASSERT_TRUE((*gpu)->LastLogits(&logits).ok());
  auto file = hf::SafetensorsFile::Open(dir + "/expected.safetensors");
  ASSERT_TRUE(file.ok()) << file.status();
  const hf::TensorInfo* t = (*file)->Find("logits");
  expected.resize(t->Count());
  (*file)->ReadFloats(*t, 0, t->Count(), expected.data());
  ASSERT_EQ(logits.size(), expected.size());
  int off = 0;
  double worst = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    const double error = std::abs(logits[i] - expected[i]);
    worst = std::max(worst, error);
    if (error > 0.05 + 0.02 * std::abs(expected[i]) && off++ < 5) {
      ADD_FAILURE() << GetParam() << " logit " << i << ": gpu " << logits[i] << ", transformers' " << expected[i];
    }
  }
  std::printf("%s on the GPU: loss %.5f vs transformers' %.5f; worst logit error %.4f\n", GetParam().c_str(), *loss,
              want, worst);
}

INSTANTIATE_TEST_SUITE_P(Families, GpuHfFixtureTest, ::testing::Values("llama2", "llama3", "mistral", "qwen2"));

}  // namespace
}  // namespace tierd::trainer::gpu
