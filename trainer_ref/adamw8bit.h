// AdamW with 8-bit blockwise moments on the host (--opt=adamw8bit): the optimizer state of
// a parameter is its fp32 master weight (4 B) and two one-byte moment codes plus, per block
// of 256 (q8::kQuantBlock), two fp32 scales — ~6 B instead of 12, so a 7B model's state is ~42 GB and a 13B
// one's ~78 GB. The arithmetic is adamw8bit_block.h's, shared with the GPU kernel.
//
// A moment's bytes (Moment8bitBytes(n), all zero for a zero moment): n codes, padded to 16
// bytes, then ceil(n / 256) fp32 absmax values. The second moment's bytes hold its square
// root (adamw8bit_block.h says why): Dequantize8bit of them gives sqrt(v).
#ifndef TIERD_TRAINER_REF_ADAMW8BIT_H_
#define TIERD_TRAINER_REF_ADAMW8BIT_H_

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "trainer_ref/adamw8bit_block.h"
#include "trainer_ref/host_adamw.h"

namespace tierd::trainer {

// The 256 values of the first moment's (signed) or the second's (unsigned) map, ascending;
// both hold 0 and 1. Its 255 thresholds: the midpoints of neighbouring values.
const std::array<float, q8::kCodes>& DynamicMap(bool is_signed);
const std::array<float, q8::kCodes - 1>& Thresholds(bool is_signed);
// A normalized value's code (q8::CodeBySearch's count) through a table of 2^17 entries keyed
// by the value's sign, exponent and top 8 mantissa bits (the key's first code and its one
// threshold's low bits), then one integer compare.
uint8_t CodeOf(bool is_signed, float normalized);
// That table (q8::kTableKeys entries, q8::CodeByTable reads it), made once per process: what
// the GPU's table path copies to the device.
const int32_t* CodeTable(bool is_signed);
// Which instruction set the host's table lookups (quantizing, dequantizing) run with:
// "avx512vbmi" (dequantizing by byte permutes), "avx512", "avx2" or "plain"
// (TIERD_HOST_SIMD=plain|avx2|avx512 picks a lesser one). Every path gives the same bits.
const char* HostLookupPath();
// Takes the best path the CPU has at or below `want` ("avx512vbmi", "avx512", "avx2", "plain");
// returns its name. For benchmarks: not while a step runs.
const char* UseHostLookupPath(const std::string& want);

uint64_t Moment8bitBytes(uint64_t n);
inline uint64_t QuantBlocks(uint64_t n) { return (n + q8::kQuantBlock - 1) / q8::kQuantBlock; }
// Where the codes and the scales of a moment of n values are within its bytes.
struct Moment8bit {
  uint8_t* codes;
  float* absmax;
};
Moment8bit MomentAt(void* bytes, uint64_t n);

// n values into a moment's bytes and back (for tests, loaders and the oracle).
void Quantize8bit(const float* values, uint64_t n, bool is_signed, void* bytes);
void Dequantize8bit(const void* bytes, uint64_t n, bool is_signed, float* values);

// One AdamW step on n parameters with 8-bit moments m_bytes and v_bytes (Moment8bitBytes(n)
// each, updated in place); master updated in place; weights_bf16, when not null, receives
// the new master rounded to bf16. Blocks are split over `threads` (0: CpuThreads());
// results do not depend on the count.
void HostAdamW8bit(float* master, void* m_bytes, void* v_bytes, uint16_t* weights_bf16, const float* grads,
                   int64_t n, const HostAdamWParams& p, int threads = 0);

// The same step from bf16 gradients, each block widened as it is read: the bits of
// HostAdamW8bit on the widened array, without a pass through an fp32 copy.
void HostAdamW8bitFromBf16(float* master, void* m_bytes, void* v_bytes, uint16_t* weights_bf16,
                           const uint16_t* grads_bf16, int64_t n, const HostAdamWParams& p, int threads = 0);

// The per-element arithmetic's parameters for a step (bias corrections included).
q8::ElementStep ElementStepFor(const HostAdamWParams& p);

}  // namespace tierd::trainer

#endif  // TIERD_TRAINER_REF_ADAMW8BIT_H_
