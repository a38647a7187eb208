#include "ipc/ring.h"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <string>
#include <thread>

#include "absl/synchronization/notification.h"
#include "ipc/ring_server.h"

namespace tierd::ipc {
namespace {

RingSegment* Fresh(int* fd) {
  auto created = CreateRingSegment();
  EXPECT_TRUE(created.ok());
  *fd = *created;
  auto mapped = MapRingSegment(*fd);
  EXPECT_TRUE(mapped.ok());
  return *mapped;
}

TEST(RingTest, PushPopInOrderUntilFull) {
  int fd;
  RingSegment* s = Fresh(&fd);
  for (uint32_t i = 0; i < kRingSlots; ++i) ASSERT_TRUE(RingPush(s->requests, RingMessage{.sequence = i}));
  EXPECT_FALSE(RingPush(s->requests, RingMessage{.sequence = 999}));
  for (uint32_t i = 0; i < kRingSlots; ++i) {
    auto m = RingPop(s->requests, s->closed, 0);
    ASSERT_TRUE(m.ok());
    EXPECT_EQ(m->sequence, i);
  }
  EXPECT_EQ(RingPop(s->requests, s->closed, 10).status().code(), absl::StatusCode::kDeadlineExceeded);
  s->closed = 1;
  EXPECT_EQ(RingPop(s->requests, s->closed, -1).status().code(), absl::StatusCode::kUnavailable);
  UnmapRingSegment(s);
  close(fd);
}

TEST(RingTest, GarbageCountersAreDataLossNotACrash) {
  int fd;
  RingSegment* s = Fresh(&fd);
  s->requests.head.store(1000);  // a hostile client
  EXPECT_EQ(RingPop(s->requests, s->closed, 0).status().code(), absl::StatusCode::kDataLoss);
  UnmapRingSegment(s);
  close(fd);
  auto not_a_ring = memfd_create("x", 0);
  ASSERT_EQ(ftruncate(not_a_ring, sizeof(RingSegment)), 0);
  EXPECT_EQ(MapRingSegment(not_a_ring).status().code(), absl::StatusCode::kFailedPrecondition);
  close(not_a_ring);
}

// A client that scribbles over the request counters: the server reports the ring broken
// and stops serving it (the daemon keeps running; other sessions have their own rings).
TEST(RingServerTest, AScribbledRingIsReportedAndNoLongerServed) {
  int fd;
  RingSegment* s = Fresh(&fd);
  auto mine = MapRingSegment(fd);
  ASSERT_TRUE(mine.ok());
  std::atomic<int> served{0};
  absl::Notification broken;
  absl::Status why;
  {
    RingServer server(
        s,
        [&](const RingMessage& r, std::string*) {
          ++served;
          return r;
        },
        [&](const absl::Status& status) {
          why = status;
          broken.Notify();
        });
    ASSERT_TRUE(RingPush((*mine)->requests, RingMessage{.sequence = 1}));
    ASSERT_TRUE(RingPop((*mine)->responses, (*mine)->closed, 5000).ok());
    (*mine)->requests.head.store((*mine)->requests.head.load() + 5 * kRingSlots);
    RingWake((*mine)->requests);
    ASSERT_TRUE(broken.WaitForNotificationWithTimeout(absl::Seconds(5)));
  }
  EXPECT_EQ(why.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(served.load(), 1);
  UnmapRingSegment(*mine);
  close(fd);
}

// A server in this process, a client in a forked one: 20k round trips across processes,
// sleeping consumers woken by futex, every answer matched to its request.
TEST(RingTest, ServerAndClientInTwoProcesses) {
  int fd;
  RingSegment* s = Fresh(&fd);
  std::atomic<int> broken{0};
  RingServer server(
      s,
      [](const RingMessage& r, std::string* error) {
        RingMessage out = r;
        out.offset = r.tensor_id * 3;
        if (r.tensor_id % 7 == 0) {  // refused, with a reason of its own
          out.code = static_cast<int32_t>(absl::StatusCode::kNotFound);
          *error = "no tensor " + std::to_string(r.tensor_id);
        }
        return out;
      },
      [&](const absl::Status&) { ++broken; });
  const pid_t child = fork();
  if (child == 0) {
    auto mine = MapRingSegment(fd);
    if (!mine.ok()) _exit(2);
    for (uint64_t i = 0; i < 20000; ++i) {
      if (!RingPush((*mine)->requests, RingMessage{.sequence = i, .op = 1, .tensor_id = i})) _exit(3);
      if (i % 5000 == 0) usleep(20000);  // let the server fall asleep now and then
      auto answer = RingPop((*mine)->responses, (*mine)->closed, 5000);
      if (!answer.ok() || answer->sequence != i || answer->offset != i * 3) _exit(4);
      const bool refused = i % 7 == 0;
      if (answer->code != (refused ? static_cast<int32_t>(absl::StatusCode::kNotFound) : 0)) _exit(5);
      if (refused && RingErrorText(**mine, i) != "no tensor " + std::to_string(i)) _exit(6);
    }
    _exit(0);
  }
  int status = 0;
  waitpid(child, &status, 0);
  EXPECT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_EQ(broken.load(), 0);
  close(fd);
}

// The error text travels beside the answer, cut to its slot, and is read within the slot
// whatever the client finds there (no NUL: the whole slot, never past it).
TEST(RingTest, ErrorTextsAreCutToTheirSlotAndReadWithinIt) {
  int fd;
  RingSegment* s = Fresh(&fd);
  SetRingErrorText(*s, 3, "cannot place 1.18 GiB in gpu");
  EXPECT_EQ(RingErrorText(*s, 3), "cannot place 1.18 GiB in gpu");
  EXPECT_EQ(RingErrorText(*s, 3 + kRingSlots), "cannot place 1.18 GiB in gpu") << "slots repeat every kRingSlots";
  SetRingErrorText(*s, 4, std::string(5000, 'x'));
  EXPECT_EQ(RingErrorText(*s, 4), std::string(kRingErrorBytes - 1, 'x'));
  std::memset(s->errors[5], 'y', kRingErrorBytes);  // a hostile peer: no terminator
  EXPECT_EQ(RingErrorText(*s, 5), std::string(kRingErrorBytes, 'y'));
  UnmapRingSegment(s);
  close(fd);
}

}  // namespace
}  // namespace tierd::ipc
