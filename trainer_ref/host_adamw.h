// AdamW on the host for state that lives in DRAM (tierd's shared DRAM tier): the
// arithmetic of the GPU kernel (gpu_ops' AdamW: fp32, gradients scaled first, bias
// correction, decoupled decay, bf16 weights written from the new master), split over the
// host's threads in contiguous slices, its loop simple enough for the compiler to
// vectorise. Results do not depend on the thread count.
#ifndef TIERD_TRAINER_REF_HOST_ADAMW_H_
#define TIERD_TRAINER_REF_HOST_ADAMW_H_

#include <bit>
#include <cstdint>

namespace tierd::trainer {

struct HostAdamWParams {
  float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.1f;
  int64_t step = 1;        // from 1 (bias correction)
  float grad_scale = 1.f;  // the clip factor / accumulation divisor, applied to each gradient
  bool decay = true;       // false for norm weights
};

// master, m, v updated in place from grads; when `weights_bf16` is not null it receives
// the new master rounded to bf16 (nearest, ties to even), as the GPU's weights are.
// `threads` 0: CpuThreads().
void HostAdamW(float* master, float* m, float* v, uint16_t* weights_bf16, const float* grads, int64_t n,
               const HostAdamWParams& p, int threads = 0);

// HostAdamW in two halves, for a step whose first moment is exchanged between them (the
// trainer's --sparse_sync=momentum) and whose second moment stays as it is: the first
// moment m from grads, as HostAdamW updates it; then the master weights from a first
// moment `m_used` and an unchanged v, as HostAdamW steps them. The same operations, so with
// m_used = m and v = HostAdamW's new v, the same bits as HostAdamW.
void HostMomentum(float* m, const float* grads, int64_t n, const HostAdamWParams& p);
void HostAdamWFromMoments(float* master, const float* m_used, const float* v, int64_t n, const HostAdamWParams& p);

// bf16 bits of x, rounded to nearest even (NaN stays a quiet NaN), as the GPU rounds.
// Inline, a select and not a branch: the loops that call it vectorise.
inline uint16_t Bf16Bits(float x) {
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  const uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (bits >> 16) | 0x40u;
  return static_cast<uint16_t>((bits & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}

// The fp32 value of bf16 bits (exact: a bf16 is an fp32's upper half). Inline for the same reason.
inline float Bf16Float(uint16_t bits) { return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16); }

}  // namespace tierd::trainer

#endif  // TIERD_TRAINER_REF_HOST_ADAMW_H_
