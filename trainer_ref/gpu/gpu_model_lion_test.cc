// The GPU model stepping Lion (StateOptions::lion) or Adafactor (StateOptions::adafactor)
// against the CPU model stepping optimizer.h's LionStep or AdafactorStep, and their checkpoints. Part of gpu_model_test
// (one binary to carry); needs a CUDA device.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "trainer_ref/checkpoint.h"
#include "trainer_ref/gpu/gpu_model.h"
#include "trainer_ref/gpu/gpu_model_test_oracle.h"
#include "trainer_ref/model.h"
#include "trainer_ref/optimizer.h"

namespace tierd::trainer::gpu {
namespace {

using testing::Batch;
using testing::HaveGpu;
using testing::InitWithBf16Matrices;
using testing::RandomBatch;

// `trained`'s state (optimizer `state`) through a checkpoint into a fresh model: the next step
// (`step(model, 9)`) gives the same loss and master weights bit for bit; a model of each of
// `others` refuses the file, naming `refusal`.
void ExpectCheckpointContinues(GpuModel& trained, const ModelConfig& config, int batch, int seq,
                               const StateOptions& state, const std::function<double(GpuModel&, int)>& step,
                               const std::vector<StateOptions>& others, const std::string& refusal) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = std::string(tmp ? tmp : "/tmp") + "/opt-ckpt-" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  auto writer = CheckpointWriter::Create(dir, 8);
  ASSERT_TRUE(writer.ok());
  ASSERT_TRUE(trained.SaveState(**writer).ok());
  auto path = (*writer)->Commit();
  ASSERT_TRUE(path.ok()) << path.status();
  auto fresh = GpuModel::Create(config, batch, seq, nullptr, state);
  ASSERT_TRUE(fresh.ok());
  auto reader = CheckpointReader::Open(*path);
  ASSERT_TRUE(reader.ok());
  ASSERT_TRUE((*fresh)->LoadState(**reader).ok());
  EXPECT_EQ(step(**fresh, 9), step(trained, 9));
  std::vector<float> a, b;
  ASSERT_TRUE((*fresh)->GetParams(&a).ok());
  ASSERT_TRUE(trained.GetParams(&b).ok());
  EXPECT_EQ(a, b);
  for (const StateOptions& other : others) {
    auto model = GpuModel::Create(config, batch, seq, nullptr, other);
    ASSERT_TRUE(model.ok());
    auto again = CheckpointReader::Open(*path);
    ASSERT_TRUE(again.ok());
    const absl::Status refused = (*model)->LoadState(**again);
    EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
    EXPECT_NE(refused.message().find(refusal), absl::string_view::npos) << refused;
  }
  std::filesystem::remove_all(dir);
}

// 8 Lion steps (lr 1e-3, Lion's betas, decay 0.1) on the same random batches: each step's GPU
// loss within 1% of the CPU's (Lion moves every element by the same size, so its losses part
// from the CPU's no faster than AdamW's); the state has no second moment (8 bytes a parameter
// of master and moment against AdamW's 12). A checkpoint continues bit for bit; an AdamW
// model refuses it; Lion with 8-bit moments is refused.
TEST(GpuModelTest, LionTracksTheCpuModelAndCheckpoints) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device here: the GPU model is checked on the lent GPU machine";
  const ModelConfig config = *ModelPreset("tiny");
  const int batch = 2, seq = 32, n = batch * seq;
  const StateOptions lion{.lion = true};
  const GpuHomeLayout layout = GpuModel::HomeLayout(config, batch, seq, lion);
  EXPECT_EQ(layout.TotalOf(Part::kAdamV), 0u);
  EXPECT_EQ(layout.TotalOf(Part::kAdamM), layout.TotalOf(Part::kMaster));
  Model<float> cpu(config, batch, seq);
  InitWithBf16Matrices(cpu, 13);
  auto gpu = GpuModel::Create(config, batch, seq, nullptr, lion);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  ASSERT_TRUE((*gpu)->SetParams(cpu.params()).ok());
  LionOptions lo;
  AdamWOptions as_adam;  // the model reads Lion's betas and decay from these
  as_adam.beta1 = lo.beta1;
  as_adam.beta2 = lo.beta2;
  as_adam.weight_decay = lo.weight_decay;
  std::vector<float> m(cpu.params().size(), 0.f);
  std::mt19937_64 rng(14);
  std::vector<Batch> batches;
  for (int step = 1; step <= 10; ++step) batches.push_back(RandomBatch(n, config.vocab, rng));
  auto gpu_step = [&](GpuModel& model, int step) {
    EXPECT_TRUE(model.ZeroGrads().ok());
    auto loss = model.Forward(batches[step - 1].tokens.data(), batches[step - 1].targets.data());
    EXPECT_TRUE(loss.ok()) << loss.status();
    EXPECT_TRUE(model.Backward().ok());
    EXPECT_TRUE(model.AdamWStep(1e-3, step, as_adam, 1.0).ok());
    return loss.ok() ? *loss : 0.0;
  };
  for (int step = 1; step <= 8; ++step) {
    cpu.ZeroGrads();
    const double lc = cpu.Forward(batches[step - 1].tokens.data(), batches[step - 1].targets.data());
    cpu.Backward();
    for (const TensorLayout& t : cpu.layout()) {
      LionStep(cpu.params().data() + t.offset, cpu.grads().data() + t.offset, m.data() + t.offset, t.count, 1e-3, lo,
               /*decay=*/t.shape.size() > 1);
    }
    const double lg = gpu_step(**gpu, step);
    std::printf("lion step %d: loss cpu %.5f gpu %.5f\n", step, lc, lg);
    EXPECT_NEAR(lg, lc, 0.01 * lc) << "step " << step;
  }
  ExpectCheckpointContinues(**gpu, config, batch, seq, lion, gpu_step, {StateOptions{}}, "optimizer=lion");
  const auto both = GpuModel::Create(config, batch, seq, nullptr, {.moments_8bit = true, .lion = true});
  EXPECT_EQ(both.status().code(), absl::StatusCode::kInvalidArgument);
}

