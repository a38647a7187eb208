// The optimizer's kernels (AdamW with fp32 or 8-bit blockwise moments) and the initial
// weights: see gpu_ops.h. Element-wise, grid-stride, except the 8-bit step (a warp per
// quantization block).
#include <cuda_bf16.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <type_traits>
#include <vector>

#include "trainer_ref/adamw8bit.h"
#include "trainer_ref/kernels/gpu_kernel_util.cuh"
#include "trainer_ref/kernels/gpu_ops.h"
#include "trainer_ref/kernels/init_normal.h"

namespace tierd::trainer::gpu {
namespace {

__global__ void InitNormalKernel(float* master, Bf16* weights, int64_t begin, int64_t count, uint64_t seed,
                                 uint64_t entry, double sigma) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count; i += int64_t{gridDim.x} * blockDim.x) {
    const float x = InitNormalValue(seed, entry, static_cast<uint64_t>(begin + i), sigma);
    master[i] = x;
    Store(weights, i, x);
  }
}

__global__ void FillKernel(float* master, Bf16* weights, int64_t count, float value) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < count; i += int64_t{gridDim.x} * blockDim.x) {
    master[i] = value;
    Store(weights, i, value);
  }
}

__constant__ float kSignedMap[q8::kCodes];
__constant__ float kUnsignedMap[q8::kCodes];
__constant__ float kSignedThresholds[q8::kCodes - 1];
__constant__ float kUnsignedThresholds[q8::kCodes - 1];

// A gradient as fp32: stored fp32, or bf16 (the compact state's, rounded once after fp32
// accumulation).
__device__ __forceinline__ float GradAt(const float* g, int64_t i) { return g[i]; }
__device__ __forceinline__ float GradAt(const Bf16* g, int64_t i) { return Load(g, i); }

// A warp per quantization block, eight blocks per CUDA block so that the maps copied to
// shared memory serve 2048 values: dequantize, step, requantize with the block's new absmax
// (adamw8bit_block.h, as the host does). A lane holds kQuantBlock / 32 values in registers and
// loads all of them before it stores any (the parts never overlap: __restrict__), so a warp
// has its whole block in flight at once rather than one round trip per value. kVector: every
// pointer is aligned for it, and a whole block's lane takes its 8 neighbours with vector loads
// and stores (codes 8 bytes, master 2 x 16, gradients 16 or 2 x 16, weights 16); a partial
// block, or !kVector, takes values lane + 32 j one by one. Which lane holds which value does
// not change a bit: each value's arithmetic is its own, the absmax an integer max.
constexpr int kQ8BlocksPerCta = 8;
constexpr int kQ8PerLane = q8::kQuantBlock / 32;
static_assert(q8::kQuantBlock == 256, "a lane's eight neighbours are one 8-byte load of codes");

__device__ __forceinline__ void LoadGrads8(const float* __restrict__ g, float out[8]) {
  const float4 a = reinterpret_cast<const float4*>(g)[0], b = reinterpret_cast<const float4*>(g)[1];
  out[0] = a.x, out[1] = a.y, out[2] = a.z, out[3] = a.w, out[4] = b.x, out[5] = b.y, out[6] = b.z, out[7] = b.w;
}
__device__ __forceinline__ void LoadGrads8(const Bf16* __restrict__ g, float out[8]) { Load8(g, out); }
// Code j of eight packed in a uint2 (j a constant after unrolling: a shift and a mask).
__device__ __forceinline__ uint32_t ByteOf(uint2 codes, int j) {
  return ((j < 4 ? codes.x : codes.y) >> (8 * (j % 4))) & 0xffu;
}
__device__ __forceinline__ void SetByte(uint2& codes, int j, uint32_t code) {
  (j < 4 ? codes.x : codes.y) |= code << (8 * (j % 4));
}

