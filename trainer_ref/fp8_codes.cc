#include "trainer_ref/fp8_codes.h"

#include <algorithm>
#include <atomic>

#include "trainer_ref/fp8.h"
#include "trainer_ref/parallel.h"

namespace tierd::trainer::fp8 {
namespace {

// The loops on their own, restrict pointers and values in registers: through the lambda's
// captures the byte stores may alias the pointers, and the loop is not vectorised (2 ns a
// value instead of a fraction of one).
uint32_t LargestBits(const uint16_t* __restrict in, int64_t n) {
  uint32_t m = 0;
  for (int64_t i = 0; i < n; ++i) m = std::max<uint32_t>(m, in[i] & 0x7fffu);
  return m;
}

// At one scale a code depends only on the value's 15 magnitude bits (the sign is copied):
// a table of 32768 codes, made once per tensor, turns the encoding into a load a value
// (0.56 ns against 1.7 for EncodeE4M3's arithmetic with SSE2's integer ops, dev box).
void EncodeSlice(const uint16_t* __restrict in, uint8_t* __restrict out, int64_t n, const uint8_t* __restrict table) {
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<uint8_t>(table[in[i] & 0x7fffu] | ((in[i] >> 8) & 0x80u));
}

}  // namespace

Fp8Scaled EncodeE4M3CurrentScaled(const uint16_t* bf16, int64_t n, uint8_t* codes, int threads) {
  // The largest |x| as the largest magnitude bits (non-negative values order as their bits,
  // NaN's above infinity's, as the GPU's AbsMax orders them); one atomic max per slice.
  std::atomic<uint32_t> largest{0};
  ParallelFor(
      n, static_cast<double>(n),
      [&](int64_t begin, int64_t end) {
        const uint32_t m = LargestBits(bf16 + begin, end - begin);
        uint32_t seen = largest.load();
        while (m > seen && !largest.compare_exchange_weak(seen, m)) {
        }
      },
      threads);
  Fp8Scaled s;
  s.amax = std::bit_cast<float>(largest.load() << 16);
  s.scale = CurrentScale(s.amax, Format::kE4M3);
  s.scale_inv = 1.0f / s.scale;
  uint8_t table[32768];
  for (uint32_t b = 0; b < 32768; ++b) table[b] = EncodeE4M3(std::bit_cast<float>(b << 16) * s.scale);
  ParallelFor(
      n, static_cast<double>(n),
      [&](int64_t begin, int64_t end) { EncodeSlice(bf16 + begin, codes + begin, end - begin, table); }, threads);
  return s;
}

void TransposeCodes(const uint8_t* in, int64_t rows, int64_t cols, uint8_t* out, int threads) {
  // 64 x 64 tiles: a tile's 64 source rows and 64 destination rows stay in L1 while it is done.
  constexpr int64_t kTile = 64;
  const int64_t tile_rows = (cols + kTile - 1) / kTile;  // tiles down the output
  ParallelFor(
      tile_rows, static_cast<double>(rows) * cols,
      [&](int64_t begin, int64_t end) {
        for (int64_t tc = begin; tc < end; ++tc) {
          const int64_t c0 = tc * kTile, c1 = std::min(cols, c0 + kTile);
          for (int64_t r0 = 0; r0 < rows; r0 += kTile) {
            const int64_t r1 = std::min(rows, r0 + kTile);
            for (int64_t c = c0; c < c1; ++c) {
              for (int64_t r = r0; r < r1; ++r) out[c * rows + r] = in[r * cols + c];
            }
          }
        }
      },
      threads);
}

}  // namespace tierd::trainer::fp8
