// The GPU trainer (trainer_ref/gpu/gpu_model) with its weights, master weights,
// gradients, Adam moments and saved activations leased from the real tierd binary on the
// real GPU, in a GPU quota about a third of the model's state: every step moves parts
// GPU <-> DRAM (<-> NVMe) while the kernels run, and the run tracks the same model on plain
// GPU buffers. Not bit for bit: two of the kernels (embedding and norm-weight gradients)
// sum with float atomics, whose order differs from run to run, so the bound is that noise
// (1e-5 relative on losses, 1e-4 relative L2 on the final weights), far below any lost or
// stale byte (a stale layer shows at percent level).
// Needs a CUDA device and the tierd binary (TIERD_BIN, default server/tierd as in Bazel's
// runfiles); skipped without a device. Run on the lent GPU machine by
// tools/device/kernels_check.sh.
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "base/units.h"
#include "clients/client.h"
#include "tests/process.h"
#include "trainer_ref/gpu/gpu_model.h"
#include "trainer_ref/gpu/gpu_tierd_home.h"
#include "trainer_ref/model.h"
#include "trainer_ref/optimizer.h"

namespace tierd {
namespace {

namespace tg = trainer::gpu;

bool HaveGpu() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

const char* TierdBinary() {
  const char* bin = std::getenv("TIERD_BIN");
  return bin != nullptr ? bin : "server/tierd";
}

// Six layers of head size 64 (the tensor-core attention), small enough to run in seconds.
trainer::ModelConfig TestConfig() { return {"test6", 6, 128, 2, 352, 512, 128}; }

class GpuTierdTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!HaveGpu()) GTEST_SKIP() << "no CUDA device here: the GPU trainer on tierd is checked on the lent GPU machine";
    runtime_dir_ = "/tmp/tierd-gpu-" + std::to_string(getpid()) + "-" + std::to_string(std::random_device{}() % 100000);
    const char* tmp = std::getenv("TEST_TMPDIR");
    daemon_ = std::make_unique<testing::Process>(
        TierdBinary(), std::vector<std::string>{"--gpu=cuda", "--gpu_bytes=256MiB", "--dram_bytes=256MiB",
                                                std::string("--nvme_dir=") + (tmp ? tmp : "/tmp"),
                                                "--nvme_bytes=256MiB", "--runtime_dir=" + runtime_dir_});
    ASSERT_NE(daemon_->WaitForLine("tierd: instance ", 30000), "") << daemon_->output();
  }
  // Every session's leases, as another client of the daemon sees them.
  absl::StatusOr<v1::ListLeasesReply> EveryLease() const {
    ClientOptions watcher_options = Options(0, 1 << 20, 1 << 20);
    watcher_options.label = "watcher";
    auto watcher = Client::Connect(watcher_options);
    if (!watcher.ok()) return watcher.status();
    return (*watcher)->ListLeases(/*every_session=*/true);
  }
  // A model with its state leased from this tierd, a third of it in the GPU quota.
  std::unique_ptr<tg::GpuModel> OnTierd(const trainer::ModelConfig& config, int batch, int seq,
                                        const tg::StateOptions& state) const {
    const tg::GpuHomeLayout layout = tg::GpuModel::HomeLayout(config, batch, seq, state);
    const uint64_t bytes = layout.Total();
    auto home = tg::MakeTierdGpuHome(layout, Options(bytes / 3, 2 * bytes, 2 * bytes));
    EXPECT_TRUE(home.ok()) << home.status();
    if (!home.ok()) return nullptr;
    auto model = tg::GpuModel::Create(config, batch, seq, std::move(*home), state);
    EXPECT_TRUE(model.ok()) << model.status();
    return model.ok() ? std::move(*model) : nullptr;
  }
  ClientOptions Options(uint64_t gpu, uint64_t dram, uint64_t nvme) const {
    ClientOptions o;
    o.runtime_dir = runtime_dir_;
    o.label = "gpu-trainer";
    o.quota = {gpu, dram, nvme};
    return o;
  }
  std::string runtime_dir_;
  std::unique_ptr<testing::Process> daemon_;
};

struct Batch {
  std::vector<int32_t> tokens, targets;
};

// Trains `a` and `b` side by side (the same batches, 2 micro-batches a step, AdamW) and
// checks that they agree step by step: every kernel is deterministic and the two AdamWs
// give the same bits, so the losses, the gradient norms and the final master weights are
// equal bit for bit (a part moved too early, or stale, would show here). `after_steps`
// runs after the last step, before the weights are read back.
// How close two runs must be where they are not the same bits: relative bounds on each step's
// loss and gradient norm and on the final master weights' L2 difference. All 0: bit for bit.
struct Closeness {
  double loss = 0, norm = 0, weights = 0;
};

