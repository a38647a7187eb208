// The fixture of the tests of LeaseTable's side of the planner (lease_table_plan_test,
// lease_table_room_test): real tiers over a fake GPU whose copies wait on a gate the test
// opens, one session, and helpers to write, read and find tensors.
#ifndef TIERD_RUNTIME_LEASE_TABLE_PLAN_TEST_UTIL_H_
#define TIERD_RUNTIME_LEASE_TABLE_PLAN_TEST_UTIL_H_

#include <gtest/gtest.h>

#include <condition_variable>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "runtime/lease_table.h"
#include "runtime/lease_table_test_util.h"
#include "runtime/mover_test_util.h"

namespace tierd {

// A planner for the tests, by tensor name (the table tells it each name's id): any of next
// uses, layout offsets and a record of the tiers' moves for room; without next uses the
// tiers make room least-recently-used.
class NamedPlanner final : public SessionPlanner {
 public:
  std::function<int64_t(const std::string& name)> next_use;
  std::function<std::optional<uint64_t>(const std::string& name, Tier tier)> layout;
  std::function<void(const RoomMove& move)> room;

  void Leased(TensorId tensor, const std::string& name) override { names_[tensor] = name; }
  void Unleased(TensorId tensor) override { names_.erase(tensor); }
  int64_t NextUse(TensorId tensor) override { return next_use(names_[tensor]); }
  bool RanksUses() const override { return next_use != nullptr; }
  std::optional<uint64_t> LayoutOffset(TensorId tensor, Tier tier) override {
    return layout ? layout(names_[tensor], tier) : std::nullopt;
  }
  void AwaitPlannedMove(TensorId, Tier) override {}
  void ObserveRoomMove(const RoomMove& move) override {
    if (room) room(move);
  }

 private:
  std::map<TensorId, std::string> names_;
};

// A clock whose sleeps (the fake GPU's modelled link time) block while the gate is shut:
// a copy in flight stays in flight until the test opens it. Deterministic, no timing.
class GateClock final : public Clock {
 public:
  int64_t NowNanos() override { return RealClock().NowNanos(); }
  void SleepNanos(int64_t) override {
    std::unique_lock<std::mutex> lock(mutex_);
    ++sleepers_;
    changed_.notify_all();
    changed_.wait(lock, [this] { return open_; });
    --sleepers_;
  }
  void Shut() {
    std::lock_guard<std::mutex> lock(mutex_);
    open_ = false;
  }
  void Open() {
    std::lock_guard<std::mutex> lock(mutex_);
    open_ = true;
    changed_.notify_all();
  }
  void WaitForSleeper() {
    std::unique_lock<std::mutex> lock(mutex_);
    changed_.wait(lock, [this] { return sleepers_ > 0; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  bool open_ = true;
  int sleepers_ = 0;
};

class PlanMovesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    FakeGpuOptions gpu;
    gpu.link_bytes_per_second = 1e12;  // each copy "sleeps" on the gate clock
    gpu.within_bytes_per_second = 1e12;  // within the GPU too
    gpu.clock = &gate_;
    engine_ = testing::MakeDaemonEngine(::testing::UnitTest::GetInstance()->current_test_info()->name(),
                                        8 * kMiB, 16 * kMiB, 32 * kMiB, gpu);
    auto table = LeaseTable::Create(*engine_.store, *engine_.mover, RealClock(), {});
    ASSERT_TRUE(table.ok()) << table.status();
    table_ = std::move(*table);
    auto s = table_->OpenSession("plan", {4 * kMiB, 8 * kMiB, 16 * kMiB});
    ASSERT_TRUE(s.ok()) << s.status();
    session_ = *s;
  }
  void TearDown() override { gate_.Open(); }
  uint8_t* Pointer(const Placement& p) {
    return engine_.store->Address(Extent{p.tier, p.arena, Allocation{p.offset, p.bytes, 0}});
  }
  TensorId LeaseWritten(const std::string& name, uint64_t floats, uint8_t fill) {
    auto id = table_->Lease(session_, testing::Spec(name, floats));
    EXPECT_TRUE(id.ok()) << id.status();
    auto p = table_->Acquire(session_, *id, Access::kOverwrite, Place::kGpu);
    EXPECT_TRUE(p.ok()) << p.status();
    std::memset(Pointer(*p), fill, p->bytes);
    EXPECT_TRUE(table_->Release(session_, *id).ok());
    return *id;
  }
  bool Holds(TensorId id, uint8_t fill, bool* fetched = nullptr) {
    auto p = table_->Acquire(session_, id, Access::kRead, Place::kGpu);
    EXPECT_TRUE(p.ok()) << p.status();
    if (!p.ok()) return false;
    if (fetched) *fetched = p->fetched;
    bool same = true;
    for (uint64_t i = 0; i < p->bytes; ++i) same &= Pointer(*p)[i] == fill;
    EXPECT_TRUE(table_->Release(session_, id).ok());
    return same;
  }
  // Where a read acquire on the GPU finds the tensor (released again).
  uint64_t OffsetOf(TensorId id) {
    auto p = table_->Acquire(session_, id, Access::kRead, Place::kGpu);
    EXPECT_TRUE(p.ok()) << p.status();
    const uint64_t offset = p.ok() ? p->offset : UINT64_MAX;
    EXPECT_TRUE(table_->Release(session_, id).ok());
    return offset;
  }
  // The planner's static layout: GPU offsets by name.
  void UseLayout(std::map<std::string, uint64_t> layout) {
    layout_ = std::move(layout);
    auto planner = std::make_shared<NamedPlanner>();
    planner->layout = [this](const std::string& name, Tier tier) -> std::optional<uint64_t> {
      auto it = layout_.find(name);
      if (tier != Tier::kGpu || it == layout_.end()) return std::nullopt;
      return it->second;
    };
    ASSERT_TRUE(table_->SetPlanner(session_, planner).ok());
  }
  bool OnGpu(TensorId id) {
    for (const LeaseView& v : table_->List(session_)) {
      if (v.id == id) return v.copies[static_cast<int>(Tier::kGpu)];
    }
    return false;
  }

  GateClock gate_;
  testing::Engine engine_;
  std::unique_ptr<LeaseTable> table_;
  SessionId session_ = 0;
  std::map<std::string, uint64_t> layout_;
};

}  // namespace tierd

#endif  // TIERD_RUNTIME_LEASE_TABLE_PLAN_TEST_UTIL_H_
