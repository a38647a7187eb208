#include "trainer_ref/adamw8bit.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>

#include "trainer_ref/parallel.h"

namespace tierd::trainer {
namespace {

// Seven decades below 1 (values 1e-6 .. 1): decade i holds 2^i values (signed: each with
// its negative) or 2^(i + 1) (unsigned), the midpoints of an even split of [0.1, 1] scaled
// by 10^(i - 6); then 0 and 1. 254 + 2 values either way.
std::array<float, q8::kCodes> MakeDynamicMap(bool is_signed) {
  std::vector<double> values;
  for (int i = 0; i < 7; ++i) {
    const int fractions = is_signed ? (1 << i) : (1 << (i + 1));
    const double scale = std::pow(10.0, i - 6);
    for (int k = 0; k < fractions; ++k) {
      const double mid = 0.1 + 0.9 * (k + 0.5) / fractions;
      values.push_back(scale * mid);
      if (is_signed) values.push_back(-scale * mid);
    }
  }
  values.push_back(0.0);
  values.push_back(1.0);
  std::sort(values.begin(), values.end());
  std::array<float, q8::kCodes> map{};
  for (int i = 0; i < q8::kCodes; ++i) map[i] = static_cast<float>(values[i]);
  return map;
}

std::array<float, q8::kCodes - 1> MakeThresholds(const std::array<float, q8::kCodes>& map) {
  std::array<float, q8::kCodes - 1> t{};
  for (int i = 0; i + 1 < q8::kCodes; ++i) t[i] = static_cast<float>((double(map[i]) + double(map[i + 1])) / 2);
  return t;
}

// Keys: a float's top 17 bits (sign, exponent, 8 mantissa bits; adamw8bit_block.h).
using q8::kKeyShift;
using q8::kLowBits;
using q8::kLowMask;
using q8::OrderingBits;
constexpr uint32_t kKeys = q8::kTableKeys;

float SmallestWithKey(uint32_t key) {
  const uint32_t low = key << kKeyShift, high = low | ((uint32_t{1} << kKeyShift) - 1);
  float a, b;
  std::memcpy(&a, &low, 4);
  std::memcpy(&b, &high, 4);
  return (key >> 16) != 0 ? b : a;  // negative: the largest magnitude is the smallest
}

// Per key, the code of the smallest value with that key (the count of thresholds below it).
std::vector<int32_t> MakeStartCodes(const std::array<float, q8::kCodes - 1>& thresholds) {
  std::vector<int32_t> start(kKeys);
  for (uint32_t key = 0; key < kKeys; ++key) {
    const float smallest = SmallestWithKey(key);
    start[key] = smallest != smallest ? 0 : q8::CodeBySearch(thresholds.data(), smallest);  // NaN keys: 0
  }
  return start;
}

// A map's lookup in one int32 per key (q8::CodeByTable), so that a vectorised loop makes one
// gather a value.
std::vector<int32_t> MakeCodeTable(const std::array<float, q8::kCodes - 1>& thresholds) {
  const std::vector<int32_t> start = MakeStartCodes(thresholds);
  std::vector<uint32_t> threshold_bits(kKeys, kLowMask);
  for (float t : thresholds) {
    const uint32_t bits = std::bit_cast<uint32_t>(t), key = bits >> kKeyShift;
    if (threshold_bits[key] != kLowMask) std::abort();  // two in one key: a changed map needs more key bits
    threshold_bits[key] = OrderingBits(bits);           // the key's last value: nothing exceeds it, as if absent
  }
  std::vector<int32_t> table(kKeys);
  for (uint32_t key = 0; key < kKeys; ++key) {
    table[key] = static_cast<int32_t>((static_cast<uint32_t>(start[key]) << kLowBits) | threshold_bits[key]);
  }
  return table;
}

// Branch-free, one int32 load indexed by int32: a loop over it vectorises into one gather.
inline int32_t LookupCode(const int32_t* __restrict table, float normalized) {
  return q8::CodeByTable(table, normalized);
}

const int32_t* TableFor(bool is_signed) {
  static const std::vector<int32_t> signed_table = MakeCodeTable(Thresholds(true));
  static const std::vector<int32_t> unsigned_table = MakeCodeTable(Thresholds(false));
  return is_signed ? signed_table.data() : unsigned_table.data();
}

// The table lookups of a step, written with gathers: GCC does not vectorise them into gather
// instructions by itself (it loads lane by lane), and the lookups are most of the 8-bit
// step's time. Each has a plain loop (any x86-64) and AVX2 and AVX-512 versions, picked once
// at run time; all give the plain loop's values (the same loads, the same integer and float
// operations, each rounded once).
void CodesPlain(const float* __restrict normalized, int64_t count, const int32_t* __restrict table,
                uint8_t* __restrict codes) {
  for (int64_t i = 0; i < count; ++i) codes[i] = static_cast<uint8_t>(LookupCode(table, normalized[i]));
}

// values[i] = map[codes[i]] * scale, squared where `square` (the second moment from its root).
void DequantizePlain(const uint8_t* __restrict codes, int64_t count, const float* __restrict map, float scale,
                     bool square, float* __restrict values) {
  for (int64_t i = 0; i < count; ++i) {
    const float x = q8::Mul(map[codes[i]], scale);
    values[i] = square ? q8::SecondMomentOf(x) : x;
  }
}

__attribute__((target("avx2"))) void CodesAvx2(const float* __restrict normalized, int64_t count,
                                               const int32_t* __restrict table, uint8_t* __restrict codes) {
  const __m256i low = _mm256_set1_epi32(static_cast<int32_t>(kLowMask));
  int64_t i = 0;
  for (; i + 8 <= count; i += 8) {
    const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(normalized + i));
    const __m256i entry = _mm256_i32gather_epi32(table, _mm256_srli_epi32(bits, kKeyShift), 4);
    const __m256i order =
        _mm256_xor_si256(_mm256_and_si256(bits, low), _mm256_and_si256(_mm256_srai_epi32(bits, 31), low));
    // start + (order > the key's threshold bits): the compare is all ones (-1) where it holds
    const __m256i code =
        _mm256_sub_epi32(_mm256_srli_epi32(entry, kLowBits), _mm256_cmpgt_epi32(order, _mm256_and_si256(entry, low)));
    const __m128i words = _mm_packus_epi32(_mm256_castsi256_si128(code), _mm256_extracti128_si256(code, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(codes + i), _mm_packus_epi16(words, words));
  }
  CodesPlain(normalized + i, count - i, table, codes + i);
}

__attribute__((target("avx2"))) void DequantizeAvx2(const uint8_t* __restrict codes, int64_t count,
                                                    const float* __restrict map, float scale, bool square,
                                                    float* __restrict values) {
  const __m256 s = _mm256_set1_ps(scale);
  int64_t i = 0;
  for (; i + 8 <= count; i += 8) {
    const __m256i index = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + i)));
    __m256 x = _mm256_mul_ps(_mm256_i32gather_ps(map, index, 4), s);
    if (square) x = _mm256_mul_ps(x, x);
    _mm256_storeu_ps(values + i, x);
  }
  DequantizePlain(codes + i, count - i, map, scale, square, values + i);
}