void TrainSideBySide(
    tg::GpuModel& a, tg::GpuModel& b, const trainer::ModelConfig& config, int batch, int seq, int steps,
    const char* names, const std::function<void()>& after_steps = [] {}, Closeness close = {}) {
  const int micro_batches = 2;
  std::mt19937_64 rng(3);
  trainer::AdamWOptions adam;
  for (int step = 1; step <= steps; ++step) {
    double losses[2] = {0, 0}, norms[2] = {0, 0};
    tg::GpuModel* models[2] = {&a, &b};
    std::vector<Batch> batches(micro_batches);
    for (Batch& mb : batches) {
      for (int i = 0; i < batch * seq; ++i) mb.tokens.push_back(static_cast<int32_t>(rng() % config.vocab));
      for (int i = 0; i < batch * seq; ++i) mb.targets.push_back(static_cast<int32_t>(rng() % config.vocab));
    }
    for (int m = 0; m < 2; ++m) {
      ASSERT_TRUE(models[m]->ZeroGrads().ok());
      if (models[m]->layer_major_micro_batches() == micro_batches) {  // all micro-batches in one call
        Batch all;
        for (const Batch& mb : batches) {
          all.tokens.insert(all.tokens.end(), mb.tokens.begin(), mb.tokens.end());
          all.targets.insert(all.targets.end(), mb.targets.begin(), mb.targets.end());
        }
        auto loss = models[m]->ForwardBackwardLayerMajor(all.tokens.data(), all.targets.data());
        ASSERT_TRUE(loss.ok()) << loss.status();
        losses[m] = *loss;
      }
      for (const Batch& mb : models[m]->layer_major_micro_batches() > 0 ? std::vector<Batch>{} : batches) {
        auto loss = models[m]->Forward(mb.tokens.data(), mb.targets.data());
        ASSERT_TRUE(loss.ok()) << loss.status();
        losses[m] += *loss / micro_batches;
        absl::Status s = models[m]->Backward();
        ASSERT_TRUE(s.ok()) << s;
      }
      auto norm = models[m]->GradNorm();
      ASSERT_TRUE(norm.ok()) << norm.status();
      norms[m] = *norm;
      absl::Status s = models[m]->AdamWStep(1e-3, step, adam, 1.0 / micro_batches);
      ASSERT_TRUE(s.ok()) << s;
    }
    std::printf("step %d: loss %.7f %.7f, gradient norm %.6f %.6f (%s)\n", step, losses[0], losses[1], norms[0],
                norms[1], names);
    if (close.loss == 0) {
      EXPECT_EQ(losses[0], losses[1]) << "step " << step;
      EXPECT_EQ(norms[0], norms[1]) << "step " << step;
    } else {
      EXPECT_NEAR(losses[0], losses[1], close.loss * losses[1]) << "step " << step;
      EXPECT_NEAR(norms[0], norms[1], close.norm * norms[1]) << "step " << step;
    }
  }
  after_steps();
  std::vector<float> pa, pb;
  ASSERT_TRUE(a.GetParams(&pa).ok());
  ASSERT_TRUE(b.GetParams(&pb).ok());
  ASSERT_EQ(pa.size(), pb.size());
  size_t differ = 0;
  double diff = 0, norm = 0;
  for (size_t i = 0; i < pa.size(); ++i) {
    differ += std::memcmp(&pa[i], &pb[i], sizeof(float)) != 0;
    diff += (static_cast<double>(pa[i]) - pb[i]) * (static_cast<double>(pa[i]) - pb[i]);
    norm += static_cast<double>(pb[i]) * pb[i];
  }
  if (close.weights == 0) {
    EXPECT_EQ(differ, 0u) << "of " << pa.size() << " final master weights differ";
  } else {
    std::printf("%zu of %zu final master weights differ; relative L2 difference %.3g\n", differ, pa.size(),
                std::sqrt(diff / norm));
    EXPECT_LE(std::sqrt(diff / norm), close.weights);
  }
}

