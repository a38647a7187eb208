#include "comm/launch_env.h"

#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"

namespace tierd::comm {
namespace {

struct Names {
  const char* launcher;
  const char *rank, *size, *local_rank, *local_size;
};

// Checked in this order: mpirun also exports nothing of the others; srun under an
// allocation sets SLURM_* even for a torchrun it starts, so torchrun's own names win.
constexpr Names kLaunchers[] = {
    {"mpirun", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"},
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
    {"srun", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"},
};

absl::Status ReadInt(const GetEnv& getenv, const char* name, int fallback, int* out) {
  const char* v = getenv(name);
  if (v == nullptr || *v == '\0') {
    *out = fallback;
    return absl::OkStatus();
  }
  if (!absl::SimpleAtoi(v, out)) {
    return absl::InvalidArgumentError(absl::StrFormat("%s=%s is not a whole number", name, v));
  }
  return absl::OkStatus();
}

}  // namespace

std::string LaunchInfo::Describe() const {
  if (launcher == "none") return "one process (no launcher's rank in the environment)";
  return absl::StrFormat("rank %d of %d (local %d of %d), launched by %s", rank, size, local_rank, local_size,
                         launcher);
}

absl::StatusOr<LaunchInfo> LaunchFromEnv(const GetEnv& getenv) {
  LaunchInfo info;
  for (const Names& n : kLaunchers) {
    if (getenv(n.rank) == nullptr || getenv(n.size) == nullptr) continue;
    info.launcher = n.launcher;
    if (absl::Status s = ReadInt(getenv, n.rank, 0, &info.rank); !s.ok()) return s;
    if (absl::Status s = ReadInt(getenv, n.size, 1, &info.size); !s.ok()) return s;
    if (absl::Status s = ReadInt(getenv, n.local_rank, info.rank, &info.local_rank); !s.ok()) return s;
    if (absl::Status s = ReadInt(getenv, n.local_size, info.size, &info.local_size); !s.ok()) return s;
    if (info.size < 1) return absl::InvalidArgumentError(absl::StrFormat("%s=%d: need at least 1", n.size, info.size));
    if (info.rank < 0 || info.rank >= info.size) {
      return absl::InvalidArgumentError(
          absl::StrFormat("%s=%d is outside [0, %s=%d)", n.rank, info.rank, n.size, info.size));
    }
    if (const char* a = getenv("MASTER_ADDR")) info.master_addr = a;
    if (absl::Status s = ReadInt(getenv, "MASTER_PORT", 0, &info.master_port); !s.ok()) return s;
    const bool torch_agent = getenv("TORCHELASTIC_RUN_ID") != nullptr;  // set by torchrun for its workers
    info.rendezvous_port = info.master_port > 0 && torch_agent ? info.master_port + 1 : info.master_port;
    if (absl::Status s = ReadInt(getenv, "TIERD_RDZV_PORT", info.rendezvous_port, &info.rendezvous_port); !s.ok()) {
      return s;
    }
    return info;
  }
  return info;
}

absl::StatusOr<LaunchInfo> LaunchFromEnv() {
  return LaunchFromEnv([](const char* name) { return static_cast<const char*>(std::getenv(name)); });
}

}  // namespace tierd::comm
