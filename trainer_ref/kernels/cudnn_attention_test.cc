// cuDNN's fused attention (cudnn_attention.h) against the CPU reference on random data: the
// forward, the backward from its own statistics, grouped-query attention with dK and dV of
// the key/value heads only, and the backward's bits run to run (deterministic algorithm); the
// non-deterministic backward (--attention=cudnn-fast) against the same reference.
// Skips without a GPU, or without libcudnn.so.9 on the library path unless
// TIERD_REQUIRE_CUDNN=1 (the lent machine's run sets it, so a skip there is a failure).
#include "trainer_ref/kernels/cudnn_attention.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "trainer_ref/cpu_ops.h"
#include "trainer_ref/kernels/gpu_test_util.h"

namespace tierd::trainer::gpu {
namespace {

using testing::Bf16Data;
using testing::CompareBf16;
using testing::Device;
using testing::Floats;
using testing::HaveGpu;
using testing::Random;

TEST(CudnnAttentionTest, RefusesAShapeWithoutWholeHeadGroups) {
  auto made = CudnnAttention::Create({.batch = 1, .seq = 64, .heads = 6, .kv_heads = 4, .head_dim = 64});
  ASSERT_EQ(made.status().code(), absl::StatusCode::kInvalidArgument) << made.status();
  EXPECT_NE(made.status().message().find("6 heads of 64, 4 key/value heads"), std::string::npos) << made.status();
}

TEST(CudnnAttentionTest, ForwardAndBackwardMatchTheCpuReference) {
  SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(21);
  const bool required = std::getenv("TIERD_REQUIRE_CUDNN") != nullptr;
  // D 64 with every head its own keys; D 128 with grouped-query attention (4 heads, 2 key/value);
  // `tuned`: every plan built and the fastest of each pass kept (Autotune), then the same checks.
  struct Case {
    int d, kv;
    bool deterministic, tuned = false;
  };
  for (auto [d, kv, deterministic, tuned] :
       {Case{64, 4, true}, Case{128, 2, true}, Case{128, 2, false}, Case{128, 2, false, true}}) {
    const int b = 2, t = 300, h = 4;
    auto attention = CudnnAttention::Create({.batch = b, .seq = t, .heads = h, .kv_heads = kv, .head_dim = d},
                                            deterministic, /*all_plans=*/tuned);
    if (!attention.ok()) {
      if (required) FAIL() << attention.status();
      GTEST_SKIP() << attention.status();
    }
    std::printf("%s, workspace %lld bytes (D %d, %d key/value heads)\n", (*attention)->Describe().c_str(),
                static_cast<long long>((*attention)->workspace_bytes()), d, kv);
    const size_t count = size_t{b} * t * h * d, kv_count = size_t{b} * t * kv * d;
    const Bf16Data q = Random(count, rng), k = Random(kv_count, rng), v = Random(kv_count, rng),
                   dout = Random(count, rng), dq0 = Random(count, rng), dk0 = Random(kv_count, rng),
                   dv0 = Random(kv_count, rng);
    Device<Bf16> d_q(q.bits), d_k(k.bits), d_v(v.bits), d_out{std::vector<Bf16>(count)}, d_dout(dout.bits),
        d_dq(dq0.bits), d_dk(dk0.bits), d_dv(dv0.bits), d_dq2(dq0.bits), d_dk2(dk0.bits), d_dv2(dv0.bits);
    Device<float> d_stats{std::vector<float>(size_t{b} * h * t)};
    Device<unsigned char> workspace{std::vector<unsigned char>(
        static_cast<size_t>(std::max<int64_t>(1, (*attention)->workspace_bytes())))};
    if (tuned) {
      auto said = (*attention)->Autotune(d_out.get(), d_stats.get(), d_dq.get(), d_dk.get(), d_dv.get(), d_dout.get(),
                                         d_q.get(), d_k.get(), d_v.get(), workspace.get(), nullptr);
      ASSERT_TRUE(said.ok()) << said.status();
      std::printf("autotuned: %s\n", said->c_str());
    }
    ASSERT_TRUE((*attention)
                    ->Forward(d_out.get(), d_stats.get(), d_q.get(), d_k.get(), d_v.get(), workspace.get(), nullptr)
                    .ok());
    for (int again = 0; again < 2; ++again) {
      ASSERT_TRUE((*attention)
                      ->Backward(again == 0 ? d_dq.get() : d_dq2.get(), again == 0 ? d_dk.get() : d_dk2.get(),
                                 again == 0 ? d_dv.get() : d_dv2.get(), d_dout.get(), d_out.get(), d_stats.get(),
                                 d_q.get(), d_k.get(), d_v.get(), workspace.get(), nullptr)
                      .ok());
    }
    std::vector<float> out(count), att(size_t{b} * h * t * t), dq(count, 0.f), dk(kv_count, 0.f), dv(kv_count, 0.f);
    cpu::AttentionForward(out.data(), att.data(), q.values.data(), k.values.data(), v.values.data(), b, t, h, kv, d);
    cpu::AttentionBackward(dq.data(), dk.data(), dv.data(), dout.values.data(), att.data(), q.values.data(),
                           k.values.data(), v.values.data(), b, t, h, kv, d);
    const std::string at = " (D " + std::to_string(d) + ", " + std::to_string(kv) + " key/value heads" +
                           (deterministic ? "" : ", non-deterministic backward") + (tuned ? ", autotuned)" : ")");
    EXPECT_EQ(CompareBf16(Floats(d_out.Host()), out, 1e-2f, "cuDNN attention out" + at), 0);
    EXPECT_EQ(CompareBf16(Floats(d_dq.Host()), dq, 2e-2f, "cuDNN attention dq" + at), 0);
    EXPECT_EQ(CompareBf16(Floats(d_dk.Host()), dk, 2e-2f, "cuDNN attention dk" + at), 0);
    EXPECT_EQ(CompareBf16(Floats(d_dv.Host()), dv, 2e-2f, "cuDNN attention dv" + at), 0);
    if (!deterministic) continue;
    // The deterministic backward: the same bits twice.
    EXPECT_EQ(std::memcmp(d_dq.Host().data(), d_dq2.Host().data(), count * 2), 0) << "dq" << at;
    EXPECT_EQ(std::memcmp(d_dk.Host().data(), d_dk2.Host().data(), kv_count * 2), 0) << "dk" << at;
    EXPECT_EQ(std::memcmp(d_dv.Host().data(), d_dv2.Host().data(), kv_count * 2), 0) << "dv" << at;
  }
}

}  // namespace
}  // namespace tierd::trainer::gpu
