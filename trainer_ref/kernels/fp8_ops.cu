#include "trainer_ref/kernels/fp8_ops.h"
#include "trainer_ref/kernels/gpu_kernel_util.cuh"

namespace tierd::trainer::gpu {
namespace {

// |x|'s bits of the two bf16 values in a word, the larger (non-negative floats order as their
// bits; NaN's above infinity's).
__device__ __forceinline__ unsigned int AbsBits2(unsigned int w) { return max((w & 0x7fffu) << 16, w & 0x7fff0000u); }

// Non-negative floats order as their bits: the block's largest |x| goes in with one atomicMax
// on the bits, whatever the order blocks finish in. NaN (bits above +inf) wins, as it should.
// Eight values a load where the tensor allows (16-byte aligned), the rest one by one.
__global__ void AbsMaxKernel(unsigned int* amax_bits, const Bf16* in, int64_t n) {
  PdlWait();
  PdlLetNextStart();
  __shared__ unsigned int block_max;
  if (threadIdx.x == 0) block_max = 0;
  __syncthreads();
  unsigned int mine = 0;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x, first = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  const bool vector = reinterpret_cast<uintptr_t>(in) % 16 == 0;
  const int64_t vectors = vector ? n / 8 : 0;
  for (int64_t i = first; i < vectors; i += stride) {
    const uint4 v = reinterpret_cast<const uint4*>(in)[i];
    const unsigned int words[4] = {v.x, v.y, v.z, v.w};
    for (unsigned int w : words) mine = max(mine, AbsBits2(w));  // |x|'s bits: the bf16 bits without the sign
  }
  for (int64_t i = vectors * 8 + first; i < n; i += stride) mine = max(mine, __float_as_uint(fabsf(Load(in, i))));
  for (int offset = 16; offset > 0; offset /= 2) mine = max(mine, __shfl_xor_sync(0xffffffffu, mine, offset));
  if (threadIdx.x % 32 == 0) atomicMax(&block_max, mine);
  __syncthreads();
  if (threadIdx.x == 0) atomicMax(amax_bits, block_max);
}

// Eight bf16 values (one 16-byte load) to their eight codes (one 8-byte store), in order.
__device__ __forceinline__ uint2 Pack8(const uint4& v, float scale, bool e5m2) {
  const unsigned int words[4] = {v.x, v.y, v.z, v.w};
  uint32_t packed[2] = {0, 0};
  for (int k = 0; k < 8; ++k) {
    const unsigned int w = words[k / 2];
    const float x = __uint_as_float(k % 2 == 0 ? w << 16 : w & 0xffff0000u);
    packed[k / 4] |= uint32_t{Fp8(x, scale, e5m2)} << (8 * (k % 4));
  }
  return make_uint2(packed[0], packed[1]);
}

// Eight values a thread where both sides allow (16-byte aligned in, 8-byte aligned out), the
// rest one by one. With amax_bits, the input's largest |x| from the same loads.
__global__ void QuantizeKernel(uint8_t* out, const Bf16* in, int64_t n, const float* scale, bool e5m2,
                               unsigned int* amax_bits) {
  PdlWait();
  PdlLetNextStart();
  const float s = *scale;
  const int64_t stride = int64_t{gridDim.x} * blockDim.x, first = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  const bool vector = reinterpret_cast<uintptr_t>(in) % 16 == 0 && reinterpret_cast<uintptr_t>(out) % 8 == 0;
  const int64_t vectors = vector ? n / 8 : 0;
  unsigned int mine = 0;
  for (int64_t i = first; i < vectors; i += stride) {
    const uint4 v = reinterpret_cast<const uint4*>(in)[i];
    mine = max(mine, max(max(AbsBits2(v.x), AbsBits2(v.y)), max(AbsBits2(v.z), AbsBits2(v.w))));
    reinterpret_cast<uint2*>(out)[i] = Pack8(v, s, e5m2);
  }
  for (int64_t i = vectors * 8 + first; i < n; i += stride) {
    const float x = Load(in, i);
    mine = max(mine, __float_as_uint(fabsf(x)));
    out[i] = Fp8(x, s, e5m2);
  }
  WarpAmax(amax_bits, mine);
}

// Eight neighbours' SwiGLU backward (16-byte loads of gate, up and dout), each gradient
// rounded to bf16 and encoded as E5M2 at sg and su, four codes a word; their |x| bits folded
// into most_g and most_u. Shared by the plain and the transposing kernels: the same bits.
__device__ __forceinline__ void SwiGluGrads8ToCodes(const Bf16* gate, const Bf16* up, const Bf16* dout, float sg,
                                                    float su, uint32_t codes_g[2], uint32_t codes_u[2],
                                                    unsigned int& most_g, unsigned int& most_u) {
  float g[8], u[8], dy[8];
  Load8(gate, g);
  Load8(up, u);
  Load8(dout, dy);
  codes_g[0] = codes_g[1] = codes_u[0] = codes_u[1] = 0;
#pragma unroll
  for (int e = 0; e < 8; ++e) {
    float dg, du;
    SwiGluGrads(g[e], u[e], dy[e], dg, du);
    dg = RoundedToBf16(dg);
    du = RoundedToBf16(du);
    most_g = max(most_g, __float_as_uint(fabsf(dg)));
    most_u = max(most_u, __float_as_uint(fabsf(du)));
    codes_g[e / 4] |= uint32_t{Fp8(dg, sg, true)} << (8 * (e % 4));
    codes_u[e / 4] |= uint32_t{Fp8(du, su, true)} << (8 * (e % 4));
  }
}

// SwiGluBackward's two outputs straight to E5M2 codes (SwiGluBackwardFp8): each value rounded
// to bf16 first, as SwiGluBackward stores it, so the codes and the amax are QuantizeFp8's of
// those stores. Eight values a thread where every pointer allows (16-byte loads, 8-byte
// stores), the rest one by one.
__global__ void SwiGluBackwardFp8Kernel(uint8_t* dgate, uint8_t* dup, const Bf16* dout, const Bf16* gate,
                                        const Bf16* up, int64_t count, const float* scale_gate, const float* scale_up,
                                        unsigned int* amax_gate, unsigned int* amax_up, bool vec) {
  const float sg = *scale_gate, su = *scale_up;
  const int64_t first = blockIdx.x * int64_t{blockDim.x} + threadIdx.x, stride = int64_t{gridDim.x} * blockDim.x;
  const int64_t groups = vec ? count / 8 : 0;
  unsigned int most_g = 0, most_u = 0;
  for (int64_t k = first; k < groups; k += stride) {
    uint32_t codes_g[2], codes_u[2];
    SwiGluGrads8ToCodes(gate + 8 * k, up + 8 * k, dout + 8 * k, sg, su, codes_g, codes_u, most_g, most_u);
    reinterpret_cast<uint2*>(dgate)[k] = make_uint2(codes_g[0], codes_g[1]);
    reinterpret_cast<uint2*>(dup)[k] = make_uint2(codes_u[0], codes_u[1]);
  }
  for (int64_t i = groups * 8 + first; i < count; i += stride) {
    float dg, du;
    SwiGluGrads(Load(gate, i), Load(up, i), Load(dout, i), dg, du);
    dg = RoundedToBf16(dg);
    du = RoundedToBf16(du);
    most_g = max(most_g, __float_as_uint(fabsf(dg)));
    most_u = max(most_u, __float_as_uint(fabsf(du)));
    dgate[i] = Fp8(dg, sg, true);
    dup[i] = Fp8(du, su, true);
  }
  WarpAmax(amax_gate, most_g);
  WarpAmax(amax_up, most_u);
}

constexpr int kBigTile = 64, kBigThreads = 256;

// A 64 x 64 tile's transposed codes from `tile` (codes of rows r0.., columns c0.., four a word):
// out (cols, rows), 16 bytes a store.
__device__ __forceinline__ void StoreTileTransposed(uint8_t* out, const uint32_t (*tile)[kBigTile / 4 + 1], int r0,
                                                    int c0, int rows) {
  for (int v = threadIdx.x; v < kBigTile * kBigTile / 16; v += kBigThreads) {
    const int c = v / 4, r = (v % 4) * 16;  // output row c0 + c, its bytes r0 + r .. + 15
    uint32_t w[4] = {0, 0, 0, 0};
    for (int k = 0; k < 16; ++k) {
      const uint32_t byte = (tile[r + k][c / 4] >> (8 * (c % 4))) & 0xffu;
      w[k / 4] |= byte << (8 * (k % 4));
    }
    *reinterpret_cast<uint4*>(out + int64_t{c0 + c} * rows + r0 + r) = make_uint4(w[0], w[1], w[2], w[3]);
  }
}

// The frame of the kernels that turn a 64 x 64 tile of a (rows, cols) matrix into FP8 codes,
// plain and transposed: each thread makes eight values' codes at a time (`codes8(at, row, col,
// codes, mine)`: the values at offset `at`, row `row`, columns `col`.., packed four a word,
// their largest |x|'s bits folded into `mine`), stored plain (8-byte stores; none with a null
// `plain`) and, through shared memory, transposed into `out` (16-byte stores of sixteen codes of
// an output row); the tile's largest |x| into *amax_bits (null: not).
template <typename Codes8>
__device__ __forceinline__ void TileToCodes(uint8_t* plain, uint8_t* out, int rows, int cols, unsigned int* amax_bits,
                                            Codes8 codes8) {
  __shared__ uint32_t tile[kBigTile][kBigTile / 4 + 1];  // [row][4 columns], padded against bank conflicts
  const int c0 = blockIdx.x * kBigTile, r0 = blockIdx.y * kBigTile;
  unsigned int mine = 0;
  for (int v = threadIdx.x; v < kBigTile * kBigTile / 8; v += kBigThreads) {
    const int r = v / 8, c = (v % 8) * 8;
    const int64_t at = int64_t{r0 + r} * cols + c0 + c;
    uint32_t codes[2];
    codes8(at, r0 + r, c0 + c, codes, mine);
    tile[r][c / 4] = codes[0];
    tile[r][c / 4 + 1] = codes[1];
    if (plain != nullptr) *reinterpret_cast<uint2*>(plain + at) = make_uint2(codes[0], codes[1]);
  }
  __syncthreads();
  StoreTileTransposed(out, tile, r0, c0, rows);
  WarpAmax(amax_bits, mine);
}

// The transposing conversion for matrices of 64 x 64 tiles (every model shape): 16-byte loads
// of eight values.
__global__ void QuantizeTransposed64Kernel(uint8_t* out, uint8_t* plain, const Bf16* in, int rows, int cols,
                                           const float* scale, bool e5m2, unsigned int* amax_bits) {
  PdlWait();
  PdlLetNextStart();
  const float s = *scale;
  TileToCodes(plain, out, rows, cols, amax_bits, [&](int64_t at, int, int, uint32_t* codes, unsigned int& mine) {
    const uint4 x = *reinterpret_cast<const uint4*>(in + at);
    mine = max(mine, max(max(AbsBits2(x.x), AbsBits2(x.y)), max(AbsBits2(x.z), AbsBits2(x.w))));
    const uint2 packed = Pack8(x, s, e5m2);
    codes[0] = packed.x;
    codes[1] = packed.y;
  });
}

// RoPE's backward (RopeKernel with sign -1) of a 64 x 64 tile of (B*T, H*D), its values rounded
// to bf16 as RopeBackward stores them, straight to codes, plain and transposed.
__global__ void RopeBackwardFp8Transposed64Kernel(uint8_t* plain, uint8_t* out, const Bf16* dx, int rows, int cols,
                                                  int t, int d, RopeFrequencies freq, const float* scale, bool e5m2,
                                                  unsigned int* amax_bits) {
  PdlWait();
  PdlLetNextStart();
  const float s = *scale;
  TileToCodes(plain, out, rows, cols, amax_bits, [&](int64_t at, int row, int col, uint32_t* codes, unsigned int& mine) {
    const int pos = row % t, i0 = (col % d) / 2;
    float x[8];
    Load8(dx + at, x);
    codes[0] = codes[1] = 0;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float cs, sn, y0, y1;
      RopeTrig(pos, freq.inv_freq[i0 + e], -1.f, cs, sn);
      RotatePair(x[2 * e], x[2 * e + 1], cs, sn, y0, y1);
      y0 = RoundedToBf16(y0);
      y1 = RoundedToBf16(y1);
      mine = max(mine, max(__float_as_uint(fabsf(y0)), __float_as_uint(fabsf(y1))));
      codes[e / 2] |= (uint32_t{Fp8(y0, s, e5m2)} | uint32_t{Fp8(y1, s, e5m2)} << 8) << (16 * (e % 2));
    }
  });
}

// SwiGLU's forward of a 64 x 64 tile (SwiGluForwardKernel's values, rounded to bf16 as it
// stores them) straight to E4M3 codes, plain and transposed; no bf16 output.
__global__ void SwiGluFp8Transposed64Kernel(uint8_t* plain, uint8_t* out, const Bf16* gate, const Bf16* up, int rows,
                                            int cols, const float* scale, unsigned int* amax_bits) {
  PdlWait();
  PdlLetNextStart();
  const float s = *scale;
  TileToCodes(plain, out, rows, cols, amax_bits, [&](int64_t at, int, int, uint32_t* codes, unsigned int& mine) {
    float g[8], u[8];
    Load8(gate + at, g);
    Load8(up + at, u);
    codes[0] = codes[1] = 0;
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const float y = RoundedToBf16(g[e] * Sigmoid(g[e]) * u[e]);
      mine = max(mine, __float_as_uint(fabsf(y)));
      codes[e / 4] |= uint32_t{Fp8(y, s, false)} << (8 * (e % 4));
    }
  });
}