// The maps (and, searching, the thresholds) in shared memory, for the CTA's warps.
struct Q8Maps {
  float signed_map[q8::kCodes], unsigned_map[q8::kCodes];
  float signed_t[q8::kCodes - 1], unsigned_t[q8::kCodes - 1];
};
template <bool kByTable>
__device__ __forceinline__ void LoadQ8Maps(Q8Maps& maps) {
  for (int i = threadIdx.x; i < q8::kCodes; i += blockDim.x) {
    maps.signed_map[i] = kSignedMap[i];
    maps.unsigned_map[i] = kUnsignedMap[i];
    if (!kByTable && i < q8::kCodes - 1) {
      maps.signed_t[i] = kSignedThresholds[i];
      maps.unsigned_t[i] = kUnsignedThresholds[i];
    }
  }
  __syncthreads();
}

// Quantization block b of one tensor, by the calling warp. kByTable: codes from the tables
// (m_table, v_table: q8::CodeByTable), else by the search. `vector`: every pointer is aligned
// for the vector loads (the same for every lane).
template <typename G, bool kByTable>
__device__ __forceinline__ void AdamW8bitBlock(float* __restrict__ master, uint8_t* __restrict__ m_codes,
                                               float* __restrict__ m_absmax, uint8_t* __restrict__ v_codes,
                                               float* __restrict__ v_absmax, Bf16* __restrict__ weights,
                                               const G* __restrict__ grads, int64_t n, int64_t b, bool vector,
                                               const q8::ElementStep& step, const int32_t* __restrict__ m_table,
                                               const int32_t* __restrict__ v_table, unsigned int* weights_amax,
                                               const Q8Maps& maps) {
  const float* signed_map = maps.signed_map;
  const float* unsigned_map = maps.unsigned_map;
  const float* signed_t = maps.signed_t;
  const float* unsigned_t = maps.unsigned_t;
  const int lane = threadIdx.x % 32;
  const int64_t begin = b * q8::kQuantBlock;
  if (begin >= n) return;  // no __syncthreads below: a warp past the end may leave
  const int count = n - begin < q8::kQuantBlock ? static_cast<int>(n - begin) : q8::kQuantBlock;
  const bool whole = vector && count == q8::kQuantBlock;  // the same for every lane of the warp
  const int first = whole ? kQ8PerLane * lane : lane, stride = whole ? 1 : 32;  // value j is first + stride * j
  // The weights' amax so far, read with the block's values rather than after the step: the
  // check before the atomic then waits on no load of its own. A stale value only lets an atomic
  // through that a later read would have skipped; the max is the same.
  const unsigned int amax_seen = weights_amax != nullptr ? *weights_amax : 0u;
  // The codes stay packed, four to a register, and are taken apart where used: unpacked, they
  // held 16 registers more, which cost the launch a quarter of its resident warps.
  uint2 mc, vc;
  float w[kQ8PerLane], g[kQ8PerLane];
  if (whole) {
    mc = *reinterpret_cast<const uint2*>(m_codes + begin + first);
    vc = *reinterpret_cast<const uint2*>(v_codes + begin + first);
    const float4 lo = reinterpret_cast<const float4*>(master + begin + first)[0];
    const float4 hi = reinterpret_cast<const float4*>(master + begin + first)[1];
    w[0] = lo.x, w[1] = lo.y, w[2] = lo.z, w[3] = lo.w, w[4] = hi.x, w[5] = hi.y, w[6] = hi.z, w[7] = hi.w;
    LoadGrads8(grads + begin + first, g);
  } else {
    mc = vc = make_uint2(0, 0);
#pragma unroll
    for (int j = 0; j < kQ8PerLane; ++j) {
      const int i = first + stride * j;
      w[j] = g[j] = 0.f;
      if (i >= count) continue;
      SetByte(mc, j, m_codes[begin + i]);
      SetByte(vc, j, v_codes[begin + i]);
      w[j] = master[begin + i];
      g[j] = GradAt(grads, begin + i);
    }
  }
  const float old_m = m_absmax[b], old_v = v_absmax[b];
  float new_m[kQ8PerLane], new_v[kQ8PerLane];
  uint32_t most_m = 0, most_v = 0;  // the magnitudes' bits: an integer max, exact in any order
#pragma unroll
  for (int j = 0; j < kQ8PerLane; ++j) {
    new_m[j] = new_v[j] = 0.f;
    if (first + stride * j >= count) continue;
    float mi = q8::Mul(signed_map[ByteOf(mc, j)], old_m);
    float vi = q8::SecondMomentOf(q8::Mul(unsigned_map[ByteOf(vc, j)], old_v));
    w[j] = step(w[j], g[j], mi, vi);
    vi = q8::RootToStore(vi);  // v is kept as its root
    new_m[j] = mi;
    new_v[j] = vi;
    most_m = max(most_m, q8::MagnitudeBits(mi));
    most_v = max(most_v, q8::MagnitudeBits(vi));
  }
  for (int o = 16; o > 0; o >>= 1) {  // every lane has read the old absmax before the shuffles
    most_m = max(most_m, __shfl_xor_sync(0xffffffffu, most_m, o));
    most_v = max(most_v, __shfl_xor_sync(0xffffffffu, most_v, o));
  }
  const float scale_m = q8::FromMagnitudeBits(most_m), scale_v = q8::FromMagnitudeBits(most_v);
  if (lane == 0) {
    m_absmax[b] = scale_m;
    v_absmax[b] = scale_v;
  }
  const float inverse_m = q8::InverseScale(scale_m), inverse_v = q8::InverseScale(scale_v);
  mc = vc = make_uint2(0, 0);
#pragma unroll
  for (int j = 0; j < kQ8PerLane; ++j) {
    const float nm = q8::Mul(new_m[j], inverse_m), nv = q8::Mul(new_v[j], inverse_v);
    if (kByTable) {
      SetByte(mc, j, static_cast<uint32_t>(q8::CodeByTable(m_table, nm)));
      SetByte(vc, j, static_cast<uint32_t>(q8::CodeByTable(v_table, nv)));
    } else {
      SetByte(mc, j, q8::CodeBySearch(signed_t, nm));
      SetByte(vc, j, q8::CodeBySearch(unsigned_t, nv));
    }
  }
  if (whole) {
    *reinterpret_cast<uint2*>(m_codes + begin + first) = mc;
    *reinterpret_cast<uint2*>(v_codes + begin + first) = vc;
    reinterpret_cast<float4*>(master + begin + first)[0] = make_float4(w[0], w[1], w[2], w[3]);
    reinterpret_cast<float4*>(master + begin + first)[1] = make_float4(w[4], w[5], w[6], w[7]);
    if (weights != nullptr) Store8(weights + begin + first, w);
  } else {
#pragma unroll
    for (int j = 0; j < kQ8PerLane; ++j) {
      const int i = first + stride * j;
      if (i >= count) continue;
      m_codes[begin + i] = static_cast<uint8_t>(ByteOf(mc, j));
      v_codes[begin + i] = static_cast<uint8_t>(ByteOf(vc, j));
      master[begin + i] = w[j];
      if (weights != nullptr) Store(weights, begin + i, w[j]);
    }
  }
  if (weights_amax == nullptr) return;
  // The largest |x| of the bf16 weights written (values past the end are 0), after the stores.
  unsigned int most_w = 0;
#pragma unroll
  for (int j = 0; j < kQ8PerLane; ++j) most_w = max(most_w, __float_as_uint(fabsf(RoundedToBf16(w[j]))));
  WarpAmax(weights_amax, most_w, amax_seen);
}


