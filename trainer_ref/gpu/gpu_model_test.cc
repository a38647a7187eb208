// The whole decoder on the GPU against the CPU model (the oracle) on the tiny config: the
// same parameters (matrices rounded to bf16 for both, so only the arithmetic differs), the
// same batch. The GPU keeps activations in bf16, so the tolerances are of that size:
//   loss within 1% relative; each parameter's gradient within 5% relative L2 error of the
//   CPU's; over 8 AdamW steps the losses stay within 3% of the CPU's, step by step.
// Needs a CUDA device (skipped without one; run on the lent GPU machine).
#include "trainer_ref/gpu/gpu_model.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "trainer_ref/adamw8bit.h"
#include "trainer_ref/gpu/gpu_model_test_oracle.h"
#include "trainer_ref/model.h"
#include "trainer_ref/optimizer.h"

namespace tierd::trainer::gpu {
namespace {

using testing::Batch;
using testing::ExpectTrainingTracksTheCpu;
using testing::GradientErrors;
using testing::HaveGpu;
using testing::InitWithBf16Matrices;
using testing::RandomBatch;

TEST(GpuModelTest, ForwardBackwardAndTrainingTrackTheCpuModel) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device here: the GPU model is checked on the lent GPU machine";
  const ModelConfig config = *ModelPreset("tiny");
  const int batch = 2, seq = 32, n = batch * seq;
  Model<float> cpu(config, batch, seq);
  InitWithBf16Matrices(cpu, 11);
  auto gpu = GpuModel::Create(config, batch, seq);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  ASSERT_TRUE((*gpu)->SetParams(cpu.params()).ok());
  std::mt19937_64 rng(12);
  const Batch b = RandomBatch(n, config.vocab, rng);

  cpu.ZeroGrads();
  const double cpu_loss = cpu.Forward(b.tokens.data(), b.targets.data());
  cpu.Backward();
  ASSERT_TRUE((*gpu)->ZeroGrads().ok());
  auto gpu_loss = (*gpu)->Forward(b.tokens.data(), b.targets.data());
  ASSERT_TRUE(gpu_loss.ok()) << gpu_loss.status();
  ASSERT_TRUE((*gpu)->Backward().ok());
  EXPECT_NEAR(*gpu_loss, cpu_loss, 0.01 * cpu_loss);
  std::vector<float> grads;
  ASSERT_TRUE((*gpu)->GetGrads(&grads).ok());
  double worst = 0;
  const std::vector<double> errors = GradientErrors(cpu, grads);
  for (size_t k = 0; k < errors.size(); ++k) {
    const std::string& name = cpu.layout()[k].name;
    ASSERT_TRUE(std::isfinite(errors[k])) << name << ": the CPU gradient is zero, so the check would be empty";
    worst = std::max(worst, errors[k]);
    EXPECT_LT(errors[k], 0.05) << name;
  }
  auto norm = (*gpu)->GradNorm();
  ASSERT_TRUE(norm.ok()) << norm.status();
  EXPECT_NEAR(*norm, GlobalNorm(cpu.grads().data(), cpu.grads().size()), 0.02 * *norm);
  std::printf("loss cpu %.6f gpu %.6f; worst gradient relative L2 error %.4f over %zu tensors\n", cpu_loss, *gpu_loss,
              worst, cpu.layout().size());

  // Training: the same batches, AdamW on both.
  ExpectTrainingTracksTheCpu(cpu, **gpu, n, rng, 0.03, "");
  std::printf("device bytes held: %lu\n", static_cast<unsigned long>((*gpu)->DeviceBytes()));
}

// InitParams: deterministic for a seed, different across seeds, and of the CPU model's
// distribution: per matrix mean ~0 and standard deviation 0.02 (output projections
// 0.02 / sqrt(2 L)), norm weights exactly 1.
TEST(GpuModelTest, InitParamsHasTheReferenceDistribution) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device here: the GPU model is checked on the lent GPU machine";
  const ModelConfig config = *ModelPreset("tiny");
  auto gpu = GpuModel::Create(config, 1, 8);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  std::vector<float> a, b, c;
  ASSERT_TRUE((*gpu)->InitParams(7).ok());
  ASSERT_TRUE((*gpu)->GetParams(&a).ok());
  ASSERT_TRUE((*gpu)->InitParams(7).ok());
  ASSERT_TRUE((*gpu)->GetParams(&b).ok());
  ASSERT_TRUE((*gpu)->InitParams(8).ok());
  ASSERT_TRUE((*gpu)->GetParams(&c).ok());
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  for (const TensorLayout& t : ParamLayout(config)) {
    double sum = 0, squares = 0;
    for (size_t i = 0; i < t.count; ++i) {
      sum += a[t.offset + i];
      squares += static_cast<double>(a[t.offset + i]) * a[t.offset + i];
    }
    const double mean = sum / t.count, sd = std::sqrt(squares / t.count - mean * mean);
    if (t.shape.size() == 1) {
      EXPECT_EQ(mean, 1.0) << t.name;
      EXPECT_EQ(sd, 0.0) << t.name;
      continue;
    }
    const bool out = t.name.find("attn.wo") != std::string::npos || t.name.find("mlp.w2") != std::string::npos;
    const double want = 0.02 / (out ? std::sqrt(2.0 * config.layers) : 1.0);
    // count >= 4096 values: the sample sd is within a few percent of sigma, the mean within
    // a few sigma / sqrt(count).
    EXPECT_NEAR(sd, want, 0.05 * want) << t.name;
    EXPECT_NEAR(mean, 0.0, 5 * want / std::sqrt(static_cast<double>(t.count))) << t.name;
  }
}

