// Data-parallel GPU ranks: each rank's gradients become the ranks' sum once a step, before the
// norm and the optimizer, in both step orders. Two models on the one GPU of the test machine
// stand for two ranks, joined by a communicator that sums through host memory (NCCL refuses two
// ranks on one GPU; tools/device/... runs NCCL itself with nccl_collectives_check).
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "trainer_ref/gpu/gpu_model.h"
#include "trainer_ref/gpu/gpu_model_test_oracle.h"

namespace tierd::trainer::gpu {
namespace {

using testing::Batch;
using testing::HaveGpu;
using testing::RandomBatch;

// Two threads' ranks: AllReduce sums the device buffers of both (rank 0's + rank 1's, in that
// order) through host memory. Only what SumOverRanks uses.
class PairCommunicator final : public comm::Communicator {
 public:
  struct Shared {
    std::mutex mu;
    std::condition_variable cv;
    std::vector<float> parts[2];
    int arrived = 0, taken = 0;
    int64_t generation = 0;
  };
  PairCommunicator(Shared* shared, int rank) : shared_(shared), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return 2; }
  std::string name() const override { return "pair"; }
  absl::Status AllReduce(float* data, int64_t count, comm::ReduceOp) override {
    if (cudaDeviceSynchronize() != cudaSuccess) return absl::InternalError("sync");
    std::vector<float> mine(count);
    cudaMemcpy(mine.data(), data, count * sizeof(float), cudaMemcpyDeviceToHost);
    std::vector<float> sum(count);
    {
      std::unique_lock<std::mutex> lock(shared_->mu);
      shared_->cv.wait(lock, [&] { return shared_->taken == 0; });  // the last call's readers are done
      shared_->parts[rank_] = std::move(mine);
      const int64_t generation = shared_->generation;
      if (++shared_->arrived == 2) {
        ++shared_->generation;
        shared_->cv.notify_all();
      } else {
        shared_->cv.wait(lock, [&] { return shared_->generation != generation; });
      }
      for (int64_t i = 0; i < count; ++i) sum[i] = shared_->parts[0][i] + shared_->parts[1][i];
      if (++shared_->taken == 2) {
        shared_->arrived = shared_->taken = 0;
        shared_->cv.notify_all();
      }
    }
    cudaMemcpy(data, sum.data(), count * sizeof(float), cudaMemcpyHostToDevice);
    Account(count * 4.0, 0);
    return absl::OkStatus();
  }
  absl::Status AllReduce(double*, int64_t, comm::ReduceOp) override { return absl::UnimplementedError("pair"); }
  absl::Status ReduceScatterSum(float*, const comm::Slices&) override { return absl::UnimplementedError("pair"); }
  absl::Status AllGather(float*, const comm::Slices&) override { return absl::UnimplementedError("pair"); }
  absl::Status AllGatherBytes(const void*, void*, int64_t) override { return absl::UnimplementedError("pair"); }
  absl::Status Barrier() override { return absl::UnimplementedError("pair"); }

 private:
  Shared* shared_;
  int rank_;
};

// One model over micro-batches b0, b1 against two ranks, one micro-batch each: the ranks end
// with the same gradients (bit for bit between them) as the one model's accumulation, up to
// the fp32 order of the two additions, and so the same norm.
void CheckRanks(bool layer_major) {
  const ModelConfig config{"dp", 3, 128, 2, 352, 512, 128};
  const int batch = 2, seq = 128, n = batch * seq;
  std::mt19937_64 rng(41);
  const Batch b[2] = {RandomBatch(n, config.vocab, rng), RandomBatch(n, config.vocab, rng)};
  const StateOptions two{.layer_major_micro_batches = layer_major ? 2 : 0};
  const StateOptions one{.layer_major_micro_batches = layer_major ? 1 : 0};
  auto single = GpuModel::Create(config, batch, seq, nullptr, two);
  ASSERT_TRUE(single.ok()) << single.status();
  ASSERT_TRUE((*single)->InitParams(9).ok());
  ASSERT_TRUE((*single)->ZeroGrads().ok());
  if (layer_major) {
    std::vector<int32_t> tokens(b[0].tokens), targets(b[0].targets);
    tokens.insert(tokens.end(), b[1].tokens.begin(), b[1].tokens.end());
    targets.insert(targets.end(), b[1].targets.begin(), b[1].targets.end());
    ASSERT_TRUE((*single)->ForwardBackwardLayerMajor(tokens.data(), targets.data()).ok());
  } else {
    for (const Batch& mb : b) {
      ASSERT_TRUE((*single)->Forward(mb.tokens.data(), mb.targets.data()).ok());
      ASSERT_TRUE((*single)->Backward().ok());
    }
  }
  std::vector<float> want;
  ASSERT_TRUE((*single)->GetGrads(&want).ok());
  const double want_norm = *(*single)->GradNorm();

  PairCommunicator::Shared shared;
  std::vector<float> got[2];
  double norms[2] = {0, 0};
  absl::Status status[2];
  std::thread ranks[2];
  for (int r = 0; r < 2; ++r) {
    ranks[r] = std::thread([&, r] {
      PairCommunicator comm(&shared, r);
      auto model = GpuModel::Create(config, batch, seq, nullptr, one);
      if (!model.ok()) {
        status[r] = model.status();
        return;
      }
      (*model)->SetDataParallel(&comm, 1);
      status[r] = (*model)->InitParams(9);
      if (status[r].ok()) status[r] = (*model)->ZeroGrads();
      if (status[r].ok() && layer_major) {
        status[r] = (*model)->ForwardBackwardLayerMajor(b[r].tokens.data(), b[r].targets.data()).status();
      } else if (status[r].ok()) {
        status[r] = (*model)->Forward(b[r].tokens.data(), b[r].targets.data()).status();
        if (status[r].ok()) status[r] = (*model)->Backward();
      }
      if (status[r].ok()) status[r] = (*model)->GetGrads(&got[r]);
      if (status[r].ok()) norms[r] = *(*model)->GradNorm();
    });
  }
  for (std::thread& t : ranks) t.join();
  ASSERT_TRUE(status[0].ok()) << status[0];
  ASSERT_TRUE(status[1].ok()) << status[1];
  ASSERT_EQ(got[0], got[1]) << "the ranks hold the same gradients";
  EXPECT_EQ(norms[0], norms[1]);
  ASSERT_EQ(got[0].size(), want.size());
  double diff = 0, norm = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    diff += (static_cast<double>(want[i]) - got[0][i]) * (static_cast<double>(want[i]) - got[0][i]);
    norm += static_cast<double>(want[i]) * want[i];
  }
  EXPECT_LT(std::sqrt(diff / norm), 1e-6) << "the ranks' sum is the one model's accumulation";
  EXPECT_NEAR(norms[0], want_norm, 1e-5 * want_norm);
}

TEST(GpuModelDataParallelTest, TwoRanksSumToOneModelsAccumulation) {
  if (!HaveGpu()) GTEST_SKIP() << "no CUDA device here: the GPU model is checked on the lent GPU machine";
  CheckRanks(/*layer_major=*/false);
  CheckRanks(/*layer_major=*/true);
}

}  // namespace
}  // namespace tierd::trainer::gpu