TEST_F(GpuTierdTest, TrainsInAThirdOfItsStateLikePlainBuffers) {
  const trainer::ModelConfig config = TestConfig();
  const int batch = 4, seq = 128;
  const tg::GpuHomeLayout layout = tg::GpuModel::HomeLayout(config, batch, seq);
  const uint64_t state = layout.Total();
  const uint64_t quota = state / 3;
  auto home = tg::MakeTierdGpuHome(layout, Options(quota, 2 * state, 2 * state));
  ASSERT_TRUE(home.ok()) << home.status();
  auto on_tierd = tg::GpuModel::Create(config, batch, seq, std::move(*home));
  auto plain = tg::GpuModel::Create(config, batch, seq);
  ASSERT_TRUE(on_tierd.ok()) << on_tierd.status();
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ((*plain)->WorkspaceBytes(), tg::GpuModel::WorkspaceBytesFor(config, batch, seq));
  EXPECT_EQ((*on_tierd)->DeviceBytes(), (*on_tierd)->WorkspaceBytes()) << "the state is tierd's, not the model's";

  trainer::Model<float> init(config, 1, 1);
  init.InitParams(5);
  ASSERT_TRUE((*on_tierd)->SetParams(init.params()).ok());
  ASSERT_TRUE((*plain)->SetParams(init.params()).ok());
  auto note = (*on_tierd)->RegisterStep(2);
  ASSERT_TRUE(note.ok()) << note.status();
  EXPECT_EQ(note->rfind("planned ", 0), 0u) << *note;
  std::printf("state %s in a GPU quota of %s; %s\n", FormatBytes(state).c_str(), FormatBytes(quota).c_str(),
              note->c_str());
  TrainSideBySide(**on_tierd, **plain, config, batch, seq, /*steps=*/4, "tierd, plain");
  // And the parts really moved: in and out of the GPU tier, never above the quota.
  auto moved = (*on_tierd)->home().Moved();
  ASSERT_TRUE(moved.ok()) << moved.status();
  std::printf("%s\n", (*on_tierd)->home().Describe().c_str());
  EXPECT_GT(moved->host_to_gpu, state) << "more than the whole state came in over the run";
  EXPECT_GT(moved->gpu_to_host, 0u);
  EXPECT_LE(moved->gpu_peak, quota);
  // The session's own GPU peak since it opened (then reset): within the quota, not empty.
  auto peak = (*on_tierd)->home().TakeGpuPeak();
  ASSERT_TRUE(peak.ok()) << peak.status();
  EXPECT_GT(*peak, 0u);
  EXPECT_LE(*peak, quota);
}

// The optimizer's state in sub-groups (--optimizer_chunks): five leases a part through tierd,
// four plain buffers a part on the other side, and the training the same bit for bit; the
// graph the planner gets names exactly the leases the home holds.
TEST_F(GpuTierdTest, OptimizerStateInSubGroupsTrainsLikeOneLease) {
  const trainer::ModelConfig config = TestConfig();
  const int batch = 4, seq = 128;
  tg::GpuHomeLayout layout = tg::GpuModel::HomeLayout(config, batch, seq);
  const uint64_t state = layout.Total();
  layout.state_chunks = 5;
  auto home = tg::MakeTierdGpuHome(layout, Options(state / 3, 2 * state, 2 * state));
  ASSERT_TRUE(home.ok()) << home.status();
  tg::GpuHomeLayout plain_layout = tg::GpuModel::HomeLayout(config, batch, seq);
  plain_layout.state_chunks = 4;
  auto plain_home = tg::MakePlainGpuHome(plain_layout);
  ASSERT_TRUE(plain_home.ok()) << plain_home.status();
  auto chunked = tg::GpuModel::Create(config, batch, seq, std::move(*home));
  auto plain = tg::GpuModel::Create(config, batch, seq, std::move(*plain_home));
  ASSERT_TRUE(chunked.ok()) << chunked.status();
  ASSERT_TRUE(plain.ok()) << plain.status();
  ASSERT_TRUE((*chunked)->InitParams(4).ok());
  ASSERT_TRUE((*plain)->InitParams(4).ok());
  auto note = (*chunked)->RegisterStep(2);
  ASSERT_TRUE(note.ok()) << note.status();
  // The graph's tensors are the session's leases, name for name and byte for byte.
  std::map<std::string, uint64_t> graph_tensors, leased;
  for (const auto& t : (*chunked)->StepGraph(2).tensors) graph_tensors[t.name] = t.bytes;
  auto leases = EveryLease();
  ASSERT_TRUE(leases.ok()) << leases.status();
  for (const auto& lease : leases->leases()) leased[lease.spec().name()] = lease.spec().shape(0);
  EXPECT_EQ(graph_tensors, leased);
  EXPECT_EQ(graph_tensors.count("opt.v.layers.2.4"), 1u);
  EXPECT_EQ(graph_tensors.count("opt.v.layers.2"), 0u);
  std::printf("%zu leases, the state in 5 sub-groups a part; %s\n", leased.size(), note->c_str());
  TrainSideBySide(**chunked, **plain, config, batch, seq, /*steps=*/3, "tierd in 5 sub-groups, plain in 4");
  std::printf("%s\n", (*chunked)->home().Describe().c_str());
}

