// A bf16 tensor as E4M3 codes at current scaling (its exact largest |x| mapped onto 448), on
// the host's threads: what the host's optimizer step writes for an FP8 layer's weights beside
// the bf16 copy, so the GPU fetches 1 byte a parameter instead of 2. The same bits as the
// GPU's AbsMax, ScaleFromAmax and QuantizeFp8 (kernels/fp8_ops.h) give, both being tested
// against fp8.h's reference (fp8::Encode, fp8::CurrentScale).
//
// Thread-safety: pure functions.
#ifndef TIERD_TRAINER_REF_FP8_CODES_H_
#define TIERD_TRAINER_REF_FP8_CODES_H_

#include <bit>
#include <cstdint>

namespace tierd::trainer::fp8 {

// fp8::Encode(y, kE4M3) without branches, so a loop over it vectorises: round to nearest even,
// finite values past 448 and infinities saturate to 448, NaN to a NaN code (sign kept).
inline uint8_t EncodeE4M3(float y) {
  const uint32_t bits = std::bit_cast<uint32_t>(y);
  const uint32_t sign = (bits >> 24) & 0x80u, abs = bits & 0x7fffffffu;
  // Normal codes: the fp32 exponent and the top three mantissa bits, rounded to nearest even
  // (a carry moves into the exponent), then the exponent rebiased from 127 to 7.
  const uint32_t normal = ((abs + 0x7ffffu + ((abs >> 20) & 1u)) >> 20) - (120u << 3);
  // Below 2^-6 the codes count steps of 2^-9: |y| 2^9 (exact) rounded to an integer by the
  // fp32 addition of 2^23 (round to nearest even), read back from the sum's mantissa.
  const float steps = std::bit_cast<float>(abs) * 512.0f + 8388608.0f;
  const uint32_t subnormal = std::bit_cast<uint32_t>(steps) - 0x4b000000u;
  // The choices as masks (GCC 12 keeps ?: here as branches, and the loop scalar).
  const uint32_t below = 0u - static_cast<uint32_t>(abs < 0x3c800000u);       // 2^-6
  const uint32_t saturated = 0u - static_cast<uint32_t>(abs >= 0x43e00000u);  // 448 and beyond, infinity too
  const uint32_t nan = 0u - static_cast<uint32_t>(abs > 0x7f800000u);
  uint32_t code = (subnormal & below) | (normal & ~below);
  code = (0x7eu & saturated) | (code & ~saturated);
  code = (0x7fu & nan) | (code & ~nan);
  return static_cast<uint8_t>(sign | code);
}

struct Fp8Scaled {
  float amax = 0;       // the tensor's largest |x| (NaN if it holds one)
  float scale = 1;      // fp8::CurrentScale(amax, kE4M3)
  float scale_inv = 1;  // 1 / scale, what reads the codes back
};

// codes[i] = EncodeE4M3(value(bf16[i]) * scale), scale from the tensor's largest |x|; split
// over `threads` (0: CpuThreads()) in contiguous slices. n may be 0 (scale 1).
Fp8Scaled EncodeE4M3CurrentScaled(const uint16_t* bf16, int64_t n, uint8_t* codes, int threads = 0);

// out (cols x rows) = in (rows x cols) transposed, bytes: a weight's codes as the backward's
// product with the output gradient reads them (FP8 tensor cores take no other form). In tiles,
// split over `threads` (0: CpuThreads()) by rows of the output.
void TransposeCodes(const uint8_t* in, int64_t rows, int64_t cols, uint8_t* out, int threads = 0);

}  // namespace tierd::trainer::fp8

#endif  // TIERD_TRAINER_REF_FP8_CODES_H_
