// What a lease describes: a named tensor with a class, a dtype and a shape. Names are
// how pins, stats and tools refer to tensors ("layers.12.attn.wqkv", "opt.m.layers.3").
#ifndef TIERD_RUNTIME_TENSOR_H_
#define TIERD_RUNTIME_TENSOR_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "base/access.h"

namespace tierd {

enum class TensorClass : uint8_t { kParam, kGrad, kOptState, kActivation, kScratch };
enum class DType : uint8_t { kF32, kBF16, kF16, kF8E4M3, kF8E5M2, kI32, kI64, kU8 };

const char* TensorClassName(TensorClass c);
const char* DTypeName(DType d);
uint32_t DTypeBytes(DType d);
absl::StatusOr<TensorClass> ParseTensorClass(absl::string_view text);
absl::StatusOr<DType> ParseDType(absl::string_view text);

struct TensorSpec {
  std::string name;
  TensorClass tensor_class = TensorClass::kParam;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
};

inline constexpr size_t kTensorNameBytesMax = 256;
inline constexpr size_t kTensorRankMax = 8;

// INVALID_ARGUMENT naming the problem (empty or over-long name, characters outside
// [A-Za-z0-9._:/-], a rank above kTensorRankMax, a dimension <= 0, a size that overflows).
// Otherwise the size in bytes.
absl::StatusOr<uint64_t> ValidateTensorSpec(const TensorSpec& spec);

}  // namespace tierd

#endif  // TIERD_RUNTIME_TENSOR_H_
