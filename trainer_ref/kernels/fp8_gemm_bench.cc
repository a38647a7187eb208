// FP8 against bf16 GEMMs at the model's shapes, side by side in one run on the GPU it finds:
// the forward matmuls of a layer (fused QKV, the attention output, fused gate/up, down) for
// 1.3B and 7B at 8 x 2048 tokens, each timed over 20 runs after 3 warm-up ones (CUDA events).
// FP8 here is E4M3 x E4M3 with per-tensor scales and bf16 output (Gemm::ForwardFp8), with the
// tensor cores' exact and fast accumulation; the conversion to FP8 is not in the time (a
// weight is converted once a step, an activation once per GEMM that reads it).
// Then what the trainer runs: one decoder layer's seven linear maps (q, k, v, o separate, gate,
// up, down), forward and backward (din and the fp32 weight gradient), at 1.3B and 7B with the
// rows of a micro-batch, in bf16 and through Fp8Linear with every conversion in the time:
// weight codes made at each pass (one micro-batch at a time) or kept (layer-major), each with
// current scaling (every conversion reads its tensor twice: largest |x|, then codes) and
// delayed scaling (once: the scale from earlier steps' amaxes).
//   bazel run -c opt //trainer_ref/kernels:fp8_gemm_bench   (or .carry/bin/fp8_gemm_bench)
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "trainer_ref/kernels/fp8_linear.h"
#include "trainer_ref/kernels/fp8_ops.h"
#include "trainer_ref/kernels/gemm.h"