// GCC 12's AVX-512 headers start some intrinsics from a self-initialised "undefined" vector,
// which -Wmaybe-uninitialized flags wherever they are inlined: not a fault of this code.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
__attribute__((target("avx512f"))) void CodesAvx512(const float* __restrict normalized, int64_t count,
                                                    const int32_t* __restrict table, uint8_t* __restrict codes) {
  const __m512i low = _mm512_set1_epi32(static_cast<int32_t>(kLowMask));
  int64_t i = 0;
  for (; i + 16 <= count; i += 16) {
    const __m512i bits = _mm512_loadu_si512(normalized + i);
    const __m512i entry = _mm512_i32gather_epi32(_mm512_srli_epi32(bits, kKeyShift), table, 4);
    const __m512i order =
        _mm512_xor_si512(_mm512_and_si512(bits, low), _mm512_and_si512(_mm512_srai_epi32(bits, 31), low));
    const __mmask16 above = _mm512_cmpgt_epi32_mask(order, _mm512_and_si512(entry, low));
    const __m512i start = _mm512_srli_epi32(entry, kLowBits);
    const __m512i code = _mm512_mask_add_epi32(start, above, start, _mm512_set1_epi32(1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(codes + i), _mm512_cvtepi32_epi8(code));
  }
  CodesPlain(normalized + i, count - i, table, codes + i);
}

__attribute__((target("avx512f"))) void DequantizeAvx512(const uint8_t* __restrict codes, int64_t count,
                                                         const float* __restrict map, float scale, bool square,
                                                         float* __restrict values) {
  const __m512 s = _mm512_set1_ps(scale);
  int64_t i = 0;
  for (; i + 16 <= count; i += 16) {
    const __m512i index = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + i)));
    __m512 x = _mm512_mul_ps(_mm512_i32gather_ps(index, map, 4), s);
    if (square) x = _mm512_mul_ps(x, x);
    _mm512_storeu_ps(values + i, x);
  }
  DequantizePlain(codes + i, count - i, map, scale, square, values + i);
}

