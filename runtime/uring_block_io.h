// The real BlockIo: io_uring (liburing) on one O_DIRECT file descriptor.
#ifndef TIERD_RUNTIME_URING_BLOCK_IO_H_
#define TIERD_RUNTIME_URING_BLOCK_IO_H_

#include <memory>

#include "absl/status/statusor.h"
#include "runtime/block_io.h"

namespace tierd {

// `fd` stays owned by the caller and must outlive the BlockIo. `queue_depth` is a
// power of two up to limits::kNvmeQueueDepthMax.
absl::StatusOr<std::unique_ptr<BlockIo>> CreateUringBlockIo(int fd, uint32_t queue_depth);

}  // namespace tierd

#endif  // TIERD_RUNTIME_URING_BLOCK_IO_H_
