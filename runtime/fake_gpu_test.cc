#include "runtime/fake_gpu.h"

#include <gtest/gtest.h>

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <random>
#include <vector>

#include "base/fake_clock.h"
#include "base/units.h"
#include "runtime/gpu_factory.h"

namespace tierd {
namespace {

TEST(FakeGpuTest, RegionBudgetIsCheckedAndReturnedOnRelease) {
  auto gpu = CreateFakeGpu({.memory_bytes = 64 * kMiB});
  auto too_big = gpu->AllocateRegion(65 * kMiB);
  ASSERT_EQ(too_big.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(too_big.status().message().find("65.0 MiB exceeds the free GPU memory (64.0 MiB free"),
            absl::string_view::npos)
      << too_big.status().message();
  {
    auto region = gpu->AllocateRegion(48 * kMiB);
    ASSERT_TRUE(region.ok());
    EXPECT_EQ(*gpu->FreeBytes(), 16 * kMiB);
    // Exportable: another mapping of the fd sees the same bytes.
    auto exported = (*region)->Export();
    ASSERT_TRUE(exported.ok());
    void* other = mmap(nullptr, 4096, PROT_READ, MAP_SHARED, exported->pool_fd, 0);
    ASSERT_NE(other, MAP_FAILED);
    static_cast<uint8_t*>((*region)->base())[100] = 42;
    EXPECT_EQ(static_cast<uint8_t*>(other)[100], 42);
    munmap(other, 4096);
    close(exported->pool_fd);
  }
  EXPECT_EQ(*gpu->FreeBytes(), 64 * kMiB);
}

TEST(FakeGpuTest, CopiesRunInOrderAndFencesWaitForThem) {
  auto gpu = CreateFakeGpu({.memory_bytes = 64 * kMiB});
  auto region = *gpu->AllocateRegion(8 * kMiB);
  auto stream = *gpu->CreateCopyStream();
  std::vector<uint8_t> host(4 * kMiB), back(4 * kMiB);
  std::mt19937 rng(3);
  for (auto& byte : host) byte = static_cast<uint8_t>(rng());
  auto* device = static_cast<uint8_t*>(region->base());
  ASSERT_TRUE(stream->CopyAsync(device, host.data(), host.size(), CopyDirection::kHostToDevice).ok());
  // A second copy of the same bytes, then the way back: stream order makes it exact.
  ASSERT_TRUE(stream->CopyAsync(device + 4 * kMiB, device, host.size(), CopyDirection::kHostToDevice).ok());
  ASSERT_TRUE(stream->CopyAsync(back.data(), device + 4 * kMiB, back.size(), CopyDirection::kDeviceToHost).ok());
  const uint64_t fence = *stream->RecordFence();
  ASSERT_TRUE(stream->WaitFence(fence).ok());
  EXPECT_EQ(std::memcmp(host.data(), back.data(), host.size()), 0);
  EXPECT_EQ(stream->WaitFence(fence + 1).code(), absl::StatusCode::kInvalidArgument);
}

TEST(FakeGpuTest, ModelledLinkTakesBytesOverBandwidthOfClockTime) {
  FakeClock clock;
  auto gpu = CreateFakeGpu({.memory_bytes = 64 * kMiB, .link_bytes_per_second = 1e9, .clock = &clock});
  auto region = *gpu->AllocateRegion(16 * kMiB);
  auto stream = *gpu->CreateCopyStream();
  std::vector<uint8_t> host(10'000'000, 1);
  ASSERT_TRUE(stream->CopyAsync(region->base(), host.data(), host.size(), CopyDirection::kHostToDevice).ok());
  ASSERT_TRUE(stream->WaitFence(*stream->RecordFence()).ok());
  // 10 MB at 1 GB/s = 10 ms of fake time (the fake clock does not move during memcpy).
  EXPECT_EQ(clock.NowNanos(), 10'000'000);
}

TEST(FakeGpuTest, ACopyWithinTheDeviceTakesItsOwnModelledTime) {
  FakeClock clock;
  auto gpu = CreateFakeGpu({.memory_bytes = 64 * kMiB,
                            .link_bytes_per_second = 1e9,
                            .within_bytes_per_second = 4e9,
                            .clock = &clock});
  auto region = *gpu->AllocateRegion(16 * kMiB);
  auto stream = *gpu->CreateCopyStream();
  auto* base = static_cast<uint8_t*>(region->base());
  std::memset(base, 7, 4'000'000);
  ASSERT_TRUE(stream->CopyAsync(base + 8 * kMiB, base, 4'000'000, CopyDirection::kDeviceToDevice).ok());
  ASSERT_TRUE(stream->WaitFence(*stream->RecordFence()).ok());
  EXPECT_EQ(clock.NowNanos(), 1'000'000) << "4 MB at 4 GB/s, not at the link's 1 GB/s";
  EXPECT_EQ(base[8 * kMiB + 3'999'999], 7);
}

TEST(GpuFactoryTest, FallsBackToTheFakeGpuWithAReason) {
  auto opened = OpenGpu({});
  ASSERT_TRUE(opened.ok());
  if (opened->device->is_fake()) {
    EXPECT_FALSE(opened->fallback_reason.empty());
    // Asking for the real GPU where there is none is an error, not a silent fake.
    EXPECT_EQ(OpenGpu({.choice = GpuChoice::kCuda}).status().code(), absl::StatusCode::kNotFound);
  } else {
    EXPECT_TRUE(opened->fallback_reason.empty());
  }
  auto fake = OpenGpu({.choice = GpuChoice::kFake});
  ASSERT_TRUE(fake.ok());
  EXPECT_TRUE(fake->device->is_fake());
}

}  // namespace
}  // namespace tierd
