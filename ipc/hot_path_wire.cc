#include "ipc/hot_path_wire.h"

#include "absl/strings/str_format.h"
#include "ipc/proto_convert.h"

namespace tierd::ipc {
namespace {

// On the ring: access 0 read, 1 write, 2 overwrite; place 0 GPU, 1 host.
uint8_t RingAccess(Access access) { return static_cast<uint8_t>(access); }
uint8_t RingPlace(Place place) { return place == Place::kHost ? 1 : 0; }

}  // namespace

RingMessage ToRing(const HotPathRequest& request) {
  RingMessage message{};
  switch (request.kind) {
    case HotPathKind::kAcquire:
      message.op = static_cast<uint32_t>(RingOp::kAcquire);
      message.tensor_id = request.tensor;
      message.access = RingAccess(request.access);
      message.place = RingPlace(request.place);
      break;
    case HotPathKind::kRelease:
      message.op = static_cast<uint32_t>(RingOp::kRelease);
      message.tensor_id = request.tensor;
      message.event = request.release_event;
      break;
    case HotPathKind::kOpBegin:
      message.op = static_cast<uint32_t>(RingOp::kOpBegin);
      message.tensor_id = request.op;
      break;
  }
  return message;
}

absl::StatusOr<HotPathRequest> FromRing(const RingMessage& message) {
  HotPathRequest request;
  switch (static_cast<RingOp>(message.op)) {
    case RingOp::kAcquire:
      if (message.access > RingAccess(Access::kOverwrite)) {
        return absl::InvalidArgumentError(
            absl::StrFormat("malformed ring request: access %d (0 read, 1 write, 2 overwrite)", message.access));
      }
      if (message.place > 1) {
        return absl::InvalidArgumentError(
            absl::StrFormat("malformed ring request: place %d (0 GPU, 1 host)", message.place));
      }
      request.kind = HotPathKind::kAcquire;
      request.tensor = message.tensor_id;
      request.access = static_cast<Access>(message.access);
      request.place = message.place == 1 ? Place::kHost : Place::kGpu;
      return request;
    case RingOp::kRelease:
      request.kind = HotPathKind::kRelease;
      request.tensor = message.tensor_id;
      request.release_event = message.event;
      return request;
    case RingOp::kOpBegin:
      if (message.tensor_id > UINT32_MAX) {
        return absl::InvalidArgumentError(
            absl::StrFormat("malformed ring request: op index %d is past 32 bits", message.tensor_id));
      }
      request.kind = HotPathKind::kOpBegin;
      request.op = static_cast<uint32_t>(message.tensor_id);
      return request;
  }
  return absl::InvalidArgumentError(
      absl::StrFormat("malformed ring request: op %d (1 acquire, 2 release, 3 op begin)", message.op));
}

v1::AcquireRequest ToAcquireRequest(const HotPathRequest& request) {
  v1::AcquireRequest out;
  out.set_tensor_id(request.tensor);
  out.set_access(ToProto(request.access));
  out.set_place(ToProto(request.place));
  return out;
}

absl::StatusOr<HotPathRequest> FromProto(const v1::AcquireRequest& request) {
  auto access = ipc::FromProto(request.access());
  if (!access.ok()) return access.status();
  auto place = ipc::FromProto(request.place());
  if (!place.ok()) return place.status();
  return HotPathRequest{.kind = HotPathKind::kAcquire, .tensor = request.tensor_id(), .access = *access,
                        .place = *place};
}

HotPathRequest ReleaseFromProto(const v1::TensorRef& request) {
  return HotPathRequest{.kind = HotPathKind::kRelease, .tensor = request.tensor_id()};
}

HotPathRequest OpBeginFromProto(const v1::OpBeginRequest& request) {
  return HotPathRequest{.kind = HotPathKind::kOpBegin, .op = request.op()};
}

}  // namespace tierd::ipc