namespace tierd::trainer::gpu {
namespace {

template <typename T>
bool Alloc(T** p, size_t bytes) {
  return cudaMalloc(reinterpret_cast<void**>(p), bytes) == cudaSuccess;
}

struct Shape {
  const char* model;
  const char* what;
  int n, ic, oc;
};

// One layer's linear maps forward and backward, bf16 against FP8; false on a failure.
// `fused`: q, k and v as one map, gate and up as one (as PyTorch's baseline runs them).
bool LayerBench(Gemm& gemm, const char* model, int n, int c, int f, cudaEvent_t start, cudaEvent_t stop,
                bool fused = false) {
  struct Linear {
    int ic, oc, input;  // input: 0 h1, 1 attention out, 2 h2, 3 swiglu out
  };
  const std::vector<Linear> linears =
      fused ? std::vector<Linear>{{c, 3 * c, 0}, {c, c, 1}, {c, 2 * f, 2}, {f, c, 3}}
            : std::vector<Linear>{{c, c, 0}, {c, c, 0}, {c, c, 0}, {c, c, 1}, {c, f, 2}, {c, f, 2}, {f, c, 3}};
  const int maps = static_cast<int>(linears.size());
  Fp8Linear::Shapes shapes;
  for (const Linear& l : linears) shapes.push_back({l.oc, l.ic});
  Fp8ScalingOptions current_scaling, delayed_scaling;
  current_scaling.delayed = false;
  auto current = Fp8Linear::Create(&gemm, n, shapes, 1, current_scaling);
  auto delayed = Fp8Linear::Create(&gemm, n, shapes, 1, delayed_scaling);
  if (!current.ok() || !delayed.ok()) return false;
  const size_t big = size_t(n) * f, wide = 2 * big, weight = 2 * size_t(c) * f;  // wide: fused gate/up's
  Bf16 *in[4] = {}, *out = nullptr, *dout = nullptr, *din = nullptr, *w[7] = {};
  float *dw = nullptr, *master = nullptr;
  bool ok = Alloc(&out, wide * 2) && Alloc(&dout, wide * 2) && Alloc(&din, big * 2) && Alloc(&dw, weight * 4) &&
            Alloc(&master, std::max(wide, weight) * 4);  // InitNormal's fp32 copy of the largest
  for (int i = 0; ok && i < 4; ++i) ok = Alloc(&in[i], (i == 3 ? big : size_t(n) * c) * 2);
  for (int i = 0; ok && i < maps; ++i) ok = Alloc(&w[i], weight * 2);
  if (!ok) return false;
  for (int i = 0; i < 4; ++i)
    InitNormal(master, in[i], 0, int64_t(i == 3 ? big : size_t(n) * c), 1, 10 + i, 1.0, nullptr);
  for (int i = 0; i < maps; ++i) InitNormal(master, w[i], 0, int64_t(weight), 1, 20 + i, 0.02, nullptr);
  InitNormal(master, dout, 0, int64_t(wide), 1, 30, 1e-3, nullptr);
  cudaMemset(dw, 0, weight * 4);
  auto time = [&](auto&& run) {
    run();
    cudaEventRecord(start);
    for (int i = 0; i < 10; ++i) run();
    cudaEventRecord(stop);
    cudaEventSynchronize(stop);
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    return ms / 10;
  };
  const double bf16 = time([&] {
    for (int k = 0; k < maps; ++k)
      ok &= gemm.Forward(out, in[linears[k].input], w[k], n, linears[k].ic, linears[k].oc, nullptr).ok();
    for (int k = 0; k < maps; ++k) {
      ok &= gemm.Backward(din, dw, dout, in[linears[k].input], w[k], n, linears[k].ic, linears[k].oc, nullptr).ok();
    }
  });
  auto fp8_pass = [&](Fp8Linear& fp8, bool forget) {
    if (forget) fp8.ForgetWeights();
    Fp8Codes codes;
    for (int k = 0; k < maps; ++k) {
      if (k == 0 || linears[k].input != linears[k - 1].input) {
        codes = fp8.QuantizeInput(0, k, in[linears[k].input], n, linears[k].ic, nullptr);
      }
      ok &= fp8.Forward(out, codes, 0, k, w[k], n, linears[k].ic, linears[k].oc, nullptr).ok();
    }
    for (int k = 0; k < maps; ++k) {
      if (k == 0 || linears[k].input != linears[k - 1].input) {
        codes = fp8.QuantizeInputTransposed(0, k, in[linears[k].input], n, linears[k].ic, nullptr);
      }
      ok &= fp8.Backward(din, dw, dout, codes, 0, k, w[k], n, linears[k].ic, linears[k].oc, nullptr).ok();
    }
  };
  // Delayed scaling converts at the current scale until its first step has been recorded.
  fp8_pass(**delayed, true);
  (*delayed)->EndStep(nullptr);
  double made[2], kept[2], casts[2];
  for (int mode = 0; mode < 2; ++mode) {
    Fp8Linear& fp8 = mode == 0 ? **current : **delayed;
    made[mode] = time([&] { fp8_pass(fp8, true); });
    kept[mode] = time([&] { fp8_pass(fp8, false); });
    // The conversions alone: the same calls' work on the inputs, without the GEMMs.
    casts[mode] = time([&] {
      for (int k = 0; k < 4; ++k) fp8.QuantizeInput(0, k, in[k], n, k == 3 ? f : c, nullptr);
      for (int k = 0; k < 4; ++k) fp8.QuantizeInputTransposed(0, k, in[k], n, k == 3 ? f : c, nullptr);
    });
  }
  // Delayed scaling, codes kept: the forward, the backward's input gradients and its weight
  // gradients (fp32, accumulated as over micro-batches) apart, each with its own conversions.
  Fp8Linear& fp8 = **delayed;
  auto part = [&](int which) {
    Fp8Codes codes;
    for (int k = 0; k < maps; ++k) {
      if (which != 1 && (k == 0 || linears[k].input != linears[k - 1].input)) {  // din reads no input
        codes = which == 0 ? fp8.QuantizeInput(0, k, in[linears[k].input], n, linears[k].ic, nullptr)
                           : fp8.QuantizeInputTransposed(0, k, in[linears[k].input], n, linears[k].ic, nullptr);
      }
      if (which == 0) {
        ok &= fp8.Forward(out, codes, 0, k, w[k], n, linears[k].ic, linears[k].oc, nullptr).ok();
      } else {
        ok &= fp8.Backward(which == 1 ? din : nullptr, which == 2 ? dw : nullptr, dout, codes, 0, k, w[k], n,
                           linears[k].ic, linears[k].oc, nullptr)
                  .ok();
      }
    }
  };
  double parts[3];
  for (int which = 0; which < 3; ++which) parts[which] = time([&] { part(which); });
  if (!ok || cudaDeviceSynchronize() != cudaSuccess) return false;
  const double flops = 3 * 2.0 * n * (4.0 * c * c + 3.0 * c * f);
  std::printf(
      "| %s | %d | %.2f ms (%.0f TFLOP/s) | %.2f ms (%.2fx) | %.2f ms (%.2fx) | %.2f ms | %.2f ms (%.2fx) | "
      "%.2f ms (%.2fx) | %.2f ms |\n",
      model, n, bf16, flops / bf16 / 1e9, made[0], bf16 / made[0], kept[0], bf16 / kept[0], casts[0], made[1],
      bf16 / made[1], kept[1], bf16 / kept[1], casts[1]);
  const double third = flops / 3;
  std::printf("    delayed scaling, codes kept, apart: forward %.2f ms (%.0f TFLOP/s), input gradients %.2f ms (%.0f), "
              "fp32 weight gradients %.2f ms (%.0f)\n",
              parts[0], third / parts[0] / 1e9, parts[1], third / parts[1] / 1e9, parts[2], third / parts[2] / 1e9);
  for (Bf16* p : {out, dout, din}) cudaFree(p);
  for (Bf16* p : in) cudaFree(p);
  for (Bf16* p : w) cudaFree(p);
  cudaFree(dw);
  cudaFree(master);
  return true;
}

int Main() {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) {
    std::fprintf(stderr, "fp8_gemm_bench: no CUDA device\n");
    return 1;
  }
  auto gemm = Gemm::Create();
  if (!gemm.ok()) {
    std::fprintf(stderr, "fp8_gemm_bench: %s\n", std::string(gemm.status().message()).c_str());
    return 1;
  }
  const std::vector<Shape> shapes = {
      {"1.3b", "qkv", 16384, 2048, 6144},      {"1.3b", "out", 16384, 2048, 2048},
      {"1.3b", "gate/up", 16384, 2048, 11008}, {"1.3b", "down", 16384, 5504, 2048},
      {"7b", "qkv", 16384, 4096, 12288},       {"7b", "out", 16384, 4096, 4096},
      {"7b", "gate/up", 16384, 4096, 22016},   {"7b", "down", 16384, 11008, 4096},
  };
  std::printf(
      "FP8 (E4M3, per-tensor scales, bf16 out) vs bf16 GEMMs, cuBLASLt, on %s; out (N, OC) = in (N, IC) x W^T\n",
      prop.name);
  std::printf(
      "| model | GEMM | N x IC x OC | bf16 TFLOP/s | fp8 TFLOP/s | fp8 fast-accum TFLOP/s | fp8 / bf16 | fast / bf16 "
      "|\n");
  std::printf("|---|---|---|---|---|---|---|---|\n");
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  double total_bf16 = 0, total_fp8 = 0, total_fast = 0;
  for (const Shape& s : shapes) {
    const size_t in_n = size_t(s.n) * s.ic, w_n = size_t(s.oc) * s.ic, out_n = size_t(s.n) * s.oc;
    Bf16 *in = nullptr, *w = nullptr, *out = nullptr;
    uint8_t *q_in = nullptr, *q_w = nullptr;
    float* slots = nullptr;
    if (!Alloc(&in, in_n * 2) || !Alloc(&w, w_n * 2) || !Alloc(&out, out_n * 2) || !Alloc(&q_in, in_n) ||
        !Alloc(&q_w, w_n) || !Alloc(&slots, 16 * sizeof(float))) {
      std::fprintf(stderr, "fp8_gemm_bench: out of GPU memory\n");
      return 1;
    }
    float* master = nullptr;  // InitNormal writes an fp32 copy beside the bf16 one
    if (!Alloc(&master, std::max(in_n, w_n) * sizeof(float))) {
      std::fprintf(stderr, "fp8_gemm_bench: out of GPU memory\n");
      return 1;
    }
    InitNormal(master, in, 0, static_cast<int64_t>(in_n), 1, 1, 1.0, nullptr);
    InitNormal(master, w, 0, static_cast<int64_t>(w_n), 1, 2, 0.02, nullptr);
    cudaFree(master);
    // Current scaling: amax, then scale = 448 / amax, and its inverse for the GEMM.
    AbsMax(slots, in, in_n, nullptr);
    AbsMax(slots + 4, w, w_n, nullptr);
    float amax[8];
    cudaMemcpy(amax, slots, sizeof(amax), cudaMemcpyDeviceToHost);
    const float host[16] = {448.f / amax[0], 0, 0, 0, 448.f / amax[4], 0, 0, 0,
                            amax[0] / 448.f, 0, 0, 0, amax[4] / 448.f, 0, 0, 0};
    cudaMemcpy(slots, host, sizeof(host), cudaMemcpyHostToDevice);
    QuantizeFp8(q_in, in, in_n, slots, false, nullptr);
    QuantizeFp8(q_w, w, w_n, slots + 4, false, nullptr);
    auto time = [&](auto&& run) {
      for (int i = 0; i < 3; ++i) run();
      cudaEventRecord(start);
      for (int i = 0; i < 20; ++i) run();
      cudaEventRecord(stop);
      cudaEventSynchronize(stop);
      float ms = 0;
      cudaEventElapsedTime(&ms, start, stop);
      return ms / 20 / 1e3;
    };
    bool ok = true;
    const double bf16 = time([&] { ok &= (*gemm)->Forward(out, in, w, s.n, s.ic, s.oc, nullptr).ok(); });
    const double fp8 =
        time([&] { ok &= (*gemm)->ForwardFp8(out, q_in, q_w, slots + 8, slots + 12, s.n, s.ic, s.oc, nullptr).ok(); });
    const double fast = time(
        [&] { ok &= (*gemm)->ForwardFp8(out, q_in, q_w, slots + 8, slots + 12, s.n, s.ic, s.oc, nullptr, true).ok(); });
    if (!ok || cudaDeviceSynchronize() != cudaSuccess) {
      std::fprintf(stderr, "fp8_gemm_bench: a GEMM failed at %s %s\n", s.model, s.what);
      return 1;
    }
    const double flops = 2.0 * s.n * s.ic * s.oc;
    total_bf16 += bf16;
    total_fp8 += fp8;
    total_fast += fast;
    std::printf("| %s | %s | %d x %d x %d | %.0f | %.0f | %.0f | %.2fx | %.2fx |\n", s.model, s.what, s.n, s.ic, s.oc,
                flops / bf16 / 1e12, flops / fp8 / 1e12, flops / fast / 1e12, bf16 / fp8, bf16 / fast);
    cudaFree(in);
    cudaFree(w);
    cudaFree(out);
    cudaFree(q_in);
    cudaFree(q_w);
    cudaFree(slots);
  }
  std::printf("all eight GEMMs: fp8 %.2fx of bf16's time-weighted speed, fast accumulation %.2fx\n",
              total_bf16 / total_fp8, total_bf16 / total_fast);
  std::printf(
      "\nOne layer's seven linear maps (fused: four), forward + backward (din, fp32 dweight), every FP8 conversion "
      "timed in\n"
      "| model | rows | bf16 | current scaling: fp8, weight codes made each pass | weight codes kept | input casts "
      "alone (4 plain, 4 transposed) | delayed scaling: fp8, weight codes made each pass | weight codes kept | input "
      "casts alone |\n"
      "|---|---|---|---|---|---|---|---|---|\n");
  const struct {
    const char* model;
    int n, c, f;
    bool fused;
  } layers[] = {{"1.3b", 4096, 2048, 5504, false},        {"1.3b, fused maps", 4096, 2048, 5504, true},
                {"1.3b", 16384, 2048, 5504, false},       {"1.3b, fused maps", 16384, 2048, 5504, true},
                {"7b", 8192, 4096, 11008, false},         {"7b, fused maps", 8192, 4096, 11008, true}};
  for (const auto& l : layers) {
    if (!LayerBench(**gemm, l.model, l.n, l.c, l.f, start, stop, l.fused)) {
      std::fprintf(stderr, "fp8_gemm_bench: the layer bench failed at %s, %d rows\n", l.model, l.n);
      return 1;
    }
  }
  // The same layers with each GEMM shape's algorithm the fastest of cuBLASLt's first 8
  // candidates (timed at the shape's first call), side by side with the rows above.
  GemmOptions searched_options;
  searched_options.candidates = 8;
  auto searched = Gemm::Create(searched_options);
  if (!searched.ok()) {
    std::fprintf(stderr, "fp8_gemm_bench: %s\n", std::string(searched.status().message()).c_str());
    return 1;
  }
  std::printf("\nThe same, each shape's algorithm the fastest of cuBLASLt's first %d candidates:\n",
              searched_options.candidates);
  for (const auto& l : layers) {
    if (!LayerBench(**searched, l.model, l.n, l.c, l.f, start, stop, l.fused)) {
      std::fprintf(stderr, "fp8_gemm_bench: the searched layer bench failed at %s, %d rows\n", l.model, l.n);
      return 1;
    }
  }
  std::printf("\nThe shapes' choices (time of the fastest and of the heuristic's first, 3 runs each):\n");
  for (const std::string& line : (*searched)->DescribePlans()) std::printf("  %s\n", line.c_str());
  // The same layers with the heuristic's first among algorithms that reduce no split of K
  // through the workspace: what those reductions (and the memsets of their workspace a
  // per-kernel profile shows beside each GEMM) cost or save.
  GemmOptions plain_options;
  plain_options.split_k_reductions = false;
  auto plain = Gemm::Create(plain_options);
  if (!plain.ok()) {
    std::fprintf(stderr, "fp8_gemm_bench: %s\n", std::string(plain.status().message()).c_str());
    return 1;
  }
  std::printf("\nThe same, the heuristic's first without split-K reductions (side by side with the first table):\n");
  for (const auto& l : layers) {
    if (!LayerBench(**plain, l.model, l.n, l.c, l.f, start, stop, l.fused)) {
      std::fprintf(stderr, "fp8_gemm_bench: the layer bench without split-K reductions failed at %s, %d rows\n",
                   l.model, l.n);
      return 1;
    }
  }
  return 0;
}

}  // namespace
}  // namespace tierd::trainer::gpu

int main() { return tierd::trainer::gpu::Main(); }