// One tensor: a warp per quantization block.
template <typename G, bool kByTable, bool kVector>
__global__ void __launch_bounds__(32 * kQ8BlocksPerCta)
    AdamW8bitKernel(float* __restrict__ master, uint8_t* __restrict__ m_codes, float* __restrict__ m_absmax,
                    uint8_t* __restrict__ v_codes, float* __restrict__ v_absmax, Bf16* __restrict__ weights,
                    const G* __restrict__ grads, int64_t n, q8::ElementStep step, const int32_t* __restrict__ m_table,
                    const int32_t* __restrict__ v_table, unsigned int* weights_amax) {
  __shared__ Q8Maps maps;
  LoadQ8Maps<kByTable>(maps);
  const int64_t b = int64_t{blockIdx.x} * kQ8BlocksPerCta + threadIdx.x / 32;
  AdamW8bitBlock<G, kByTable>(master, m_codes, m_absmax, v_codes, v_absmax, weights, grads, n, b, kVector, step,
                              m_table, v_table, weights_amax, maps);
}

// Several tensors in one launch (a layer's matrices and norms): each CTA finds its tensor by
// the CTAs before it, then steps its blocks as AdamW8bitKernel would. The same bits; one
// launch's ramp and tail instead of one a tensor (the C x C matrices ran at 0.73x the rate of
// the F x C ones alone, elementwise_bench on the H100).
constexpr int kQ8ManyTensors = 16;
template <typename G>
struct Q8Tensor {
  float* master;
  uint8_t *m_codes, *v_codes;
  float *m_absmax, *v_absmax;
  Bf16* weights;
  const G* grads;
  int64_t n;
  unsigned int* weights_amax;
  q8::ElementStep step;
  bool vector;
};
template <typename G>
struct Q8Tensors {
  int count;
  unsigned first_cta[kQ8ManyTensors + 1];  // tensor k's CTAs: [first_cta[k], first_cta[k + 1])
  Q8Tensor<G> t[kQ8ManyTensors];
};
template <typename G, bool kByTable>
__global__ void __launch_bounds__(32 * kQ8BlocksPerCta)
    AdamW8bitManyKernel(const __grid_constant__ Q8Tensors<G> tensors, const int32_t* __restrict__ m_table,
                        const int32_t* __restrict__ v_table) {
  PdlWait();
  PdlLetNextStart();
  __shared__ Q8Maps maps;
  LoadQ8Maps<kByTable>(maps);
  int k = 0;
  while (k + 1 < tensors.count && blockIdx.x >= tensors.first_cta[k + 1]) ++k;
  const Q8Tensor<G>& t = tensors.t[k];
  const int64_t b = int64_t{blockIdx.x - tensors.first_cta[k]} * kQ8BlocksPerCta + threadIdx.x / 32;
  AdamW8bitBlock<G, kByTable>(t.master, t.m_codes, t.m_absmax, t.v_codes, t.v_absmax, t.weights, t.grads, t.n, b,
                              t.vector, t.step, m_table, v_table, t.weights_amax, maps);
}