// 8 Adafactor steps (lr 1e-3, decay 0.1) on the same random batches: each step's GPU loss within
// 1% of the CPU's; the state is each matrix's rows + cols floats (a few per cent of the master
// weights' bytes) and no second part. A checkpoint continues bit for bit; an AdamW model and a
// Lion model refuse it.
TEST(GpuModelTest, AdafactorTracksTheCpuModelAndCheckpoints) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device here: the GPU model is checked on the lent GPU machine";
  const ModelConfig config = *ModelPreset("tiny");
  const int batch = 2, seq = 32, n = batch * seq;
  const StateOptions adafactor{.adafactor = true};
  const GpuHomeLayout layout = GpuModel::HomeLayout(config, batch, seq, adafactor);
  EXPECT_EQ(layout.TotalOf(Part::kAdamV), 0u);
  uint64_t factored = 0;
  for (const TensorLayout& t : ParamLayout(config)) {
    factored += 4 * (t.shape.size() == 2 ? t.shape[0] + t.shape[1] : t.count);
  }
  EXPECT_EQ(layout.TotalOf(Part::kAdamM), factored);
  EXPECT_LT(layout.TotalOf(Part::kAdamM), layout.TotalOf(Part::kMaster) / 10);
  Model<float> cpu(config, batch, seq);
  InitWithBf16Matrices(cpu, 15);
  auto gpu = GpuModel::Create(config, batch, seq, nullptr, adafactor);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  ASSERT_TRUE((*gpu)->SetParams(cpu.params()).ok());
  std::vector<std::vector<float>> state;
  for (const TensorLayout& t : cpu.layout()) {
    state.emplace_back(t.shape.size() == 2 ? t.shape[0] + t.shape[1] : t.count, 0.f);
  }
  std::mt19937_64 rng(16);
  std::vector<Batch> batches;
  for (int step = 1; step <= 10; ++step) batches.push_back(RandomBatch(n, config.vocab, rng));
  AdamWOptions as_adam;  // the model reads the decay from these
  auto gpu_step = [&](GpuModel& model, int step) {
    EXPECT_TRUE(model.ZeroGrads().ok());
    auto loss = model.Forward(batches[step - 1].tokens.data(), batches[step - 1].targets.data());
    EXPECT_TRUE(loss.ok()) << loss.status();
    EXPECT_TRUE(model.Backward().ok());
    EXPECT_TRUE(model.AdamWStep(1e-3, step, as_adam, 1.0).ok());
    return loss.ok() ? *loss : 0.0;
  };
  for (int step = 1; step <= 8; ++step) {
    cpu.ZeroGrads();
    const double lc = cpu.Forward(batches[step - 1].tokens.data(), batches[step - 1].targets.data());
    cpu.Backward();
    size_t e = 0;
    for (const TensorLayout& t : cpu.layout()) {
      const bool matrix = t.shape.size() == 2;
      AdafactorStep(cpu.params().data() + t.offset, cpu.grads().data() + t.offset, state[e++].data(),
                    matrix ? t.shape[0] : t.count, matrix ? t.shape[1] : 0, 1e-3, step, AdafactorOptions{},
                    /*decay=*/matrix);
    }
    const double lg = gpu_step(**gpu, step);
    std::printf("adafactor step %d: loss cpu %.5f gpu %.5f\n", step, lc, lg);
    EXPECT_NEAR(lg, lc, 0.01 * lc) << "step " << step;
  }
  ExpectCheckpointContinues(**gpu, config, batch, seq, adafactor, gpu_step,
                            {StateOptions{}, StateOptions{.lion = true}}, "optimizer=adafactor");
  EXPECT_EQ(GpuModel::Create(config, batch, seq, nullptr, {.lion = true, .adafactor = true}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tierd::trainer::gpu
