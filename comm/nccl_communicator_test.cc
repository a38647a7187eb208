// What the NCCL backend does before any GPU work: it finds NCCL at run time or says where it
// looked, and a process without a GPU gets an error, not a crash. Its collectives run on the
// GPU machine (nccl_collectives_check).
#include "comm/nccl_communicator.h"

#include <cuda_runtime_api.h>

#include "gtest/gtest.h"

namespace tierd::comm {
namespace {

TEST(NcclCommunicatorTest, NcclIsFoundAtRunTimeOrTheErrorSaysWhereToPutIt) {
  auto version = NcclVersion();
  if (version.ok()) {
    EXPECT_EQ(version->rfind("NCCL 2.", 0), 0u) << *version;
    EXPECT_NE(version->find("libnccl.so.2"), std::string::npos) << *version;
  } else {
    EXPECT_EQ(version.status().code(), absl::StatusCode::kNotFound) << version.status();
    EXPECT_NE(version.status().message().find("LD_LIBRARY_PATH"), std::string::npos) << version.status();
  }
}

TEST(NcclCommunicatorTest, NoGpuIsAnErrorThatSaysSo) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) == cudaSuccess && devices > 0) GTEST_SKIP() << "a GPU is here";
  if (!NcclVersion().ok()) GTEST_SKIP() << "no NCCL here";
  auto made = MakeNcclCommunicator(LaunchInfo{});
  EXPECT_EQ(made.status().code(), absl::StatusCode::kFailedPrecondition) << made.status();
  EXPECT_NE(made.status().message().find("no CUDA device"), std::string::npos) << made.status();
}

}  // namespace
}  // namespace tierd::comm