// SwiGluBackwardFp8Kernel's values and codes for a 64 x 64 tile, plain and transposed.
__global__ void SwiGluBackwardFp8Transposed64Kernel(uint8_t* dgate, uint8_t* dup, uint8_t* dgate_t, uint8_t* dup_t,
                                                    const Bf16* dout, const Bf16* gate, const Bf16* up, int rows,
                                                    int cols, const float* scale_gate, const float* scale_up,
                                                    unsigned int* amax_gate, unsigned int* amax_up) {
  PdlWait();
  PdlLetNextStart();
  __shared__ uint32_t tile_g[kBigTile][kBigTile / 4 + 1], tile_u[kBigTile][kBigTile / 4 + 1];
  const float sg = *scale_gate, su = *scale_up;
  const int c0 = blockIdx.x * kBigTile, r0 = blockIdx.y * kBigTile;
  unsigned int most_g = 0, most_u = 0;
  for (int v = threadIdx.x; v < kBigTile * kBigTile / 8; v += kBigThreads) {
    const int r = v / 8, c = (v % 8) * 8;
    const int64_t at = int64_t{r0 + r} * cols + c0 + c;
    uint32_t codes_g[2], codes_u[2];
    SwiGluGrads8ToCodes(gate + at, up + at, dout + at, sg, su, codes_g, codes_u, most_g, most_u);
    *reinterpret_cast<uint2*>(dgate + at) = make_uint2(codes_g[0], codes_g[1]);
    *reinterpret_cast<uint2*>(dup + at) = make_uint2(codes_u[0], codes_u[1]);
    tile_g[r][c / 4] = codes_g[0];
    tile_g[r][c / 4 + 1] = codes_g[1];
    tile_u[r][c / 4] = codes_u[0];
    tile_u[r][c / 4 + 1] = codes_u[1];
  }
  __syncthreads();
  StoreTileTransposed(dgate_t, tile_g, r0, c0, rows);
  StoreTileTransposed(dup_t, tile_u, r0, c0, rows);
  WarpAmax(amax_gate, most_g);
  WarpAmax(amax_up, most_u);
}