// Activation checkpointing: a layer keeps only its input and its backward recomputes the
// rest, so the same loss and, up to the float atomics of two gradient kernels (embedding,
// norm weights), the same gradients, from much less saved memory.
TEST(GpuModelTest, CheckpointingGivesTheSameLossAndGradients) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device here: the GPU model is checked on the lent GPU machine";
  const ModelConfig config{"ckpt", 3, 128, 2, 352, 512, 128};  // head size 64: the tensor-core attention
  const int batch = 2, seq = 128;
  const GpuHomeLayout full = GpuModel::HomeLayout(config, batch, seq);
  const GpuHomeLayout ckpt = GpuModel::HomeLayout(config, batch, seq, {.checkpointing = true});
  EXPECT_LT(ckpt.TotalOf(Part::kActs) * 5, full.TotalOf(Part::kActs)) << "saves a fifth or less";
  // --grad_checkpointing=dynamic's split: the last layer keeps everything, the others their input.
  const StateOptions split{.checkpointing = true, .kept_layers = 1};
  const GpuHomeLayout dynamic = GpuModel::HomeLayout(config, batch, seq, split);
  EXPECT_EQ(dynamic.bytes[1][static_cast<int>(Part::kActs)], ckpt.bytes[1][static_cast<int>(Part::kActs)]);
  EXPECT_EQ(dynamic.bytes[3][static_cast<int>(Part::kActs)], full.bytes[3][static_cast<int>(Part::kActs)]);
  const StateOptions all_kept{.checkpointing = true, .kept_layers = 3};
  EXPECT_EQ(GpuModel::HomeLayout(config, batch, seq, all_kept).TotalOf(Part::kActs), full.TotalOf(Part::kActs));
  EXPECT_EQ(GpuModel::WorkspaceBytesFor(config, batch, seq, all_kept), GpuModel::WorkspaceBytesFor(config, batch, seq))
      << "nothing recomputes: no recompute buffers";
  // Per saved tensor: layer 0 recomputes, layer 1 keeps lean (all but its norms' and SwiGLU's
  // outputs), layer 2 keeps everything.
  const StateOptions lean{.checkpointing = true, .kept_layers = 1, .lean_layers = 1};
  const GpuHomeLayout leaning = GpuModel::HomeLayout(config, batch, seq, lean);
  const int acts = static_cast<int>(Part::kActs);
  EXPECT_EQ(leaning.bytes[1][acts], ckpt.bytes[1][acts]);
  EXPECT_EQ(leaning.bytes[3][acts], full.bytes[3][acts]);
  // Two n x c and one n x f bf16 tensors fewer (256-byte aligned sizes here).
  EXPECT_EQ(leaning.bytes[2][acts], full.bytes[2][acts] - 2 * (batch * seq * 128 * 2) - batch * seq * 352 * 2);
  auto plain = GpuModel::Create(config, batch, seq);
  auto recomputing = GpuModel::Create(config, batch, seq, nullptr, {.checkpointing = true});
  auto partly = GpuModel::Create(config, batch, seq, nullptr, split);
  auto lean_model = GpuModel::Create(config, batch, seq, nullptr, lean);
  ASSERT_TRUE(lean_model.ok()) << lean_model.status();
  ASSERT_TRUE(plain.ok()) << plain.status();
  ASSERT_TRUE(recomputing.ok()) << recomputing.status();
  ASSERT_TRUE(partly.ok()) << partly.status();
  EXPECT_EQ((*recomputing)->WorkspaceBytes(), GpuModel::WorkspaceBytesFor(config, batch, seq, {.checkpointing = true}));
  EXPECT_EQ((*partly)->WorkspaceBytes(), (*recomputing)->WorkspaceBytes());
  std::mt19937_64 rng(21);
  const Batch b = RandomBatch(batch * seq, config.vocab, rng);
  constexpr int kModels = 4;
  std::vector<float> grads[kModels];
  double losses[kModels];
  GpuModel* models[kModels] = {plain->get(), recomputing->get(), partly->get(), lean_model->get()};
  const char* names[kModels] = {"plain", "full", "dynamic", "dynamic with a lean layer"};
  for (int m = 0; m < kModels; ++m) {
    ASSERT_TRUE(models[m]->InitParams(3).ok());
    ASSERT_TRUE(models[m]->ZeroGrads().ok());
    for (int micro = 0; micro < 2; ++micro) {  // accumulation over two micro-batches
      auto loss = models[m]->Forward(b.tokens.data(), b.targets.data());
      ASSERT_TRUE(loss.ok()) << loss.status();
      losses[m] = *loss;
      ASSERT_TRUE(models[m]->Backward().ok());
    }
    ASSERT_TRUE(models[m]->GetGrads(&grads[m]).ok());
  }
  EXPECT_EQ(losses[0], losses[1]) << "the forward is the same computation";
  EXPECT_EQ(losses[0], losses[2]);
  EXPECT_EQ(losses[0], losses[3]);
  for (int m = 1; m < kModels; ++m) {
    for (const TensorLayout& t : ParamLayout(config)) {
      double diff = 0, norm = 0;
      for (size_t i = 0; i < t.count; ++i) {
        const double x = grads[0][t.offset + i], y = grads[m][t.offset + i];
        diff += (x - y) * (x - y);
        norm += x * x;
      }
      ASSERT_GT(norm, 0) << t.name;
      EXPECT_LT(std::sqrt(diff / norm), 1e-5) << t.name << " (" << names[m] << ")";
    }
  }
}

