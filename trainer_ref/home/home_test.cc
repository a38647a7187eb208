#include "trainer_ref/home/home.h"

#include <cstdint>
#include <cstdlib>

#include "gtest/gtest.h"

namespace tierd::trainer {
namespace {

HomeTable ThreeTensors() {
  return {{"layers.0.w", TensorClass::kParam, 1000}, {"grad.layers.0", TensorClass::kGrad, 4}, {"act.layers.0", TensorClass::kActivation, 3}};
}

// Plain host memory: every tensor its own zeroed, 64-byte aligned bytes, there from the
// start to the end; nothing moves and nothing is on the device.
TEST(PlainHomeTest, HostTensorsAreZeroedAlignedAndApart) {
  auto home = MakePlainHome(ThreeTensors());
  ASSERT_TRUE(home.ok()) << home.status();
  EXPECT_EQ((*home)->table(), ThreeTensors());
  EXPECT_TRUE((*home)->Holds(Place::kHost));
  EXPECT_FALSE((*home)->Holds(Place::kGpu));
  std::vector<unsigned char*> seen;
  for (size_t i = 0; i < 3; ++i) {
    auto p = (*home)->Acquire(i, Access::kWrite, Place::kHost);
    ASSERT_TRUE(p.ok()) << p.status();
    auto* bytes = static_cast<unsigned char*>(*p);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(bytes) % 64, 0u);
    for (uint64_t b = 0; b < ThreeTensors()[i].bytes; ++b) ASSERT_EQ(bytes[b], 0) << i << " byte " << b;
    for (uint64_t b = 0; b < ThreeTensors()[i].bytes; ++b) bytes[b] = static_cast<unsigned char>(i + 1);
    seen.push_back(bytes);
    ASSERT_TRUE((*home)->Release(i).ok());
  }
  // Written apart: each still holds its own value.
  for (size_t i = 0; i < 3; ++i) {
    auto p = (*home)->Acquire(i, Access::kRead, Place::kHost);
    ASSERT_TRUE(p.ok());
    EXPECT_EQ(*p, seen[i]);
    EXPECT_EQ(static_cast<unsigned char*>(*p)[ThreeTensors()[i].bytes - 1], i + 1);
  }
  EXPECT_EQ((*home)->OwnDeviceBytes(), 0u);
  EXPECT_EQ((*home)->Moved()->all_links, 0u);
  EXPECT_EQ((*home)->RegisterGraph({}).value(), "") << "plain buffers have no planner";
  EXPECT_EQ((*home)->Describe(), "plain buffers (no offload)");
}

TEST(PlainHomeTest, APlaceItDoesNotHoldAndAnIndexPastTheTableAreRefused) {
  auto home = MakePlainHome(ThreeTensors());
  ASSERT_TRUE(home.ok());
  auto gpu = (*home)->Acquire(1, Access::kRead, Place::kGpu);
  ASSERT_EQ(gpu.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(gpu.status().message().find("grad.layers.0 was asked for on the GPU"), std::string::npos) << gpu.status();
  auto past = (*home)->Acquire(3, Access::kRead, Place::kHost);
  ASSERT_EQ(past.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_NE(past.status().message().find("tensor 3 of a home of 3"), std::string::npos) << past.status();
}

// A memory that runs out at the third tensor: the error is the memory's own, and the two
// tensors already allocated are given back.
TEST(PlainHomeTest, AnAllocationThatFailsComesBackAndFreesWhatWasHeld) {
  int live = 0;
  PlainMemory memory;
  memory.place = Place::kGpu;
  memory.describe = "test device";
  memory.allocate = [&live](const HomeTensor& t, uint64_t held, uint64_t total) -> absl::StatusOr<void*> {
    if (t.name == "act.layers.0") {
      return absl::ResourceExhaustedError("no room for " + t.name + " after " + std::to_string(held) + " of " +
                                          std::to_string(total));
    }
    ++live;
    return std::malloc(t.bytes);
  };
  memory.free = [&live](void* p) {
    --live;
    std::free(p);
  };
  auto home = MakePlainHome(ThreeTensors(), memory);
  ASSERT_EQ(home.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(home.status().message(), "no room for act.layers.0 after 1004 of 1007");
  EXPECT_EQ(live, 0);
  // The same memory with room: a device home counts its bytes as its own.
  memory.allocate = [&live](const HomeTensor& t, uint64_t, uint64_t) -> absl::StatusOr<void*> {
    ++live;
    return std::malloc(t.bytes);
  };
  {
    auto device = MakePlainHome(ThreeTensors(), memory);
    ASSERT_TRUE(device.ok());
    EXPECT_EQ((*device)->OwnDeviceBytes(), 1007u);
    EXPECT_EQ((*device)->TakeGpuPeak().value(), 1007u);
    EXPECT_TRUE((*device)->Holds(Place::kGpu));
    EXPECT_FALSE((*device)->Acquire(0, Access::kRead, Place::kHost).ok());
    EXPECT_EQ(live, 3);
  }
  EXPECT_EQ(live, 0);
}

TEST(CheckTableTest, NamesTheFirstDifference) {
  EXPECT_TRUE(CheckTable(ThreeTensors(), ThreeTensors(), "the model's").ok());
  HomeTable bigger = ThreeTensors();
  bigger[1].bytes = 8;
  absl::Status s = CheckTable(ThreeTensors(), bigger, "the model's");
  ASSERT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("tensor 1 is grad.layers.0 of 4 bytes (grad), not grad.layers.0 of 8 bytes (grad)"),
            std::string::npos)
      << s;
  HomeTable shorter = ThreeTensors();
  shorter.pop_back();
  s = CheckTable(shorter, ThreeTensors(), "the model's");
  EXPECT_NE(s.message().find("it lacks tensor 2, act.layers.0"), std::string::npos) << s;
  s = CheckTable(ThreeTensors(), shorter, "the model's");
  EXPECT_NE(s.message().find("it has a tensor 2 more, act.layers.0"), std::string::npos) << s;
  HomeTable renamed = ThreeTensors();
  renamed[0].cls = TensorClass::kOptState;
  EXPECT_FALSE(CheckTable(renamed, ThreeTensors(), "the model's").ok());
}

}  // namespace
}  // namespace tierd::trainer
