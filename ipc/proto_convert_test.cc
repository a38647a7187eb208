#include "ipc/proto_convert.h"

#include <gtest/gtest.h>

namespace tierd::ipc {
namespace {

TEST(ProtoConvertTest, SpecsRoundTrip) {
  const TensorSpec spec{"layers.3.mlp.w1", TensorClass::kOptState, DType::kBF16, {4096, 11008}};
  auto back = FromProto(ToProto(spec));
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->name, spec.name);
  EXPECT_EQ(back->tensor_class, spec.tensor_class);
  EXPECT_EQ(back->dtype, spec.dtype);
  EXPECT_EQ(back->shape, spec.shape);
}

TEST(ProtoConvertTest, UnknownAndUnspecifiedValuesAreInvalid) {
  v1::TensorSpec spec;
  spec.set_name("x");
  spec.set_dtype(v1::DTYPE_F32);
  EXPECT_EQ(FromProto(spec).status().code(), absl::StatusCode::kInvalidArgument);  // no class
  spec.set_tensor_class(v1::TENSOR_CLASS_PARAM);
  spec.set_dtype(static_cast<v1::DType>(99));
  EXPECT_EQ(FromProto(spec).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(FromProto(static_cast<v1::Access>(77)).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(FromProto(v1::PLACE_UNSPECIFIED).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(FromProto(v1::TIER_UNSPECIFIED).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ToGrpc(absl::ResourceExhaustedError("full")).error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_EQ(FromGrpc(grpc::Status(grpc::StatusCode::NOT_FOUND, "x")).code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace tierd::ipc
