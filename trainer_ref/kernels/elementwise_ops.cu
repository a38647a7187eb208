// The reference trainer's element-wise kernels (see gpu_ops.h): RoPE, SwiGLU, the residual
// stream's adds and its bf16 copy. Eight values a thread with 16-byte accesses where every
// pointer is aligned (`vec`), one a thread otherwise; grid-stride.
#include <cuda_bf16.h>

#include <algorithm>

#include "trainer_ref/kernels/gpu_kernel_util.cuh"
#include "trainer_ref/kernels/gpu_ops.h"

namespace tierd::trainer::gpu {
namespace {

// One block per row (token) of x (B*T, H, D) and, with y, of y (B*T, HY, D) too (queries and
// keys: one launch, the angles made once for both): the row's D/2 angles pos * inv_freq[i] once
// into shared memory, then every head's pairs turn by them (sign -1: back); four pairs a thread
// with 16-byte accesses (`vec`: D a multiple of 8, aligned) or one. A head's values and angles
// are the same with y or without it: the same bits.
__global__ void RopeKernel(Bf16* x, int h, Bf16* y, int hy, int t, int d, RopeFrequencies freq, float sign,
                           bool vec) {
  PdlWait();
  PdlLetNextStart();
  extern __shared__ float trig[];  // cos[D/2] | sin[D/2]
  const int half = d / 2;
  const int64_t row = blockIdx.x;
  const int pos = static_cast<int>(row % t);
  for (int i = threadIdx.x; i < half; i += blockDim.x) RopeTrig(pos, freq.inv_freq[i], sign, trig[i], trig[half + i]);
  __syncthreads();
  Bf16* x_row = x + row * h * d;
  Bf16* y_row = y != nullptr ? y + row * hy * d : nullptr;
  if (vec) {  // x's row, then y's: h * d is a whole number of heads, so 8 * k % d is the pair's place in both
    const int in_x = h * d / 8;
    for (int k = threadIdx.x; k < in_x + hy * d / 8; k += blockDim.x) {
      Bf16* p = k < in_x ? x_row + 8 * k : y_row + 8 * (k - in_x);
      const int i0 = (8 * k % d) / 2;
      float v[8];
      Load8(p, v);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float a = v[2 * e], b = v[2 * e + 1];
        RotatePair(a, b, trig[i0 + e], trig[half + i0 + e], v[2 * e], v[2 * e + 1]);
      }
      Store8(p, v);
    }
    return;
  }
  for (int k = threadIdx.x; k < (h + hy) * half; k += blockDim.x) {
    const int i = k % half, head = k / half;
    Bf16* base_row = head < h ? x_row + int64_t{head} * d : y_row + int64_t{head - h} * d;
    float u, w;
    RotatePair(Load(base_row, 2 * i), Load(base_row, 2 * i + 1), trig[i], trig[half + i], u, w);
    Store(base_row, 2 * i, u);
    Store(base_row, 2 * i + 1, w);
  }
}

// Element-wise kernels: eight values a thread with 16-byte accesses over the whole groups
// of eight when every pointer is aligned (`vec`), then one a thread for the rest.
// With q.codes, the output's E4M3 codes too (Fp8Out), or only them with a null `out`.
__global__ void SwiGluForwardKernel(Bf16* out, const Bf16* gate, const Bf16* up, int64_t count, bool vec, Fp8Out q) {
  const int64_t first = blockIdx.x * int64_t{blockDim.x} + threadIdx.x, stride = int64_t{gridDim.x} * blockDim.x;
  const int64_t groups = vec ? count / 8 : 0;
  const float code_scale = q.codes != nullptr ? *q.scale : 0.f;
  unsigned int most = 0;
  for (int64_t k = first; k < groups; k += stride) {
    float g[8], u[8];
    Load8(gate + 8 * k, g);
    Load8(up + 8 * k, u);
#pragma unroll
    for (int e = 0; e < 8; ++e) g[e] = g[e] * Sigmoid(g[e]) * u[e];
    if (out != nullptr) Store8(out + 8 * k, g);
    if (q.codes == nullptr) continue;
    uint32_t packed[2] = {0, 0};
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const float s = RoundedToBf16(g[e]);
      most = max(most, __float_as_uint(fabsf(s)));
      packed[e / 4] |= uint32_t{Fp8(s, code_scale, false)} << (8 * (e % 4));
    }
    reinterpret_cast<uint2*>(q.codes)[k] = make_uint2(packed[0], packed[1]);
  }
  for (int64_t i = groups * 8 + first; i < count; i += stride) {
    const float g = Load(gate, i), s = g * Sigmoid(g) * Load(up, i);
    if (out != nullptr) Store(out, i, s);
    if (q.codes == nullptr) continue;
    const float rounded = RoundedToBf16(s);
    most = max(most, __float_as_uint(fabsf(rounded)));
    q.codes[i] = Fp8(rounded, code_scale, false);
  }
  if (q.codes != nullptr) WarpAmax(reinterpret_cast<unsigned int*>(q.amax), most);
}

__global__ void SwiGluBackwardKernel(Bf16* dgate, Bf16* dup, const Bf16* dout, const Bf16* gate, const Bf16* up,
                                     int64_t count, bool vec) {
  const int64_t first = blockIdx.x * int64_t{blockDim.x} + threadIdx.x, stride = int64_t{gridDim.x} * blockDim.x;
  const int64_t groups = vec ? count / 8 : 0;
  for (int64_t k = first; k < groups; k += stride) {
    float g[8], u[8], dy[8], dg[8];
    Load8(gate + 8 * k, g);
    Load8(up + 8 * k, u);
    Load8(dout + 8 * k, dy);
#pragma unroll
    for (int e = 0; e < 8; ++e) SwiGluGrads(g[e], u[e], dy[e], dg[e], u[e]);  // u becomes du
    Store8(dgate + 8 * k, dg);
    Store8(dup + 8 * k, u);
  }
  for (int64_t i = groups * 8 + first; i < count; i += stride) {
    float dg, du;
    SwiGluGrads(Load(gate, i), Load(up, i), Load(dout, i), dg, du);
    Store(dgate, i, dg);
    Store(dup, i, du);
  }
}

