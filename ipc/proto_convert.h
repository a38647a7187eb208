// Conversions between the wire types (proto/tierd.proto) and the runtime's, and from
// absl::Status to grpc::Status. Unknown or unspecified enum values are INVALID_ARGUMENT.
#ifndef TIERD_IPC_PROTO_CONVERT_H_
#define TIERD_IPC_PROTO_CONVERT_H_

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "proto/tierd.pb.h"
#include "runtime/tensor.h"
#include "runtime/tier.h"
#include "base/access.h"

namespace tierd::ipc {

// Error messages sent back are at most ~kReplyMessageMax bytes: a request can make one echo
// a name of any length, and gRPC refuses trailing metadata above 8 KiB (the client then
// sees "metadata size exceeds limit" instead of the error).
inline constexpr size_t kReplyMessageMax = 1024;
std::string BoundedMessage(absl::string_view message);
grpc::Status ToGrpc(const absl::Status& status);
absl::Status FromGrpc(const grpc::Status& status);

absl::StatusOr<Tier> FromProto(v1::Tier tier);
v1::Tier ToProto(Tier tier);
absl::StatusOr<TensorSpec> FromProto(const v1::TensorSpec& spec);
v1::TensorSpec ToProto(const TensorSpec& spec);
absl::StatusOr<Place> FromProto(v1::Place place);
v1::Place ToProto(Place place);
absl::StatusOr<Access> FromProto(v1::Access access);
v1::Access ToProto(Access access);

}  // namespace tierd::ipc

#endif  // TIERD_IPC_PROTO_CONVERT_H_