// Dequantizing without gathers (AVX-512 VBMI: Ice Lake, Sapphire Rapids, Zen 4): the map's 256
// values kept as four 256-byte planes (byte k of every value) in sixteen registers, and 64 codes
// looked up at once, a byte plane at a time, by two 128-byte table permutes and a blend on the
// code's top bit; four unpacks then put each value's bytes back together. Gathers load one lane
// at a time (16 loads a vector), and these lookups were a quarter of the 8-bit step's time.
struct MapPlanes {
  alignas(64) uint8_t bytes[4][q8::kCodes];
};

MapPlanes MakePlanes(const float* map) {
  MapPlanes planes;
  for (int i = 0; i < q8::kCodes; ++i) {
    const uint32_t bits = std::bit_cast<uint32_t>(map[i]);
    for (int k = 0; k < 4; ++k) planes.bytes[k][i] = static_cast<uint8_t>(bits >> (8 * k));
  }
  return planes;
}

// The planes of one of the two maps; null for any other table.
const MapPlanes* PlanesOf(const float* map) {
  static const MapPlanes signed_planes = MakePlanes(DynamicMap(true).data());
  static const MapPlanes unsigned_planes = MakePlanes(DynamicMap(false).data());
  if (map == DynamicMap(true).data()) return &signed_planes;
  if (map == DynamicMap(false).data()) return &unsigned_planes;
  return nullptr;
}

// The unpacks interleave within 128-bit lanes: output vector q's value 4L + e (lane L, e < 4)
// comes from the permuted codes' byte 16L + 4q + e, so that byte takes code 16q + 4L + e.
constexpr std::array<uint8_t, 64> MakeLaneOrder() {
  std::array<uint8_t, 64> order{};
  for (int i = 0; i < 64; ++i) order[i] = static_cast<uint8_t>(16 * ((i / 4) % 4) + 4 * (i / 16) + i % 4);
  return order;
}
alignas(64) constexpr std::array<uint8_t, 64> kLaneOrder = MakeLaneOrder();

