// Shared set-up for the LeaseTable tests: a real TierStore (fake GPU, real shared memory,
// a real O_DIRECT file) with a Mover, tensor specs of float counts, and writes and reads of
// seeded bytes through acquires.
#ifndef TIERD_RUNTIME_LEASE_TABLE_TEST_UTIL_H_
#define TIERD_RUNTIME_LEASE_TABLE_TEST_UTIL_H_

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "runtime/lease_table.h"
#include "runtime/mover_test_util.h"

namespace tierd::testing {

inline TensorSpec Spec(const std::string& name, uint64_t floats, TensorClass c = TensorClass::kParam) {
  return TensorSpec{name, c, DType::kF32, {static_cast<int64_t>(floats)}};
}

// Each test gets its own engine: GPU 16 MiB, DRAM 16 MiB, NVMe 64 MiB.
class LeaseTableTest : public ::testing::Test {
 public:
  void SetUp() override {
    engine_ = MakeDaemonEngine(::testing::UnitTest::GetInstance()->current_test_info()->name(),
                               16 * kMiB, 16 * kMiB, 64 * kMiB);
  }
  std::unique_ptr<LeaseTable> Table(std::vector<PinRule> pins = {}, std::vector<PriorityRule> priorities = {}) {
    auto table =
        LeaseTable::Create(*engine_.store, *engine_.mover, RealClock(), std::move(pins), std::move(priorities));
    EXPECT_TRUE(table.ok()) << table.status();
    return std::move(*table);
  }
  uint8_t* Pointer(const Placement& p) {
    const Extent e{p.tier, p.arena, Allocation{p.offset, p.bytes, 0}};
    return engine_.store->Address(e);
  }
  // Writes `seed`'s bytes into the tensor through a write acquire (on the GPU unless said).
  void Write(LeaseTable& table, SessionId s, TensorId t, uint32_t seed, Place place = Place::kGpu) {
    auto p = table.Acquire(s, t, Access::kWrite, place);
    ASSERT_TRUE(p.ok()) << p.status();
    std::mt19937_64 rng(seed);
    uint8_t* bytes = Pointer(*p);
    for (uint64_t i = 0; i < p->bytes; i += 8) {  // sizes are multiples of 4: copy whole words
      const uint64_t word = rng();
      std::memcpy(bytes + i, &word, std::min<uint64_t>(8, p->bytes - i));
    }
    ASSERT_TRUE(table.Release(s, t).ok());
  }
  // Reads the tensor at `place` and checks it holds `seed`'s bytes.
  bool Holds(LeaseTable& table, SessionId s, TensorId t, uint32_t seed, Place place) {
    auto p = table.Acquire(s, t, Access::kRead, place);
    EXPECT_TRUE(p.ok()) << p.status();
    if (!p.ok()) return false;
    std::mt19937_64 rng(seed);
    const uint8_t* bytes = Pointer(*p);
    bool same = true;
    for (uint64_t i = 0; i < p->bytes && same; i += 8) {
      const uint64_t word = rng();
      same = std::memcmp(bytes + i, &word, std::min<uint64_t>(8, p->bytes - i)) == 0;
    }
    EXPECT_TRUE(table.Release(s, t).ok());
    return same;
  }
  testing::Engine engine_;
};

}  // namespace tierd::testing

#endif  // TIERD_RUNTIME_LEASE_TABLE_TEST_UTIL_H_
