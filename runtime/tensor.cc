#include "runtime/tensor.h"

#include "absl/status/status.h"
#include "absl/strings/str_format.h"

namespace tierd {

const char* TensorClassName(TensorClass c) {
  switch (c) {
    case TensorClass::kParam: return "param";
    case TensorClass::kGrad: return "grad";
    case TensorClass::kOptState: return "opt_state";
    case TensorClass::kActivation: return "activation";
    case TensorClass::kScratch: return "scratch";
  }
  return "?";
}

const char* DTypeName(DType d) {
  switch (d) {
    case DType::kF32: return "f32";
    case DType::kBF16: return "bf16";
    case DType::kF16: return "f16";
    case DType::kF8E4M3: return "f8e4m3";
    case DType::kF8E5M2: return "f8e5m2";
    case DType::kI32: return "i32";
    case DType::kI64: return "i64";
    case DType::kU8: return "u8";
  }
  return "?";
}

uint32_t DTypeBytes(DType d) {
  switch (d) {
    case DType::kF32: case DType::kI32: return 4;
    case DType::kBF16: case DType::kF16: return 2;
    case DType::kF8E4M3: case DType::kF8E5M2: case DType::kU8: return 1;
    case DType::kI64: return 8;
  }
  return 0;
}

absl::StatusOr<TensorClass> ParseTensorClass(absl::string_view text) {
  for (TensorClass c : {TensorClass::kParam, TensorClass::kGrad, TensorClass::kOptState,
                        TensorClass::kActivation, TensorClass::kScratch}) {
    if (text == TensorClassName(c)) return c;
  }
  return absl::InvalidArgumentError(absl::StrFormat(
      "unknown tensor class '%s' (param, grad, opt_state, activation, scratch)", text));
}

absl::StatusOr<DType> ParseDType(absl::string_view text) {
  for (DType d : {DType::kF32, DType::kBF16, DType::kF16, DType::kF8E4M3, DType::kF8E5M2,
                  DType::kI32, DType::kI64, DType::kU8}) {
    if (text == DTypeName(d)) return d;
  }
  return absl::InvalidArgumentError(absl::StrFormat(
      "unknown dtype '%s' (f32, bf16, f16, f8e4m3, f8e5m2, i32, i64, u8)", text));
}

absl::StatusOr<uint64_t> ValidateTensorSpec(const TensorSpec& spec) {
  if (spec.name.empty() || spec.name.size() > kTensorNameBytesMax) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "tensor name must have 1 to %d characters (got %d)", kTensorNameBytesMax, spec.name.size()));
  }
  for (char c : spec.name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '.' || c == '_' || c == ':' || c == '/' || c == '-';
    if (!ok) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "tensor name '%s' has a character outside [A-Za-z0-9._:/-]",
          absl::string_view(spec.name).substr(0, 64)));
    }
  }
  if (spec.shape.empty() || spec.shape.size() > kTensorRankMax) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "tensor '%s': rank %d, must be 1 to %d", spec.name, spec.shape.size(), kTensorRankMax));
  }
  const uint32_t element = DTypeBytes(spec.dtype);
  if (element == 0) return absl::InvalidArgumentError(absl::StrFormat("tensor '%s': bad dtype", spec.name));
  unsigned __int128 bytes = element;
  for (int64_t dim : spec.shape) {
    if (dim <= 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("tensor '%s': dimension %d is not positive", spec.name, dim));
    }
    bytes *= static_cast<uint64_t>(dim);
    if (bytes > (uint64_t{1} << 50)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("tensor '%s': larger than 1 PiB (shape overflow?)", spec.name));
    }
  }
  return static_cast<uint64_t>(bytes);
}

}  // namespace tierd
