#include "ipc/hot_path_wire.h"

#include <gtest/gtest.h>

#include <vector>

namespace tierd::ipc {
namespace {

std::vector<HotPathRequest> EveryRequest() {
  std::vector<HotPathRequest> out;
  for (Access access : {Access::kRead, Access::kWrite, Access::kOverwrite}) {
    for (Place place : {Place::kGpu, Place::kHost}) {
      out.push_back({.kind = HotPathKind::kAcquire, .tensor = 1234567890123ull, .access = access, .place = place});
    }
  }
  out.push_back({.kind = HotPathKind::kRelease, .tensor = 7});
  out.push_back({.kind = HotPathKind::kRelease, .tensor = 8, .release_event = 32});
  out.push_back({.kind = HotPathKind::kOpBegin, .op = UINT32_MAX});
  return out;
}

void ExpectSame(const HotPathRequest& a, const HotPathRequest& b) {
  EXPECT_EQ(a.kind, b.kind);
  EXPECT_EQ(a.tensor, b.tensor);
  EXPECT_EQ(a.access, b.access);
  EXPECT_EQ(a.place, b.place);
  EXPECT_EQ(a.op, b.op);
  EXPECT_EQ(a.release_event, b.release_event);
}

TEST(HotPathWireTest, EveryRequestCrossesTheRingUnchanged) {
  for (const HotPathRequest& request : EveryRequest()) {
    auto back = FromRing(ToRing(request));
    ASSERT_TRUE(back.ok()) << back.status();
    ExpectSame(request, *back);
  }
}

TEST(HotPathWireTest, EveryRequestCrossesGrpcUnchanged) {
  for (const HotPathRequest& request : EveryRequest()) {
    HotPathRequest back;
    if (request.kind == HotPathKind::kAcquire) {
      auto decoded = FromProto(ToAcquireRequest(request));
      ASSERT_TRUE(decoded.ok()) << decoded.status();
      back = *decoded;
    } else if (request.kind == HotPathKind::kRelease) {
      v1::TensorRef ref;
      ref.set_tensor_id(request.tensor);
      back = ReleaseFromProto(ref);
      back.release_event = request.release_event;  // gRPC's release waits for the stream itself
    } else {
      v1::OpBeginRequest begin;
      begin.set_op(request.op);
      back = OpBeginFromProto(begin);
    }
    ExpectSame(request, back);
  }
}

// The ring's wire format is the contract with clients built earlier: these bytes must not move.
TEST(HotPathWireTest, TheRingsFieldsAreTheDocumentedOnes) {
  RingMessage m = ToRing({.kind = HotPathKind::kAcquire, .tensor = 5, .access = Access::kOverwrite,
                          .place = Place::kHost});
  EXPECT_EQ(m.op, 1u);
  EXPECT_EQ(m.access, 2);
  EXPECT_EQ(m.place, 1);
  EXPECT_EQ(m.tensor_id, 5u);
  m = ToRing({.kind = HotPathKind::kRelease, .tensor = 6, .release_event = 3});
  EXPECT_EQ(m.op, 2u);
  EXPECT_EQ(m.event, 3u);
  m = ToRing({.kind = HotPathKind::kOpBegin, .op = 9});
  EXPECT_EQ(m.op, 3u);
  EXPECT_EQ(m.tensor_id, 9u);
}

TEST(HotPathWireTest, AMalformedRingMessageIsRefusedNamingTheField) {
  RingMessage m = ToRing({.kind = HotPathKind::kAcquire, .tensor = 5});
  m.access = 3;
  auto bad = FromRing(m);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("access 3"), std::string::npos) << bad.status();
  m.access = 0;
  m.place = 2;
  bad = FromRing(m);
  EXPECT_NE(bad.status().message().find("place 2"), std::string::npos) << bad.status();
  m.op = 9;
  bad = FromRing(m);
  EXPECT_NE(bad.status().message().find("op 9"), std::string::npos) << bad.status();
  m = ToRing({.kind = HotPathKind::kOpBegin});
  m.tensor_id = 1ull << 32;
  bad = FromRing(m);
  EXPECT_NE(bad.status().message().find("past 32 bits"), std::string::npos) << bad.status();
}

TEST(HotPathWireTest, AnUnknownGrpcEnumIsRefused) {
  v1::AcquireRequest request = ToAcquireRequest({.kind = HotPathKind::kAcquire, .tensor = 1});
  request.set_access(static_cast<v1::Access>(99));
  EXPECT_EQ(FromProto(request).status().code(), absl::StatusCode::kInvalidArgument);
  request = ToAcquireRequest({.kind = HotPathKind::kAcquire, .tensor = 1});
  request.set_place(v1::PLACE_UNSPECIFIED);
  EXPECT_EQ(FromProto(request).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tierd::ipc
