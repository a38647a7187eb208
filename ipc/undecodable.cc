#include "ipc/undecodable.h"

#include <string>

namespace tierd::ipc {
namespace {

class UndecodableRequest final : public grpc::experimental::Interceptor {
 public:
  explicit UndecodableRequest(std::string method) : method_(std::move(method)) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    using grpc::experimental::InterceptionHookPoints;
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS)) {
      // tierd's handlers say why they fail; only gRPC's own decode failure is INTERNAL
      // with nothing said.
      const grpc::Status status = methods->GetSendStatus();
      if (status.error_code() == grpc::StatusCode::INTERNAL && status.error_message().empty()) {
        methods->ModifySendStatus(grpc::Status(
            grpc::StatusCode::INVALID_ARGUMENT,
            "tierd could not decode this " + method_ +
                " request: a string field (a tensor or op name, a label) that is not valid UTF-8, or bytes that are "
                "not that message; nothing was done"));
      }
    }
    methods->Proceed();
  }

 private:
  const std::string method_;
};

class UndecodableRequestFactory final : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  grpc::experimental::Interceptor* CreateServerInterceptor(grpc::experimental::ServerRpcInfo* info) override {
    return new UndecodableRequest(info->method() != nullptr ? info->method() : "");
  }
};

}  // namespace

std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> UndecodableRequestInterceptors() {
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> out;
  out.push_back(std::make_unique<UndecodableRequestFactory>());
  return out;
}

}  // namespace tierd::ipc
