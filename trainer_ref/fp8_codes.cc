#include "trainer_ref/fp8_codes.h"

#include <algorithm>
#include <atomic>

#include "trainer_ref/fp8.h"
#include "trainer_ref/parallel.h"

namespace tierd::trainer::fp8 {

Fp8Scaled EncodeE4M3CurrentScaled(const uint16_t* bf16, int64_t n, uint8_t* codes, int threads) {
  // The largest |x| as the largest magnitude bits (non-negative values order as their bits,
  // NaN's above infinity's, as the GPU's AbsMax orders them); one atomic max per slice.
  std::atomic<uint32_t> largest{0};
  ParallelFor(
      n, static_cast<double>(n),
      [&](int64_t begin, int64_t end) {
        uint32_t m = 0;
        for (int64_t i = begin; i < end; ++i) m = std::max<uint32_t>(m, bf16[i] & 0x7fffu);
        uint32_t seen = largest.load();
        while (m > seen && !largest.compare_exchange_weak(seen, m)) {
        }
      },
      threads);
  Fp8Scaled s;
  s.amax = std::bit_cast<float>(largest.load() << 16);
  s.scale = CurrentScale(s.amax, Format::kE4M3);
  s.scale_inv = 1.0f / s.scale;
  const float scale = s.scale;
  ParallelFor(
      n, static_cast<double>(n),
      [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
          codes[i] = EncodeE4M3(std::bit_cast<float>(static_cast<uint32_t>(bf16[i]) << 16) * scale);
        }
      },
      threads);
  return s;
}

}  // namespace tierd::trainer::fp8