// AdamW on the host, in tierd's DRAM tier (SetOptimizerOnCpu), in the background while the
// next forward runs, the state in 3 sub-groups a part: the same training as AdamW on the GPU (the two give the same bits),
// while the master weights and moments never go to the GPU.
TEST_F(GpuTierdTest, TheOptimizerOnTheHostTracksTheGpu) {
  const trainer::ModelConfig config = TestConfig();
  const int batch = 4, seq = 128;
  tg::GpuHomeLayout layout = tg::GpuModel::HomeLayout(config, batch, seq);
  layout.state_chunks = 3;  // the host steps the state chunk by chunk too
  const uint64_t state = layout.Total();
  auto home = tg::MakeTierdGpuHome(layout, Options(state / 3, 2 * state, 2 * state));
  ASSERT_TRUE(home.ok()) << home.status();
  auto on_host = tg::GpuModel::Create(config, batch, seq, std::move(*home));
  auto plain = tg::GpuModel::Create(config, batch, seq);
  ASSERT_TRUE(on_host.ok()) << on_host.status();
  ASSERT_TRUE(plain.ok()) << plain.status();
  (*on_host)->SetOptimizerOnCpu(true);
  ASSERT_TRUE((*on_host)->InitParams(9).ok());
  ASSERT_TRUE((*plain)->InitParams(9).ok());
  ASSERT_TRUE((*on_host)->RegisterStep(2).ok());
  // After the run no master weights or moments are on the GPU: each host step dropped the
  // copies the initial upload left there, and nothing brought them back.
  auto optimizer_state_on_gpu = [&] {
    ASSERT_TRUE((*on_host)->FinishOptimizerStep().ok());
    auto leases = EveryLease();
    ASSERT_TRUE(leases.ok()) << leases.status();
    int optimizer_state = 0, on_gpu = 0;
    for (const auto& lease : leases->leases()) {
      const std::string& name = lease.spec().name();
      if (name.rfind("master.", 0) != 0 && name.rfind("opt.", 0) != 0) continue;
      ++optimizer_state;
      for (int tier : lease.copies()) on_gpu += tier == v1::TIER_GPU;
    }
    int chunks = 0;
    for (int g = 0; g < static_cast<int>(layout.groups.size()); ++g) chunks += 3 * layout.Chunks(g, tg::Part::kMaster);
    EXPECT_EQ(optimizer_state, chunks);
    EXPECT_EQ(chunks, 9 * static_cast<int>(layout.groups.size()));
    EXPECT_EQ(on_gpu, 0) << "master weights or moments on the GPU";
  };
  // The host's AdamW gives the kernel's bits, so the runs stay as close as two GPU runs.
  TrainSideBySide(**on_host, **plain, config, batch, seq, /*steps=*/4, "host AdamW overlapping the next forward, GPU AdamW",
                  optimizer_state_on_gpu);
  EXPECT_GT((*on_host)->HostOptimizerSeconds(), 0.0) << "the host did the steps";
  std::printf("%s\n", (*on_host)->home().Describe().c_str());
  // A plain home has no host tier: the CPU optimizer says so.
  auto no_host = tg::GpuModel::Create(config, batch, seq);
  ASSERT_TRUE(no_host.ok());
  (*no_host)->SetOptimizerOnCpu(true);
  ASSERT_TRUE((*no_host)->InitParams(9).ok());
  const absl::Status refused = (*no_host)->AdamWStep(1e-3, 1, trainer::AdamWOptions{}, 1.0);
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnimplemented) << refused;
}