// --fused_norms: the residual add, the copies the backward keeps and the norms in one kernel
// (and a layer's last add carried into the next layer's first norm) give the same loss and
// gradients to the bit, plain, with checkpointing (the recompute's forward fused too; fp32 or
// bf16 checkpoints; a layer of each kind: recomputed, lean, kept) and in FP8.
TEST(GpuModelTest, FusedNormsGiveTheSameBits) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device here: the GPU model is checked on the lent GPU machine";
  const ModelConfig config{"fused", 3, 128, 2, 352, 512, 128};
  const int batch = 2, seq = 128;
  std::mt19937_64 rng(23);
  const Batch b = RandomBatch(batch * seq, config.vocab, rng);
  struct Variant {
    const char* name;
    StateOptions state;
  };
  const Variant variants[] = {
      {"every activation kept", {}},
      {"checkpointing", {.checkpointing = true}},
      {"bf16 checkpoints", {.checkpointing = true, .bf16_checkpoints = true}},
      {"recomputed, lean and kept layers", {.checkpointing = true, .kept_layers = 1, .lean_layers = 1}},
  };
  for (const Variant& v : variants) {
    for (const bool fp8 : {false, true}) {
      SCOPED_TRACE(std::string(v.name) + (fp8 ? ", fp8" : ""));
      std::vector<float> grads[2];
      double losses[2] = {0, 0};
      for (int fused = 0; fused < 2; ++fused) {
        StateOptions state = v.state;
        state.fused_norms = fused == 1;
        auto model = GpuModel::Create(config, batch, seq, nullptr, state);
        ASSERT_TRUE(model.ok()) << model.status();
        if (fp8) ASSERT_TRUE((*model)->UseFp8().ok());
        ASSERT_TRUE((*model)->InitParams(5).ok());
        ASSERT_TRUE((*model)->ZeroGrads().ok());
        for (int micro = 0; micro < 2; ++micro) {
          auto loss = (*model)->Forward(b.tokens.data(), b.targets.data());
          ASSERT_TRUE(loss.ok()) << loss.status();
          losses[fused] += *loss;
          ASSERT_TRUE((*model)->Backward().ok());
        }
        ASSERT_TRUE((*model)->GetGrads(&grads[fused]).ok());
      }
      EXPECT_EQ(losses[0], losses[1]);
      ASSERT_EQ(grads[0].size(), grads[1].size());
      EXPECT_EQ(std::memcmp(grads[0].data(), grads[1].data(), grads[0].size() * sizeof(float)), 0);
    }
  }
}

