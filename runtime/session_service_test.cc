// SessionService is the one place an acquire, a release or an op's start is done for both
// doors: the lease table's answer comes back as is, and the planner hears exactly the
// successful requests, in order, with the acquire's own duration.
#include "runtime/session_service.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "runtime/lease_table_test_util.h"

namespace tierd {
namespace {

using testing::LeaseTableTest;
using testing::Spec;

// Every reading is 1000 ns after the one before: an acquire "takes" 1000 ns.
class SteppingClock final : public Clock {
 public:
  int64_t NowNanos() override { return now_ += 1000; }
  void SleepNanos(int64_t) override {}

 private:
  int64_t now_ = 0;
};

class Recorder final : public HotPathObserver {
 public:
  absl::Status OpBegin(SessionId session, uint32_t op) override {
    heard.push_back("op " + std::to_string(session) + " " + std::to_string(op));
    return op == 99 ? absl::OutOfRangeError("no op 99") : absl::OkStatus();
  }
  void Acquired(SessionId session, TensorId tensor, Access access, Place place, int64_t waited_nanos) override {
    heard.push_back("acquired " + std::to_string(session) + " " + std::to_string(tensor) + " " +
                    std::to_string(static_cast<int>(access)) + " " + std::to_string(static_cast<int>(place)) + " " +
                    std::to_string(waited_nanos));
  }
  void Released(SessionId session, TensorId tensor) override {
    heard.push_back("released " + std::to_string(session) + " " + std::to_string(tensor));
  }
  std::vector<std::string> heard;
};

using SessionServiceTest = LeaseTableTest;

TEST_F(SessionServiceTest, ThePlannerHearsEachSuccessfulRequestOnceAndInOrder) {
  auto table = Table();
  SteppingClock clock;
  SessionService service(*table, clock);
  EXPECT_EQ(service.OpBegin(1, 0).code(), absl::StatusCode::kUnimplemented) << "no planner yet";
  Recorder recorder;
  service.set_observer(&recorder);
  auto session = table->OpenSession("s", {kMiB, kMiB, 4 * kMiB});
  ASSERT_TRUE(session.ok()) << session.status();
  auto tensor = table->Lease(*session, Spec("w", 1024));
  ASSERT_TRUE(tensor.ok()) << tensor.status();

  ASSERT_TRUE(service.OpBegin(*session, 3).ok());
  auto placement = service.Acquire(*session, *tensor, Access::kWrite, Place::kGpu);
  ASSERT_TRUE(placement.ok()) << placement.status();
  EXPECT_EQ(placement->bytes, 4096u);
  EXPECT_EQ(placement->tier, Tier::kGpu);
  ASSERT_TRUE(service.Release(*session, *tensor).ok());
  // Refusals pass through untouched and are not heard.
  EXPECT_EQ(service.Acquire(*session, *tensor + 100, Access::kRead, Place::kGpu).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_FALSE(service.Release(*session, *tensor).ok()) << "not acquired";
  EXPECT_EQ(service.OpBegin(*session, 99).code(), absl::StatusCode::kOutOfRange) << "the planner's answer";

  const std::string s = std::to_string(*session), t = std::to_string(*tensor);
  const std::vector<std::string> want = {
      "op " + s + " 3",
      "acquired " + s + " " + t + " " + std::to_string(static_cast<int>(Access::kWrite)) + " " +
          std::to_string(static_cast<int>(Place::kGpu)) + " 1000",
      "released " + s + " " + t,
      "op " + s + " 99",
  };
  EXPECT_EQ(recorder.heard, want);
  // Every request is timed, refused or not (the unplanned op begin never reached a planner).
  const HotPathTimes times = service.times();
  EXPECT_EQ(times.acquires, 2);
  EXPECT_EQ(times.releases, 2);
  EXPECT_EQ(times.op_begins, 2);
  EXPECT_GT(times.acquire_seconds, 0);  // the stepping clock moves at each reading
  EXPECT_EQ(times.Describe().rfind("acquire 2 x ", 0), 0u) << times.Describe();
}

}  // namespace
}  // namespace tierd