// 8-bit blockwise moments (--opt=adamw8bit): the host steps them in tierd's DRAM tier, a
// plain model steps them with the GPU kernel; the two give the same bits, so the training
// is the same bit for bit, and the moments take a quarter of fp32's bytes.
TEST_F(GpuTierdTest, EightBitMomentsOnTheHostTrainLikeOnTheGpu) {
  const trainer::ModelConfig config = TestConfig();
  const int batch = 4, seq = 128;
  const tg::GpuHomeLayout fp32 = tg::GpuModel::HomeLayout(config, batch, seq);
  const tg::GpuHomeLayout layout = tg::GpuModel::HomeLayout(config, batch, seq, {.moments_8bit = true});
  EXPECT_LT(layout.TotalOf(tg::Part::kAdamM), fp32.TotalOf(tg::Part::kAdamM) / 3);
  auto on_host = OnTierd(config, batch, seq, {.moments_8bit = true});
  auto on_gpu = tg::GpuModel::Create(config, batch, seq, nullptr, {.moments_8bit = true});
  ASSERT_NE(on_host, nullptr);
  ASSERT_TRUE(on_gpu.ok()) << on_gpu.status();
  on_host->SetOptimizerOnCpu(true);
  ASSERT_TRUE(on_host->InitParams(9).ok());
  ASSERT_TRUE((*on_gpu)->InitParams(9).ok());
  ASSERT_TRUE(on_host->RegisterStep(2).ok());
  TrainSideBySide(*on_host, **on_gpu, config, batch, seq, /*steps=*/4, "host AdamW 8-bit, GPU AdamW 8-bit");
  EXPECT_GT(on_host->HostOptimizerSeconds(), 0.0) << "the host did the steps";
  // A home of fp32 moments is not one for a model of 8-bit ones.
  auto fp32_home = tg::MakePlainGpuHome(fp32);
  ASSERT_TRUE(fp32_home.ok());
  EXPECT_EQ(tg::GpuModel::Create(config, batch, seq, std::move(*fp32_home), {.moments_8bit = true}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Lion (--opt=lion): the host steps it in tierd's DRAM tier, a plain model with the GPU kernel;
// the two give the same bits, so the training is the same bit for bit. Its state has no
// second moment: no "opt.v." lease at all.
TEST_F(GpuTierdTest, LionOnTheHostTrainsLikeOnTheGpu) {
  const trainer::ModelConfig config = TestConfig();
  const int batch = 4, seq = 128;
  auto on_host = OnTierd(config, batch, seq, {.lion = true});
  auto on_gpu = tg::GpuModel::Create(config, batch, seq, nullptr, {.lion = true});
  ASSERT_NE(on_host, nullptr);
  ASSERT_TRUE(on_gpu.ok()) << on_gpu.status();
  on_host->SetOptimizerOnCpu(true);
  ASSERT_TRUE(on_host->InitParams(9).ok());
  ASSERT_TRUE((*on_gpu)->InitParams(9).ok());
  ASSERT_TRUE(on_host->RegisterStep(2).ok());
  TrainSideBySide(*on_host, **on_gpu, config, batch, seq, /*steps=*/4, "host Lion, GPU Lion");
  EXPECT_GT(on_host->HostOptimizerSeconds(), 0.0) << "the host did the steps";
  auto leases = EveryLease();
  ASSERT_TRUE(leases.ok()) << leases.status();
  int moments = 0;
  for (const auto& lease : leases->leases()) {
    const std::string& name = lease.spec().name();
    EXPECT_NE(name.rfind("opt.v.", 0), 0u) << name;
    moments += name.rfind("opt.m.", 0) == 0;
  }
  EXPECT_EQ(moments, config.layers + 2);
}

// Adafactor (--opt=adafactor): the host steps it in tierd's DRAM tier (HostAdafactor, its sums
// in the GPU kernels' order), a plain model with the GPU kernels. Unlike AdamW and Lion the two
// are not the same bits yet (a matrix's factored update differs in the last bits on the H200),
// and bf16 weight rounding amplifies that over steps (gradient norms 7e-4 apart by step 4), so
// the bound is: each step's loss within 1e-5 relative, its gradient norm within 3e-3, the final
// master weights within 5e-4 relative (L2) of each other (H200: 1.3e-4).
TEST_F(GpuTierdTest, AdafactorOnTheHostTrainsLikeOnTheGpu) {
  const trainer::ModelConfig config = TestConfig();
  const int batch = 4, seq = 128;
  auto on_host = OnTierd(config, batch, seq, {.adafactor = true});
  auto on_gpu = tg::GpuModel::Create(config, batch, seq, nullptr, {.adafactor = true});
  ASSERT_NE(on_host, nullptr);
  ASSERT_TRUE(on_gpu.ok()) << on_gpu.status();
  on_host->SetOptimizerOnCpu(true);
  ASSERT_TRUE(on_host->InitParams(9).ok());
  ASSERT_TRUE((*on_gpu)->InitParams(9).ok());
  ASSERT_TRUE(on_host->RegisterStep(2).ok());
  TrainSideBySide(
      *on_host, **on_gpu, config, batch, seq, /*steps=*/4, "host Adafactor, GPU Adafactor", [] {},
      Closeness{1e-5, 3e-3, 5e-4});
  EXPECT_GT(on_host->HostOptimizerSeconds(), 0.0) << "the host did the steps";
}

// The GPU's AdamW deferred to the next forward (SetOptimizerDeferred: each group's update
// queued just before its next use), 8-bit moments, layer-major over 2 micro-batches, through
// tierd at a third of the state: the same training, bit for bit, as a plain model stepping
// every group at the end of the step one micro-batch after the other.
TEST_F(GpuTierdTest, TheGpuUpdateDeferredToTheNextForwardTrainsTheSame) {
  const trainer::ModelConfig config = TestConfig();
  const int batch = 4, seq = 128, micro = 2;
  auto deferred =
      OnTierd(config, batch, seq, {.checkpointing = true, .layer_major_micro_batches = micro, .moments_8bit = true});
  auto plain = tg::GpuModel::Create(config, batch, seq, nullptr, {.checkpointing = true, .moments_8bit = true});
  ASSERT_NE(deferred, nullptr);
  ASSERT_TRUE(plain.ok()) << plain.status();
  deferred->SetOptimizerDeferred(true);
  ASSERT_TRUE(deferred->InitParams(5).ok());
  ASSERT_TRUE((*plain)->InitParams(5).ok());
  auto note = deferred->RegisterStep(micro);
  ASSERT_TRUE(note.ok()) << note.status();
  TrainSideBySide(*deferred, **plain, config, batch, seq, /*steps=*/4,
                  "deferred GPU AdamW 8-bit layer-major on tierd, plain GPU AdamW 8-bit");
  std::printf("%s\n%s\n", note->c_str(), deferred->home().Describe().c_str());
}

// The compact state through tierd (bf16 gradients, no weights parts: each use of a layer's
// weights reads its master copy), with the GPU's update deferred, layer-major over 2
// micro-batches, at a third of the state in the GPU quota: the same training, bit for bit, as
// a plain compact model stepping at the end of each step.
TEST_F(GpuTierdTest, TheCompactStateTrainsThroughTierdAsOnPlainBuffers) {
  const trainer::ModelConfig config = TestConfig();
  const int batch = 4, seq = 128, micro = 2;
  const tg::StateOptions state{
      .checkpointing = true, .layer_major_micro_batches = micro, .moments_8bit = true, .compact = true};
  auto deferred = OnTierd(config, batch, seq, state);
  auto plain = tg::GpuModel::Create(config, batch, seq, nullptr, state);
  ASSERT_NE(deferred, nullptr);
  ASSERT_TRUE(plain.ok()) << plain.status();
  deferred->SetOptimizerDeferred(true);
  ASSERT_TRUE(deferred->InitParams(6).ok());
  ASSERT_TRUE((*plain)->InitParams(6).ok());
  auto note = deferred->RegisterStep(micro);
  ASSERT_TRUE(note.ok()) << note.status();
  TrainSideBySide(*deferred, **plain, config, batch, seq, /*steps=*/4,
                  "compact state, deferred GPU AdamW 8-bit layer-major on tierd; plain compact layer-major");
  std::printf("%s\n%s\n", note->c_str(), deferred->home().Describe().c_str());
  // The host's optimizer writes bf16 weights, which the compact state does not keep.
  deferred->SetOptimizerOnCpu(true);
  EXPECT_EQ(deferred->AdamWStep(1e-3, 9, trainer::AdamWOptions{}, 1.0).code(), absl::StatusCode::kFailedPrecondition);
}

// The Llama family through tierd: grouped-query attention (4 query heads of 64 over 2
// key/value heads), q/k/v biases, tied embeddings (the head acquires the embedding group's
// weights and gradients) and llama3 RoPE, the head's logits in chunks of 128 rows,
// layer-major over 2 micro-batches, with the GPU's update deferred or AdamW on the host: the
// same training, bit for bit, as the same model on plain buffers (layer-major too: tied, the
// embedding's gradient sums the head's and the embedding's in the step's order), and the
// registered graph names the embedding group's parts in the head's op.
TEST_F(GpuTierdTest, TheLlamaFamilyTrainsThroughTierdAsOnPlainBuffers) {
  trainer::ModelConfig config = TestConfig();
  config.heads = 4;
  config.kv_heads = 2;
  config.head_size = 64;
  config.qkv_bias = true;
  config.tied_embeddings = true;
  config.rope_theta = 500000;
  config.rope_scaling = {trainer::RopeScaling::Type::kLlama3, 8.0, 1.0, 4.0, 32};
  const int batch = 4, seq = 128, micro = 2;
  for (const bool host : {false, true}) {
    const tg::StateOptions state{.checkpointing = true, .layer_major_micro_batches = micro, .head_rows = 128};
    auto tierd = OnTierd(config, batch, seq, state);
    auto plain = tg::GpuModel::Create(config, batch, seq, nullptr, state);
    ASSERT_NE(tierd, nullptr);
    ASSERT_TRUE(plain.ok()) << plain.status();
    if (host) {
      tierd->SetOptimizerOnCpu(true);
    } else {
      tierd->SetOptimizerDeferred(true);
    }
    ASSERT_TRUE(tierd->InitParams(8).ok());
    ASSERT_TRUE((*plain)->InitParams(8).ok());
    auto note = tierd->RegisterStep(micro);
    ASSERT_TRUE(note.ok()) << note.status();
    const prefetcher::Graph graph = tierd->StepGraph(micro);
    bool head_reads_embedding = false;
    for (const auto& op : graph.ops) {
      if (op.name.rfind("final.", 0) != 0) continue;
      for (auto t : op.reads) head_reads_embedding |= graph.tensors[t].name == "embed.w";
    }
    EXPECT_TRUE(head_reads_embedding) << "tied: the head's op reads the embedding's weights";
    TrainSideBySide(*tierd, **plain, config, batch, seq, /*steps=*/3,
                    host ? "family on tierd with AdamW on the host; plain" : "family on tierd, deferred GPU AdamW; plain");
    std::printf("%s\n", tierd->home().Describe().c_str());
  }
}

// A GPU quota below what one step of the model holds at once (a layer's four parts while
// its parameters are set: weights, master weights and the two moments) fails with an error
// that names the part and says why, not a crash or a hang.
// FP8 weight codes written by the host's optimizer (--fp8_weight_codes): a model whose FP8
// layers read the codes the host made (layer-major, one layer left in bf16) trains bit for bit
// as one whose GPU makes its codes from the bf16 weights at current scaling (two micro-batches
// in turn): the host's codes are the GPU's bits. And the weights cost less over PCIe: with the
// whole state fitting the GPU quota, a step brings the coded layers' codes in instead of their
// bf16 weights (each model alone on the daemon, which counts every session's moves together).
TEST_F(GpuTierdTest, FP8WeightCodesFromTheHostTrainLikeTheGpusOwn) {
  int major = 0, device = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  if (major < 9) GTEST_SKIP() << "FP8 matmuls need compute capability 8.9 or later";
  const trainer::ModelConfig config = TestConfig();
  const int batch = 4, seq = 128, steps = 4;
  const tg::StateOptions states[2] = {{.layer_major_micro_batches = 2, .fp8_weight_codes = true}, {}};
  auto make = [&](int m) -> std::unique_ptr<tg::GpuModel> {
    const tg::GpuHomeLayout layout = tg::GpuModel::HomeLayout(config, batch, seq, states[m]);
    const uint64_t bytes = layout.Total();
    auto home = tg::MakeTierdGpuHome(layout, Options(2 * bytes, 2 * bytes, 2 * bytes));
    EXPECT_TRUE(home.ok()) << home.status();
    if (!home.ok()) return nullptr;
    auto model = tg::GpuModel::Create(config, batch, seq, std::move(*home), states[m]);
    EXPECT_TRUE(model.ok()) << model.status();
    if (!model.ok()) return nullptr;
    tg::Fp8ScalingOptions current;
    current.delayed = false;
    std::vector<bool> fp8_layers(config.layers, true);
    fp8_layers[0] = false;  // a bf16 layer reads its bf16 part
    EXPECT_TRUE((*model)->UseFp8(fp8_layers, current).ok());
    (*model)->SetOptimizerOnCpu(true);
    EXPECT_TRUE((*model)->InitParams(12).ok());
    EXPECT_TRUE((*model)->RegisterStep(2).ok());
    return std::move(*model);
  };
  // Bytes into the GPU over steps 2 and 3 of a model alone.
  uint64_t in[2] = {0, 0};
  std::mt19937_64 rng(5);
  std::vector<int32_t> tokens(2 * batch * seq), targets(2 * batch * seq);
  for (auto& t : tokens) t = static_cast<int32_t>(rng() % config.vocab);
  for (auto& t : targets) t = static_cast<int32_t>(rng() % config.vocab);
  for (int m = 0; m < 2; ++m) {
    std::unique_ptr<tg::GpuModel> model = make(m);
    ASSERT_NE(model, nullptr);
    uint64_t before = 0;
    for (int step = 1; step <= 3; ++step) {
      ASSERT_TRUE(model->FinishOptimizerStep().ok());
      auto moved = model->home().Moved();
      ASSERT_TRUE(moved.ok()) << moved.status();
      if (step == 2) before = moved->host_to_gpu;
      ASSERT_TRUE(model->ZeroGrads().ok());
      if (m == 0) {
        ASSERT_TRUE(model->ForwardBackwardLayerMajor(tokens.data(), targets.data()).ok());
      } else {
        for (int k = 0; k < 2; ++k) {
          ASSERT_TRUE(model->Forward(tokens.data() + k * batch * seq, targets.data() + k * batch * seq).ok());
          ASSERT_TRUE(model->Backward().ok());
        }
      }
      ASSERT_TRUE(model->AdamWStep(1e-3, step, trainer::AdamWOptions{}, 0.5).ok());
    }
    ASSERT_TRUE(model->FinishOptimizerStep().ok());
    auto moved = model->home().Moved();
    ASSERT_TRUE(moved.ok()) << moved.status();
    in[m] = moved->host_to_gpu - before;
  }
  const tg::GpuHomeLayout plain = tg::GpuModel::HomeLayout(config, batch, seq);
  const uint64_t coded_bf16 = (config.layers - 1) * plain.bytes[2][static_cast<int>(tg::Part::kWeights)];
  const uint64_t coded_codes = (config.layers - 1) * tg::GpuModel::WeightCodesBytes(config);
  std::printf(
      "host to GPU in steps 2-3: %s with host-made codes, %s without; the coded layers' weights: %s of codes, "
      "%s of bf16\n",
      FormatBytes(in[0]).c_str(), FormatBytes(in[1]).c_str(), FormatBytes(coded_codes).c_str(),
      FormatBytes(coded_bf16).c_str());
  // Two steps' saving is nominally twice the difference; what the planner prefetches for the
  // next step before the window closes, or had before it opened, blurs that by up to a step's
  // weights (H200: 3.68 MiB against 5.10, nominally 1.92 MiB apart), so at least one step's.
  EXPECT_LE(static_cast<double>(in[0] + coded_bf16 - coded_codes), static_cast<double>(in[1]));
  // The bits: side by side from the same initial weights.
  std::unique_ptr<tg::GpuModel> models[2] = {make(0), make(1)};
  ASSERT_NE(models[0], nullptr);
  ASSERT_NE(models[1], nullptr);
  EXPECT_EQ(models[0]->LayersReadingWeightCodes(), config.layers - 1);
  EXPECT_EQ(models[1]->LayersReadingWeightCodes(), 0);
  // The step graph has the coded layers read their codes part, the bf16 layer its bf16 part.
  const auto graph = models[0]->StepGraph(2);
  std::map<std::string, int> reads;
  for (const auto& op : graph.ops) {
    for (auto t : op.reads) ++reads[graph.tensors[t].name];
  }
  EXPECT_GT(reads["layers.3.w8"], 0);
  EXPECT_EQ(reads["layers.3.w"], 0);
  EXPECT_GT(reads["layers.0.w"], 0);
  EXPECT_EQ(reads.count("layers.0.w8"), 0u);
  // The host's step rewrites the codes whole, but only updates the bf16 weights no GPU op of a
  // coded layer reads: were they "overwritten", the plan would take them for dead between
  // steps and drop them (a checkpoint, a fall back to bf16 read them).
  std::set<std::string> host_writes, host_overwrites;
  for (const auto& op : graph.ops) {
    for (auto t : op.host_writes) host_writes.insert(graph.tensors[t].name);
    for (auto t : op.host_overwrites) host_overwrites.insert(graph.tensors[t].name);
  }
  EXPECT_EQ(host_writes.count("layers.3.w"), 1u);
  EXPECT_EQ(host_overwrites.count("layers.3.w"), 0u);
  EXPECT_EQ(host_overwrites.count("layers.3.w8"), 1u);
  EXPECT_EQ(host_overwrites.count("layers.0.w"), 1u);
  TrainSideBySide(*models[0], *models[1], config, batch, seq, steps,
                  "FP8 layers from host-made codes, layer-major; from the GPU's own codes");
}

TEST_F(GpuTierdTest, AQuotaBelowOneLayerSaysSo) {
  const trainer::ModelConfig config = TestConfig();
  const int batch = 4, seq = 128;
  const tg::GpuHomeLayout layout = tg::GpuModel::HomeLayout(config, batch, seq);
  const uint64_t acts = layout.bytes[1][static_cast<int>(tg::Part::kActs)];
  auto home = tg::MakeTierdGpuHome(layout, Options(acts / 2, 2 * layout.Total(), 2 * layout.Total()));
  ASSERT_TRUE(home.ok()) << home.status();
  auto model = tg::GpuModel::Create(config, batch, seq, std::move(*home));
  ASSERT_TRUE(model.ok()) << model.status();
  const absl::Status s = (*model)->InitParams(5);
  ASSERT_FALSE(s.ok());
  std::printf("%s\n", s.ToString().c_str());
  EXPECT_NE(s.message().find("acquiring "), std::string::npos) << s;
  EXPECT_NE(s.message().find("layers.0"), std::string::npos) << s;  // the embedding's parts fit; layer 0's do not
}

}  // namespace
}  // namespace tierd
