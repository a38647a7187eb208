// Mover: asynchronous moves between adjacent tiers, GPU<->DRAM over the copy engines
// (one link per direction, both at once) and DRAM<->NVMe over io_uring; and GPU->GPU within
// the GPU tier's region (a copy moved to join free space), on a stream of its own. Every move
// ends in exactly one callback with its status; bytes, moves and busy time are
// accounted per link and direction; each link bounds its queued and in-flight work.
// GPU<->NVMe is not a link: such data is staged through DRAM by the caller.
//
// Thread-safe. Callbacks run on the link's thread and must not block on the Mover.
#ifndef TIERD_RUNTIME_MOVER_H_
#define TIERD_RUNTIME_MOVER_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "base/clock.h"
#include "base/limits.h"
#include "runtime/block_io.h"
#include "runtime/gpu_link.h"
#include "runtime/link_meter.h"
#include "runtime/nvme_link.h"
#include "runtime/tier_store.h"

namespace tierd {

struct MoverOptions {
  // Register the DRAM tier with io_uring as fixed buffers (pins it; counts against
  // RLIMIT_MEMLOCK without CAP_IPC_LOCK). Unregistered I/O works, a little slower.
  bool register_nvme_buffers = true;
  // NVMe op size and checksum granularity: a power of two from 64 KiB to 64 MiB.
  uint64_t nvme_chunk_bytes = limits::kNvmeChunkBytesDefault;
  // A copy moved within the GPU by MoveAndWait (joining free space) of at most this many
  // bytes goes out to a pinned host buffer of this size and back on the two PCIe links
  // instead of a device copy, while neither link has more than this many bytes unfinished
  // with it. Why: without MPS, a device copy issued from the daemon's context waits for a
  // time slice beside a trainer's kernels (~2.4 ms on an H100 whatever its size, taking
  // 4-5% from the trainer), where the copy engines take 0.5 ms for 16 MiB and 1.5 ms for
  // 64 MiB and leave the trainer alone. 0: always a device copy.
  uint64_t gpu_bounce_bytes = 0;
};

// Moves within the GPU that went through host memory (MoverOptions::gpu_bounce_bytes).
struct BounceStats {
  uint64_t moves = 0;
  uint64_t bytes = 0;
};

class Mover {
 public:
  // `nvme_io` drives the store's NVMe file (null when the store has no NVMe tier).
  // `store` and `clock` must outlive the Mover.
  static absl::StatusOr<std::unique_ptr<Mover>> Create(TierStore& store,
                                                       std::unique_ptr<BlockIo> nvme_io,
                                                       Clock& clock,
                                                       const MoverOptions& options = {});
  ~Mover();  // drains every link

  // Copies the first `bytes` of `source` to the first `bytes` of `destination`.
  // INVALID_ARGUMENT (and no callback) for tiers that are not adjacent (GPU to GPU is a
  // link: within the region), ranges of one arena that overlap, 0 bytes, or
  // more bytes than either extent holds. NVMe moves round `bytes` up to 4 KiB.
  absl::Status Move(const Extent& source, const Extent& destination, uint64_t bytes,
                    MoveCallback done);
  // Move, then wait for it; returns its final status. A move within the GPU may go through
  // host memory (MoverOptions::gpu_bounce_bytes): the same bytes arrive.
  absl::Status MoveAndWait(const Extent& source, const Extent& destination, uint64_t bytes);
  // Several moves submitted together, then waited for: each one's final status, in order (a
  // refused one does not stop the others). Copies within the GPU queue on its stream at once,
  // so beside a trainer they share a time slice where one by one each waits for its own.
  struct Request {
    Extent source, destination;
    uint64_t bytes = 0;
  };
  std::vector<absl::Status> MoveAllAndWait(const std::vector<Request>& moves);
  // Returns when every move submitted so far has finished.
  void Drain();
  LinkStats Stats(Link link) const;  // bounced moves count on the host links they used
  BounceStats Bounced() const;
  // The NVMe device, reads and writes together: bytes, and the time it was busy with either.
  LinkStats NvmeDeviceStats() const;
  // Why io_uring fixed buffers are not used, or OK.
  absl::Status NvmeBufferRegistration() const;

 private:
  explicit Mover(TierStore& store) : store_(store) {}
  absl::Status Check(const Extent& source, const Extent& destination, uint64_t bytes) const;
  bool Bounces(const Extent& source, const Extent& destination, uint64_t bytes) const;
  // GPU -> the bounce buffer -> GPU, in chunks: each chunk goes back up as soon as it is down.
  absl::Status Bounce(void* dst, const void* src, uint64_t bytes);

  TierStore& store_;
  uint64_t bounce_bytes_ = 0;
  uint8_t* bounce_buffer_ = nullptr;  // pinned, bounce_bytes_ long; one bounce at a time
  mutable absl::Mutex bounce_mutex_;
  BounceStats bounced_ ABSL_GUARDED_BY(bounce_mutex_);
  std::unique_ptr<GpuLink> to_gpu_;
  std::unique_ptr<GpuLink> from_gpu_;
  std::unique_ptr<GpuLink> within_gpu_;
  std::unique_ptr<NvmeLink> nvme_;
};

}  // namespace tierd

#endif  // TIERD_RUNTIME_MOVER_H_