// 32 x 32 tiles through shared memory: reads and writes both along rows. With `plain`, the
// codes are also written untransposed (one read of the input for both).
constexpr int kTile = 32;
__global__ void QuantizeTransposedKernel(uint8_t* out, uint8_t* plain, const Bf16* in, int rows, int cols,
                                         const float* scale, bool e5m2, unsigned int* amax_bits) {
  __shared__ uint8_t tile[kTile][kTile + 1];
  const float s = *scale;
  const int c0 = blockIdx.x * kTile, r0 = blockIdx.y * kTile;
  unsigned int mine = 0;
  for (int dy = threadIdx.y; dy < kTile; dy += blockDim.y) {
    const int r = r0 + dy, c = c0 + threadIdx.x;
    if (r < rows && c < cols) {
      const float x = Load(in, int64_t{r} * cols + c);
      mine = max(mine, __float_as_uint(fabsf(x)));
      const uint8_t code = Fp8(x, s, e5m2);
      tile[dy][threadIdx.x] = code;
      if (plain != nullptr) plain[int64_t{r} * cols + c] = code;
    }
  }
  __syncthreads();
  for (int dy = threadIdx.y; dy < kTile; dy += blockDim.y) {
    const int c = c0 + dy, r = r0 + threadIdx.x;  // out row c, column r
    if (r < rows && c < cols) out[int64_t{c} * rows + r] = tile[threadIdx.x][dy];
  }
  WarpAmax(amax_bits, mine);
}

