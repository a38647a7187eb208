#include "runtime/host_memory.h"

#include <sys/statvfs.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_format.h"
#include "base/units.h"

namespace tierd {

absl::StatusOr<HostMemoryInfo> ReadHostMemoryInfo(const std::string& shm_directory) {
  HostMemoryInfo info;
  std::ifstream meminfo("/proc/meminfo");
  if (!meminfo) return absl::UnavailableError("cannot read /proc/meminfo");
  std::string line;
  bool found = false;
  while (std::getline(meminfo, line)) {
    std::istringstream fields(line);
    std::string key;
    uint64_t kib = 0;
    if (fields >> key >> kib && key == "MemAvailable:") {
      info.mem_available_bytes = kib * kKiB;
      found = true;
    }
  }
  if (!found) return absl::UnavailableError("/proc/meminfo has no MemAvailable line");
  struct statvfs fs;
  if (statvfs(shm_directory.c_str(), &fs) != 0) {
    return absl::UnavailableError(
        absl::StrFormat("statvfs(%s): %s", shm_directory, std::strerror(errno)));
  }
  info.shm_free_bytes = static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize;
  return info;
}

absl::Status CheckDramBudget(uint64_t budget_bytes, uint64_t headroom_bytes,
                             const HostMemoryInfo& info) {
  const uint64_t givable =
      info.mem_available_bytes > headroom_bytes ? info.mem_available_bytes - headroom_bytes : 0;
  if (budget_bytes > givable) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "dram tier: budget %s exceeds what this host can give: %s available, minus %s kept for "
        "the system and the trainers = %s. Lower the DRAM budget (the NVMe tier takes the rest).",
        FormatBytes(budget_bytes), FormatBytes(info.mem_available_bytes),
        FormatBytes(headroom_bytes), FormatBytes(givable)));
  }
  if (budget_bytes > info.shm_free_bytes) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "dram tier: budget %s exceeds the free space of the shared-memory filesystem (%s free "
        "in /dev/shm). Enlarge it (mount -o remount,size=...) or lower the DRAM budget.",
        FormatBytes(budget_bytes), FormatBytes(info.shm_free_bytes)));
  }
  return absl::OkStatus();
}

}  // namespace tierd
