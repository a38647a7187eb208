#include "ipc/proto_convert.h"

#include "absl/strings/str_format.h"

namespace tierd::ipc {

std::string BoundedMessage(absl::string_view message) {
  if (message.size() <= kReplyMessageMax) return std::string(message);
  // The head (what failed) and the tail (why), cut at character boundaries.
  auto boundary = [&message](size_t at) {
    while (at > 0 && at < message.size() && (static_cast<unsigned char>(message[at]) & 0xC0) == 0x80) --at;
    return at;
  };
  const size_t head = boundary(kReplyMessageMax * 3 / 4);
  const size_t tail = boundary(message.size() - kReplyMessageMax / 5);
  return absl::StrFormat("%s [... %d bytes cut ...] %s", message.substr(0, head), tail - head, message.substr(tail));
}

grpc::Status ToGrpc(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), BoundedMessage(status.message()));
}

absl::Status FromGrpc(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
}

absl::StatusOr<Tier> FromProto(v1::Tier tier) {
  switch (tier) {
    case v1::TIER_GPU: return Tier::kGpu;
    case v1::TIER_DRAM: return Tier::kDram;
    case v1::TIER_NVME: return Tier::kNvme;
    default: return absl::InvalidArgumentError(absl::StrFormat("tier %d is not gpu, dram or nvme", tier));
  }
}

v1::Tier ToProto(Tier tier) {
  switch (tier) {
    case Tier::kGpu: return v1::TIER_GPU;
    case Tier::kDram: return v1::TIER_DRAM;
    case Tier::kNvme: return v1::TIER_NVME;
  }
  return v1::TIER_UNSPECIFIED;
}

namespace {

constexpr std::pair<v1::TensorClass, TensorClass> kClasses[] = {
    {v1::TENSOR_CLASS_PARAM, TensorClass::kParam},
    {v1::TENSOR_CLASS_GRAD, TensorClass::kGrad},
    {v1::TENSOR_CLASS_OPT_STATE, TensorClass::kOptState},
    {v1::TENSOR_CLASS_ACTIVATION, TensorClass::kActivation},
    {v1::TENSOR_CLASS_SCRATCH, TensorClass::kScratch},
};
constexpr std::pair<v1::DType, DType> kDTypes[] = {
    {v1::DTYPE_F32, DType::kF32},       {v1::DTYPE_BF16, DType::kBF16},
    {v1::DTYPE_F16, DType::kF16},       {v1::DTYPE_F8E4M3, DType::kF8E4M3},
    {v1::DTYPE_F8E5M2, DType::kF8E5M2}, {v1::DTYPE_I32, DType::kI32},
    {v1::DTYPE_I64, DType::kI64},       {v1::DTYPE_U8, DType::kU8},
};

}  // namespace

absl::StatusOr<TensorSpec> FromProto(const v1::TensorSpec& spec) {
  TensorSpec out;
  out.name = spec.name();
  bool class_ok = false, dtype_ok = false;
  for (auto [wire, mine] : kClasses) {
    if (wire == spec.tensor_class()) out.tensor_class = mine, class_ok = true;
  }
  for (auto [wire, mine] : kDTypes) {
    if (wire == spec.dtype()) out.dtype = mine, dtype_ok = true;
  }
  if (!class_ok) {
    return absl::InvalidArgumentError(
        absl::StrFormat("tensor '%s': tensor_class %d is not a known class", spec.name(), spec.tensor_class()));
  }
  if (!dtype_ok) {
    return absl::InvalidArgumentError(
        absl::StrFormat("tensor '%s': dtype %d is not a known dtype", spec.name(), spec.dtype()));
  }
  out.shape.assign(spec.shape().begin(), spec.shape().end());
  return out;
}

v1::TensorSpec ToProto(const TensorSpec& spec) {
  v1::TensorSpec out;
  out.set_name(spec.name);
  for (auto [wire, mine] : kClasses) {
    if (mine == spec.tensor_class) out.set_tensor_class(wire);
  }
  for (auto [wire, mine] : kDTypes) {
    if (mine == spec.dtype) out.set_dtype(wire);
  }
  for (int64_t dim : spec.shape) out.add_shape(dim);
  return out;
}

absl::StatusOr<Place> FromProto(v1::Place place) {
  if (place == v1::PLACE_GPU) return Place::kGpu;
  if (place == v1::PLACE_HOST) return Place::kHost;
  return absl::InvalidArgumentError("place must be PLACE_GPU or PLACE_HOST");
}

v1::Place ToProto(Place place) { return place == Place::kHost ? v1::PLACE_HOST : v1::PLACE_GPU; }

v1::Access ToProto(Access access) {
  switch (access) {
    case Access::kRead:
      return v1::ACCESS_READ;
    case Access::kWrite:
      return v1::ACCESS_WRITE;
    case Access::kOverwrite:
      return v1::ACCESS_OVERWRITE;
  }
  return v1::ACCESS_READ;
}

absl::StatusOr<Access> FromProto(v1::Access access) {
  if (access == v1::ACCESS_READ) return Access::kRead;
  if (access == v1::ACCESS_WRITE) return Access::kWrite;
  if (access == v1::ACCESS_OVERWRITE) return Access::kOverwrite;
  return absl::InvalidArgumentError("access must be ACCESS_READ, ACCESS_WRITE or ACCESS_OVERWRITE");
}

}  // namespace tierd::ipc
