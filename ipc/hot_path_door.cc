#include "ipc/hot_path_door.h"

#include <utility>

#include "ipc/proto_convert.h"

namespace tierd::ipc {

absl::StatusOr<Placement> Serve(SessionService& service, SessionId session, const HotPathRequest& request,
                                std::unique_ptr<GpuFence> fence) {
  switch (request.kind) {
    case HotPathKind::kAcquire:
      return service.Acquire(session, request.tensor, request.access, request.place);
    case HotPathKind::kRelease:
      if (absl::Status s = service.Release(session, request.tensor, std::move(fence)); !s.ok()) return s;
      return Placement{};
    case HotPathKind::kOpBegin:
      if (absl::Status s = service.OpBegin(session, request.op); !s.ok()) return s;
      return Placement{};
  }
  return absl::InvalidArgumentError("unknown hot-path request");
}

void AnswerOnRing(const absl::StatusOr<Placement>& served, RingMessage* response, std::string* error) {
  response->code = static_cast<int32_t>(served.status().code());
  if (!served.ok()) {
    *error = std::string(served.status().message());
    return;
  }
  response->arena = served->arena;
  response->offset = served->offset;
  response->bytes = served->bytes;
  response->fetched = served->fetched;
}

void ToReply(const Placement& placement, v1::AcquireReply* reply) {
  reply->set_tier(ToProto(placement.tier));
  reply->set_arena_id(placement.arena);
  reply->set_offset(placement.offset);
  reply->set_bytes(placement.bytes);
  reply->set_fetched(placement.fetched);
}

}  // namespace tierd::ipc
