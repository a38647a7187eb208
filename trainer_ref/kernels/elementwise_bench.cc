// The trainer's element-wise and row kernels (gpu_ops.h) at a decoder layer's shapes, each
// timed over 20 runs after 3 warm-up ones (CUDA events), with the bytes each must move at
// least (every input read once, every output written once) and that rate against a
// device-to-device cudaMemcpy measured in the same run: what share of the memory system each
// kernel gets. Shapes: one micro-batch of 4 x 2048 tokens of 1.3B and 7B; the optimizer's
// kernels on one MLP weight matrix.
//   bazel run -c opt //trainer_ref/kernels:elementwise_bench   (or .carry/bin/elementwise_bench)
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <vector>

#include "trainer_ref/adamw8bit.h"
#include "trainer_ref/kernels/bench_timer.h"
#include "trainer_ref/kernels/fp8_ops.h"
#include "trainer_ref/kernels/gpu_ops.h"

namespace tierd::trainer::gpu {
namespace {

struct Buffers {
  std::vector<void*> all;
  void* Get(size_t bytes) {
    void* p = nullptr;
    if (cudaMalloc(&p, bytes) != cudaSuccess) return nullptr;
    cudaMemset(p, 0, bytes);
    all.push_back(p);
    return p;
  }
  ~Buffers() {
    for (void* p : all) cudaFree(p);
  }
};

bool Bench(const char* model, int b, int t, int c, int f, int heads, cudaEvent_t start, cudaEvent_t stop) {
  const int n = b * t, d = c / heads;
  const size_t nc = size_t(n) * c, nf = size_t(n) * f;
  Buffers buf;
  auto* x = static_cast<float*>(buf.Get(nc * 4));
  auto* dx = static_cast<float*>(buf.Get(nc * 4));
  auto* h = static_cast<Bf16*>(buf.Get(nc * 2));
  auto* q = static_cast<Bf16*>(buf.Get(nc * 2));
  auto* g = static_cast<Bf16*>(buf.Get(nf * 2));
  auto* u = static_cast<Bf16*>(buf.Get(nf * 2));
  auto* s = static_cast<Bf16*>(buf.Get(nf * 2));
  auto* dg = static_cast<Bf16*>(buf.Get(nf * 2));
  auto* du = static_cast<Bf16*>(buf.Get(nf * 2));
  auto* rstd = static_cast<float*>(buf.Get(size_t(n) * 4));
  auto* weight = static_cast<float*>(buf.Get(size_t(c) * 4));
  auto* dweight = static_cast<float*>(buf.Get(size_t(c) * 4));
  auto* scratch = static_cast<float*>(buf.Get(size_t(RmsNormScratchFloats(n, c)) * 4));
  auto* master = static_cast<float*>(buf.Get(nf * 4));
  if (master == nullptr) return false;
  InitNormal(master, g, 0, int64_t(nf), 3, 1, 1.0, nullptr);
  InitNormal(master, u, 0, int64_t(nf), 3, 2, 1.0, nullptr);
  InitNormal(master, s, 0, int64_t(nf), 3, 3, 1.0, nullptr);
  InitNormal(master, h, 0, int64_t(nc), 3, 4, 1.0, nullptr);
  InitNormal(master, q, 0, int64_t(nc), 3, 5, 1.0, nullptr);
  std::vector<float> ones(c, 1.f), xs(nc, 0.5f);
  cudaMemcpy(weight, ones.data(), c * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(x, xs.data(), nc * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(dx, xs.data(), nc * 4, cudaMemcpyHostToDevice);
  cudaMemcpy(rstd, xs.data(), size_t(n) * 4, cudaMemcpyHostToDevice);
  const double copy_ms =
      MeanMs([&] { cudaMemcpyAsync(dg, g, nf * 2, cudaMemcpyDeviceToDevice, nullptr); }, start, stop);
  const double copy_gbs = 2.0 * nf * 2 / copy_ms / 1e6;
  std::printf("\n%s, %d x %d tokens (C %d, F %d, %d heads of %d): device-to-device copy %.0f GB/s (read + write)\n",
              model, b, t, c, f, heads, d, copy_gbs);
  std::printf("| kernel | ms | GB moved (at least) | GB/s | vs copy |\n|---|---|---|---|---|\n");
  double total_ms = 0;
  auto row = [&](const char* name, double bytes, const std::function<void()>& run) {
    const double ms = MeanMs(run, start, stop);
    total_ms += ms;
    std::printf("| %s | %.3f | %.3f | %.0f | %.2f |\n", name, ms, bytes / 1e9, bytes / ms / 1e6,
                bytes / ms / 1e6 / copy_gbs);
  };
  row("RmsNormForward", nc * 4.0 + nc * 2, [&] { RmsNormForward(h, rstd, x, weight, n, c, 1e-5f, nullptr); });
  row("RmsNormBackward (din and dweight)", nc * 4.0 * 3 + nc * 2,
      [&] { RmsNormBackward(dx, dweight, h, x, weight, rstd, n, c, scratch, nullptr); });
  std::vector<double> inv_freq(d / 2);
  for (int i = 0; i < d / 2; ++i) inv_freq[i] = std::pow(10000.0, -2.0 * i / d);
  const RopeFrequencies freq = RopeFrequenciesOf(inv_freq);
  row("RopeForward (q)", nc * 4.0, [&] { RopeForward(q, b, t, heads, d, freq, nullptr); });
  row("RopeForwardPair (q and k, one launch)", nc * 8.0,
      [&] { RopeForwardPair(q, heads, h, heads, b, t, d, freq, nullptr); });
  row("SwiGluForward", nf * 6.0, [&] { SwiGluForward(s, g, u, n, f, nullptr); });
  row("SwiGluBackward (writes dg, du)", nf * 10.0, [&] { SwiGluBackward(dg, du, s, g, u, n, f, nullptr); });
  row("AddInto (fp32 += bf16)", nc * 10.0, [&] { AddInto(x, h, int64_t(nc), nullptr); });
  row("ToBf16", nc * 6.0, [&] { ToBf16(h, dx, int64_t(nc), nullptr); });
  row("cudaMemsetAsync (bf16 N x F)", nf * 2.0, [&] { cudaMemsetAsync(dg, 0, nf * 2, nullptr); });
  row("cudaMemcpyAsync (fp32 N x C)", nc * 8.0,
      [&] { cudaMemcpyAsync(dx, x, nc * 4, cudaMemcpyDeviceToDevice, nullptr); });
  // FP8 casts of a layer's inputs (E4M3, delayed scaling: the scale is known, the amax folded
  // into the step's running one): plain for the forward, transposed for the weight gradients.
  auto* codes = static_cast<uint8_t*>(buf.Get(nf));
  auto* codes_t = static_cast<uint8_t*>(buf.Get(nf));
  auto* slot = static_cast<float*>(buf.Get(4 * sizeof(float)));
  const std::vector<float> slot_init = {1.f, 1.f, 0.f, 0.f};  // scale, 1 / scale, running amax, amax
  cudaMemcpy(slot, slot_init.data(), sizeof(float) * 4, cudaMemcpyHostToDevice);
  row("AbsMax (bf16 N x C)", nc * 2.0, [&] { AbsMax(slot + 3, h, int64_t(nc), nullptr); });
  row("QuantizeFp8 (bf16 N x C, amax)", nc * 3.0,
      [&] { QuantizeFp8(codes, h, int64_t(nc), slot, false, nullptr, slot + 2); });
  row("QuantizeFp8 (bf16 N x F, amax)", nf * 3.0,
      [&] { QuantizeFp8(codes, s, int64_t(nf), slot, false, nullptr, slot + 2); });
  row("QuantizeFp8Transposed (N x C)", nc * 3.0,
      [&] { QuantizeFp8Transposed(codes_t, h, n, c, slot, false, nullptr, nullptr, slot + 2); });
  row("QuantizeFp8Transposed (N x F, and plain)", nf * 4.0,
      [&] { QuantizeFp8Transposed(codes_t, s, n, f, slot, true, nullptr, codes, slot + 2); });
  // The same casts made by the kernels that make their inputs (delayed scaling): the fused
  // residual norm and SwiGLU writing E4M3 codes beside their output, SwiGLU's backward writing
  // the two gradients' E5M2 codes only, the norm's backward writing dx's bf16 copy beside dx.
  const Fp8Out to_codes{codes, slot, slot + 2};
  row("ResidualRmsNormForward (add, copy, + E4M3 codes)", nc * (4.0 + 2 + 4 + 4 + 2 + 1),
      [&] { ResidualRmsNormForward(h, rstd, x, q, dx, weight, n, c, 1e-5f, nullptr, to_codes); });
  row("SwiGluForward (+ E4M3 codes)", nf * 7.0, [&] { SwiGluForward(s, g, u, n, f, nullptr, to_codes); });
  row("SwiGluBackwardFp8 (writes dg, du codes)", nf * 8.0,
      [&] { SwiGluBackwardFp8(codes, codes_t, s, g, u, int64_t(nf), slot, slot, slot + 2, slot + 2, nullptr); });
  row("RmsNormBackward (+ dx in bf16)", nc * 4.0 * 3 + nc * 2 + nc * 2,
      [&] { RmsNormBackward(dx, dweight, h, x, weight, rstd, n, c, scratch, nullptr, q); });
  // The optimizer on one F x C weight matrix: fp32 AdamW reads the gradient, master and both
  // moments and writes the master, the moments and the bf16 weights (30 B a value); 8-bit
  // moments make that 18 B (and a scale per block).
  const int64_t w = int64_t(f) * c;
  auto* grads = static_cast<float*>(buf.Get(w * 4));
  auto* m = static_cast<float*>(buf.Get(w * 4));
  auto* v = static_cast<float*>(buf.Get(w * 4));
  auto* weights = static_cast<Bf16*>(buf.Get(w * 2));
  void* m8 = buf.Get(Moment8bitBytes(w));
  void* v8 = buf.Get(Moment8bitBytes(w));
  if (v8 == nullptr) return false;
  InitNormal(master, weights, 0, w, 7, 6, 1e-3, nullptr);  // master (nf >= w values) and the weights
  cudaMemcpy(grads, master, w * 4, cudaMemcpyDeviceToDevice);
  AdamWParams p;
  auto* sum_scratch = static_cast<float*>(buf.Get(kSumSquaresScratch * sizeof(float)));
  row("SumSquares (fp32 F x C, the gradient norm)", w * 4.0,
      [&] { SumSquares(grads, w, slot + 3, sum_scratch, nullptr); });
  row("AdamW (F x C, fp32 moments)", w * 30.0, [&] { AdamW(master, m, v, weights, grads, w, p, nullptr); });
  UseGpuCodePath("search");
  row("AdamW8bit (F x C, 8-bit moments; codes by search)", w * 18.0,
      [&] { AdamW8bit(master, m8, v8, weights, grads, w, p, nullptr); });
  UseGpuCodePath("table");
  row("AdamW8bit (the same, codes by table)", w * 18.0,
      [&] { AdamW8bit(master, m8, v8, weights, grads, w, p, nullptr); });
  // As the step calls it with FP8 weight codes: the largest |x| of the new bf16 weights too
  // (a warp's max, then an atomic where it exceeds the value read; zeroed before each step, as
  // the step does, the 4-byte memset timed with it), and on a C x C matrix (attention's maps: a
  // third of the values, so the launch and the last wave weigh more).
  auto* weights_amax = slot + 3;
  row("AdamW8bit (the same, + the weights' amax from 0)", w * 18.0, [&] {
    cudaMemsetAsync(weights_amax, 0, sizeof(float), nullptr);
    AdamW8bit(master, m8, v8, weights, grads, w, p, nullptr, weights_amax);
  });
  const int64_t sq = int64_t(c) * c;
  row("AdamW8bit (the same on C x C, + the weights' amax from 0)", sq * 18.0, [&] {
    cudaMemsetAsync(weights_amax, 0, sizeof(float), nullptr);
    AdamW8bit(master, m8, v8, weights, grads, sq, p, nullptr, weights_amax);
  });
  // Master, gradients and weights one value into their arrays: not 16-byte aligned, so the
  // kernel loads value by value rather than eight at a time.
  row("AdamW8bit (the same, arrays not aligned: one by one)", w * 18.0,
      [&] { AdamW8bit(master + 1, m8, v8, weights + 1, grads + 1, w - 1, p, nullptr); });
  auto* grads_bf16 = static_cast<Bf16*>(buf.Get(w * 2));
  ToBf16(grads_bf16, grads, w, nullptr);
  row("AdamW8bit (the same, bf16 gradients)", w * 16.0,
      [&] { AdamW8bit(master, m8, v8, weights, grads_bf16, w, p, nullptr); });
  // A decoder layer's step as the trainer takes it (--optimizer_one_launch): its four C x C and
  // three F x C matrices in one launch, each with its weights' amax, the amaxes zeroed first.
  std::vector<AdamW8bitTensor> layer;
  auto* amaxes = static_cast<float*>(buf.Get(8 * sizeof(float)));
  for (int k = 0; k < 7; ++k) {
    const int64_t count = k < 4 ? sq : w;
    AdamW8bitTensor t;
    t.master = static_cast<float*>(buf.Get(count * 4));
    t.grads = static_cast<float*>(buf.Get(count * 4));
    t.weights = static_cast<Bf16*>(buf.Get(count * 2));
    t.m_bytes = buf.Get(Moment8bitBytes(count));
    t.v_bytes = buf.Get(Moment8bitBytes(count));
    if (t.v_bytes == nullptr) return false;
    InitNormal(t.master, t.weights, 0, count, 7, 10 + k, 1e-3, nullptr);
    cudaMemcpy(const_cast<float*>(t.grads), t.master, count * 4, cudaMemcpyDeviceToDevice);
    t.n = count;
    t.params = p;
    t.weights_amax = amaxes + k;
    layer.push_back(t);
  }
  row("AdamW8bitMany (a layer: 4 C x C + 3 F x C, one launch, + the amaxes)", (4 * sq + 3 * w) * 18.0, [&] {
    cudaMemsetAsync(amaxes, 0, 8 * sizeof(float), nullptr);
    AdamW8bitMany(layer, nullptr);
  });
  // The loss and its gradient over a micro-batch's logits (vocabulary 32,000, both models'):
  // read once from memory and written once, at least. The first N x F logits are random, the
  // rest 0 (every target 0): the kernels read and write every value alike either way.
  const int vocab = 32000;
  auto* logits = static_cast<Bf16*>(buf.Get(size_t(n) * vocab * 2));
  auto* dlogits = static_cast<Bf16*>(buf.Get(size_t(n) * vocab * 2));
  auto* targets = static_cast<int32_t*>(buf.Get(size_t(n) * 4));
  auto* losses = static_cast<float*>(buf.Get(size_t(n) * 4));
  if (losses == nullptr) return false;
  InitNormal(master, logits, 0, std::min<int64_t>(int64_t(n) * vocab, int64_t(nf)), 7, 30, 2.0, nullptr);
  row("CrossEntropy (N x 32000 bf16 logits, loss + gradient)", double(n) * vocab * 4.0,
      [&] { CrossEntropy(losses, dlogits, logits, targets, n, vocab, n, nullptr); });
  std::printf("sum of the rows: %.3f ms\n", total_ms);
  return cudaDeviceSynchronize() == cudaSuccess;
}

int Main() {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) {
    std::fprintf(stderr, "elementwise_bench: no CUDA device\n");
    return 1;
  }
  std::printf("element-wise and row kernels of the trainer on %s\n", prop.name);
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  if (!Bench("1.3b", 4, 2048, 2048, 5504, 16, start, stop) || !Bench("7b", 4, 2048, 4096, 11008, 32, start, stop)) {
    std::fprintf(stderr, "elementwise_bench: CUDA failed (%s)\n", cudaGetErrorString(cudaGetLastError()));
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace tierd::trainer::gpu

int main() { return tierd::trainer::gpu::Main(); }
