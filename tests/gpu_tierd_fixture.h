// What the GPU-trainer-through-tierd tests share (gpu_trainer_tierd_test.cc,
// gpu_trainer_tierd_state_test.cc): a real tierd binary per test on the real GPU, models with
// their state leased from it, and two models trained side by side.
#ifndef TIERD_TESTS_GPU_TIERD_FIXTURE_H_
#define TIERD_TESTS_GPU_TIERD_FIXTURE_H_

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


namespace tierd::gpu_tierd_testing {

namespace tg = trainer::gpu;

inline bool HaveGpu() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

inline const char* TierdBinary() {
  const char* bin = std::getenv("TIERD_BIN");
  return bin != nullptr ? bin : "server/tierd";
}

// Six layers of head size 64 (the tensor-core attention), small enough to run in seconds.
inline trainer::ModelConfig TestConfig() { return {"test6", 6, 128, 2, 352, 512, 128}; }

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

inline void TrainSideBySide(
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

}  // namespace tierd::gpu_tierd_testing

#endif  // TIERD_TESTS_GPU_TIERD_FIXTURE_H_
