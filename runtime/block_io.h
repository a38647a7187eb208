// BlockIo: asynchronous reads and writes on one file, the seam under the NVMe link.
// The real one is io_uring (uring_block_io.h); FaultInjectingBlockIo wraps any BlockIo
// to fail or shorten chosen ops (tests). Modelled on Seastar's reactor backend: one
// owner thread, a bounded number of ops in flight, completions reaped in batches.
//
// Thread-compatible: one thread owns a BlockIo and makes every call.
#ifndef TIERD_RUNTIME_BLOCK_IO_H_
#define TIERD_RUNTIME_BLOCK_IO_H_

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace tierd {

enum class IoKind : uint8_t { kRead, kWrite };

struct IoOp {
  IoKind kind = IoKind::kRead;
  void* buffer = nullptr;     // O_DIRECT: aligned to 4 KiB, like file_offset and bytes
  uint64_t file_offset = 0;
  uint32_t bytes = 0;
  int buffer_index = -1;      // a registered buffer containing [buffer, buffer+bytes), or -1
  uint64_t tag = 0;           // returned in the completion
};

struct IoCompletion {
  uint64_t tag = 0;
  int32_t result = 0;  // bytes transferred (may be short), or -errno
};

class BlockIo {
 public:
  virtual ~BlockIo() = default;
  // Ops in flight at most; Queue() beyond it is a caller bug.
  virtual uint32_t queue_depth() const = 0;
  // Registers buffers for zero-copy-setup I/O (io_uring fixed buffers). An error means
  // "not available here"; ops with buffer_index -1 still work.
  virtual absl::Status RegisterBuffers(const std::vector<iovec>& buffers) = 0;
  // Queues an op; it is sent to the device by the next Submit().
  virtual absl::Status Queue(const IoOp& op) = 0;
  virtual absl::Status Submit() = 0;
  // Reaps up to `max` completions; with `wait`, blocks until at least one is ready
  // (if any op is in flight).
  virtual absl::StatusOr<size_t> Reap(IoCompletion* out, size_t max, bool wait) = 0;
};

}  // namespace tierd

#endif  // TIERD_RUNTIME_BLOCK_IO_H_
