// FP8 numbers as the H200's tensor cores read them (OCP FP8: E4M3 "fn", no infinities,
// max 448; E5M2, IEEE-like, max 57344) and the per-tensor scaling that makes a tensor's
// values fit them: the CPU reference for the GPU's conversions (cuda_fp8.h's
// __nv_cvt_float_to_fp8 with __NV_SATFINITE: round to nearest even, finite values past the
// largest saturate to it, NaN stays NaN) and Transformer Engine's delayed scaling (the
// scale from the largest |x| over a window of past steps).
//
// Thread-safety: the functions are pure; a DelayedScaling is one tensor's, used by one thread.
#ifndef TIERD_TRAINER_REF_FP8_H_
#define TIERD_TRAINER_REF_FP8_H_

#include <cstdint>
#include <deque>
#include <string>

namespace tierd::trainer::fp8 {

enum class Format { kE4M3, kE5M2 };

// The largest finite value: 448 (E4M3), 57344 (E5M2).
float MaxFinite(Format format);
// The smallest normal value: 2^-6 (E4M3), 2^-14 (E5M2). Below it a value keeps fewer
// significant bits (subnormal codes) and below half the smallest subnormal it is 0.
float MinNormal(Format format);
// The code of `x` (rounded to nearest even; beyond the largest finite, saturated to it,
// infinities included; NaN to a NaN code).
uint8_t Encode(float x, Format format);
// The value of a code (NaN codes to NaN; E5M2's infinity codes to infinity).
float Decode(uint8_t code, Format format);
// x rounded to the nearest FP8 value: Decode(Encode(x)).
inline float Round(float x, Format format) { return Decode(Encode(x, format), format); }
const char* FormatName(Format format);

// Current scaling's scale for a tensor whose largest |x| is `amax`: MaxFinite / amax (in
// fp32, rounded once), so the tensor's largest value lands on the format's largest. An amax
// of 0 (all zeros), not finite (an overflow upstream: the codes saturate or stay NaN and the
// loss shows it) or so small that the quotient is not finite gives 1.
float CurrentScale(float amax, Format format);

// One tensor's scale: values are stored as code = Encode(x * scale) and read back as
// Decode(code) * scale_inv. Delayed (Transformer Engine's recipe): each step records the
// tensor's amax; the scale for the next step is MaxFinite / max(the last `window` amaxes) /
// 2^margin. An amax of 0 or not finite keeps the previous scale (and counts as an overflow
// when not finite). Current scaling is the same with a window of one, recorded before use.
// Until a positive amax has been recorded (has_scale) the scale is 1 and means nothing: a
// trainer converts at the current scale then, and no saturation or underflow is counted.
// This is the reference the GPU's scaling state (fp8_ops.h: UpdateDelayedScaling) is tested
// against, bit for bit.
class DelayedScaling {
 public:
  explicit DelayedScaling(Format format, int window = 16, int margin = 0);
  // Fixed scaling (a debugging mode): the scale is `scale` from the start and never moves;
  // Record still keeps the history and counts overflows, saturation and underflow against it,
  // so a scale that does not suit the tensor shows.
  static DelayedScaling Fixed(Format format, float scale);
  // The amax this step's tensor had (before scaling); updates the scale for the next step.
  void Record(float amax);
  float scale() const { return scale_; }
  float scale_inv() const { return 1.0f / scale_; }
  bool has_scale() const { return has_scale_; }
  // Steps whose amax was not finite (an overflow upstream); steps in a row where the scaled
  // amax was more than twice the format's largest value, so the largest values were cut to
  // less than half (the window's max fell behind a growing tensor; a tensor that merely grows
  // a little, as weights do in training, clips its largest value by about as much as FP8
  // rounds it, which is not counted);
  // steps in a row where it fell below the format's smallest normal value (a tensor that
  // shrank past what its window's max allows: every value lost precision). What a precision
  // policy falls back on.
  int non_finite() const { return non_finite_; }
  int saturated_in_a_row() const { return saturated_in_a_row_; }
  int underflow_in_a_row() const { return underflow_in_a_row_; }
  std::string Describe() const;

 private:
  Format format_;
  int window_, margin_;
  std::deque<float> history_;
  float scale_ = 1.0f;
  bool has_scale_ = false;
  bool fixed_ = false;
  int non_finite_ = 0, saturated_in_a_row_ = 0, underflow_in_a_row_ = 0;
};

}  // namespace tierd::trainer::fp8

#endif  // TIERD_TRAINER_REF_FP8_H_
