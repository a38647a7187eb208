// What a session is called and what it may hold: the ids the daemon hands out and the bytes
// per tier a session may lease. Shared by the daemon, the wire conversions and the clients
// (which link this vocabulary, not the storage engine).
#ifndef TIERD_RUNTIME_SESSION_H_
#define TIERD_RUNTIME_SESSION_H_

#include <cstdint>

namespace tierd {

using SessionId = uint64_t;
using TensorId = uint64_t;

struct SessionQuota {
  uint64_t gpu_bytes = 0;
  uint64_t dram_bytes = 0;
  uint64_t nvme_bytes = 0;
};

}  // namespace tierd

#endif  // TIERD_RUNTIME_SESSION_H_