// FP8 codes transposed as bytes (TransposeFp8). 64 x 64 tiles where the shape and pointers
// allow: each thread loads 16 codes of an input row and stores 16 of an output row.
__global__ void TransposeCodes64Kernel(uint8_t* out, const uint8_t* in, int rows, int cols) {
  PdlWait();
  PdlLetNextStart();
  __shared__ __align__(16) uint8_t tile[kBigTile][kBigTile + 16];  // rows stay 16-byte aligned
  const int r0 = blockIdx.y * kBigTile, c0 = blockIdx.x * kBigTile;
  const int t = threadIdx.x, part = t % 4, line = t / 4;
  *reinterpret_cast<uint4*>(&tile[line][16 * part]) =
      *reinterpret_cast<const uint4*>(in + int64_t{r0 + line} * cols + c0 + 16 * part);
  __syncthreads();
  uint32_t packed[4] = {0, 0, 0, 0};
  for (int i = 0; i < 16; ++i) packed[i / 4] |= uint32_t{tile[16 * part + i][line]} << (8 * (i % 4));
  *reinterpret_cast<uint4*>(out + int64_t{c0 + line} * rows + r0 + 16 * part) =
      make_uint4(packed[0], packed[1], packed[2], packed[3]);
}

__global__ void TransposeCodesKernel(uint8_t* out, const uint8_t* in, int rows, int cols) {
  __shared__ uint8_t tile[kTile][kTile + 1];
  const int c0 = blockIdx.x * kTile, r0 = blockIdx.y * kTile;
  for (int dy = threadIdx.y; dy < kTile; dy += blockDim.y) {
    const int r = r0 + dy, c = c0 + threadIdx.x;
    if (r < rows && c < cols) tile[dy][threadIdx.x] = in[int64_t{r} * cols + c];
  }
  __syncthreads();
  for (int dy = threadIdx.y; dy < kTile; dy += blockDim.y) {
    const int c = c0 + dy, r = r0 + threadIdx.x;
    if (r < rows && c < cols) out[int64_t{c} * rows + r] = tile[threadIdx.x][dy];
  }
}

