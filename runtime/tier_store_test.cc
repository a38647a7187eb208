#include "runtime/tier_store.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "absl/strings/str_format.h"
#include "base/units.h"
#include "runtime/fake_gpu.h"

namespace tierd {
namespace {

std::string TestDir() { return std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp"; }

std::string UniqueName(const char* what) {
  return std::string("tierd-test-") + what + "-" + std::to_string(getpid());
}

TierStoreOptions SmallOptions(const char* what) {
  TierStoreOptions options;
  options.gpu_bytes = 8 * kMiB;
  options.dram_bytes = 16 * kMiB;
  options.dram_headroom_bytes = 0;
  options.nvme_directory = TestDir();
  options.nvme_bytes = 32 * kMiB;
  options.instance_name = UniqueName(what);
  return options;
}

bool ShmExists(const std::string& name) { return access(("/dev/shm/" + name).c_str(), F_OK) == 0; }

TEST(TierStoreTest, OpensThreeTiersAndCleansUpAfterItself) {
  auto gpu = CreateFakeGpu({});
  const TierStoreOptions options = SmallOptions("open");
  {
    auto store = TierStore::Open(options, *gpu);
    ASSERT_TRUE(store.ok()) << store.status();
    EXPECT_TRUE((*store)->HasTier(Tier::kGpu) && (*store)->HasTier(Tier::kDram) &&
                (*store)->HasTier(Tier::kNvme));
    EXPECT_EQ((*store)->Stats(Tier::kDram).budget_bytes, 16 * kMiB);
    EXPECT_TRUE(ShmExists(options.instance_name + "-dram"));
    // The NVMe file is unlinked at once: a crash cannot leak its space.
    EXPECT_FALSE(std::filesystem::exists((*store)->nvme()->path()));
  }
  EXPECT_FALSE(ShmExists(options.instance_name + "-dram"));
}

TEST(TierStoreTest, AllocationBeyondABudgetNamesTheTierAndTheNumbers) {
  auto gpu = CreateFakeGpu({});
  auto store = *TierStore::Open(SmallOptions("budget"), *gpu);
  auto first = store->Allocate(Tier::kGpu, 6 * kMiB);
  ASSERT_TRUE(first.ok());
  auto second = store->Allocate(Tier::kGpu, 3 * kMiB);
  ASSERT_EQ(second.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(second.status().message(),
            absl::StrFormat("gpu tier (arena %d of 8.00 MiB): cannot allocate 3.00 MiB: 2.00 MiB "
                            "free of 8.00 MiB, largest free block 2.00 MiB",
                            store->DefaultArena(Tier::kGpu)));
  EXPECT_EQ(store->Stats(Tier::kGpu).peak_used_bytes, 6 * kMiB);
  ASSERT_TRUE(store->Free(*first).ok());
  EXPECT_EQ(store->Free(*first).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->Stats(Tier::kGpu).peak_used_bytes, 6 * kMiB) << "the peak stays after a free";
  auto small = store->Allocate(Tier::kGpu, 1 * kMiB);
  ASSERT_TRUE(small.ok());
  EXPECT_EQ(store->Stats(Tier::kGpu).peak_used_bytes, 6 * kMiB);
  ASSERT_TRUE(store->Free(*small).ok());
  EXPECT_TRUE(store->Allocate(Tier::kGpu, 8 * kMiB).ok());
  EXPECT_EQ(store->Stats(Tier::kGpu).peak_used_bytes, 8 * kMiB);
}

// Sessions one after the other, each filling its arena and closing without freeing (its
// arena destroyed whole): the tier's peak is one session's, never above the budget (it was
// 2x, 3x: a destroyed arena's bytes stayed counted as used).
TEST(TierStoreTest, AClosedSessionsBytesLeaveTheTiersUseAndPeak) {
  auto gpu = CreateFakeGpu({});
  TierStoreOptions options = SmallOptions("sequential");
  options.default_arenas = false;
  auto store = *TierStore::Open(options, *gpu);
  const uint64_t budget = store->Stats(Tier::kDram).budget_bytes;
  for (int session = 1; session <= 3; ++session) {
    auto arena = store->CreateArena(Tier::kDram, budget, absl::StrFormat("session-%d", session));
    ASSERT_TRUE(arena.ok()) << arena.status();
    ASSERT_TRUE(store->Allocate(*arena, budget / 2).ok());
    ASSERT_TRUE(store->Allocate(*arena, budget / 4).ok());
    ASSERT_TRUE(store->DestroyArena(*arena).ok());
    EXPECT_EQ(store->Stats(Tier::kDram).peak_used_bytes, budget / 2 + budget / 4) << "after session " << session;
  }
}

TEST(TierStoreTest, ArenasAreCarvedFromTheNodeBudgetAndGiveItBack) {
  auto gpu = CreateFakeGpu({});
  TierStoreOptions options = SmallOptions("arenas");
  options.default_arenas = false;
  auto store = *TierStore::Open(options, *gpu);
  EXPECT_EQ(store->DefaultArena(Tier::kDram), kNoArena);
  auto a = store->CreateArena(Tier::kDram, 10 * kMiB, "session-1");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_TRUE(ShmExists(options.instance_name + "-session-1"));
  // 16 MiB budget, 10 reserved: a second 10 MiB arena does not fit, 6 MiB does.
  auto b = store->CreateArena(Tier::kDram, 10 * kMiB, "session-2");
  ASSERT_EQ(b.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(b.status().message().find("does not fit the node budget (16.0 MiB, of which 10.0 MiB "
                                      "is already reserved"),
            absl::string_view::npos)
      << b.status().message();
  EXPECT_FALSE(ShmExists(options.instance_name + "-session-2"));
  ASSERT_TRUE(store->CreateArena(Tier::kDram, 6 * kMiB, "session-3").ok());
  // Extents of different arenas are apart; each arena is its own segment.
  Extent x = *store->Allocate(*a, kMiB);
  EXPECT_EQ(store->Address(x), store->dram_segment(*a)->base() + x.offset());
  EXPECT_EQ(store->Stats(Tier::kDram).reserved_bytes, 16 * kMiB);
  EXPECT_EQ(store->Stats(Tier::kDram).arena_count, 2u);
  ASSERT_TRUE(store->DestroyArena(*a).ok());
  EXPECT_FALSE(ShmExists(options.instance_name + "-session-1"));
  EXPECT_EQ(store->Free(x).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store->DestroyArena(*a).code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(store->CreateArena(Tier::kDram, 10 * kMiB, "session-4").ok());
  // GPU arenas likewise.
  auto g = store->CreateArena(Tier::kGpu, 8 * kMiB, "gpu-1");
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(store->CreateArena(Tier::kGpu, 1 * kMiB, "gpu-2").status().code(),
            absl::StatusCode::kResourceExhausted);
}

TEST(TierStoreTest, RefusesADramBudgetTheHostCannotGive) {
  auto gpu = CreateFakeGpu({});
  TierStoreOptions options = SmallOptions("host");
  options.dram_headroom_bytes = 1 * kGiB;
  options.host_memory = HostMemoryInfo{.mem_available_bytes = 1 * kGiB + 8 * kMiB,
                                       .shm_free_bytes = 64 * kGiB};
  auto store = TierStore::Open(options, *gpu);
  ASSERT_EQ(store.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(store.status().message().find("budget 16.0 MiB exceeds what this host can give: "
                                          "1.01 GiB available, minus 1.00 GiB"),
            absl::string_view::npos)
      << store.status().message();
  options.host_memory = HostMemoryInfo{.mem_available_bytes = 64 * kGiB, .shm_free_bytes = kMiB};
  options.dram_headroom_bytes = 0;
  store = TierStore::Open(options, *gpu);
  ASSERT_EQ(store.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(store.status().message().find("/dev/shm"), absl::string_view::npos);
  EXPECT_FALSE(ShmExists(options.instance_name + "-dram"));
}

TEST(TierStoreTest, RefusesBadNvmeDirectoriesAndBudgetsBeyondTheDisk) {
  auto gpu = CreateFakeGpu({});
  TierStoreOptions options = SmallOptions("nvme");
  options.nvme_directory = TestDir() + "/does-not-exist";
  EXPECT_EQ(TierStore::Open(options, *gpu).status().code(), absl::StatusCode::kFailedPrecondition);
  const std::string not_a_directory = TestDir() + "/plain-file";
  { std::ofstream(not_a_directory) << "x"; }
  options.nvme_directory = not_a_directory;
  auto file = TierStore::Open(options, *gpu);
  EXPECT_EQ(file.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(file.status().message().find("does not exist"), absl::string_view::npos);
  options.nvme_directory = TestDir();
  options.nvme_bytes = uint64_t{1} << 60;
  auto huge = TierStore::Open(options, *gpu);
  ASSERT_EQ(huge.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(huge.status().message().find("exceeds the free space of"), absl::string_view::npos);
}

TEST(TierStoreTest, RefusesAGpuBudgetBeyondTheDevice) {
  auto gpu = CreateFakeGpu({.memory_bytes = 4 * kMiB});
  auto store = TierStore::Open(SmallOptions("gpu"), *gpu);
  ASSERT_EQ(store.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(store.status().message().find("gpu tier: budget 8.00 MiB exceeds the free GPU memory"),
            absl::string_view::npos);
}

TEST(TierStoreTest, ASecondStoreWithTheSameNameIsRefusedWithoutHarmingTheFirst) {
  auto gpu = CreateFakeGpu({});
  TierStoreOptions options = SmallOptions("twice");
  options.nvme_bytes = 0;
  auto first = *TierStore::Open(options, *gpu);
  auto second = TierStore::Open(options, *gpu);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE(ShmExists(options.instance_name + "-dram"));
}

}  // namespace
}  // namespace tierd