template <typename G>
__global__ void AdamWKernel(float* master, float* m, float* v, Bf16* weights, const G* grads, int64_t n, AdamWParams p,
                            float c1, float c2) {
  // Every operation rounded on its own (the _rn intrinsics: no fused multiply-add), in the
  // order HostAdamW computes them: the two optimizers give the same bits, so a run may
  // step on the GPU or on the host and stay the same run.
  const float decay = p.decay ? __fmul_rn(p.lr, p.weight_decay) : 0.f;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const float g = __fmul_rn(GradAt(grads, i), p.grad_scale);
    const float mi = __fadd_rn(__fmul_rn(p.beta1, m[i]), __fmul_rn(1.f - p.beta1, g));
    const float vi = __fadd_rn(__fmul_rn(p.beta2, v[i]), __fmul_rn(__fmul_rn(1.f - p.beta2, g), g));
    m[i] = mi;
    v[i] = vi;
    float w = master[i];
    w = __fsub_rn(w, __fmul_rn(decay, w));
    w = __fsub_rn(w, __fdiv_rn(__fmul_rn(p.lr, __fdiv_rn(mi, c1)), __fadd_rn(__fsqrt_rn(__fdiv_rn(vi, c2)), p.eps)));
    master[i] = w;
    if (weights != nullptr) Store(weights, i, w);
  }
}