__attribute__((target("avx512f,avx512bw,avx512vbmi"))) void DequantizeVbmi(const uint8_t* __restrict codes,
                                                                           int64_t count, const float* __restrict map,
                                                                           float scale, bool square,
                                                                           float* __restrict values) {
  const MapPlanes* planes = PlanesOf(map);
  if (planes == nullptr) return DequantizeAvx512(codes, count, map, scale, square, values);
  __m512i table[4][4];
  for (int k = 0; k < 4; ++k) {
    for (int j = 0; j < 4; ++j) table[k][j] = _mm512_load_si512(planes->bytes[k] + 64 * j);
  }
  const __m512i order = _mm512_load_si512(kLaneOrder.data());
  const __m512 s = _mm512_set1_ps(scale);
  int64_t i = 0;
  for (; i + 64 <= count; i += 64) {
    const __m512i index = _mm512_permutexvar_epi8(order, _mm512_loadu_si512(codes + i));
    const __mmask64 upper = _mm512_movepi8_mask(index);  // codes 128..255: the planes' second half
    __m512i plane[4];
    for (int k = 0; k < 4; ++k) {
      const __m512i lower_half = _mm512_permutex2var_epi8(table[k][0], index, table[k][1]);
      const __m512i upper_half = _mm512_permutex2var_epi8(table[k][2], index, table[k][3]);
      plane[k] = _mm512_mask_blend_epi8(upper, lower_half, upper_half);
    }
    const __m512i low01 = _mm512_unpacklo_epi8(plane[0], plane[1]), high01 = _mm512_unpackhi_epi8(plane[0], plane[1]);
    const __m512i low23 = _mm512_unpacklo_epi8(plane[2], plane[3]), high23 = _mm512_unpackhi_epi8(plane[2], plane[3]);
    const __m512i words[4] = {_mm512_unpacklo_epi16(low01, low23), _mm512_unpackhi_epi16(low01, low23),
                              _mm512_unpacklo_epi16(high01, high23), _mm512_unpackhi_epi16(high01, high23)};
    for (int q = 0; q < 4; ++q) {
      __m512 x = _mm512_mul_ps(_mm512_castsi512_ps(words[q]), s);
      if (square) x = _mm512_mul_ps(x, x);
      _mm512_storeu_ps(values + i + 16 * q, x);
    }
  }
  DequantizeAvx512(codes + i, count - i, map, scale, square, values + i);
}

#pragma GCC diagnostic pop

struct Lookups {
  void (*codes)(const float*, int64_t, const int32_t*, uint8_t*);
  void (*dequantize)(const uint8_t*, int64_t, const float*, float, bool, float*);
  const char* name;
};

constexpr Lookups kPaths[] = {{CodesPlain, DequantizePlain, "plain"},
                              {CodesAvx2, DequantizeAvx2, "avx2"},
                              {CodesAvx512, DequantizeAvx512, "avx512"},
                              {CodesAvx512, DequantizeVbmi, "avx512vbmi"}};

// The best path the CPU has at or below `want` ("" or "avx512vbmi": the best; "avx512"; "avx2";
// "plain").
int PathUpTo(const std::string& want) {
  const bool vbmi = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                    __builtin_cpu_supports("avx512vbmi");
  if (vbmi && (want.empty() || want == "avx512vbmi")) return 3;
  if (__builtin_cpu_supports("avx512f") && (want.empty() || want == "avx512" || want == "avx512vbmi")) return 2;
  if (__builtin_cpu_supports("avx2") && want != "plain") return 1;
  return 0;
}

// Chosen at first use; TIERD_HOST_SIMD=plain|avx2 takes a lesser path than the CPU's best.
std::atomic<int> path{-1};
const Lookups& TheLookups() {
  int p = path.load(std::memory_order_relaxed);
  if (p < 0) {
    const char* forced = std::getenv("TIERD_HOST_SIMD");
    int expected = -1;
    path.compare_exchange_strong(expected, PathUpTo(forced != nullptr ? forced : ""));
    p = path.load(std::memory_order_relaxed);
  }
  return kPaths[p];
}

