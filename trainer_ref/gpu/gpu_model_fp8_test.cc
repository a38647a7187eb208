// The GPU model with its layers' matmuls in FP8 (GpuModel::UseFp8) against the CPU model and
// the bf16 GPU model. Part of gpu_model_test (one binary to carry); needs a CUDA device.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "trainer_ref/checkpoint.h"

#include "trainer_ref/gpu/gpu_model.h"
#include "trainer_ref/gpu/gpu_model_test_oracle.h"
#include "trainer_ref/kernels/gpu_test_util.h"
#include "trainer_ref/model.h"
#include "trainer_ref/optimizer.h"

namespace tierd::trainer::gpu {
namespace {

using testing::Batch;
using testing::ExpectTrainingTracksTheCpu;
using testing::HaveGpu;
using testing::InitWithBf16Matrices;
using testing::RandomBatch;

// The layers' matmuls in FP8 (UseFp8) against the CPU model in fp32: FP8's rounding (E4M3:
// 3 mantissa bits, a value's relative error up to 1/16; E5M2 gradients 1/8) is far coarser
// than bf16's, so the bounds are: loss within 2%; every tensor's gradient within 25% relative
// L2 error and the whole gradient's cosine with the CPU's at least 0.97; over 8 AdamW steps
// the losses within 5% of the CPU's. And it is FP8 that ran: the gradients differ from the
// bf16 model's by more than bf16's own error (0.5% relative L2).
TEST(GpuModelTest, Fp8MatmulsTrackTheCpuModel) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device here: the GPU model is checked on the lent GPU machine";
  const ModelConfig config = *ModelPreset("tiny");
  const int batch = 2, seq = 32, n = batch * seq;
  Model<float> cpu(config, batch, seq);
  InitWithBf16Matrices(cpu, 11);
  auto gpu = GpuModel::Create(config, batch, seq);
  auto bf16 = GpuModel::Create(config, batch, seq);
  ASSERT_TRUE(gpu.ok() && bf16.ok());
  ASSERT_TRUE((*gpu)->UseFp8().ok());
  EXPECT_TRUE((*gpu)->fp8());
  EXPECT_FALSE((*bf16)->fp8());
  ASSERT_TRUE((*gpu)->SetParams(cpu.params()).ok());
  ASSERT_TRUE((*bf16)->SetParams(cpu.params()).ok());
  std::mt19937_64 rng(12);
  const Batch b = RandomBatch(n, config.vocab, rng);
  cpu.ZeroGrads();
  const double cpu_loss = cpu.Forward(b.tokens.data(), b.targets.data());
  cpu.Backward();
  std::vector<float> grads, bf16_grads;
  double gpu_loss = 0;
  for (GpuModel* m : {gpu->get(), bf16->get()}) {
    ASSERT_TRUE(m->ZeroGrads().ok());
    auto loss = m->Forward(b.tokens.data(), b.targets.data());
    ASSERT_TRUE(loss.ok()) << loss.status();
    ASSERT_TRUE(m->Backward().ok());
    ASSERT_TRUE(m->GetGrads(m == gpu->get() ? &grads : &bf16_grads).ok());
    if (m == gpu->get()) gpu_loss = *loss;
  }
  EXPECT_NEAR(gpu_loss, cpu_loss, 0.02 * cpu_loss);
  double worst = 0, dot = 0, gg = 0, cc = 0, off_bf16 = 0;
  for (const TensorLayout& t : cpu.layout()) {
    double diff = 0, norm = 0;
    for (size_t i = 0; i < t.count; ++i) {
      const double g = cpu.grads()[t.offset + i], x = grads[t.offset + i], y = bf16_grads[t.offset + i];
      diff += (x - g) * (x - g);
      norm += g * g;
      dot += x * g;
      gg += x * x;
      cc += g * g;
      off_bf16 += (x - y) * (x - y);
    }
    ASSERT_GT(norm, 0) << t.name;
    worst = std::max(worst, std::sqrt(diff / norm));
    EXPECT_LT(std::sqrt(diff / norm), 0.25) << t.name;
  }
  const double cosine = dot / std::sqrt(gg * cc), from_bf16 = std::sqrt(off_bf16 / cc);
  EXPECT_GT(cosine, 0.97);
  EXPECT_GT(from_bf16, 0.005) << "the FP8 model's gradients are the bf16 model's: FP8 did not run";
  std::printf("fp8: loss cpu %.6f gpu %.6f; worst gradient relative L2 error %.4f, cosine %.5f, %.4f from bf16's\n",
              cpu_loss, gpu_loss, worst, cosine, from_bf16);
  ExpectTrainingTracksTheCpu(cpu, **gpu, n, rng, 0.05, "fp8 ");
  // Shapes FP8 tensor cores do not take are refused with the numbers.
  const ModelConfig odd{"odd", 1, 72, 2, 200, 256, 64};
  auto refused = GpuModel::Create(odd, 1, 24);
  ASSERT_TRUE(refused.ok()) << refused.status();
  const absl::Status why = (*refused)->UseFp8();
  EXPECT_EQ(why.code(), absl::StatusCode::kInvalidArgument) << why;
  EXPECT_NE(why.message().find("24 rows"), absl::string_view::npos) << why;
}

// --bf16_layers: a layer kept out of FP8 computes exactly as in the bf16 model. Every layer
// kept: the same loss and gradients bit for bit; only the last in FP8: the first layer's
// weight gradients still differ (the FP8 layer's backward feeds them), so it did run.
TEST(GpuModelTest, LayersKeptOutOfFp8ComputeAsBf16) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device here: the GPU model is checked on the lent GPU machine";
  const ModelConfig config = *ModelPreset("tiny");
  const int batch = 2, seq = 32, n = batch * seq;
  std::mt19937_64 rng(21);
  const Batch b = RandomBatch(n, config.vocab, rng);
  auto grads_of = [&](std::vector<bool> fp8_layers, double* loss) {
    auto m = GpuModel::Create(config, batch, seq);
    EXPECT_TRUE(m.ok()) << m.status();
    if (!fp8_layers.empty()) {
      EXPECT_TRUE((*m)->UseFp8(fp8_layers).ok());
    }
    EXPECT_TRUE((*m)->InitParams(3).ok());
    EXPECT_TRUE((*m)->ZeroGrads().ok());
    auto l = (*m)->Forward(b.tokens.data(), b.targets.data());
    EXPECT_TRUE(l.ok()) << l.status();
    *loss = l.ok() ? *l : 0;
    EXPECT_TRUE((*m)->Backward().ok());
    std::vector<float> g;
    EXPECT_TRUE((*m)->GetGrads(&g).ok());
    return g;
  };
  double bf16_loss = 0, kept_loss = 0, last_loss = 0;
  const std::vector<float> bf16 = grads_of({}, &bf16_loss);
  const std::vector<float> kept = grads_of(std::vector<bool>(config.layers, false), &kept_loss);
  std::vector<bool> last_only(config.layers, false);
  last_only.back() = true;
  const std::vector<float> last = grads_of(last_only, &last_loss);
  EXPECT_EQ(kept_loss, bf16_loss);
  EXPECT_EQ(kept, bf16);
  EXPECT_NE(last, bf16);
  auto wrong = GpuModel::Create(config, batch, seq);
  ASSERT_TRUE(wrong.ok());
  EXPECT_EQ((*wrong)->UseFp8({true}).code(), absl::StatusCode::kInvalidArgument) << "one layer's choice for two";
}