// Layer-major order over K micro-batches: the same mean loss, gradients and gradient norm,
// bit for bit, as K Forward/Backward pairs; with and without checkpointing; the model's home
// holds each layer's saved tensor per micro-batch (K slots) and refuses a home made for one.
// In FP8 too: there layer-major reuses a layer's weight codes over the K micro-batches that
// one-by-one makes K times, so equal bits also say the kept codes are the right ones.
// kept_layers, lean_layers: with checkpointing, the last layers that keep everything and the
// ones before them that keep lean (dynamic's split).
void CheckLayerMajor(bool checkpointing, bool fp8 = false, int kept_layers = 0, int lean_layers = 0) {
  const ModelConfig config{"lm", 3, 128, 2, 352, 512, 128};  // head size 64: the tensor-core attention
  const int batch = 2, seq = 128, micro = 3, n = batch * seq;
  const StateOptions layered{.checkpointing = checkpointing,
                             .kept_layers = kept_layers,
                             .lean_layers = lean_layers,
                             .layer_major_micro_batches = micro};
  const StateOptions one_state{.checkpointing = checkpointing, .kept_layers = kept_layers, .lean_layers = lean_layers};
  const GpuHomeLayout one = GpuModel::HomeLayout(config, batch, seq, one_state);
  const GpuHomeLayout slots = GpuModel::HomeLayout(config, batch, seq, layered);
  EXPECT_EQ(slots.TotalOf(Part::kActs), micro * one.TotalOf(Part::kActs));
  EXPECT_EQ(slots.Chunks(1, Part::kActs), micro);
  EXPECT_EQ(PartName(slots, 1, Part::kActs, 2), "act.layers.0.2");
  auto wrong_home = MakePlainGpuHome(one);
  ASSERT_TRUE(wrong_home.ok());
  EXPECT_EQ(GpuModel::Create(config, batch, seq, std::move(*wrong_home), layered).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto one_by_one = GpuModel::Create(config, batch, seq, nullptr, one_state);
  auto layer_major = GpuModel::Create(config, batch, seq, nullptr, layered);
  ASSERT_TRUE(one_by_one.ok()) << one_by_one.status();
  ASSERT_TRUE(layer_major.ok()) << layer_major.status();
  EXPECT_EQ((*layer_major)->WorkspaceBytes(), GpuModel::WorkspaceBytesFor(config, batch, seq, layered));
  if (fp8) {
    ASSERT_TRUE((*one_by_one)->UseFp8().ok());
    ASSERT_TRUE((*layer_major)->UseFp8().ok());
    EXPECT_EQ((*layer_major)->WorkspaceBytes(), GpuModel::WorkspaceBytesFor(config, batch, seq, layered) +
                                                    GpuModel::Fp8WorkspaceBytesFor(config, batch, seq));
  }
  std::mt19937_64 rng(33);
  std::vector<int32_t> tokens, targets;
  for (int m = 0; m < micro; ++m) {
    const Batch b = RandomBatch(n, config.vocab, rng);
    tokens.insert(tokens.end(), b.tokens.begin(), b.tokens.end());
    targets.insert(targets.end(), b.targets.begin(), b.targets.end());
  }
  ASSERT_TRUE((*one_by_one)->InitParams(5).ok());
  ASSERT_TRUE((*layer_major)->InitParams(5).ok());
  ASSERT_TRUE((*one_by_one)->ZeroGrads().ok());
  ASSERT_TRUE((*layer_major)->ZeroGrads().ok());
  double want = 0;
  for (int m = 0; m < micro; ++m) {
    auto loss = (*one_by_one)->Forward(tokens.data() + m * n, targets.data() + m * n);
    ASSERT_TRUE(loss.ok()) << loss.status();
    want += *loss / micro;
    ASSERT_TRUE((*one_by_one)->Backward().ok());
  }
  EXPECT_EQ((*one_by_one)->ForwardBackwardLayerMajor(tokens.data(), targets.data()).status().code(),
            absl::StatusCode::kFailedPrecondition);
  auto got = (*layer_major)->ForwardBackwardLayerMajor(tokens.data(), targets.data());
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, want);
  std::vector<float> a, b;
  ASSERT_TRUE((*one_by_one)->GetGrads(&a).ok());
  ASSERT_TRUE((*layer_major)->GetGrads(&b).ok());
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) ASSERT_EQ(a[i], b[i]) << "gradient element " << i;
  EXPECT_EQ(*(*one_by_one)->GradNorm(), *(*layer_major)->GradNorm());
  const double norm = *(*one_by_one)->GradNorm();
  // The same micro-batches queued without a wait each (ForwardQueued), the losses taken once;
  // told the step's micro-batches (SetDataParallel, one rank), the model takes the norm in the
  // last backward only: the same norm, and none to read before it.
  (*one_by_one)->SetDataParallel(nullptr, micro);
  ASSERT_TRUE((*one_by_one)->ZeroGrads().ok());
  for (int m = 0; m < micro; ++m) {
    if (m > 0) {
      EXPECT_EQ((*one_by_one)->GradNorm().status().code(), absl::StatusCode::kFailedPrecondition) << m;
    }
    ASSERT_TRUE((*one_by_one)->ForwardQueued(tokens.data() + m * n, targets.data() + m * n).ok());
    ASSERT_TRUE((*one_by_one)->Backward().ok());
  }
  auto queued = (*one_by_one)->TakeLoss();
  ASSERT_TRUE(queued.ok()) << queued.status();
  EXPECT_EQ(*queued, want);
  ASSERT_TRUE((*one_by_one)->GetGrads(&a).ok());
  EXPECT_EQ(a, b);
  EXPECT_EQ(*(*one_by_one)->GradNorm(), norm);
}

