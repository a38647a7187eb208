// Shared set-up for the mover tests: a real TierStore (fake GPU, real shared memory,
// a real O_DIRECT file in TEST_TMPDIR) and a Mover over real io_uring, optionally
// wrapped in a FaultInjectingBlockIo.
#ifndef TIERD_RUNTIME_MOVER_TEST_UTIL_H_
#define TIERD_RUNTIME_MOVER_TEST_UTIL_H_

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "base/clock.h"
#include "base/units.h"
#include "runtime/fake_gpu.h"
#include "runtime/fault_injecting_block_io.h"
#include "runtime/mover.h"
#include "runtime/tier_store.h"
#include "runtime/uring_block_io.h"

namespace tierd::testing {

// "tierd-test-<name>-<pid>-<random>": sandboxes reuse pids, so a crashed earlier run's
// leftover segment must not collide with this run's.
inline std::string UniqueInstance(const std::string& name) {
  static const unsigned tag = std::random_device{}() % 100000;
  return "tierd-test-" + name + "-" + std::to_string(getpid()) + "-" + std::to_string(tag);
}

struct Engine {
  std::unique_ptr<GpuDevice> gpu;
  std::unique_ptr<TierStore> store;
  std::unique_ptr<Mover> mover;
  FaultInjectingBlockIo* faults = nullptr;  // owned by the mover's NVMe link

  // Fills an extent of the GPU or DRAM tier with seeded random bytes.
  void Fill(const Extent& extent, uint64_t bytes, uint32_t seed) {
    std::mt19937_64 rng(seed);
    uint8_t* p = store->Address(extent);
    for (uint64_t i = 0; i < bytes; i += 8) {
      const uint64_t word = rng();
      std::memcpy(p + i, &word, std::min<uint64_t>(8, bytes - i));
    }
  }
  std::vector<uint8_t> Bytes(const Extent& extent, uint64_t bytes) {
    const uint8_t* p = store->Address(extent);
    return std::vector<uint8_t>(p, p + bytes);
  }
};

// Fixed buffers pin memory against the user's RLIMIT_MEMLOCK, which tests running in
// parallel share: only the test that checks registration asks for it.
inline Engine MakeEngine(const std::string& name, std::vector<IoFault> faults = {},
                         uint64_t dram_bytes = 64 * kMiB, bool register_buffers = false,
                         uint64_t gpu_bounce_bytes = 0) {
  Engine engine;
  engine.gpu = CreateFakeGpu({});
  TierStoreOptions options;
  options.gpu_bytes = 32 * kMiB;
  options.dram_bytes = dram_bytes;
  options.dram_headroom_bytes = 0;
  options.nvme_directory = std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp";
  options.nvme_bytes = 64 * kMiB;
  options.instance_name = UniqueInstance(name);
  auto store = TierStore::Open(options, *engine.gpu);
  EXPECT_TRUE(store.ok()) << store.status();
  engine.store = std::move(*store);
  auto io = CreateUringBlockIo(engine.store->nvme()->fd(), 16);
  EXPECT_TRUE(io.ok()) << io.status();
  std::unique_ptr<BlockIo> block_io = std::move(*io);
  if (!faults.empty()) {
    auto wrapped = std::make_unique<FaultInjectingBlockIo>(std::move(block_io), std::move(faults));
    engine.faults = wrapped.get();
    block_io = std::move(wrapped);
  }
  auto mover = Mover::Create(*engine.store, std::move(block_io), RealClock(),
                             MoverOptions{.register_nvme_buffers = register_buffers,
                                          .gpu_bounce_bytes = gpu_bounce_bytes});
  EXPECT_TRUE(mover.ok()) << mover.status();
  engine.mover = std::move(*mover);
  return engine;
}

// The daemon's shape: node budgets, no default arenas (sessions create their own).
inline Engine MakeDaemonEngine(const std::string& name, uint64_t gpu_budget, uint64_t dram_budget,
                               uint64_t nvme_budget, const FakeGpuOptions& gpu_options = {}) {
  Engine engine;
  engine.gpu = CreateFakeGpu(gpu_options);
  TierStoreOptions options;
  options.gpu_bytes = gpu_budget;
  options.dram_bytes = dram_budget;
  options.dram_headroom_bytes = 0;
  options.nvme_directory = std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp";
  options.nvme_bytes = nvme_budget;
  options.instance_name = UniqueInstance(name);
  options.default_arenas = false;
  auto store = TierStore::Open(options, *engine.gpu);
  EXPECT_TRUE(store.ok()) << store.status();
  engine.store = std::move(*store);
  auto io = CreateUringBlockIo(engine.store->nvme()->fd(), 16);
  EXPECT_TRUE(io.ok()) << io.status();
  auto mover = Mover::Create(*engine.store, std::move(*io), RealClock(),
                             MoverOptions{.register_nvme_buffers = false});
  EXPECT_TRUE(mover.ok()) << mover.status();
  engine.mover = std::move(*mover);
  return engine;
}

}  // namespace tierd::testing

#endif  // TIERD_RUNTIME_MOVER_TEST_UTIL_H_
