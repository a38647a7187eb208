// What the host can really give the DRAM tier: MemAvailable (pages the kernel can
// hand out without swapping) and the free space of the shared-memory filesystem. A
// budget above either would be overcommit, and the kernel's OOM killer or a SIGBUS on
// a tmpfs page would end the job later instead of a clear refusal now.
#ifndef TIERD_RUNTIME_HOST_MEMORY_H_
#define TIERD_RUNTIME_HOST_MEMORY_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace tierd {

struct HostMemoryInfo {
  uint64_t mem_available_bytes = 0;
  uint64_t shm_free_bytes = 0;
};

// Reads /proc/meminfo and statvfs(shm_directory) (default /dev/shm).
absl::StatusOr<HostMemoryInfo> ReadHostMemoryInfo(const std::string& shm_directory = "/dev/shm");

// OK if `budget_bytes` fits what the host can give, leaving `headroom_bytes` of
// MemAvailable to everything else; RESOURCE_EXHAUSTED with the numbers otherwise.
absl::Status CheckDramBudget(uint64_t budget_bytes, uint64_t headroom_bytes,
                             const HostMemoryInfo& info);

}  // namespace tierd

#endif  // TIERD_RUNTIME_HOST_MEMORY_H_