// One training step on batch `b` (step number `at`): its loss.
double TrainStep(GpuModel& m, const Batch& b, int at, double grad_scale) {
  EXPECT_TRUE(m.ZeroGrads().ok());
  auto loss = m.Forward(b.tokens.data(), b.targets.data());
  EXPECT_TRUE(loss.ok()) << loss.status();
  EXPECT_TRUE(m.Backward().ok());
  EXPECT_TRUE(m.AdamWStep(1e-3, at, AdamWOptions{}, grad_scale).ok());
  return loss.ok() ? *loss : 0;
}

// `trained`'s state through a checkpoint file into `fresh`: the next step (`at`) of each has
// the same loss and leaves the same master weights; `other` refuses the file, its message
// holding `refusal`.
void CheckCheckpointRoundTrip(GpuModel& trained, GpuModel& fresh, GpuModel& other, const Batch& b, int at,
                              double grad_scale, const std::string& refusal) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = std::string(tmp ? tmp : "/tmp") + "/gpu-ckpt-" + std::to_string(getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  auto writer = CheckpointWriter::Create(dir, 2);
  ASSERT_TRUE(writer.ok()) << writer.status();
  ASSERT_TRUE(trained.SaveState(**writer).ok());
  auto path = (*writer)->Commit();
  ASSERT_TRUE(path.ok()) << path.status();
  auto reader = CheckpointReader::Open(*path);
  ASSERT_TRUE(reader.ok());
  ASSERT_TRUE(fresh.LoadState(**reader).ok());
  EXPECT_EQ(TrainStep(fresh, b, at, grad_scale), TrainStep(trained, b, at, grad_scale));
  std::vector<float> a, c;
  ASSERT_TRUE(trained.GetParams(&a).ok());
  ASSERT_TRUE(fresh.GetParams(&c).ok());
  EXPECT_EQ(a, c);
  auto again = CheckpointReader::Open(*path);
  ASSERT_TRUE(again.ok());
  const absl::Status refused = other.LoadState(**again);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_NE(refused.message().find(refusal), absl::string_view::npos) << refused;
  std::filesystem::remove_all(dir);
}

// A checkpoint of a trained model, loaded into a fresh one, continues bit for bit (the next
// step's loss and the master weights); one of another shape is refused with both shapes.
TEST(GpuModelTest, ACheckpointContinuesBitForBitAndRefusesAnotherShape) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device here: the GPU model is checked on the lent GPU machine";
  const ModelConfig config{"ck", 2, 128, 2, 352, 512, 128};
  const int batch = 2, seq = 64;
  auto trained = GpuModel::Create(config, batch, seq);
  auto fresh = GpuModel::Create(config, batch, seq);
  ASSERT_TRUE(trained.ok() && fresh.ok());
  std::mt19937_64 rng(41);
  const Batch b = RandomBatch(batch * seq, config.vocab, rng);
  ASSERT_TRUE((*trained)->InitParams(2).ok());
  ASSERT_TRUE((*fresh)->InitParams(9).ok());  // other weights, to be overwritten
  for (int at = 1; at <= 2; ++at) TrainStep(**trained, b, at, 1.0);
  ModelConfig wider = config;
  wider.d_ff = 384;
  auto other = GpuModel::Create(wider, batch, seq);
  ASSERT_TRUE(other.ok());
  CheckCheckpointRoundTrip(**trained, **fresh, **other, b, 3, 1.0, "another model shape");
}

