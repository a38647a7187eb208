// AdamW with 8-bit blockwise moments, the arithmetic shared by the host (adamw8bit.cc) and
// the GPU kernel (kernels/gpu_ops.cu), so that both give the same bits.
//
// A moment of n values is stored as n one-byte codes and one fp32 scale (absmax) per block
// of kQuantBlock values: value = map[code] * absmax. The maps are dynamic-exponent maps
// (the scheme of Dettmers' 8-bit optimizers): 256 ascending values in [-1, 1] (the first
// moment, signed) or [0, 1] (the second, unsigned), with as many codes per decade below 1
// as the decade's weight calls for, so small values keep relative precision. A value's code
// is the number of thresholds below it, the thresholds being the midpoints of neighbouring
// map values (in double, rounded to fp32): the nearest code, a tie to the lower; values are
// normalized by one multiplication with the block's 1 / absmax. A step,
// per block: dequantize m and v, update them and the master weight in fp32 exactly as the
// fp32 AdamW does, then requantize with the block's new absmax. All-zero bytes are a zero
// moment (absmax 0).
//
// The second moment is stored as its square root (the gradient's RMS; v = r * r when read):
// v = g^2 spans twice the decades of the gradients in a block, so where a block's gradient
// magnitudes differ ~100x or more, v quantized directly falls into the map's coarse lowest
// decades or to zero and the update m / sqrt(v) of those elements grows several-fold (at
// 1.3B on the H200 the training loss drifted +1.8% over 300 steps). Its root keeps the
// gradients' own range; the update reads sqrt(v) = r, so r's error is the update's.
//
// Every operation is rounded on its own: the device uses the _rn intrinsics, the host is
// compiled with -ffp-contract=off; the absmax is a max (order-free) and the code a search.
#ifndef TIERD_TRAINER_REF_ADAMW8BIT_BLOCK_H_
#define TIERD_TRAINER_REF_ADAMW8BIT_BLOCK_H_

#include <cstdint>

#ifdef __CUDACC__
#define TIERD_Q8_HD __host__ __device__
#else
#define TIERD_Q8_HD
#include <cmath>
#endif