// Quantization blocks [first, last) of one step, in loops the compiler vectorises (cloned
// per instruction set, as HostAdamW): dequantize; the AdamW arithmetic; the absmax; codes.
__attribute__((target_clones("avx512f", "avx2", "default"))) void StepBlocks(
    int64_t first, int64_t last, float* __restrict master, Moment8bit m, Moment8bit v, uint16_t* __restrict weights,
    const float* __restrict grads, const uint16_t* __restrict grads_bf16, int64_t n, const q8::ElementStep& step) {
  const float* signed_map = DynamicMap(true).data();
  const float* unsigned_map = DynamicMap(false).data();
  const int32_t* m_table = TableFor(true);
  const int32_t* v_table = TableFor(false);
  const Lookups& lookup = TheLookups();
  float mi[q8::kQuantBlock], vi[q8::kQuantBlock], gi[q8::kQuantBlock];
  for (int64_t b = first; b < last; ++b) {
    const int64_t begin = b * q8::kQuantBlock, count = std::min<int64_t>(q8::kQuantBlock, n - begin);
    const uint8_t* __restrict m_codes = m.codes + begin;
    const uint8_t* __restrict v_codes = v.codes + begin;
    float* __restrict w = master + begin;
    const float* __restrict g = grads + begin;
    if (grads_bf16 != nullptr) {  // widened a block at a time: exact (a bf16 is an fp32's upper half)
      for (int64_t i = 0; i < count; ++i) gi[i] = Bf16Float(grads_bf16[begin + i]);
      g = gi;
    }
    const q8::ElementStep s = step;  // a local copy: no aliasing with the stores for the compiler to fear
    lookup.dequantize(m_codes, count, signed_map, m.absmax[b], /*square=*/false, mi);
    lookup.dequantize(v_codes, count, unsigned_map, v.absmax[b], /*square=*/true, vi);  // v from its root
    for (int64_t i = 0; i < count; ++i) w[i] = s(w[i], g[i], mi[i], vi[i]);
    for (int64_t i = 0; i < count; ++i) vi[i] = q8::RootToStore(vi[i]);  // v is kept as its root
    if (weights != nullptr) {
      uint16_t* __restrict w16 = weights + begin;
      for (int64_t i = 0; i < count; ++i) w16[i] = Bf16Bits(w[i]);
    }
    uint32_t most_m = 0, most_v = 0;
    for (int64_t i = 0; i < count; ++i) {
      most_m = std::max(most_m, q8::MagnitudeBits(mi[i]));
      most_v = std::max(most_v, q8::MagnitudeBits(vi[i]));
    }
    m.absmax[b] = q8::FromMagnitudeBits(most_m);
    v.absmax[b] = q8::FromMagnitudeBits(most_v);
    const float inverse_m = q8::InverseScale(m.absmax[b]), inverse_v = q8::InverseScale(v.absmax[b]);
    for (int64_t i = 0; i < count; ++i) {
      mi[i] = q8::Mul(mi[i], inverse_m);
      vi[i] = q8::Mul(vi[i], inverse_v);
    }
    lookup.codes(mi, count, m_table, m.codes + begin);
    lookup.codes(vi, count, v_table, v.codes + begin);
  }
}

}  // namespace

const std::array<float, q8::kCodes>& DynamicMap(bool is_signed) {
  static const std::array<float, q8::kCodes> signed_map = MakeDynamicMap(true);
  static const std::array<float, q8::kCodes> unsigned_map = MakeDynamicMap(false);
  return is_signed ? signed_map : unsigned_map;
}

const std::array<float, q8::kCodes - 1>& Thresholds(bool is_signed) {
  static const std::array<float, q8::kCodes - 1> signed_t = MakeThresholds(DynamicMap(true));
  static const std::array<float, q8::kCodes - 1> unsigned_t = MakeThresholds(DynamicMap(false));
  return is_signed ? signed_t : unsigned_t;
}

const int32_t* CodeTable(bool is_signed) { return TableFor(is_signed); }

uint8_t CodeOf(bool is_signed, float normalized) {
  return static_cast<uint8_t>(LookupCode(TableFor(is_signed), normalized));
}

uint64_t Moment8bitBytes(uint64_t n) { return (n + 15) / 16 * 16 + 4 * QuantBlocks(n); }

Moment8bit MomentAt(void* bytes, uint64_t n) {
  auto* base = static_cast<uint8_t*>(bytes);
  return {base, reinterpret_cast<float*>(base + (n + 15) / 16 * 16)};
}