// The host's AdamW8bit over a model's parameters, tensor by tensor (each tensor's moments its
// own, as the CPU trainer keeps them): the reference the GPU's 8-bit steps are checked against.
// Tensors of fewer than `fp32_under` values step with fp32 moments (HostAdamW) instead.
class HostAdamW8bitReference {
 public:
  HostAdamW8bitReference(const ModelConfig& config, std::vector<float> master, int64_t fp32_under = 0)
      : layout_(ParamLayout(config)), master_(std::move(master)), fp32_under_(fp32_under) {
    for (const TensorLayout& t : layout_) {
      m_.emplace_back(Moment8bitBytes(t.count), 0);
      v_.emplace_back(Moment8bitBytes(t.count), 0);
      m32_.emplace_back(t.count, 0.f);
      v32_.emplace_back(t.count, 0.f);
    }
  }
  // Step `at` from `grads`, as GpuModel::AdamWStep(lr, at, AdamWOptions{}, grad_scale).
  void Step(const std::vector<float>& grads, int at, float lr, float grad_scale) {
    for (size_t e = 0; e < layout_.size(); ++e) {
      const TensorLayout& t = layout_[e];
      HostAdamWParams p;
      p.lr = lr;
      p.step = at;
      p.grad_scale = grad_scale;
      p.decay = t.shape.size() > 1;
      if (static_cast<int64_t>(t.count) < fp32_under_) {
        HostAdamW(master_.data() + t.offset, m32_[e].data(), v32_[e].data(), nullptr, grads.data() + t.offset,
                  static_cast<int64_t>(t.count), p);
        continue;
      }
      HostAdamW8bit(master_.data() + t.offset, m_[e].data(), v_[e].data(), nullptr, grads.data() + t.offset,
                    static_cast<int64_t>(t.count), p);
    }
  }
  // How many of the model's master weights differ from the host's in some bit.
  size_t Differ(GpuModel& model) const {
    std::vector<float> got;
    EXPECT_TRUE(model.GetParams(&got).ok());
    EXPECT_EQ(got.size(), master_.size());
    size_t differ = got.size() == master_.size() ? 0 : got.size() + master_.size();
    for (size_t i = 0; i < std::min(got.size(), master_.size()); ++i) {
      differ += std::memcmp(&got[i], &master_[i], sizeof(float)) != 0;
    }
    return differ;
  }

 private:
  std::vector<TensorLayout> layout_;
  std::vector<float> master_;
  int64_t fp32_under_;
  std::vector<std::vector<uint8_t>> m_, v_;
  std::vector<std::vector<float>> m32_, v32_;
};

// Three steps of `model` on `b`, each against `host` stepping the same gradients: the master
// weights the same to the bit after every step.
void StepBesideHost(GpuModel& model, HostAdamW8bitReference& host, const Batch& b) {
  for (int at = 1; at <= 3; ++at) {
    ASSERT_TRUE(model.ZeroGrads().ok());
    ASSERT_TRUE(model.Forward(b.tokens.data(), b.targets.data()).ok());
    ASSERT_TRUE(model.Backward().ok());
    std::vector<float> grads;
    ASSERT_TRUE(model.GetGrads(&grads).ok());
    ASSERT_TRUE(model.AdamWStep(1e-3, at, AdamWOptions{}, 0.5).ok());
    host.Step(grads, at, 1e-3f, 0.5f);
    ASSERT_EQ(host.Differ(model), 0u) << "master weights differ from the host's after step " << at;
  }
}