namespace tierd::trainer::q8 {

// 256, as bitsandbytes' 8-bit optimizers: with blocks of 2048 (a row of a 1.3B model's
// matrix) an outlier feature sets the absmax of the whole row, the other values sit in the
// map's coarse lower decades, and nearest rounding cannot follow their second moment down as
// their gradients shrink (sqrt(v) drifts high, the update low): at 1.3B over 1000 steps the
// training loss ended +10% above fp32 moments' (docs/BENCHMARKS.md, "8-bit moments").
inline constexpr int kQuantBlock = 256;
inline constexpr int kCodes = 256;

#ifdef __CUDA_ARCH__
TIERD_Q8_HD inline float Mul(float a, float b) { return __fmul_rn(a, b); }
TIERD_Q8_HD inline float Add(float a, float b) { return __fadd_rn(a, b); }
TIERD_Q8_HD inline float Sub(float a, float b) { return __fsub_rn(a, b); }
TIERD_Q8_HD inline float Div(float a, float b) { return __fdiv_rn(a, b); }
TIERD_Q8_HD inline float Sqrt(float a) { return __fsqrt_rn(a); }
#else
inline float Mul(float a, float b) { return a * b; }
inline float Add(float a, float b) { return a + b; }
inline float Sub(float a, float b) { return a - b; }
inline float Div(float a, float b) { return a / b; }
inline float Sqrt(float a) { return std::sqrt(a); }
#endif

// The number of the kCodes - 1 ascending thresholds below x: x's code. (CodeByTable below
// finds the same count with one load.)
TIERD_Q8_HD inline uint8_t CodeBySearch(const float* thresholds, float x) {
  int lo = 0, hi = kCodes - 1;  // the first threshold >= x, or kCodes - 1
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (thresholds[mid] < x) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return static_cast<uint8_t>(lo);
}

// The same count through a table of kTableKeys int32 entries keyed by a float's top 17 bits
// (sign, exponent, 8 mantissa bits): the key's start code (the code of its smallest value)
// above kLowBits bits that order the key's values and its threshold's. The maps put at most one
// threshold among the values of a key (MakeCodeTable checks), and the values of a key differ only
// in their low kLowBits bits, which order them as the values for positive keys and in reverse
// for negative ones; so x's code is the start plus one where the key's threshold t < x, that is
// where x's ordering bits exceed t's. A key without a threshold stores the largest ordering
// bits, which nothing exceeds. One load and one compare: the host's vectorised loops gather it;
// the GPU's table path reads it from device memory (adamw8bit.h: CodeTable).
inline constexpr int kKeyShift = 15;
inline constexpr uint32_t kTableKeys = uint32_t{1} << (32 - kKeyShift);
inline constexpr int kLowBits = kKeyShift;
inline constexpr uint32_t kLowMask = (uint32_t{1} << kLowBits) - 1;

// The bits of x that order the values of its key ascending: the low bits, reversed when x is
// negative.
TIERD_Q8_HD inline uint32_t OrderingBits(uint32_t bits) {
  return (bits & kLowMask) ^ (static_cast<uint32_t>(static_cast<int32_t>(bits) >> 31) & kLowMask);
}

TIERD_Q8_HD inline uint32_t FloatBits(float x) {
#ifdef __CUDA_ARCH__
  return __float_as_uint(x);
#else
  uint32_t bits;
  __builtin_memcpy(&bits, &x, 4);
  return bits;
#endif
}

TIERD_Q8_HD inline int32_t CodeByTable(const int32_t* __restrict table, float x) {
  const uint32_t bits = FloatBits(x);
#ifdef __CUDA_ARCH__
  const uint32_t entry = static_cast<uint32_t>(__ldg(table + (bits >> kKeyShift)));
#else
  const uint32_t entry = static_cast<uint32_t>(table[bits >> kKeyShift]);
#endif
  return static_cast<int32_t>((entry >> kLowBits) + (OrderingBits(bits) > (entry & kLowMask) ? 1u : 0u));
}

// A block's absmax is the largest of its values' magnitudes compared as the bit patterns of
// |x| (positive floats order as their bits): an integer max, exact in any order and simple
// to vectorise.
TIERD_Q8_HD inline uint32_t MagnitudeBits(float x) { return FloatBits(x) & 0x7fffffffu; }
TIERD_Q8_HD inline float FromMagnitudeBits(uint32_t bits) {
#ifdef __CUDA_ARCH__
  return __uint_as_float(bits);
#else
  float x;
  __builtin_memcpy(&x, &bits, 4);
  return x;
#endif
}

// The factor that normalizes a block's values: 1 / absmax (0 when the block is all zeros).
TIERD_Q8_HD inline float InverseScale(float absmax) { return absmax > 0.f ? Div(1.f, absmax) : 0.f; }

// The second moment from its stored root, and the root to store.
TIERD_Q8_HD inline float SecondMomentOf(float root) { return Mul(root, root); }
TIERD_Q8_HD inline float RootToStore(float v) { return Sqrt(v); }

// One element's AdamW with the previous moments m, v (dequantized): updates them, returns
// the new master weight. The fp32 AdamW's operations in its order (host_adamw.cc, gpu_ops'
// AdamW kernel). c1, c2: bias corrections; decay: lr * weight_decay, or 0.
struct ElementStep {
  float beta1, beta2, lr, eps, decay, c1, c2, grad_scale;
  TIERD_Q8_HD float operator()(float w, float grad, float& m, float& v) const {
    const float g = Mul(grad, grad_scale);
    m = Add(Mul(beta1, m), Mul(Sub(1.f, beta1), g));
    v = Add(Mul(beta2, v), Mul(Mul(Sub(1.f, beta2), g), g));
    w = Sub(w, Mul(decay, w));
    return Sub(w, Div(Mul(lr, Div(m, c1)), Add(Sqrt(Div(v, c2)), eps)));
  }
};

}  // namespace tierd::trainer::q8

#endif  // TIERD_TRAINER_REF_ADAMW8BIT_BLOCK_H_