// As fp8::CurrentScale: one fp32 division, and 1 for a degenerate amax.
__device__ __forceinline__ float CurrentScaleOf(float amax, float max_finite) {
  float s = 1.0f;
  if (amax > 0 && isfinite(amax)) {
    const float q = __fdiv_rn(max_finite, amax);
    if (isfinite(q)) s = q;
  }
  return s;
}

__global__ void ScaleFromAmaxKernel(float* scale, float* scale_inv, const float* amax, float max_finite,
                                    float* running_amax) {
  PdlWait();
  PdlLetNextStart();
  const float a = *amax;
  if (running_amax != nullptr) {  // as the bits of |x| order (NaN above infinity), as WarpAmax's
    auto* bits = reinterpret_cast<unsigned int*>(running_amax);
    *bits = max(*bits, __float_as_uint(a));
  }
  const float s = CurrentScaleOf(a, max_finite);
  *scale = s;
  *scale_inv = __fdiv_rn(1.0f, s);
}

__global__ void ScalesFromAmaxesKernel(float* slots, int stride, const float* amax, int count, float max_finite) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= count) return;
  const float a = amax[t], s = CurrentScaleOf(a, max_finite);
  float* slot = slots + static_cast<int64_t>(t) * stride;
  slot[0] = __fdiv_rn(1.0f, s);
  slot[1] = s;
  slot[2] = a;
}

