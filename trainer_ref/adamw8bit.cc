#include "trainer_ref/adamw8bit.h"

#include <algorithm>
#include <cmath>
#include <cstring>

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

inline float Bigger(float a, float b) { return b > a ? b : a; }

// Quantization blocks [first, last) of one step.
void StepBlocks(int64_t first, int64_t last, float* master, Moment8bit m, Moment8bit v, uint16_t* weights,
                const float* grads, int64_t n, const q8::ElementStep& step) {
  const float* signed_map = DynamicMap(true).data();
  const float* unsigned_map = DynamicMap(false).data();
  float new_m[q8::kQuantBlock], new_v[q8::kQuantBlock];
  for (int64_t b = first; b < last; ++b) {
    const int64_t begin = b * q8::kQuantBlock, count = std::min<int64_t>(q8::kQuantBlock, n - begin);
    float most_m = 0.f, most_v = 0.f;
    for (int64_t i = 0; i < count; ++i) {
      float mi = q8::Mul(signed_map[m.codes[begin + i]], m.absmax[b]);
      float vi = q8::Mul(unsigned_map[v.codes[begin + i]], v.absmax[b]);
      const float w = step(master[begin + i], grads[begin + i], mi, vi);
      master[begin + i] = w;
      if (weights != nullptr) weights[begin + i] = Bf16Bits(w);
      new_m[i] = mi;
      new_v[i] = vi;
      most_m = Bigger(most_m, std::fabs(mi));
      most_v = Bigger(most_v, vi);
    }
    m.absmax[b] = most_m;
    v.absmax[b] = most_v;
    for (int64_t i = 0; i < count; ++i) {
      m.codes[begin + i] = q8::Encode(signed_map, new_m[i], most_m);
      v.codes[begin + i] = q8::Encode(unsigned_map, new_v[i], most_v);
    }
  }
}

}  // namespace

const std::array<float, q8::kCodes>& DynamicMap(bool is_signed) {
  static const std::array<float, q8::kCodes> signed_map = MakeDynamicMap(true);
  static const std::array<float, q8::kCodes> unsigned_map = MakeDynamicMap(false);
  return is_signed ? signed_map : unsigned_map;
}

uint64_t Moment8bitBytes(uint64_t n) { return (n + 15) / 16 * 16 + 4 * QuantBlocks(n); }

Moment8bit MomentAt(void* bytes, uint64_t n) {
  auto* base = static_cast<uint8_t*>(bytes);
  return {base, reinterpret_cast<float*>(base + (n + 15) / 16 * 16)};
}

void Quantize8bit(const float* values, uint64_t n, bool is_signed, void* bytes) {
  const Moment8bit out = MomentAt(bytes, n);
  const float* map = DynamicMap(is_signed).data();
  for (uint64_t b = 0; b < QuantBlocks(n); ++b) {
    const uint64_t begin = b * q8::kQuantBlock, end = std::min<uint64_t>(n, begin + q8::kQuantBlock);
    float most = 0.f;
    for (uint64_t i = begin; i < end; ++i) most = Bigger(most, std::fabs(values[i]));
    out.absmax[b] = most;
    for (uint64_t i = begin; i < end; ++i) out.codes[i] = q8::Encode(map, values[i], most);
  }
}

void Dequantize8bit(const void* bytes, uint64_t n, bool is_signed, float* values) {
  const Moment8bit in = MomentAt(const_cast<void*>(bytes), n);
  const float* map = DynamicMap(is_signed).data();
  for (uint64_t i = 0; i < n; ++i) values[i] = q8::Mul(map[in.codes[i]], in.absmax[i / q8::kQuantBlock]);
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

void HostAdamW8bit(float* master, void* m_bytes, void* v_bytes, uint16_t* weights_bf16, const float* grads,
                   int64_t n, const HostAdamWParams& p, int threads) {
  const q8::ElementStep step = ElementStepFor(p);
  const Moment8bit m = MomentAt(m_bytes, n), v = MomentAt(v_bytes, n);
  const int64_t blocks = static_cast<int64_t>(QuantBlocks(n));
  ParallelFor(
      blocks, 60.0 * n,
      [&](int64_t first, int64_t last) { StepBlocks(first, last, master, m, v, weights_bf16, grads, n, step); },
      threads);
}

}  // namespace tierd::trainer
