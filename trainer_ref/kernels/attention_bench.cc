// Our causal attention kernels (attention_tc.cu) at the models' shapes on the GPU it finds:
// forward and backward, and the backward kernel by kernel (delta; the key kernel, writing dS;
// the dQ kernel; and the previous design's key and query kernels, the query kernel computing
// S and dP again), each timed over 20 runs after 3 warm-up ones (CUDA events). TFLOP/s are
// nominal causal FLOPs, as FlashAttention counts them: forward 4 b h T^2 d / 2, backward 2.5
// times that. One JSON line per shape, for tools/bench/attention_torch.py, which times
// PyTorch's SDPA (flash) at the same shapes in the same call and prints the ratio:
//   .carry/bin/attention_bench | python3 tools/bench/attention_torch.py
//   bazel run -c opt //trainer_ref/kernels:attention_bench   (or .carry/bin/attention_bench)
#include <cuda_runtime_api.h>

#include <cstdio>
#include <tuple>
#include <utility>
#include <vector>

#include "trainer_ref/kernels/attention_tc.h"
#include "trainer_ref/kernels/bench_timer.h"
#include "trainer_ref/kernels/gpu_ops.h"

namespace tierd::trainer::gpu {
namespace {

struct Shape {
  const char* model;
  int b, t, h, d;
};

bool Bench(const Shape& s, cudaEvent_t start, cudaEvent_t stop) {
  const size_t n = size_t(s.b) * s.t * s.h * s.d, rows = size_t(s.b) * s.h * s.t;
  Bf16 *q, *k, *v, *out, *dout, *dq, *dk, *dv;
  float *lse, *master;
  unsigned char* scratch;
  // The backward as the trainer runs it, and room for the whole batch's dS for the parts.
  const int64_t scratch_bytes = AttentionBackwardScratchBytes(s.b, s.t, s.h, s.d),
                all_bytes = AttentionBackwardScratchBytes(s.b, s.t, s.h, s.d, s.b);
  std::vector<Bf16**> bf = {&q, &k, &v, &out, &dout, &dq, &dk, &dv};
  for (Bf16** p : bf) {
    if (cudaMalloc(reinterpret_cast<void**>(p), n * 2) != cudaSuccess) return false;
  }
  if (cudaMalloc(reinterpret_cast<void**>(&lse), rows * 4) != cudaSuccess ||
      cudaMalloc(reinterpret_cast<void**>(&scratch), static_cast<size_t>(all_bytes)) != cudaSuccess ||
      cudaMalloc(reinterpret_cast<void**>(&master), n * 4) != cudaSuccess) {
    return false;
  }
  int entry = 1;
  for (Bf16* p : {q, k, v, dout}) InitNormal(master, p, 0, int64_t(n), 7, entry++, 1.0, nullptr);
  bool ok = true;
  auto time = [&](auto&& run) { return MeanMs(run, start, stop); };
  const double fwd =
      time([&] { ok &= AttentionForwardTc(out, lse, q, k, v, s.b, s.t, s.h, s.d, nullptr) == cudaSuccess; });
  const double bwd_only = time([&] {
    ok &= AttentionBackward(dq, dk, dv, dout, out, lse, scratch, scratch_bytes, q, k, v, s.b, s.t, s.h, s.d, nullptr) ==
          cudaSuccess;
  });
  ok &= cudaDeviceSynchronize() == cudaSuccess;
  // Where the backward's time goes, kernel by kernel, with dS (as used) and with the query
  // kernel computing S and dP again (the previous design); each gives the backward's bits.
  std::vector<Bf16> dq_bits(n), dk_bits(n), dv_bits(n), other(n);
  for (auto [from, to] : {std::pair{dq, &dq_bits}, {dk, &dk_bits}, {dv, &dv_bits}}) {
    ok &= cudaMemcpy(to->data(), from, n * 2, cudaMemcpyDeviceToHost) == cudaSuccess;
  }
  auto part = [&](AttentionBackwardPart which, bool recompute) {
    return time([&] {
      ok &= AttentionBackwardPartTc(which, recompute, dq, dk, dv, dout, out, lse, scratch, all_bytes, q, k, v, s.b, s.t,
                                    s.h, s.d, nullptr) == cudaSuccess;
    });
  };
  // What the parts left against the backward's bits, from zeroed gradients.
  auto same_bits = [&](const char* design, bool with_dq) {
    for (auto [got, want, name] : {std::tuple{dk, &dk_bits, "dK"}, {dv, &dv_bits, "dV"}, {dq, &dq_bits, "dQ"}}) {
      if (got == dq && !with_dq) continue;
      ok &= cudaMemcpy(other.data(), got, n * 2, cudaMemcpyDeviceToHost) == cudaSuccess;
      if (other != *want) {
        std::fprintf(stderr, "attention_bench: %s gives other %s bits than the backward\n", design, name);
        ok = false;
      }
    }
  };
  for (Bf16* p : {dq, dk, dv}) ok &= cudaMemset(p, 0, n * 2) == cudaSuccess;
  const double delta_ms = part(AttentionBackwardPart::kDelta, false),
               keys_ms = part(AttentionBackwardPart::kKeys, false),
               queries_ms = part(AttentionBackwardPart::kQueries, false);
  same_bits("the parts with dS", true);
  for (Bf16* p : {dq, dk, dv}) ok &= cudaMemset(p, 0, n * 2) == cudaSuccess;
  const double keys_recompute_ms = part(AttentionBackwardPart::kKeys, true),
               queries_recompute_ms = part(AttentionBackwardPart::kQueries, true);
  // dQ from S and dP computed again rounds dS from other fp32 sums: dK and dV only.
  same_bits("the previous design", false);
  const double flops = 4.0 * s.b * s.h * double(s.t) * s.t * s.d / 2;
  std::printf(
      "{\"impl\":\"ours\",\"model\":\"%s\",\"b\":%d,\"t\":%d,\"h\":%d,\"d\":%d,\"fwd_ms\":%.3f,\"bwd_ms\":%.3f,"
      "\"fwd_tflops\":%.1f,\"bwd_tflops\":%.1f,\"delta_ms\":%.3f,\"keys_ms\":%.3f,\"queries_ms\":%.3f,"
      "\"keys_recompute_ms\":%.3f,\"queries_recompute_ms\":%.3f,\"scratch_mib\":%.1f}\n",
      s.model, s.b, s.t, s.h, s.d, fwd, bwd_only, flops / fwd / 1e9, 2.5 * flops / bwd_only / 1e9, delta_ms, keys_ms,
      queries_ms, keys_recompute_ms, queries_recompute_ms, scratch_bytes / 1048576.0);
  for (Bf16** p : bf) cudaFree(*p);
  cudaFree(lse);
  cudaFree(scratch);
  cudaFree(master);
  return ok;
}

int Main() {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) {
    std::fprintf(stderr, "attention_bench: no CUDA device\n");
    return 1;
  }
  std::fprintf(stderr, "attention_bench: causal attention, bf16 in and out, fp32 softmax, on %s\n", prop.name);
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  // The trainer's micro-batches: 1.3B at 2 and 4 sequences, 7B at 4; head size 128.
  for (const Shape& s :
       {Shape{"1.3b", 2, 2048, 16, 128}, Shape{"1.3b", 4, 2048, 16, 128}, Shape{"1.3b", 8, 2048, 16, 128},
        Shape{"7b", 4, 2048, 32, 128}}) {
    if (!Bench(s, start, stop)) {
      std::fprintf(stderr, "attention_bench: CUDA failed at %s (%s)\n", s.model,
                   cudaGetErrorString(cudaGetLastError()));
      return 1;
    }
  }
  return 0;
}

}  // namespace
}  // namespace tierd::trainer::gpu

int main() { return tierd::trainer::gpu::Main(); }
