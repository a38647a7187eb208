// Our causal attention kernels (attention_tc.cu) at the models' shapes on the GPU it finds:
// forward and backward (delta, the key kernel, the query kernel), each timed over 20 runs
// after 3 warm-up ones (CUDA events). TFLOP/s are nominal causal FLOPs, as FlashAttention
// counts them: forward 4 b h T^2 d / 2, backward 2.5 times that (our backward does 3.5 times
// the forward's matmuls: S and dP are computed in both the key and the query kernel).
// One JSON line per shape, for tools/device/attention_bench.sh, which runs PyTorch's SDPA
// (flash) at the same shapes in the same call and prints the ratio.
//   bazel run -c opt //trainer_ref/kernels:attention_bench   (or .carry/bin/attention_bench)
#include <cuda_runtime_api.h>

#include <cstdio>
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
  float *lse, *delta, *master;
  std::vector<Bf16**> bf = {&q, &k, &v, &out, &dout, &dq, &dk, &dv};
  for (Bf16** p : bf) {
    if (cudaMalloc(reinterpret_cast<void**>(p), n * 2) != cudaSuccess) return false;
  }
  if (cudaMalloc(reinterpret_cast<void**>(&lse), rows * 4) != cudaSuccess ||
      cudaMalloc(reinterpret_cast<void**>(&delta), rows * 4) != cudaSuccess ||
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
    ok &= AttentionBackwardTc(dq, dk, dv, dout, out, lse, delta, q, k, v, s.b, s.t, s.h, s.d, nullptr) == cudaSuccess;
  });
  ok &= cudaDeviceSynchronize() == cudaSuccess;
  const double flops = 4.0 * s.b * s.h * double(s.t) * s.t * s.d / 2;
  std::printf(
      "{\"impl\":\"ours\",\"model\":\"%s\",\"b\":%d,\"t\":%d,\"h\":%d,\"d\":%d,\"fwd_ms\":%.3f,\"bwd_ms\":%.3f,"
      "\"fwd_tflops\":%.1f,\"bwd_tflops\":%.1f}\n",
      s.model, s.b, s.t, s.h, s.d, fwd, bwd_only, flops / fwd / 1e9, 2.5 * flops / bwd_only / 1e9);
  for (Bf16** p : bf) cudaFree(*p);
  cudaFree(lse);
  cudaFree(delta);
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
       {Shape{"1.3b", 2, 2048, 16, 128}, Shape{"1.3b", 4, 2048, 16, 128}, Shape{"7b", 4, 2048, 32, 128}}) {
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