// One thread a tensor: fp8::DelayedScaling::Record's arithmetic, step for step (the same fp32
// operations, rounded the same way), on the tensor's running amax, which is then reset.
__global__ void UpdateDelayedScalingKernel(float* slots, float* history, Fp8ScalingState* states, int tensors,
                                           int window, int margin, bool set_scales, bool fixed_scales) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= tensors) return;
  Fp8ScalingState& st = states[t];
  float* slot = slots + 4 * t;
  const float amax = slot[2];
  slot[2] = 0.0f;
  st.last_amax = amax;
  const float max_finite = st.e5m2 ? 57344.0f : 448.0f, min_normal = st.e5m2 ? 0x1p-14f : 0x1p-6f;
  if (!isfinite(amax)) {
    ++st.non_finite;
  } else {
    const float scaled = __fmul_rn(amax, st.scale);
    st.saturated_in_a_row = st.has_scale && scaled > 2 * max_finite ? st.saturated_in_a_row + 1 : 0;
    st.underflow_in_a_row = st.has_scale && amax > 0 && scaled < min_normal ? st.underflow_in_a_row + 1 : 0;
    float* h = history + int64_t{t} * window;
    h[st.next] = amax;
    st.next = (st.next + 1) % window;
    st.count = min(st.count + 1, window);
    float most = 0.0f;
    for (int i = 0; i < st.count; ++i) most = fmaxf(most, h[i]);
    if (most > 0 && !fixed_scales) {
      st.scale = ldexpf(__fdiv_rn(max_finite, most), -margin);
      st.has_scale = 1;
    }
  }
  if (set_scales && st.has_scale) {
    slot[1] = st.scale;
    slot[0] = __fdiv_rn(1.0f, st.scale);
  }
}

}  // namespace

void UpdateDelayedScaling(float* slots, float* history, Fp8ScalingState* states, int tensors, int window, int margin,
                          bool set_scales, cudaStream_t stream, bool fixed_scales) {
  if (tensors <= 0) return;
  UpdateDelayedScalingKernel<<<(tensors + 127) / 128, 128, 0, stream>>>(
      slots, history, states, tensors, window < 1 ? 1 : window, margin, set_scales, fixed_scales);
}

void ScaleFromAmax(float* scale, float* scale_inv, const float* amax, bool e5m2, cudaStream_t stream,
                   float* running_amax) {
  Launch(ScaleFromAmaxKernel, 1, 1, 0, stream, scale, scale_inv, amax, e5m2 ? 57344.0f : 448.0f, running_amax);
}

void ScalesFromAmaxes(float* slots, int stride, const float* amax, int count, bool e5m2, cudaStream_t stream) {
  if (count <= 0) return;
  ScalesFromAmaxesKernel<<<(count + 127) / 128, 128, 0, stream>>>(slots, stride, amax, count,
                                                                  e5m2 ? 57344.0f : 448.0f);
}

void QuantizeFp8Transposed(uint8_t* out, const Bf16* in, int rows, int cols, const float* scale, bool e5m2,
                           cudaStream_t stream, uint8_t* plain, float* amax) {
  if (rows == 0 || cols == 0) return;
  auto* amax_bits = reinterpret_cast<unsigned int*>(amax);
  const bool big = rows % kBigTile == 0 && cols % kBigTile == 0 && reinterpret_cast<uintptr_t>(in) % 16 == 0 &&
                   reinterpret_cast<uintptr_t>(out) % 16 == 0 && reinterpret_cast<uintptr_t>(plain) % 8 == 0;
  if (big) {
    const dim3 grid(cols / kBigTile, rows / kBigTile);
    Launch(QuantizeTransposed64Kernel, grid, kBigThreads, 0, stream, out, plain, in, rows, cols, scale, e5m2,
           amax_bits);
    return;
  }
  const dim3 grid((cols + kTile - 1) / kTile, (rows + kTile - 1) / kTile), block(kTile, 8);
  QuantizeTransposedKernel<<<grid, block, 0, stream>>>(out, plain, in, rows, cols, scale, e5m2, amax_bits);
}

bool SwiGluBackwardFp8Transposed(uint8_t* dgate, uint8_t* dup, uint8_t* dgate_t, uint8_t* dup_t, const Bf16* dout,
                                 const Bf16* gate, const Bf16* up, int rows, int cols, const float* scale_gate,
                                 const float* scale_up, float* amax_gate, float* amax_up, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0 || rows % kBigTile != 0 || cols % kBigTile != 0 ||
      !Aligned16(dout, gate, up, dgate_t, dup_t) || !Aligned8(dgate, dup)) {
    return false;
  }
  const dim3 grid(cols / kBigTile, rows / kBigTile);
  Launch(SwiGluBackwardFp8Transposed64Kernel, grid, kBigThreads, 0, stream, dgate, dup, dgate_t, dup_t, dout, gate, up,
         rows, cols, scale_gate, scale_up, reinterpret_cast<unsigned int*>(amax_gate),
         reinterpret_cast<unsigned int*>(amax_up));
  return true;
}

