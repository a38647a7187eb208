// cuDNN's fused attention at the benchmarked models' micro-batch shapes: the plan its
// heuristics pick first (what the trainer runs) against the fastest of every plan its
// heuristics and fallback list offer (CudnnAttention::Autotune), forward and backward, the
// backward as --attention=cudnn-fast runs it (non-deterministic) and as --attention=cudnn does.
// Each timed as the mean of 20 runs after 3 warm-up ones (CUDA events), TFLOP/s as
// FlashAttention counts causal FLOPs (forward 4 b h T^2 d / 2, backward 2.5 times that).
//   .carry/bin/cudnn_attention_bench        (libcudnn.so.9 on LD_LIBRARY_PATH)
#include <cuda_runtime_api.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "trainer_ref/kernels/bench_timer.h"
#include "trainer_ref/kernels/cudnn_attention.h"
#include "trainer_ref/kernels/gpu_ops.h"

namespace tierd::trainer::gpu {
namespace {

struct Case {
  const char* model;
  CudnnAttention::Shape shape;
};

struct Buffers {
  std::vector<void*> all;
  Bf16 *q = nullptr, *k = nullptr, *v = nullptr, *out = nullptr, *dout = nullptr, *dq = nullptr, *dk = nullptr,
       *dv = nullptr;
  float* stats = nullptr;
  void* workspace = nullptr;
  ~Buffers() {
    for (void* p : all) cudaFree(p);
  }
  template <typename T>
  bool Get(T** p, size_t bytes) {
    void* raw = nullptr;
    if (cudaMalloc(&raw, bytes == 0 ? 1 : bytes) != cudaSuccess) return false;
    all.push_back(raw);
    *p = static_cast<T*>(raw);
    return true;
  }
};

bool Bench(const Case& c, bool deterministic, cudaEvent_t start, cudaEvent_t stop) {
  const CudnnAttention::Shape& s = c.shape;
  auto heuristic = CudnnAttention::Create(s, deterministic);
  auto tuned = CudnnAttention::Create(s, deterministic, /*all_plans=*/true);
  if (!heuristic.ok() || !tuned.ok()) {
    std::printf("%s: %s\n", c.model, (!heuristic.ok() ? heuristic.status() : tuned.status()).ToString().c_str());
    return false;
  }
  const size_t rows = size_t(s.batch) * s.seq, qn = rows * s.heads * s.head_dim, kn = rows * s.kv_heads * s.head_dim;
  Buffers b;
  float* master = nullptr;
  if (!b.Get(&b.q, qn * 2) || !b.Get(&b.k, kn * 2) || !b.Get(&b.v, kn * 2) || !b.Get(&b.out, qn * 2) ||
      !b.Get(&b.dout, qn * 2) || !b.Get(&b.dq, qn * 2) || !b.Get(&b.dk, kn * 2) || !b.Get(&b.dv, kn * 2) ||
      !b.Get(&b.stats, size_t(s.batch) * s.heads * s.seq * 4) || !b.Get(&master, qn * 4) ||
      !b.Get(&b.workspace, static_cast<size_t>((*tuned)->workspace_bytes()))) {
    std::printf("%s: no room\n", c.model);
    return false;
  }
  int entry = 1;
  InitNormal(master, b.q, 0, int64_t(qn), 7, entry++, 1.0, nullptr);
  InitNormal(master, b.k, 0, int64_t(kn), 7, entry++, 1.0, nullptr);
  InitNormal(master, b.v, 0, int64_t(kn), 7, entry++, 1.0, nullptr);
  InitNormal(master, b.dout, 0, int64_t(qn), 7, entry++, 1.0, nullptr);
  auto tuning = (*tuned)->Autotune(b.out, b.stats, b.dq, b.dk, b.dv, b.dout, b.q, b.k, b.v, b.workspace, nullptr);
  if (!tuning.ok()) {
    std::printf("%s: %s\n", c.model, tuning.status().ToString().c_str());
    return false;
  }
  bool ok = true;
  double ms[2][2];  // [heuristic, tuned][forward, backward]
  for (int t = 0; t < 2; ++t) {
    CudnnAttention* a = t == 0 ? heuristic->get() : tuned->get();
    ms[t][0] = MeanMs([&] { ok &= a->Forward(b.out, b.stats, b.q, b.k, b.v, b.workspace, nullptr).ok(); }, start,
                      stop);
    ms[t][1] = MeanMs(
        [&] {
          ok &= a->Backward(b.dq, b.dk, b.dv, b.dout, b.out, b.stats, b.q, b.k, b.v, b.workspace, nullptr).ok();
        },
        start, stop);
  }
  const double fwd_flops = 4.0 * s.batch * s.heads * double(s.seq) * s.seq * s.head_dim / 2;
  std::printf(
      "%s (batch %d, T %d, %d heads of %d, %d kv heads), %s backward: forward %.3f -> %.3f ms (%.0f -> %.0f "
      "TFLOP/s), backward %.3f -> %.3f ms (%.0f -> %.0f TFLOP/s); tuned/heuristic %.3fx forward, %.3fx backward\n"
      "  heuristic's %s\n  %s\n",
      c.model, s.batch, s.seq, s.heads, s.head_dim, s.kv_heads, deterministic ? "deterministic" : "non-deterministic",
      ms[0][0], ms[1][0], fwd_flops / ms[0][0] / 1e9, fwd_flops / ms[1][0] / 1e9, ms[0][1], ms[1][1],
      2.5 * fwd_flops / ms[0][1] / 1e9, 2.5 * fwd_flops / ms[1][1] / 1e9, ms[0][0] / ms[1][0], ms[0][1] / ms[1][1],
      (*heuristic)->PlanNames().c_str(), tuning->c_str());
  return ok && cudaDeviceSynchronize() == cudaSuccess;
}

}  // namespace
}  // namespace tierd::trainer::gpu

int main() {
  using tierd::trainer::gpu::Bench;
  using tierd::trainer::gpu::Case;
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) {
    std::printf("no CUDA device\n");
    return 1;
  }
  std::printf("cuDNN attention, heuristic's first plan against the fastest plan, on %s\n", prop.name);
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  const Case cases[] = {{"1.3b", {2, 2048, 16, 16, 128}},
                        {"gqa-1.4b", {2, 2048, 32, 8, 64}},
                        {"wide-2.8b", {4, 2048, 24, 8, 128}},
                        {"7b", {4, 2048, 32, 32, 128}}};
  bool ok = true;
  for (const Case& c : cases) {
    for (bool deterministic : {false, true}) ok &= Bench(c, deterministic, start, stop);
  }
  return ok ? 0 : 1;
}
