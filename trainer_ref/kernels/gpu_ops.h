// The reference trainer's ops on the GPU: bf16 storage with fp32 arithmetic and fp32
// reductions, the same shapes and meanings as trainer_ref/cpu_ops.h (the oracle they are
// checked against in gpu_ops_test). All pointers are device pointers; every function only
// queues work on `stream` (no synchronisation). Backward functions ADD into the gradients
// they produce, like the CPU ops, except where a comment says "writes".
//
// Storage: activations and weights bf16 (`Bf16`, the raw 16 bits), except the residual
// stream and its gradient, fp32 (every layer adds into them: in bf16 the small additions
// would round away, as autocast keeps them in fp32 too); norm weights fp32 (small and
// sensitive), every weight gradient fp32 (accumulated over micro-batches without bf16
// rounding), per-row statistics fp32, the optimizer's master weights and moments fp32.
#ifndef TIERD_TRAINER_REF_KERNELS_GPU_OPS_H_
#define TIERD_TRAINER_REF_KERNELS_GPU_OPS_H_

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <vector>

#include "trainer_ref/host_adafactor.h"
#include "trainer_ref/host_adamw.h"

namespace tierd::trainer::gpu {

using Bf16 = uint16_t;  // bfloat16 bits; device code reads them as __nv_bfloat16

// out (N, C, the fp32 residual stream) = wte[tokens], wte (V, C). Tokens outside [0, V)
// give zero rows.
void EmbeddingForward(float* out, const int32_t* tokens, const Bf16* wte, int n, int c, int v, cudaStream_t stream);
// Every backward kernel is deterministic (no atomic adds): the same inputs give the same
// bits on every run, so two runs of a step (plain buffers or tierd, the optimizer on the
// GPU or on the host) can be compared bit for bit.
//
// dwte (V, C, fp32) += dout rows summed by token. `index` (on the device) is the rows
// grouped by token, from TokenSegments on the host: each token's rows are summed in row
// order, then added to its row of dwte.
struct TokenSegments {
  std::vector<int32_t> index;  // rows (with a token in [0, V)) | segment starts (+1) | segment tokens
  int rows = 0, segments = 0;
};
TokenSegments SegmentTokens(const int32_t* tokens, int n, int v);
void EmbeddingBackward(float* dwte, const float* dout, const int32_t* index, int rows, int segments, int c,
                       cudaStream_t stream);

// E4M3 codes of a kernel's bf16 output written beside it, at *scale: the codes QuantizeFp8
// (fp8_ops.h) makes of that output, bit for bit, with the output's largest |x| folded into
// *amax (null: not). No codes with a null `codes`. What a layer's forward gives its FP8 linear
// maps when the input's scale is known before the input is (delayed scaling), so that no
// conversion reads the output again. A kernel given codes may be given a null bf16 output:
// the codes alone are written.
struct Fp8Out {
  uint8_t* codes = nullptr;
  const float* scale = nullptr;
  float* amax = nullptr;
};

// out (bf16) = in * rstd * weight, `in` the fp32 residual stream; rstd (N) = 1 / sqrt(mean(in^2)
// + eps), written for backward.
void RmsNormForward(Bf16* out, float* rstd, const float* in, const float* weight, int n, int c, float eps,
                    cudaStream_t stream);
// The same norm of the residual stream x after `residual` (bf16, N x C; null: none) is added
// into it (x written back, as AddInto), with x then also copied to `saved` (null: not), in one
// pass: AddInto, a device copy and RmsNormForward in one read of x. The same bits as those
// three (one kernel, the same loops), where every pointer is 16-byte aligned and C % 4 == 0.
void ResidualRmsNormForward(Bf16* out, float* rstd, float* x, const Bf16* residual, float* saved, const float* weight,
                            int n, int c, float eps, cudaStream_t stream, const Fp8Out& codes = {});
// The norm of x + residual without writing x back: the sum goes to `sum` and to `saved` (either
// may be null, not both). ResidualRmsNormForward's bits for out, rstd and the sum: a layer's
// norm reading its input from one place and leaving the sum in another (the residual stream
// carried from a layer's last add into the next layer's first norm).
void SumRmsNormForward(Bf16* out, float* rstd, const float* x, const Bf16* residual, float* sum, float* saved,
                       const float* weight, int n, int c, float eps, cudaStream_t stream, const Fp8Out& codes = {});
// din (fp32, the residual gradient) += d/d(in); dweight (fp32, C) += sum over rows: partial
// sums per block of rows into `scratch` (RmsNormScratchFloats), made beside din's from the same
// loads, then summed (every sum in an order fixed by the shape: the same bits each run).
// With din_bf16, din (after the add) rounded to bf16 there too: ToBf16's bits, without its read.
void RmsNormBackward(float* din, float* dweight, const Bf16* dout, const float* in, const float* weight,
                     const float* rstd, int n, int c, float* scratch, cudaStream_t stream, Bf16* din_bf16 = nullptr);
int64_t RmsNormScratchFloats(int n, int c);

// RoPE's inverse frequencies (RopeInverseFrequencies: D/2 of them, head sizes up to 256), passed
// to the kernel by value.
struct RopeFrequencies {
  static constexpr int kMaxPairs = 128;
  float inv_freq[kMaxPairs] = {};
};
RopeFrequencies RopeFrequenciesOf(const std::vector<double>& inv_freq);
// Rotary embedding in place on x (B*T, H, D), as cpu::RopeForward; backward turns back.
void RopeForward(Bf16* x, int b, int t, int h, int d, const RopeFrequencies& freq, cudaStream_t stream);
void RopeBackward(Bf16* dx, int b, int t, int h, int d, const RopeFrequencies& freq, cudaStream_t stream);
// RopeForward of the queries q (B*T, HQ, D) and the keys k (B*T, HK, D) in one launch, each
// token's angles made once for both: the bits of the two calls.
void RopeForwardPair(Bf16* q, int hq, Bf16* k, int hk, int b, int t, int d, const RopeFrequencies& freq,
                     cudaStream_t stream);

// q/k/v biases (gpu_family_ops.cu). out (N, OC, bf16) += bias (OC, fp32), each value rounded
// once; dbias (OC, fp32) += dout (N, OC) summed over the rows: partial sums per 64 rows into
// `scratch` (BiasScratchFloats), then summed in order (deterministic).
void BiasForward(Bf16* out, const float* bias, int n, int oc, cudaStream_t stream);
void BiasBackward(float* dbias, const Bf16* dout, int n, int oc, float* scratch, cudaStream_t stream);
int64_t BiasScratchFloats(int n, int oc);

// Grouped-query attention on the kernels of multi-head attention (gpu_family_ops.cu): kv
// (N, KV*D) repeated to full (N, H*D), each key/value head for its H/KV query heads
// (head h reads head h / (H/KV)); and back, dkv (N, KV*D) = the sum of each group's heads of
// dfull (N, H*D) in head order, in fp32, rounded once (writes).
void RepeatKvHeads(Bf16* full, const Bf16* kv, int n, int h, int kv_heads, int d, cudaStream_t stream);
void SumKvHeadGroups(Bf16* dkv, const Bf16* dfull, int n, int h, int kv_heads, int d, cudaStream_t stream);

// out (N, F) = silu(gate) * up; backward writes dgate and dup (nothing else adds into them).
void SwiGluForward(Bf16* out, const Bf16* gate, const Bf16* up, int n, int f, cudaStream_t stream,
                   const Fp8Out& codes = {});
void SwiGluBackward(Bf16* dgate, Bf16* dup, const Bf16* dout, const Bf16* gate, const Bf16* up, int n, int f,
                    cudaStream_t stream);

// x (fp32) += y (bf16): a sublayer's output into the residual stream (`count` values).
void AddInto(float* x, const Bf16* y, int64_t count, cudaStream_t stream);
// out (bf16) = in (fp32), rounded: the residual gradient as a GEMM's input.
void ToBf16(Bf16* out, const float* in, int64_t count, cudaStream_t stream);

// Cross-entropy fused with its backward: losses (N, fp32) writes each row's loss (0 for an
// ignored row, target < 0); dlogits (N, V) writes (softmax - onehot) / counted, where
// `counted` is the number of rows with a target (the mean's divisor, known to the caller).
// dlogits may be null (validation).
void CrossEntropy(float* losses, Bf16* dlogits, const Bf16* logits, const int32_t* targets, int n, int v,
                  int counted, cudaStream_t stream);

// Causal attention without a T x T matrix: q, k, v, out (B, T, H*D); lse (B, H, T, fp32)
// writes each row's log-sum-exp of its scaled scores, for backward. Scores are scaled by
// 1/sqrt(D); softmax online in fp32. Head sizes 64 and 128 run on tensor cores
// (attention_tc.cu, flash-style tiles); others (at most 256) one warp per query row.
// Backward writes dq, dk, dv, recomputing the probabilities from lse; every gradient row
// is summed in one place in a fixed order (deterministic, no atomics). `scratch` holds
// AttentionBackwardScratchBytes (or more): rowsum(dO * O), and on tensor cores dS (bf16) for
// as many sequences at a time as it holds, so dQ needs no second S and dP. The returned error is
// the launch's (cudaSuccess when queued; cudaErrorInvalidValue for too small a scratch).
cudaError_t AttentionForward(Bf16* out, float* lse, const Bf16* q, const Bf16* k, const Bf16* v, int b, int t, int h,
                             int d, cudaStream_t stream);
// `sequences_at_once`: room for at most that many sequences' dS (0: the fewest equal passes
// over the batch that keep dS within 512 MiB, at least one sequence a pass).
int64_t AttentionBackwardScratchBytes(int b, int t, int h, int d, int sequences_at_once = 0);
cudaError_t AttentionBackward(Bf16* dq, Bf16* dk, Bf16* dv, const Bf16* dout, const Bf16* out, const float* lse,
                              void* scratch, int64_t scratch_bytes, const Bf16* q, const Bf16* k, const Bf16* v, int b,
                              int t, int h, int d, cudaStream_t stream);

// AdamW on `n` parameters: fp32 master, m, v updated in place from grads (fp32) scaled by
// grad_scale (the clip factor / accumulation divisor); the bf16 weights the model reads
// are written from the new master (none when `weights` is null: the master is the weights,
// as for tierd.torch's fp32 parameters; Lion and AdamW8bit alike). Bias correction for `step` (1-based); decoupled decay
// when `decay`.
// The same parameters as the host's AdamW (host_adamw.h), which runs this kernel's
// arithmetic on the CPU.
using AdamWParams = ::tierd::trainer::HostAdamWParams;
void AdamW(float* master, float* m, float* v, Bf16* weights, const float* grads, int64_t n, const AdamWParams& p,
           cudaStream_t stream);
// The same from bf16 gradients (the compact state's): each read as the fp32 it rounds, so the
// bits are those of the fp32 overload given the rounded values.
void AdamW(float* master, float* m, float* v, Bf16* weights, const Bf16* grads, int64_t n, const AdamWParams& p,
           cudaStream_t stream);

// Lion (optimizer.h's LionStep) on `n` parameters: fp32 master and its one moment m updated in
// place from grads scaled by grad_scale, the bf16 weights written from the new master. Reads
// lr, beta1, beta2, weight_decay, grad_scale and decay of `p` (Lion's betas: 0.9, 0.99). The
// host's HostLion (host_lion.h) arithmetic, operation for operation: the same bits.
void Lion(float* master, float* m, Bf16* weights, const float* grads, int64_t n, const AdamWParams& p,
          cudaStream_t stream);
void Lion(float* master, float* m, Bf16* weights, const Bf16* grads, int64_t n, const AdamWParams& p,
          cudaStream_t stream);  // bf16 gradients (the compact state's)

// Adafactor (optimizer.h's AdafactorStep, the reference) on one tensor: a matrix of rows x
// cols (its state: R, rows floats, then C, cols floats) or a vector of `rows` values (cols 0;
// its state: V, rows floats); master and state updated in place from grads scaled by
// grad_scale, the bf16 weights written from the new master. beta2t: 1 - step^decay_rate,
// from the host. fp32 throughout with every sum in a fixed order: deterministic, within
// fp32 rounding of the reference (the host's HostAdafactor sums in another order). `scratch`:
// AdafactorScratchFloats(cols) floats on the device. The returned error is the launch's.
using AdafactorParams = ::tierd::trainer::HostAdafactorParams;
int64_t AdafactorScratchFloats(int64_t cols);
cudaError_t Adafactor(float* master, float* state, Bf16* weights, const float* grads, int64_t rows, int64_t cols,
                      const AdafactorParams& p, float* scratch, cudaStream_t stream);
cudaError_t Adafactor(float* master, float* state, Bf16* weights, const Bf16* grads, int64_t rows, int64_t cols,
                      const AdafactorParams& p, float* scratch, cudaStream_t stream);

// Initial weights: master[0, count) (fp32) and weights[0, count) (bf16, rounded from it) =
// elements [begin, begin + count) of the tensor with stream id `entry`, N(0, sigma)
// (InitNormalValue in init_normal.h is the CPU reference). InitConstant writes `value`.
void InitNormal(float* master, Bf16* weights, int64_t begin, int64_t count, uint64_t seed, uint64_t entry, double sigma,
                cudaStream_t stream);
void InitConstant(float* master, Bf16* weights, int64_t count, float value, cudaStream_t stream);

// The same with 8-bit blockwise moments (trainer_ref/adamw8bit.h: m_bytes and v_bytes of
// Moment8bitBytes(n) each, on the device): the host's HostAdamW8bit arithmetic, the same
// bits. The returned error is the launch's. With `weights_amax` (and weights), the largest |x|
// of the bf16 weights written is folded into it (its bits' max, as AbsMax: the caller zeroes
// it), so FP8 codes of the new weights need no pass of their own to find their scale.
cudaError_t AdamW8bit(float* master, void* m_bytes, void* v_bytes, Bf16* weights, const float* grads, int64_t n,
                      const AdamWParams& p, cudaStream_t stream, float* weights_amax = nullptr);
cudaError_t AdamW8bit(float* master, void* m_bytes, void* v_bytes, Bf16* weights, const Bf16* grads, int64_t n,
                      const AdamWParams& p, cudaStream_t stream,
                      float* weights_amax = nullptr);  // bf16 gradients, as AdamW's
// Several tensors' 8-bit steps in as few launches as there are kinds of gradients (at most 16
// tensors a launch): each tensor's bits as AdamW8bit gives them alone (its own params, amax
// and alignment), without a launch's ramp and tail for each. A tensor names its gradients in
// fp32 (grads) or bf16 (grads_bf16), one of them.
struct AdamW8bitTensor {
  float* master = nullptr;
  void *m_bytes = nullptr, *v_bytes = nullptr;
  Bf16* weights = nullptr;
  const float* grads = nullptr;
  const Bf16* grads_bf16 = nullptr;
  int64_t n = 0;
  AdamWParams params;
  float* weights_amax = nullptr;
};
cudaError_t AdamW8bitMany(const std::vector<AdamW8bitTensor>& tensors, cudaStream_t stream);
// How AdamW8bit finds each new code, the same codes either way: "table" (the host's table of
// 2^17 entries a map, 1 MiB for both in device memory, read once a value: q8::CodeByTable; the
// default, 1.66x the search's rate on the H200) or "search" (a binary search over the 255
// thresholds in shared memory, 8 dependent loads a value). TIERD_GPU_Q8_CODES=search picks it
// for a run; UseGpuCodePath for benchmarks and tests, not while a step is queued. Returns the
// path in use.
const char* GpuCodePath();
const char* UseGpuCodePath(const std::string& want);

// Programmatic dependent launch for the trainer's own row and element-wise kernels (sm_90 and
// later: each may start while the kernel before it in the stream drains, and waits for its
// writes on the device). On by default there; TIERD_PDL=0 in the environment launches them
// plainly. UsePdl sets it for this process's current device, for tests and side-by-side runs,
// not while work is queued; returns whether it is on now (off below sm_90 whatever is asked).
bool UsePdl(bool on);

// *out (one fp32 on the device) += the sum of squares of x (n values): for the global
// gradient norm. Per-block partial sums into `scratch` (kSumSquaresScratch floats), then
// summed in order by one block.
constexpr int kSumSquaresScratch = 1024;
void SumSquares(const float* x, int64_t n, float* out, float* scratch, cudaStream_t stream);

// Host conversions with the device's rounding (round to nearest even), for tests and
// loaders.
Bf16 ToBf16(float x);
float FromBf16(Bf16 x);

}  // namespace tierd::trainer::gpu

#endif  // TIERD_TRAINER_REF_KERNELS_GPU_OPS_H_