const char* HostLookupPath() { return TheLookups().name; }

const char* UseHostLookupPath(const std::string& want) {
  path.store(PathUpTo(want), std::memory_order_relaxed);
  return TheLookups().name;
}

void Quantize8bit(const float* values, uint64_t n, bool is_signed, void* bytes) {
  const Moment8bit out = MomentAt(bytes, n);
  std::vector<float> normalized(q8::kQuantBlock);
  for (uint64_t b = 0; b < QuantBlocks(n); ++b) {
    const uint64_t begin = b * q8::kQuantBlock, end = std::min<uint64_t>(n, begin + q8::kQuantBlock);
    uint32_t most = 0;
    for (uint64_t i = begin; i < end; ++i) most = std::max(most, q8::MagnitudeBits(values[i]));
    out.absmax[b] = q8::FromMagnitudeBits(most);
    const float inverse = q8::InverseScale(out.absmax[b]);
    for (uint64_t i = begin; i < end; ++i) normalized[i - begin] = q8::Mul(values[i], inverse);
    TheLookups().codes(normalized.data(), static_cast<int64_t>(end - begin), TableFor(is_signed), out.codes + begin);
  }
}

void Dequantize8bit(const void* bytes, uint64_t n, bool is_signed, float* values) {
  const Moment8bit in = MomentAt(const_cast<void*>(bytes), n);
  const float* map = DynamicMap(is_signed).data();
  for (uint64_t b = 0; b < QuantBlocks(n); ++b) {
    const uint64_t begin = b * q8::kQuantBlock, end = std::min<uint64_t>(n, begin + q8::kQuantBlock);
    TheLookups().dequantize(in.codes + begin, static_cast<int64_t>(end - begin), map, in.absmax[b], false,
                            values + begin);
  }
}

q8::ElementStep ElementStepFor(const HostAdamWParams& p) {
  q8::ElementStep s;
  s.beta1 = p.beta1;
  s.beta2 = p.beta2;
  s.lr = p.lr;
  s.eps = p.eps;
  s.decay = p.decay ? p.lr * p.weight_decay : 0.f;
  s.c1 = static_cast<float>(1.0 - std::pow(static_cast<double>(p.beta1), static_cast<double>(p.step)));
  s.c2 = static_cast<float>(1.0 - std::pow(static_cast<double>(p.beta2), static_cast<double>(p.step)));
  s.grad_scale = p.grad_scale;
  return s;
}

namespace {
// The step over every block, the gradients as fp32 or as bf16 (one of the two null).
void Step8bit(float* master, void* m_bytes, void* v_bytes, uint16_t* weights_bf16, const float* grads,
              const uint16_t* grads_bf16, int64_t n, const HostAdamWParams& p, int threads) {
  const q8::ElementStep step = ElementStepFor(p);
  const Moment8bit m = MomentAt(m_bytes, n), v = MomentAt(v_bytes, n);
  ParallelFor(
      static_cast<int64_t>(QuantBlocks(n)), 60.0 * n,
      [&](int64_t first, int64_t last) {
        StepBlocks(first, last, master, m, v, weights_bf16, grads, grads_bf16, n, step);
      },
      threads);
}
}  // namespace

void HostAdamW8bit(float* master, void* m_bytes, void* v_bytes, uint16_t* weights_bf16, const float* grads,
                   int64_t n, const HostAdamWParams& p, int threads) {
  Step8bit(master, m_bytes, v_bytes, weights_bf16, grads, nullptr, n, p, threads);
}

void HostAdamW8bitFromBf16(float* master, void* m_bytes, void* v_bytes, uint16_t* weights_bf16,
                           const uint16_t* grads_bf16, int64_t n, const HostAdamWParams& p, int threads) {
  Step8bit(master, m_bytes, v_bytes, weights_bf16, nullptr, grads_bf16, n, p, threads);
}

}  // namespace tierd::trainer