// A step as the trainer runs one: forward, backward, the FP8 step end, AdamW.
double Fp8TrainStep(GpuModel& m, const Batch& b, int at) {
  EXPECT_TRUE(m.ZeroGrads().ok());
  auto loss = m.Forward(b.tokens.data(), b.targets.data());
  EXPECT_TRUE(loss.ok()) << loss.status();
  EXPECT_TRUE(m.Backward().ok());
  m.EndFp8Step();
  EXPECT_TRUE(m.AdamWStep(1e-3, at, AdamWOptions{}, 1.0).ok());
  return loss.ok() ? *loss : 0;
}

// An FP8 layer that keeps its activations keeps its maps' inputs h1, h2 and s as their codes
// transposed, made in the forward (Acts::inputs_transposed); a lean layer keeps neither, and
// its backward converts the remade bf16 inputs, as every layer's did before. Both give the same
// bits: over three steps (the first at current scales, each input's scale copied beside its
// codes; the later ones at delayed scales, where the norms and SwiGLU write the codes), one
// micro-batch at a time and layer-major over three (each micro-batch's codes read back at the
// scale they were made at, not the last micro-batch's). d_ff 384 takes SwiGLU's kernel that
// writes the codes transposed itself, 352 (not of 64 x 64 tiles) the byte transpose after.
// The same in rooms of a byte an element (StateOptions::fp8_layers); and where such a layer
// runs bf16 (layer 1 left out of UseFp8, as a layer that fell back), it keeps lean and its
// backward recomputes its element-wise outputs: the bits of a bf16 layer in bf16 rooms.
TEST(GpuModelTest, Fp8InputsKeptTransposedGiveTheBitsOfConvertingThemAgain) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device here: the GPU model is checked on the lent GPU machine";
  const int batch = 2, seq = 64, n = batch * seq;
  for (const auto& [d_ff, micro] : std::vector<std::pair<int, int>>{{384, 0}, {384, 3}, {352, 0}, {352, 3}}) {
    const ModelConfig config{"kept", 3, 128, 2, d_ff, 512, 128};  // head size 64
    SCOPED_TRACE((micro > 0 ? "layer-major, 3 micro-batches" : "one micro-batch a step") +
                 std::string(", d_ff ") + std::to_string(d_ff));
    const std::vector<bool> all(config.layers, true), but_1 = {true, false, true};
    auto make = [&](int kept, int lean, bool coded_rooms, const std::vector<bool>& fp8) {
      auto m = GpuModel::Create(config, batch, seq, nullptr,
                                {.checkpointing = true,
                                 .kept_layers = kept,
                                 .lean_layers = lean,
                                 .fp8_layers = coded_rooms ? all : std::vector<bool>{},
                                 .layer_major_micro_batches = micro});
      EXPECT_TRUE(m.ok()) << m.status();
      EXPECT_TRUE((*m)->UseFp8(fp8).ok());
      EXPECT_TRUE((*m)->InitParams(7).ok());
      return std::move(*m);
    };
    // Each model beside the one it must equal: (kept, converting), (coded, converting),
    // (coded rooms with layer 1 in bf16, bf16 rooms with layer 1 in bf16).
    std::unique_ptr<GpuModel> models[5] = {
        make(config.layers, 0, false, all), make(0, config.layers, false, all), make(config.layers, 0, true, all),
        make(config.layers, 0, true, but_1), make(config.layers, 0, false, but_1)};
    const std::pair<int, int> pairs[3] = {{0, 1}, {2, 1}, {3, 4}};
    std::mt19937_64 rng(57);
    for (int at = 1; at <= 3; ++at) {
      std::vector<int32_t> tokens, targets;
      for (int m = 0; m < std::max(1, micro); ++m) {
        const Batch b = RandomBatch(n, config.vocab, rng);
        tokens.insert(tokens.end(), b.tokens.begin(), b.tokens.end());
        targets.insert(targets.end(), b.targets.begin(), b.targets.end());
      }
      double losses[5];
      std::vector<float> grads[5];
      for (int k = 0; k < 5; ++k) {
        GpuModel& m = *models[k];
        ASSERT_TRUE(m.ZeroGrads().ok());
        auto loss = micro > 0 ? m.ForwardBackwardLayerMajor(tokens.data(), targets.data())
                              : m.Forward(tokens.data(), targets.data());
        ASSERT_TRUE(loss.ok()) << loss.status();
        if (micro == 0) {
          const absl::Status backward = m.Backward();
          ASSERT_TRUE(backward.ok()) << backward;
        }
        losses[k] = *loss;
        ASSERT_TRUE(m.GetGrads(&grads[k]).ok());
        m.EndFp8Step();
        ASSERT_TRUE(m.AdamWStep(1e-3, at, AdamWOptions{}, 1.0).ok());
      }
      for (const auto& [k, want] : pairs) {
        EXPECT_EQ(losses[k], losses[want]) << "step " << at << ", model " << k;
        ASSERT_EQ(grads[k].size(), grads[want].size());
        size_t off = 0;
        for (size_t i = 0; i < grads[k].size(); ++i) off += grads[k][i] != grads[want][i];
        EXPECT_EQ(off, 0u) << "step " << at << ", model " << k << ": gradient elements differing, of "
                           << grads[k].size();
      }
      EXPECT_NE(losses[3], losses[0]) << "layer 1 in bf16 trains otherwise than in FP8";
    }
  }
}

