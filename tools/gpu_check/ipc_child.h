#ifndef TIERD_TOOLS_GPU_CHECK_IPC_CHILD_H_
#define TIERD_TOOLS_GPU_CHECK_IPC_CHILD_H_

#include <cstddef>
#include <cstdint>
#include <string>

namespace tierd::gpu_check {

struct ChildArgs {
  int pool_fd = -1;           // inherited across exec
  std::string pointer_hex;    // GpuRegionExport.pointer_data
  int to_parent_fd = -1;
  int from_parent_fd = -1;
  uint64_t a_offset = 0, b_offset = 0, c_offset = 0;
  size_t words = 0;           // 32-bit words per test buffer
};

int RunChild(const ChildArgs& args);

}  // namespace tierd::gpu_check

#endif  // TIERD_TOOLS_GPU_CHECK_IPC_CHILD_H_