__global__ void AddIntoKernel(float* x, const Bf16* y, int64_t count, bool vec) {
  const int64_t first = blockIdx.x * int64_t{blockDim.x} + threadIdx.x, stride = int64_t{gridDim.x} * blockDim.x;
  const int64_t groups = vec ? count / 8 : 0;
  for (int64_t k = first; k < groups; k += stride) {
    float v[8];
    Load8(y + 8 * k, v);
    auto* x4 = reinterpret_cast<float4*>(x + 8 * k);
    float4 a = x4[0], b = x4[1];
    a.x += v[0], a.y += v[1], a.z += v[2], a.w += v[3];
    b.x += v[4], b.y += v[5], b.z += v[6], b.w += v[7];
    x4[0] = a;
    x4[1] = b;
  }
  for (int64_t i = groups * 8 + first; i < count; i += stride) x[i] += Load(y, i);
}

__global__ void ToBf16Kernel(Bf16* out, const float* in, int64_t count, bool vec) {
  const int64_t first = blockIdx.x * int64_t{blockDim.x} + threadIdx.x, stride = int64_t{gridDim.x} * blockDim.x;
  const int64_t groups = vec ? count / 8 : 0;
  for (int64_t k = first; k < groups; k += stride) {
    const auto* in4 = reinterpret_cast<const float4*>(in + 8 * k);
    const float4 a = in4[0], b = in4[1];
    const float v[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
    Store8(out + 8 * k, v);
  }
  for (int64_t i = groups * 8 + first; i < count; i += stride) Store(out, i, in[i]);
}

}  // namespace

void Rope(Bf16* x, int h, Bf16* y, int hy, int b, int t, int d, const RopeFrequencies& freq, float sign,
          cudaStream_t stream) {
  const int64_t rows = int64_t{b} * t;
  if (rows == 0) return;
  if (y == nullptr) hy = 0;
  const bool vec = d % 8 == 0 && Aligned16(x) && (y == nullptr || Aligned16(y));
  const int threads = std::min(kThreads, std::max(32, vec ? (h + hy) * d / 8 : (h + hy) * d / 2));
  Launch(RopeKernel, static_cast<unsigned>(rows), threads, d * sizeof(float), stream, x, h, y, hy, t, d, freq, sign,
         vec);
}

RopeFrequencies RopeFrequenciesOf(const std::vector<double>& inv_freq) {
  RopeFrequencies out;
  for (size_t i = 0; i < inv_freq.size() && i < RopeFrequencies::kMaxPairs; ++i) {
    out.inv_freq[i] = static_cast<float>(inv_freq[i]);
  }
  return out;
}

void RopeForward(Bf16* x, int b, int t, int h, int d, const RopeFrequencies& freq, cudaStream_t stream) {
  Rope(x, h, nullptr, 0, b, t, d, freq, 1.f, stream);
}

void RopeForwardPair(Bf16* q, int hq, Bf16* k, int hk, int b, int t, int d, const RopeFrequencies& freq,
                     cudaStream_t stream) {
  Rope(q, hq, k, hk, b, t, d, freq, 1.f, stream);
}

void RopeBackward(Bf16* dx, int b, int t, int h, int d, const RopeFrequencies& freq, cudaStream_t stream) {
  Rope(dx, h, nullptr, 0, b, t, d, freq, -1.f, stream);
}

void SwiGluForward(Bf16* out, const Bf16* gate, const Bf16* up, int n, int f, cudaStream_t stream,
                   const Fp8Out& codes) {
  const int64_t count = int64_t{n} * f;
  const bool vec = Aligned16(out, gate, up) && reinterpret_cast<uintptr_t>(codes.codes) % 8 == 0;
  SwiGluForwardKernel<<<Blocks(vec ? count / 8 + count % 8 : count), kThreads, 0, stream>>>(out, gate, up, count, vec,
                                                                                            codes);
}

void SwiGluBackward(Bf16* dgate, Bf16* dup, const Bf16* dout, const Bf16* gate, const Bf16* up, int n, int f,
                    cudaStream_t stream) {
  const int64_t count = int64_t{n} * f;
  const bool vec = Aligned16(dgate, dup, dout, gate, up);
  SwiGluBackwardKernel<<<Blocks(vec ? count / 8 + count % 8 : count), kThreads, 0, stream>>>(dgate, dup, dout, gate, up,
                                                                                             count, vec);
}

void AddInto(float* x, const Bf16* y, int64_t count, cudaStream_t stream) {
  const bool vec = Aligned16(x) && Aligned16(y);
  AddIntoKernel<<<Blocks(vec ? count / 8 + count % 8 : count), kThreads, 0, stream>>>(x, y, count, vec);
}

void ToBf16(Bf16* out, const float* in, int64_t count, cudaStream_t stream) {
  const bool vec = Aligned16(out) && Aligned16(in);
  ToBf16Kernel<<<Blocks(vec ? count / 8 + count % 8 : count), kThreads, 0, stream>>>(out, in, count, vec);
}

}  // namespace tierd::trainer::gpu