// For a layer's tensors in one launch (--optimizer_one_launch) and a launch a tensor: a model
// of `state` steps three times as the host does (fp32 moments under `fp32_under` values, 8-bit
// above), then a checkpoint of it continues bit for bit in a fresh model of `state` and a model
// of `refusing` refuses it (CheckCheckpointRoundTrip; `note` names the state's format).
void StepBesideHostBothWays(const ModelConfig& config, int batch, int seq, const StateOptions& state,
                            int64_t fp32_under, uint64_t seed, const StateOptions& refusing, const char* note) {
  for (const bool one_launch : {false, true}) {
    SCOPED_TRACE(one_launch ? "one launch a layer" : "a launch a tensor");
    StateOptions options = state;
    options.optimizer_one_launch = one_launch;
    auto model = GpuModel::Create(config, batch, seq, nullptr, options);
    ASSERT_TRUE(model.ok()) << model.status();
    ASSERT_TRUE((*model)->InitParams(4).ok());
    std::vector<float> master;
    ASSERT_TRUE((*model)->GetParams(&master).ok());
    HostAdamW8bitReference host(config, std::move(master), fp32_under);
    std::mt19937_64 rng(seed);
    const Batch b = RandomBatch(batch * seq, config.vocab, rng);
    ASSERT_NO_FATAL_FAILURE(StepBesideHost(**model, host, b));
    auto fresh = GpuModel::Create(config, batch, seq, nullptr, options);
    auto other = GpuModel::Create(config, batch, seq, nullptr, refusing);
    ASSERT_TRUE(fresh.ok() && other.ok());
    CheckCheckpointRoundTrip(**model, **fresh, **other, b, 4, 0.5, note);
  }
}

// 8-bit blockwise moments on the GPU: three steps give, bit for bit, the master weights the
// host's HostAdamW8bit makes from the same gradients, tensor by tensor (each tensor's
// moments its own, as the CPU trainer keeps them); a checkpoint of such a model continues
// bit for bit, and a model of fp32 moments refuses it. A layer's tensors in one launch
// (--optimizer_one_launch) or one a tensor alike.
TEST(GpuModelTest, EightBitMomentsStepAsTheHostDoesAndCheckpoint) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device here: the GPU model is checked on the lent GPU machine";
  const ModelConfig config{"q8", 2, 128, 2, 352, 512, 128};
  const int batch = 2, seq = 64;
  // Checkpointed, a fresh 8-bit model continues it; one of fp32 moments refuses it.
  StepBesideHostBothWays(config, batch, seq, {.moments_8bit = true}, /*fp32_under=*/0, 17, StateOptions{},
                         "moments=8bit");
}

// --adamw8bit_min_size: tensors under it (here the norms' 128 values) keep fp32 moments within
// the 8-bit state: their moment parts grow by what fp32 costs, three steps give the host's
// master weights bit for bit (8-bit for the matrices, fp32 AdamW for the norms), a checkpoint
// continues bit for bit and a model whose every tensor is 8-bit refuses it.
TEST(GpuModelTest, SmallTensorsKeepFp32MomentsBesideEightBitOnes) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device here: the GPU model is checked on the lent GPU machine";
  const ModelConfig config{"q8", 2, 128, 2, 352, 512, 128};
  const int batch = 2, seq = 64;
  const StateOptions mixed{.moments_8bit = true, .moments_8bit_min = 4096};
  const GpuHomeLayout all8 = GpuModel::HomeLayout(config, batch, seq, {.moments_8bit = true});
  const GpuHomeLayout some32 = GpuModel::HomeLayout(config, batch, seq, mixed);
  const int m = static_cast<int>(Part::kAdamM);
  // A layer's two norms: 2 x (128 x 4) fp32 bytes instead of 2 x Moment8bitBytes(128).
  EXPECT_EQ(some32.bytes[1][m], all8.bytes[1][m] + 2 * (128 * 4 - Moment8bitBytes(128)));
  // The fp32 tensors stepped beside one launch of the 8-bit ones too; every tensor 8-bit refuses it.
  StepBesideHostBothWays(config, batch, seq, mixed, /*fp32_under=*/4096, 19, {.moments_8bit = true},
                         "moments-fp32-under=4096");
}

