// A request gRPC cannot decode (a string field that is not UTF-8, a malformed message) never
// reaches tierd's handlers: gRPC answers it INTERNAL with no message. This server
// interceptor answers it INVALID_ARGUMENT instead, naming the method and what to check.
//
// Thread-safety: gRPC creates one interceptor per call.
#ifndef TIERD_IPC_UNDECODABLE_H_
#define TIERD_IPC_UNDECODABLE_H_

#include <grpcpp/support/server_interceptor.h>

#include <memory>
#include <vector>

namespace tierd::ipc {

// For grpc::ServerBuilder::experimental().SetInterceptorCreators.
std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> UndecodableRequestInterceptors();

}  // namespace tierd::ipc

#endif  // TIERD_IPC_UNDECODABLE_H_