template <typename G>
__global__ void LionKernel(float* master, float* m, Bf16* weights, const G* grads, int64_t n, AdamWParams p) {
  // HostLion's operations in its order, each rounded on its own.
  const float wd = p.decay ? p.weight_decay : 0.f, one_minus_b1 = 1.f - p.beta1, one_minus_b2 = 1.f - p.beta2;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const float g = __fmul_rn(GradAt(grads, i), p.grad_scale);
    const float mi = m[i];
    const float c = __fadd_rn(__fmul_rn(p.beta1, mi), __fmul_rn(one_minus_b1, g));
    const float sign = c > 0.f ? 1.f : (c < 0.f ? -1.f : 0.f);
    float w = master[i];
    w = __fsub_rn(w, __fmul_rn(p.lr, __fadd_rn(sign, __fmul_rn(wd, w))));
    master[i] = w;
    m[i] = __fadd_rn(__fmul_rn(p.beta2, mi), __fmul_rn(one_minus_b2, g));
    if (weights != nullptr) Store(weights, i, w);
  }
}

template <typename G>
void LaunchAdamW(float* master, float* m, float* v, Bf16* weights, const G* grads, int64_t n, const AdamWParams& p,
                 cudaStream_t stream) {
  const float c1 = static_cast<float>(1.0 - std::pow(static_cast<double>(p.beta1), static_cast<double>(p.step)));
  const float c2 = static_cast<float>(1.0 - std::pow(static_cast<double>(p.beta2), static_cast<double>(p.step)));
  AdamWKernel<<<Blocks(n), kThreads, 0, stream>>>(master, m, v, weights, grads, n, p, c1, c2);
}

// The code path (GpuCodePath): -1 until first asked (TIERD_GPU_Q8_CODES), then one of these.
constexpr int kBySearchPath = 0, kByTablePath = 1;
std::atomic<int> code_path{-1};

// The table by default: 1.66x the search's rate on the H200 (elementwise_bench, 1.3B and 7B shapes).
int CodePathNamed(const std::string& name) { return name == "search" ? kBySearchPath : kByTablePath; }

void ChooseCodePath() {
  if (code_path.load(std::memory_order_relaxed) >= 0) return;
  const char* forced = std::getenv("TIERD_GPU_Q8_CODES");
  int unset = -1;
  code_path.compare_exchange_strong(unset, CodePathNamed(forced != nullptr ? forced : ""));
}

// The host's code tables on the device, uploaded once per device at first use (2 x 512 KiB).
struct CodeTables {
  cudaError_t status = cudaSuccess;
  const int32_t* signed_table = nullptr;
  const int32_t* unsigned_table = nullptr;
  bool ok() const { return status == cudaSuccess; }
};
CodeTables DeviceCodeTables() {
  static std::mutex mutex;
  static std::map<int, CodeTables> per_device;
  int device = 0;
  if (cudaError_t e = cudaGetDevice(&device); e != cudaSuccess) return {e};
  std::lock_guard<std::mutex> lock(mutex);
  auto it = per_device.find(device);
  if (it != per_device.end()) return it->second;
  const size_t bytes = sizeof(int32_t) * q8::kTableKeys;
  int32_t* d = nullptr;
  CodeTables t;
  t.status = cudaMalloc(&d, 2 * bytes);
  if (t.status == cudaSuccess) t.status = cudaMemcpy(d, CodeTable(true), bytes, cudaMemcpyHostToDevice);
  if (t.status == cudaSuccess)
    t.status = cudaMemcpy(d + q8::kTableKeys, CodeTable(false), bytes, cudaMemcpyHostToDevice);
  if (t.status != cudaSuccess) {
    cudaFree(d);
    return t;  // not kept: the next step tries again
  }
  t.signed_table = d;
  t.unsigned_table = d + q8::kTableKeys;
  per_device[device] = t;
  return t;
}

cudaError_t UploadQ8Maps() {
  static const cudaError_t maps = [] {  // the maps, once per process
    cudaError_t e = cudaMemcpyToSymbol(kSignedMap, DynamicMap(true).data(), sizeof(float) * q8::kCodes);
    if (e == cudaSuccess) e = cudaMemcpyToSymbol(kUnsignedMap, DynamicMap(false).data(), sizeof(float) * q8::kCodes);
    const size_t t = sizeof(float) * (q8::kCodes - 1);
    if (e == cudaSuccess) e = cudaMemcpyToSymbol(kSignedThresholds, Thresholds(true).data(), t);
    if (e == cudaSuccess) e = cudaMemcpyToSymbol(kUnsignedThresholds, Thresholds(false).data(), t);
    return e;
  }();
  return maps;
}

