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

// A message echoing a 10 KB name is cut to its head and tail (under gRPC's 8 KiB metadata
// limit), at character boundaries; short ones go back whole.
TEST(ProtoConvertTest, ErrorRepliesAreBounded) {
  EXPECT_EQ(ToGrpc(absl::NotFoundError("no lease named 'x'")).error_message(), "no lease named 'x'");
  const std::string name(10000, 'n');
  const std::string message = "AdminPin: no tensor named '" + name + "\xc3\xa9' in session 3";
  const grpc::Status bounded = ToGrpc(absl::NotFoundError(message));
  EXPECT_EQ(bounded.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_LE(bounded.error_message().size(), kReplyMessageMax + 64);
  EXPECT_EQ(bounded.error_message().rfind("AdminPin: no tensor named 'nnn", 0), 0u) << bounded.error_message();
  EXPECT_NE(bounded.error_message().find("bytes cut"), std::string::npos);
  EXPECT_NE(bounded.error_message().find("' in session 3"), std::string::npos);
  std::string accented;
  for (int i = 0; i < 3000; ++i) accented += "\xc3\xa9";
  for (const std::string prefix : {"", "a"}) {  // the cuts fall on a first byte, then on a second
    const std::string m = BoundedMessage(prefix + accented);
    ASSERT_LT(m.size(), kReplyMessageMax + 64);
    for (size_t i = 0; i < m.size(); ++i) {
      const auto c = static_cast<unsigned char>(m[i]);
      if (c == 0xc3) {
        EXPECT_EQ(static_cast<unsigned char>(m[i + 1]), 0xa9) << "a first byte cut from its second at " << i;
      }
      if (c == 0xa9) {
        EXPECT_EQ(static_cast<unsigned char>(m[i - 1]), 0xc3) << "a second byte without its first at " << i;
      }
    }
  }
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