// Delayed scaling in the model: its first step converts at the current scales (the same loss,
// bit for bit, as current scaling's), later ones at the window's and stay within 2% of
// current scaling's losses; steady training makes no layer fall back. A checkpoint carries the
// scales: a fresh model continues bit for bit, and a model of current scaling refuses the
// file. A layer whose input then grows 8-fold a step (its norm's weights scaled) outruns its
// delayed scale three steps in a row and falls back to bf16, with the reason; a checkpoint
// keeps the fallback.
TEST(GpuModelTest, DelayedFp8ScalingTrainsCheckpointsAndFallsBack) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device here: the GPU model is checked on the lent GPU machine";
  const ModelConfig config = *ModelPreset("tiny");
  const int batch = 2, seq = 32, n = batch * seq;
  Fp8ScalingOptions delayed_options, current_options;
  current_options.delayed = false;
  auto make = [&](const Fp8ScalingOptions& o) {
    auto m = GpuModel::Create(config, batch, seq);
    EXPECT_TRUE(m.ok()) << m.status();
    EXPECT_TRUE((*m)->UseFp8({}, o).ok());
    EXPECT_TRUE((*m)->InitParams(5).ok());
    return std::move(*m);
  };
  auto delayed = make(delayed_options), current = make(current_options);
  std::mt19937_64 rng(51);
  std::vector<Batch> batches;
  for (int i = 0; i < 8; ++i) batches.push_back(RandomBatch(n, config.vocab, rng));
  EXPECT_EQ(Fp8TrainStep(*delayed, batches[0], 1), Fp8TrainStep(*current, batches[0], 1));
  for (int at = 2; at <= 3; ++at) {
    const double d = Fp8TrainStep(*delayed, batches[at - 1], at), c = Fp8TrainStep(*current, batches[at - 1], at);
    EXPECT_NEAR(d, c, 0.02 * c) << "step " << at;
  }
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = std::string(tmp ? tmp : "/tmp") + "/fp8-ckpt-" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  auto save = [&](GpuModel& m, int step) {
    auto writer = CheckpointWriter::Create(dir, step);
    EXPECT_TRUE(writer.ok()) << writer.status();
    EXPECT_TRUE(m.SaveState(**writer).ok());
    auto path = (*writer)->Commit();
    EXPECT_TRUE(path.ok()) << path.status();
    return *path;
  };
  const std::string path = save(*delayed, 3);
  auto fresh = make(delayed_options);
  auto reader = CheckpointReader::Open(path);
  ASSERT_TRUE(reader.ok());
  ASSERT_TRUE(fresh->LoadState(**reader).ok());
  EXPECT_EQ(Fp8TrainStep(*fresh, batches[3], 4), Fp8TrainStep(*delayed, batches[3], 4));
  std::vector<float> a, b;
  ASSERT_TRUE(fresh->GetParams(&a).ok());
  ASSERT_TRUE(delayed->GetParams(&b).ok());
  EXPECT_EQ(a, b);
  const std::vector<std::string> steady = delayed->Fp8FallBack(3);
  EXPECT_TRUE(steady.empty()) << "steady training makes no layer fall back: " << (steady.empty() ? "" : steady[0]);
  auto other = make(current_options);
  auto again = CheckpointReader::Open(path);
  ASSERT_TRUE(again.ok());
  const absl::Status refused = other->LoadState(**again);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_NE(refused.message().find("--fp8_scaling"), absl::string_view::npos) << refused;
  // Layer 0's attention norm weights x 8 before each of three steps: its q, k, v input grows
  // past twice what its delayed scale allows, step after step.
  const std::vector<TensorLayout> layout = ParamLayout(config);
  for (int at = 5; at <= 7; ++at) {
    ASSERT_TRUE(delayed->GetParams(&b).ok());
    for (const TensorLayout& t : layout) {
      if (t.name != "layers.0.attn_norm.w") continue;
      for (size_t i = 0; i < t.count; ++i) b[t.offset + i] *= 8.0f;
    }
    ASSERT_TRUE(delayed->SetParams(b).ok());
    Fp8TrainStep(*delayed, batches[at - 1], at);
  }
  const std::vector<std::string> lines = delayed->Fp8FallBack(3);
  ASSERT_FALSE(lines.empty());
  EXPECT_EQ(lines[0].rfind("layer 0 falls back to bf16: the attention norm's output (the q, k, v input) saturated 3 "
                           "steps in a row",
                           0),
            0u)
      << lines[0];
  for (const std::string& line : lines) std::printf("%s\n", line.c_str());
  EXPECT_FALSE(delayed->fp8_layers()[0]);
  EXPECT_TRUE(delayed->Fp8FallBack(3).empty()) << "a layer falls back once";
  const std::string after = save(*delayed, 7);
  auto resumed = make(delayed_options);
  auto third = CheckpointReader::Open(after);
  ASSERT_TRUE(third.ok());
  ASSERT_TRUE(resumed->LoadState(**third).ok());
  EXPECT_EQ(resumed->fp8_layers(), delayed->fp8_layers());
  EXPECT_EQ(Fp8TrainStep(*resumed, batches[7], 8), Fp8TrainStep(*delayed, batches[7], 8));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace tierd::trainer::gpu
