// A hot-path request (an acquire, a release, an op's start) in one form for both of tierd's
// doors, and its one encoding on each: the shared-memory ring's 64-byte message and gRPC's
// messages. Clients encode with these and the daemon decodes with them; ipc/hot_path_door.h
// serves what was decoded. Nothing here links the storage engine.
#ifndef TIERD_IPC_HOT_PATH_WIRE_H_
#define TIERD_IPC_HOT_PATH_WIRE_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "base/access.h"
#include "ipc/ring.h"
#include "proto/tierd.pb.h"
#include "runtime/session.h"

namespace tierd::ipc {

enum class HotPathKind : uint8_t { kAcquire, kRelease, kOpBegin };

struct HotPathRequest {
  HotPathKind kind = HotPathKind::kAcquire;
  TensorId tensor = 0;             // acquire, release
  Access access = Access::kRead;   // acquire
  Place place = Place::kGpu;       // acquire
  uint32_t op = 0;                 // op begin: the op's index in the session's registered graph
  uint64_t release_event = 0;      // ring release: 1 + the index of the client's shared event
                                   // recorded after its GPU work on the tensor; 0: none
};

// The ring. A message that is not a request (an unknown op, access or place; an op index past
// 32 bits) is INVALID_ARGUMENT naming the field and its value.
RingMessage ToRing(const HotPathRequest& request);
absl::StatusOr<HotPathRequest> FromRing(const RingMessage& message);

// gRPC. The caller adds the session's reference.
v1::AcquireRequest ToAcquireRequest(const HotPathRequest& request);
absl::StatusOr<HotPathRequest> FromProto(const v1::AcquireRequest& request);
HotPathRequest ReleaseFromProto(const v1::TensorRef& request);
HotPathRequest OpBeginFromProto(const v1::OpBeginRequest& request);

}  // namespace tierd::ipc

#endif  // TIERD_IPC_HOT_PATH_WIRE_H_