// A tensor's step as the kernels take it: its moments' codes and scales, whether its arrays
// take the vector loads, and its step's constants.
template <typename G>
Q8Tensor<G> Q8TensorOf(float* master, void* m_bytes, void* v_bytes, Bf16* weights, const G* grads, int64_t n,
                       const AdamWParams& p, float* weights_amax) {
  const Moment8bit m = MomentAt(m_bytes, n), v = MomentAt(v_bytes, n);
  const bool vector = Aligned16(master, grads) && (weights == nullptr || Aligned16(weights)) &&
                      reinterpret_cast<uintptr_t>(m.codes) % 8 == 0 && reinterpret_cast<uintptr_t>(v.codes) % 8 == 0;
  return {master,  m.codes, v.codes, m.absmax, v.absmax, weights, grads, n, reinterpret_cast<unsigned int*>(weights_amax),
          ElementStepFor(p), vector};
}

unsigned Q8Ctas(int64_t n) { return static_cast<unsigned>((QuantBlocks(n) + kQ8BlocksPerCta - 1) / kQ8BlocksPerCta); }

template <typename G>
cudaError_t LaunchAdamW8bit(float* master, void* m_bytes, void* v_bytes, Bf16* weights, const G* grads, int64_t n,
                            const AdamWParams& p, cudaStream_t stream, float* weights_amax) {
  if (const cudaError_t maps = UploadQ8Maps(); maps != cudaSuccess) return maps;
  ChooseCodePath();
  if (n <= 0) return cudaSuccess;
  const Q8Tensor<G> t = Q8TensorOf(master, m_bytes, v_bytes, weights, grads, n, p, weights_amax);
  auto launch = [&](auto kernel, const int32_t* m_table, const int32_t* v_table) {
    kernel<<<Q8Ctas(n), 32 * kQ8BlocksPerCta, 0, stream>>>(t.master, t.m_codes, t.m_absmax, t.v_codes, t.v_absmax,
                                                           t.weights, t.grads, n, t.step, m_table, v_table,
                                                           t.weights_amax);
  };
  if (code_path.load(std::memory_order_relaxed) == kByTablePath) {
    auto tables = DeviceCodeTables();
    if (!tables.ok()) return tables.status;
    if (t.vector) {
      launch(AdamW8bitKernel<G, true, true>, tables.signed_table, tables.unsigned_table);
    } else {
      launch(AdamW8bitKernel<G, true, false>, tables.signed_table, tables.unsigned_table);
    }
  } else if (t.vector) {
    launch(AdamW8bitKernel<G, false, true>, nullptr, nullptr);
  } else {
    launch(AdamW8bitKernel<G, false, false>, nullptr, nullptr);
  }
  return cudaGetLastError();
}

// The tensors whose gradients are G, kQ8ManyTensors a launch.
template <typename G>
cudaError_t LaunchAdamW8bitMany(const std::vector<AdamW8bitTensor>& tensors, cudaStream_t stream) {
  const int32_t *m_table = nullptr, *v_table = nullptr;
  const bool by_table = code_path.load(std::memory_order_relaxed) == kByTablePath;
  if (by_table) {
    auto tables = DeviceCodeTables();
    if (!tables.ok()) return tables.status;
    m_table = tables.signed_table;
    v_table = tables.unsigned_table;
  }
  Q8Tensors<G> batch{};
  auto flush = [&] {
    if (batch.count == 0) return;
    const unsigned grid = batch.first_cta[batch.count];
    if (by_table) {
      Launch(AdamW8bitManyKernel<G, true>, grid, 32 * kQ8BlocksPerCta, 0, stream, batch, m_table, v_table);
    } else {
      Launch(AdamW8bitManyKernel<G, false>, grid, 32 * kQ8BlocksPerCta, 0, stream, batch, nullptr, nullptr);
    }
    batch = Q8Tensors<G>{};
  };
  for (const AdamW8bitTensor& x : tensors) {
    const G* grads = nullptr;
    if constexpr (std::is_same_v<G, float>) {
      grads = x.grads;
    } else {
      grads = x.grads_bf16;
    }
    if (grads == nullptr || x.n <= 0) continue;
    batch.t[batch.count] = Q8TensorOf(x.master, x.m_bytes, x.v_bytes, x.weights, grads, x.n, x.params, x.weights_amax);
    batch.first_cta[batch.count + 1] = batch.first_cta[batch.count] + Q8Ctas(x.n);
    if (++batch.count == kQ8ManyTensors) flush();
  }
  flush();
  return cudaGetLastError();
}

}  // namespace