bool SwiGluForwardFp8Transposed(uint8_t* plain, uint8_t* transposed, const Bf16* gate, const Bf16* up, int rows,
                                int cols, const float* scale, float* amax, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0 || rows % kBigTile != 0 || cols % kBigTile != 0 || !Aligned16(gate, up, transposed) ||
      !Aligned8(plain)) {
    return false;
  }
  const dim3 grid(cols / kBigTile, rows / kBigTile);
  Launch(SwiGluFp8Transposed64Kernel, grid, kBigThreads, 0, stream, plain, transposed, gate, up, rows, cols, scale,
         reinterpret_cast<unsigned int*>(amax));
  return true;
}

bool RopeBackwardFp8Transposed(uint8_t* plain, uint8_t* transposed, const Bf16* dx, int b, int t, int h, int d,
                               const RopeFrequencies& freq, const float* scale, bool e5m2, float* amax,
                               cudaStream_t stream) {
  const int64_t rows = int64_t{b} * t, cols = int64_t{h} * d;
  if (rows <= 0 || cols <= 0 || rows % kBigTile != 0 || cols % kBigTile != 0 || rows > INT32_MAX ||
      cols > INT32_MAX || d % 8 != 0 || d / 2 > RopeFrequencies::kMaxPairs || !Aligned16(dx, transposed) ||
      !Aligned8(plain)) {
    return false;
  }
  const dim3 grid(static_cast<unsigned>(cols / kBigTile), static_cast<unsigned>(rows / kBigTile));
  Launch(RopeBackwardFp8Transposed64Kernel, grid, kBigThreads, 0, stream, plain, transposed, dx, static_cast<int>(rows),
         static_cast<int>(cols), t, d, freq, scale, e5m2, reinterpret_cast<unsigned int*>(amax));
  return true;
}

void TransposeFp8(uint8_t* out, const uint8_t* in, int rows, int cols, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  if (rows % kBigTile == 0 && cols % kBigTile == 0 && reinterpret_cast<uintptr_t>(in) % 16 == 0 &&
      reinterpret_cast<uintptr_t>(out) % 16 == 0) {
    Launch(TransposeCodes64Kernel, dim3(cols / kBigTile, rows / kBigTile), kBigThreads, 0, stream, out, in, rows, cols);
    return;
  }
  const dim3 grid((cols + kTile - 1) / kTile, (rows + kTile - 1) / kTile), block(kTile, 8);
  TransposeCodesKernel<<<grid, block, 0, stream>>>(out, in, rows, cols);
}

void AbsMax(float* amax, const Bf16* in, int64_t n, cudaStream_t stream) {
  cudaMemsetAsync(amax, 0, sizeof(float), stream);
  if (n == 0) return;
  Launch(AbsMaxKernel, Blocks(n) < 1024 ? Blocks(n) : 1024, kThreads, 0, stream, reinterpret_cast<unsigned int*>(amax),
         in, n);
}

void QuantizeFp8(uint8_t* out, const Bf16* in, int64_t n, const float* scale, bool e5m2, cudaStream_t stream,
                 float* amax) {
  if (n == 0) return;
  // Eight values a thread: a thread a value would leave seven of eight idle.
  Launch(QuantizeKernel, Blocks((n + 7) / 8), kThreads, 0, stream, out, in, n, scale, e5m2,
         reinterpret_cast<unsigned int*>(amax));
}

void SwiGluBackwardFp8(uint8_t* dgate, uint8_t* dup, const Bf16* dout, const Bf16* gate, const Bf16* up, int64_t count,
                       const float* scale_gate, const float* scale_up, float* amax_gate, float* amax_up,
                       cudaStream_t stream) {
  if (count == 0) return;
  const bool vec = Aligned16(dout, gate, up) && reinterpret_cast<uintptr_t>(dgate) % 8 == 0 &&
                   reinterpret_cast<uintptr_t>(dup) % 8 == 0;
  SwiGluBackwardFp8Kernel<<<Blocks(vec ? count / 8 + count % 8 : count), kThreads, 0, stream>>>(
      dgate, dup, dout, gate, up, count, scale_gate, scale_up, reinterpret_cast<unsigned int*>(amax_gate),
      reinterpret_cast<unsigned int*>(amax_up), vec);
}

}  // namespace tierd::trainer::gpu