// The compact state (StateOptions::compact: gradients kept as bf16 after accumulating in
// fp32, no bf16 weight copy kept): from the same weights, the same loss and gradient norm as
// the full state, and its gradients rounded once, bit for bit; three steps give the master
// weights the host's AdamW makes from those gradients; a checkpoint continues bit for bit and
// a full-state model refuses it; a second backward in one step is refused with the reason.
TEST(GpuModelTest, TheCompactStateKeepsGradientsRoundedOnceAndWeightsFromTheMaster) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device here: the GPU model is checked on the lent GPU machine";
  const ModelConfig config{"cs", 2, 128, 2, 352, 512, 128};
  const int batch = 2, seq = 64;
  const StateOptions compact_state{.moments_8bit = true, .compact = true};
  const GpuHomeLayout full_layout = GpuModel::HomeLayout(config, batch, seq, {.moments_8bit = true});
  const GpuHomeLayout layout = GpuModel::HomeLayout(config, batch, seq, compact_state);
  EXPECT_EQ(layout.TotalOf(Part::kWeights), 0u);
  EXPECT_EQ(2 * layout.TotalOf(Part::kGrads), full_layout.TotalOf(Part::kGrads));
  auto full = GpuModel::Create(config, batch, seq, nullptr, {.moments_8bit = true});
  auto model = GpuModel::Create(config, batch, seq, nullptr, compact_state);
  ASSERT_TRUE(full.ok()) << full.status();
  ASSERT_TRUE(model.ok()) << model.status();
  ASSERT_TRUE((*full)->InitParams(4).ok());
  ASSERT_TRUE((*model)->InitParams(4).ok());
  std::mt19937_64 rng(19);
  const Batch b = RandomBatch(batch * seq, config.vocab, rng);
  std::vector<float> master;
  ASSERT_TRUE((*model)->GetParams(&master).ok());
  HostAdamW8bitReference host(config, std::move(master));
  for (int at = 1; at <= 3; ++at) {
    ASSERT_TRUE((*model)->ZeroGrads().ok());
    auto loss = (*model)->Forward(b.tokens.data(), b.targets.data());
    ASSERT_TRUE(loss.ok()) << loss.status();
    ASSERT_TRUE((*model)->Backward().ok());
    std::vector<float> grads;
    ASSERT_TRUE((*model)->GetGrads(&grads).ok());
    if (at == 1) {  // the same weights as the full state's: the same sums
      ASSERT_TRUE((*full)->ZeroGrads().ok());
      auto full_loss = (*full)->Forward(b.tokens.data(), b.targets.data());
      ASSERT_TRUE(full_loss.ok());
      ASSERT_TRUE((*full)->Backward().ok());
      EXPECT_EQ(*loss, *full_loss);
      EXPECT_EQ(*(*model)->GradNorm(), *(*full)->GradNorm());
      std::vector<float> full_grads;
      ASSERT_TRUE((*full)->GetGrads(&full_grads).ok());
      ASSERT_EQ(grads.size(), full_grads.size());
      size_t differ = 0, nonzero = 0;
      for (size_t i = 0; i < grads.size(); ++i) {
        differ += grads[i] != FromBf16(ToBf16(full_grads[i]));
        nonzero += grads[i] != 0;
      }
      EXPECT_EQ(differ, 0u) << "of " << grads.size() << " gradients are not the full state's rounded once";
      EXPECT_GT(nonzero, grads.size() / 2);
    }
    ASSERT_TRUE((*model)->AdamWStep(1e-3, at, AdamWOptions{}, 0.5).ok());
    host.Step(grads, at, 1e-3f, 0.5f);
    ASSERT_EQ(host.Differ(**model), 0u) << "master weights differ from the host's after step " << at;
  }
  auto fresh = GpuModel::Create(config, batch, seq, nullptr, compact_state);
  ASSERT_TRUE(fresh.ok());
  ASSERT_TRUE((*fresh)->InitParams(8).ok());  // other weights, to be overwritten
  CheckCheckpointRoundTrip(**model, **fresh, **full, b, 4, 0.5, "state=compact");
  // Two backwards in a step would round the first's gradients before the second adds to them.
  ASSERT_TRUE((*fresh)->ZeroGrads().ok());
  for (int micro = 0; micro < 2; ++micro) ASSERT_TRUE((*fresh)->Forward(b.tokens.data(), b.targets.data()).ok());
  ASSERT_TRUE((*fresh)->Backward().ok());
  const absl::Status second = (*fresh)->Backward();
  EXPECT_EQ(second.code(), absl::StatusCode::kFailedPrecondition) << second;
  EXPECT_NE(second.message().find("--step_order=layer"), std::string::npos) << second;
}

TEST(GpuModelTest, LayerMajorOrderGivesTheSameLossAndGradientsBitForBit) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device here: the GPU model is checked on the lent GPU machine";
  CheckLayerMajor(/*checkpointing=*/true);
  CheckLayerMajor(/*checkpointing=*/false);
  CheckLayerMajor(/*checkpointing=*/true, /*fp8=*/true);
  CheckLayerMajor(/*checkpointing=*/true, /*fp8=*/false, /*kept_layers=*/2);  // --grad_checkpointing=dynamic
  CheckLayerMajor(/*checkpointing=*/true, /*fp8=*/false, /*kept_layers=*/1, /*lean_layers=*/1);
  CheckLayerMajor(/*checkpointing=*/true, /*fp8=*/true, /*kept_layers=*/0, /*lean_layers=*/2);
}

}  // namespace
}  // namespace tierd::trainer::gpu