void AdamW(float* master, float* m, float* v, Bf16* weights, const float* grads, int64_t n, const AdamWParams& p,
           cudaStream_t stream) {
  LaunchAdamW(master, m, v, weights, grads, n, p, stream);
}

void AdamW(float* master, float* m, float* v, Bf16* weights, const Bf16* grads, int64_t n, const AdamWParams& p,
           cudaStream_t stream) {
  LaunchAdamW(master, m, v, weights, grads, n, p, stream);
}

void Lion(float* master, float* m, Bf16* weights, const float* grads, int64_t n, const AdamWParams& p,
          cudaStream_t stream) {
  if (n > 0) LionKernel<<<Blocks(n), kThreads, 0, stream>>>(master, m, weights, grads, n, p);
}

void Lion(float* master, float* m, Bf16* weights, const Bf16* grads, int64_t n, const AdamWParams& p,
          cudaStream_t stream) {
  if (n > 0) LionKernel<<<Blocks(n), kThreads, 0, stream>>>(master, m, weights, grads, n, p);
}

void InitNormal(float* master, Bf16* weights, int64_t begin, int64_t count, uint64_t seed, uint64_t entry, double sigma,
                cudaStream_t stream) {
  if (count > 0)
    InitNormalKernel<<<Blocks(count), kThreads, 0, stream>>>(master, weights, begin, count, seed, entry, sigma);
}

void InitConstant(float* master, Bf16* weights, int64_t count, float value, cudaStream_t stream) {
  if (count > 0) FillKernel<<<Blocks(count), kThreads, 0, stream>>>(master, weights, count, value);
}

const char* GpuCodePath() {
  ChooseCodePath();
  return code_path.load(std::memory_order_relaxed) == kByTablePath ? "table" : "search";
}

const char* UseGpuCodePath(const std::string& want) {
  code_path.store(CodePathNamed(want), std::memory_order_relaxed);
  return GpuCodePath();
}

cudaError_t AdamW8bit(float* master, void* m_bytes, void* v_bytes, Bf16* weights, const float* grads, int64_t n,
                      const AdamWParams& p, cudaStream_t stream, float* weights_amax) {
  return LaunchAdamW8bit(master, m_bytes, v_bytes, weights, grads, n, p, stream, weights_amax);
}

cudaError_t AdamW8bit(float* master, void* m_bytes, void* v_bytes, Bf16* weights, const Bf16* grads, int64_t n,
                      const AdamWParams& p, cudaStream_t stream, float* weights_amax) {
  return LaunchAdamW8bit(master, m_bytes, v_bytes, weights, grads, n, p, stream, weights_amax);
}

cudaError_t AdamW8bitMany(const std::vector<AdamW8bitTensor>& tensors, cudaStream_t stream) {
  if (const cudaError_t maps = UploadQ8Maps(); maps != cudaSuccess) return maps;
  ChooseCodePath();
  for (const AdamW8bitTensor& t : tensors) {
    if (t.n > 0 && (t.grads == nullptr) == (t.grads_bf16 == nullptr)) return cudaErrorInvalidValue;
  }
  if (const cudaError_t e = LaunchAdamW8bitMany<float>(tensors, stream); e != cudaSuccess) return e;
  return LaunchAdamW8bitMany<Bf16>(tensors, stream);
}

}  // namespace tierd::trainer::gpu
