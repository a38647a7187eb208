// LeaseTable: leases, acquires and releases across the tiers, pins, sessions and their
// budgets, concurrency, and random operations that never lose a byte. (Under pressure:
// lease_table_pressure_test.cc; the planner's moves: lease_table_plan_test.cc; GPU fences:
// lease_table_fence_test.cc.)
#include "runtime/lease_table.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <map>
#include <random>
#include <thread>

#include "runtime/lease_table_test_util.h"

namespace tierd {
namespace {

using testing::LeaseTableTest;
using testing::Spec;

// A session's use of each tier: allocated bytes now, and the most since it opened or since
// the last reset (a trainer's peak per step).
TEST_F(LeaseTableTest, UsageHasPeaksThatReset) {
  auto table = Table();
  auto s = *table->OpenSession("usage", {2 * kMiB, 4 * kMiB, 8 * kMiB});
  const TensorId a = *table->Lease(s, Spec("a", 256 * 1024));  // 1 MiB each
  const TensorId b = *table->Lease(s, Spec("b", 256 * 1024));
  const TensorId c = *table->Lease(s, Spec("c", 256 * 1024));
  for (TensorId id : {a, b, c}) Write(*table, s, id, 7);  // on the GPU in turn: 2 MiB at most
  auto usage = table->Usage(s, /*reset_peaks=*/false);
  ASSERT_TRUE(usage.ok()) << usage.status();
  const auto& gpu = (*usage)[static_cast<int>(Tier::kGpu)];
  EXPECT_EQ(gpu.quota, 2 * kMiB);
  EXPECT_EQ(gpu.peak, 2 * kMiB) << "two of the three fit at once";
  EXPECT_LE(gpu.used, gpu.peak);
  // Unlease all: nothing held; the peak stays until a reset.
  for (TensorId id : {a, b, c}) ASSERT_TRUE(table->Unlease(s, id).ok());
  usage = table->Usage(s, /*reset_peaks=*/true);
  ASSERT_TRUE(usage.ok());
  EXPECT_EQ((*usage)[static_cast<int>(Tier::kGpu)].used, 0u);
  EXPECT_EQ((*usage)[static_cast<int>(Tier::kGpu)].peak, 2 * kMiB);
  usage = table->Usage(s, /*reset_peaks=*/false);
  ASSERT_TRUE(usage.ok());
  EXPECT_EQ((*usage)[static_cast<int>(Tier::kGpu)].peak, 0u) << "restarted from what is held";
  EXPECT_FALSE(table->Usage(s + 100, false).ok()) << "an unknown session";
}

TEST_F(LeaseTableTest, TensorsSurviveEvictionThroughEveryTier) {
  auto table = Table();
  // 4 MiB of GPU and of DRAM for eight 1.5 MiB tensors: most must live on NVMe.
  auto s = *table->OpenSession("train", {4 * kMiB, 4 * kMiB, 32 * kMiB});
  std::vector<TensorId> ids;
  for (int i = 0; i < 8; ++i) {
    auto id = table->Lease(s, Spec("layers." + std::to_string(i) + ".w", 384 * 1024));
    ASSERT_TRUE(id.ok()) << id.status();
    ids.push_back(*id);
    ASSERT_TRUE(table->Validate().ok()) << table->Validate();
  }
  for (int i = 0; i < 8; ++i) {
    Write(*table, s, ids[i], 100 + i);
    ASSERT_TRUE(table->Validate().ok()) << table->Validate();
  }
  for (int round = 0; round < 2; ++round) {
    for (int i = 7; i >= 0; --i) {
      EXPECT_TRUE(Holds(*table, s, ids[i], 100 + i, i % 2 ? Place::kGpu : Place::kHost)) << i;
      ASSERT_TRUE(table->Validate().ok()) << table->Validate();
    }
  }
  const LeaseStats stats = table->Stats();
  EXPECT_GT(stats.stalls, 8u);
  EXPECT_GT(stats.writebacks, 4u);
  EXPECT_EQ(stats.leases, 8u);
  EXPECT_GT(engine_.mover->Stats(Link::kDramToNvme).moves, 0u);
  EXPECT_GT(engine_.mover->Stats(Link::kNvmeToDram).moves, 0u);
}

TEST_F(LeaseTableTest, BadRequestsGetClearErrors) {
  auto table = Table();
  auto s = *table->OpenSession("bad", {2 * kMiB, 2 * kMiB, 4 * kMiB});
  EXPECT_EQ(table->Lease(s, Spec("", 4)).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(table->Lease(s, Spec("has space", 4)).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(table->Lease(s, TensorSpec{"zero", TensorClass::kParam, DType::kF32, {4, 0}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(table->Lease(s, TensorSpec{"huge", TensorClass::kParam, DType::kF32, {1 << 30, 1 << 30}})
                .status().code(),
            absl::StatusCode::kInvalidArgument);
  auto too_big = table->Lease(s, Spec("too.big", 3 * kMiB));  // 12 MiB > every quota
  ASSERT_EQ(too_big.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(too_big.status().message().find("no tier of session 'bad' has room"), absl::string_view::npos)
      << too_big.status().message();
  auto a = *table->Lease(s, Spec("a", 1024));
  EXPECT_EQ(table->Lease(s, Spec("a", 1024)).status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(table->Release(s, a).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(table->Acquire(s, 999, Access::kRead, Place::kGpu).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(table->Acquire(999, a, Access::kRead, Place::kGpu).status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(table->Acquire(s, a, Access::kWrite, Place::kGpu).ok());
  EXPECT_EQ(table->Acquire(s, a, Access::kRead, Place::kHost).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(table->Unlease(s, a).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(table->Release(s, a).ok());
  EXPECT_EQ(table->Release(s, a).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(table->Unlease(s, a).ok());
  EXPECT_EQ(table->Acquire(s, a, Access::kRead, Place::kGpu).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(table->Validate().ok());
}

TEST_F(LeaseTableTest, AcquiredTensorsAreNeverEvictedAndFullIsExplained) {
  auto table = Table();
  auto s = *table->OpenSession("full", {2 * kMiB, 4 * kMiB, 8 * kMiB});
  auto x = *table->Lease(s, Spec("x", 256 * 1024));  // 1 MiB each
  auto y = *table->Lease(s, Spec("y", 256 * 1024));
  auto z = *table->Lease(s, Spec("z", 256 * 1024));
  ASSERT_TRUE(table->Acquire(s, x, Access::kWrite, Place::kGpu).ok());
  ASSERT_TRUE(table->Acquire(s, y, Access::kWrite, Place::kGpu).ok());
  auto no_room = table->Acquire(s, z, Access::kWrite, Place::kGpu);
  ASSERT_EQ(no_room.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(no_room.status().message().find("held by 2 acquired, 0 pinned and 0 other"),
            absl::string_view::npos)
      << no_room.status().message();
  ASSERT_TRUE(table->Release(s, y).ok());
  EXPECT_TRUE(table->Acquire(s, z, Access::kWrite, Place::kGpu).ok());  // y makes room now
  EXPECT_TRUE(table->Validate().ok()) << table->Validate();
}

TEST_F(LeaseTableTest, PinnedTensorsStayInTheirTier) {
  EXPECT_EQ(LeaseTable::Create(*engine_.store, *engine_.mover, RealClock(), {{"embed[", Tier::kGpu}})
                .status().code(),
            absl::StatusCode::kInvalidArgument);
  auto table = Table({{"embed\\..*", Tier::kGpu}});
  auto s = *table->OpenSession("pins", {3 * kMiB, 8 * kMiB, 16 * kMiB});
  auto embed = *table->Lease(s, Spec("embed.tokens", 256 * 1024));
  Write(*table, s, embed, 7);
  std::vector<TensorId> others;
  for (int i = 0; i < 6; ++i) {
    others.push_back(*table->Lease(s, Spec("layers." + std::to_string(i), 256 * 1024)));
    Write(*table, s, others.back(), 20 + i);
  }
  for (const LeaseView& view : table->List(s)) {
    if (view.spec.name == "embed.tokens") {
      EXPECT_TRUE(view.copies[static_cast<int>(Tier::kGpu)]);
      EXPECT_EQ(view.pinned, Tier::kGpu);
    }
  }
  EXPECT_TRUE(Holds(*table, s, embed, 7, Place::kGpu));
  // Pin at run time moves a tensor and keeps it; unpin lets it go again.
  ASSERT_TRUE(table->Pin(s, others[0], Tier::kGpu).ok());
  for (int i = 1; i < 6; ++i) EXPECT_TRUE(Holds(*table, s, others[i], 20 + i, Place::kGpu));
  EXPECT_TRUE(table->List(s)[1].copies[static_cast<int>(Tier::kGpu)]);
  EXPECT_TRUE(Holds(*table, s, others[0], 20, Place::kGpu));
  ASSERT_TRUE(table->Unpin(s, others[0]).ok());
  EXPECT_TRUE(table->Validate().ok()) << table->Validate();
}

// Eviction priorities: in a 3 MiB GPU quota, the tensor written first would be the least
// recently used victim; with priority 1 it stays on the GPU while five later ones of priority 0
// come and go (and without the rule it leaves). Softer than a pin: when only copies of priority 1
// are there, one of them makes room. A bad pattern is refused.
TEST_F(LeaseTableTest, ALowerEvictionPriorityLeavesFirst) {
  EXPECT_EQ(LeaseTable::Create(*engine_.store, *engine_.mover, RealClock(), {}, {{"layers[", 1}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  const uint64_t mib_floats = 256 * 1024;
  for (bool ruled : {true, false}) {
    SCOPED_TRACE(ruled ? "with the rule" : "without");
    auto table = ruled ? Table({}, {{"layers\\.hot\\..*", 1}}) : Table();
    auto s = *table->OpenSession("priorities", {3 * kMiB, 8 * kMiB, 16 * kMiB});
    auto hot = *table->Lease(s, Spec("layers.hot.w", mib_floats));
    Write(*table, s, hot, 3);
    for (int i = 0; i < 5; ++i) {
      const TensorId t = *table->Lease(s, Spec("layers." + std::to_string(i) + ".w", mib_floats));
      Write(*table, s, t, 40 + i);
    }
    bool on_gpu = false;
    for (const LeaseView& view : table->List(s)) {
      if (view.spec.name != "layers.hot.w") continue;
      on_gpu = view.copies[static_cast<int>(Tier::kGpu)];
      EXPECT_EQ(view.priority, ruled ? 1 : 0);
    }
    EXPECT_EQ(on_gpu, ruled) << "the least recently used tensor stays only with its priority";
    EXPECT_TRUE(Holds(*table, s, hot, 3, Place::kGpu));
    EXPECT_TRUE(table->Validate().ok()) << table->Validate();
  }
  // Only priority 1 on the GPU: a newcomer of priority 0 still finds room.
  auto table = Table({}, {{"hot\\..*", 1}});
  auto s = *table->OpenSession("all hot", {3 * kMiB, 8 * kMiB, 16 * kMiB});
  for (int i = 0; i < 3; ++i) Write(*table, s, *table->Lease(s, Spec("hot." + std::to_string(i), mib_floats)), 60 + i);
  const TensorId cold = *table->Lease(s, Spec("cold", mib_floats));
  Write(*table, s, cold, 70);
  EXPECT_TRUE(Holds(*table, s, cold, 70, Place::kGpu));
  EXPECT_TRUE(table->Validate().ok()) << table->Validate();
}

// Thrashing: three 1 MiB tensors read in turn on a 2 MiB GPU quota evict each other (each
// read back is a refetch, counted per tensor and tier). With the thrash lock (2 refetches, a
// warm-up of 100 acquires, half the quota), the first to reach 2 refetches is pinned on the GPU
// and stops moving; the other two go on thrashing in the rest, and neither is locked (a second
// 1 MiB would pass half the quota); the bytes stay right; an unpin ends the lock.
TEST_F(LeaseTableTest, ATensorThatThrashesInTheWarmUpIsLockedWhereItThrashed) {
  const uint64_t mib_floats = 256 * 1024;
  for (bool lock : {false, true}) {
    SCOPED_TRACE(lock ? "lock" : "count only");
    auto table = Table();
    ThrashOptions options;
    options.lock = lock;
    options.warmup_acquires = 100;
    options.refetches = 2;
    options.max_locked_fraction = 0.5;
    table->SetThrashOptions(options);
    auto s = *table->OpenSession("thrash", {2 * kMiB, 8 * kMiB, 16 * kMiB});
    std::vector<TensorId> t;
    for (int i = 0; i < 3; ++i) {
      t.push_back(*table->Lease(s, Spec("layers." + std::to_string(i), mib_floats)));
      Write(*table, s, t.back(), 80 + i);
    }
    for (int round = 0; round < 4; ++round) {
      for (int i = 0; i < 3; ++i) ASSERT_TRUE(Holds(*table, s, t[i], 80 + i, Place::kGpu)) << round << " " << i;
    }
    std::vector<LeaseView> views = table->List(s);
    ASSERT_EQ(views.size(), 3u);
    const int gpu = static_cast<int>(Tier::kGpu);
    if (!lock) {
      // Clean copies go first: layers.0 and 1, read back (a copy in DRAM too), evict each
      // other every time; layers.2, dirty since its write, never leaves.
      EXPECT_GE(views[0].refetches[gpu], 3u);
      EXPECT_GE(views[1].refetches[gpu], 3u);
      EXPECT_EQ(views[2].refetches[gpu], 0u);
      for (const LeaseView& v : views) EXPECT_FALSE(v.pinned || v.thrash_locked) << v.spec.name;
      EXPECT_EQ(table->Stats().thrash_locks, 0u);
      EXPECT_EQ(table->Stats().refetches, views[0].refetches[gpu] + views[1].refetches[gpu]);
      continue;
    }
    EXPECT_TRUE(views[0].thrash_locked) << "layers.0 reached 2 refetches first";
    EXPECT_EQ(views[0].pinned, Tier::kGpu);
    EXPECT_EQ(views[0].refetches[gpu], 2u) << "locked, it stopped moving";
    for (int i : {1, 2}) {
      EXPECT_FALSE(views[i].thrash_locked) << "a second 1 MiB would pass half of the 2 MiB quota";
      EXPECT_FALSE(views[i].pinned);
      EXPECT_GE(views[i].refetches[gpu], 3u) << "the other two share the rest and go on thrashing";
    }
    EXPECT_EQ(table->Stats().thrash_locks, 1u);
    EXPECT_TRUE(table->Validate().ok()) << table->Validate();
    ASSERT_TRUE(table->Unpin(s, t[0]).ok());
    EXPECT_FALSE(table->List(s)[0].thrash_locked);
  }
}

// A thrash lock never makes a placement fail: with locks allowed the whole quota (fraction 1)
// and one refetch enough, four 1 MiB tensors read in turn on 3 MiB of GPU end with every byte
// there locked; the next one's fetch finds nothing else to evict, so a lock is let go (counted,
// that tensor never locked again) and every read still gets its bytes.
TEST_F(LeaseTableTest, AThrashLockIsLetGoRatherThanAPlacementFailing) {
  const uint64_t mib_floats = 256 * 1024;
  auto table = Table();
  ThrashOptions options;
  options.lock = true;
  options.warmup_acquires = 1000;
  options.refetches = 1;
  options.max_locked_fraction = 1.0;
  table->SetThrashOptions(options);
  auto s = *table->OpenSession("locks", {3 * kMiB, 8 * kMiB, 16 * kMiB});
  std::vector<TensorId> t;
  for (int i = 0; i < 4; ++i) {
    t.push_back(*table->Lease(s, Spec("layers." + std::to_string(i), mib_floats)));
    Write(*table, s, t.back(), 40 + i);
  }
  for (int round = 0; round < 6; ++round) {
    for (int i = 0; i < 4; ++i) ASSERT_TRUE(Holds(*table, s, t[i], 40 + i, Place::kGpu)) << round << " " << i;
  }
  const auto stats = table->Stats();
  EXPECT_GE(stats.thrash_locks, 3u) << "the quota's worth got locked";
  EXPECT_GE(stats.thrash_unlocks, 1u) << "and a lock was let go for the fourth";
  EXPECT_LE(stats.thrash_locks, 3u + stats.thrash_unlocks);
  uint64_t locked = 0;
  for (const LeaseView& v : table->List(s)) locked += v.thrash_locked ? v.bytes : 0;
  EXPECT_LE(locked, 3 * kMiB);
  EXPECT_TRUE(table->Validate().ok()) << table->Validate();
}

TEST_F(LeaseTableTest, SessionsAreIsolatedAndGiveTheirBudgetBack) {
  auto table = Table();
  auto a = *table->OpenSession("a", {8 * kMiB, 8 * kMiB, 16 * kMiB});
  auto b = *table->OpenSession("b", {8 * kMiB, 8 * kMiB, 16 * kMiB});
  auto c = table->OpenSession("c", {1 * kMiB, 1 * kMiB, 0});  // the node budget is spent
  EXPECT_EQ(c.status().code(), absl::StatusCode::kResourceExhausted);
  auto ta = *table->Lease(a, Spec("w", 1024));
  auto tb = *table->Lease(b, Spec("w", 1024));  // same name, other session: fine
  Write(*table, a, ta, 1);
  Write(*table, b, tb, 2);
  EXPECT_NE(table->SessionArena(a, Tier::kGpu), table->SessionArena(b, Tier::kGpu));
  EXPECT_TRUE(Holds(*table, a, ta, 1, Place::kGpu));
  EXPECT_TRUE(Holds(*table, b, tb, 2, Place::kGpu));
  ASSERT_TRUE(table->CloseSession(a).ok());
  EXPECT_EQ(table->Acquire(a, ta, Access::kRead, Place::kGpu).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(engine_.store->Stats(Tier::kGpu).reserved_bytes, 8 * kMiB);
  EXPECT_TRUE(table->OpenSession("c", {1 * kMiB, 1 * kMiB, 0}).ok());
  EXPECT_TRUE(Holds(*table, b, tb, 2, Place::kGpu));
  EXPECT_EQ(table->Stats().sessions, 2u);
}

// Four sessions at once, each from its own thread, while a monitor samples the tiers:
// no tier's allocations or reservations ever exceed its budget, and no bytes get mixed up.
TEST_F(LeaseTableTest, ConcurrentSessionsNeverExceedTheBudgets) {
  auto table = Table();
  std::atomic<bool> done{false};
  std::array<std::atomic<uint64_t>, kTierCount> peak_used{}, peak_reserved{};
  std::thread monitor([&] {
    while (!done) {
      for (Tier tier : {Tier::kGpu, Tier::kDram, Tier::kNvme}) {
        const TierStats stats = engine_.store->Stats(tier);
        auto& used = peak_used[static_cast<int>(tier)];
        auto& reserved = peak_reserved[static_cast<int>(tier)];
        used = std::max<uint64_t>(used, stats.allocator.used_bytes);
        reserved = std::max<uint64_t>(reserved, stats.reserved_bytes);
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  });
  std::vector<std::thread> workers;
  for (int w = 0; w < 4; ++w) {
    workers.emplace_back([&, w] {
      auto s = table->OpenSession("w" + std::to_string(w), {4 * kMiB, 4 * kMiB, 16 * kMiB});
      ASSERT_TRUE(s.ok()) << s.status();
      std::mt19937 rng(w);
      std::vector<std::pair<TensorId, uint32_t>> mine;
      for (int step = 0; step < 120; ++step) {
        if (mine.size() < 10 && rng() % 3 == 0) {
          auto id = table->Lease(*s, Spec("t" + std::to_string(step), 1024 * (64 + rng() % 256)));
          if (id.ok()) mine.push_back({*id, 0});
          continue;
        }
        if (mine.empty()) continue;
        auto& [id, seed] = mine[rng() % mine.size()];
        if (seed == 0 || rng() % 2) {
          seed = static_cast<uint32_t>(w * 1000 + step + 1);
          Write(*table, *s, id, seed);
        } else {
          EXPECT_TRUE(Holds(*table, *s, id, seed, rng() % 2 ? Place::kGpu : Place::kHost));
        }
      }
    });
  }
  for (auto& worker : workers) worker.join();
  done = true;
  monitor.join();
  EXPECT_TRUE(table->Validate().ok()) << table->Validate();
  for (Tier tier : {Tier::kGpu, Tier::kDram, Tier::kNvme}) {
    const uint64_t budget = engine_.store->Stats(tier).budget_bytes;
    EXPECT_LE(peak_used[static_cast<int>(tier)].load(), budget) << TierName(tier);
    EXPECT_LE(peak_reserved[static_cast<int>(tier)].load(), budget) << TierName(tier);
  }
  EXPECT_GT(peak_used[static_cast<int>(Tier::kNvme)].load(), 0u);  // the pressure was real
  EXPECT_GT(table->Stats().writebacks, 0u);
}

// Random leases, writes, reads at both places, unleases and pins over two sessions with
// small quotas; the model knows each tensor's bytes. Validate() after every step.
TEST_F(LeaseTableTest, RandomOperationsNeverLoseOrMixUpBytes) {
  auto table = Table();
  std::mt19937_64 rng(2024);
  struct Model {
    TensorId id;
    uint32_t seed;  // 0: never written
  };
  std::vector<SessionId> sessions = {*table->OpenSession("s0", {3 * kMiB, 3 * kMiB, 24 * kMiB}),
                                     *table->OpenSession("s1", {2 * kMiB, 4 * kMiB, 24 * kMiB})};
  std::vector<std::map<std::string, Model>> models(2);
  int next_name = 0;
  for (int step = 0; step < 400; ++step) {
    const int si = rng() % 2;
    const SessionId s = sessions[si];
    auto& model = models[si];
    const int op = rng() % 10;
    if (op < 2 || model.empty()) {
      const std::string name = "t" + std::to_string(next_name++);
      auto id = table->Lease(s, Spec(name, 1024 * (1 + rng() % 256)));
      if (id.ok()) model[name] = {*id, 0};
      else ASSERT_EQ(id.status().code(), absl::StatusCode::kResourceExhausted) << id.status();
    } else {
      auto it = std::next(model.begin(), rng() % model.size());
      Model& m = it->second;
      if (op < 5) {
        m.seed = static_cast<uint32_t>(step + 1);
        Write(*table, s, m.id, m.seed);
      } else if (op < 9) {
        if (m.seed != 0) {
          ASSERT_TRUE(Holds(*table, s, m.id, m.seed, op % 2 ? Place::kGpu : Place::kHost)) << step;
        }
      } else {
        ASSERT_TRUE(table->Unlease(s, m.id).ok());
        model.erase(it);
      }
    }
    ASSERT_TRUE(table->Validate().ok()) << table->Validate() << " at step " << step;
  }
  for (int si = 0; si < 2; ++si) {
    for (auto& [name, m] : models[si]) {
      if (m.seed != 0) {
        EXPECT_TRUE(Holds(*table, sessions[si], m.id, m.seed, Place::kGpu)) << name;
      }
    }
  }
  EXPECT_GT(table->Stats().writebacks, 10u);
  // The joins of fragmented free space (moves elsewhere, slides) ran too, every byte checked.
  EXPECT_GT(table->Stats().relocations, 10u);
  EXPECT_GT(table->Stats().gpu_relocations, 0u);
}

}  // namespace
}  // namespace tierd
