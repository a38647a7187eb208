// NvmeLink: both directions of the DRAM<->NVMe link, driven by one thread that owns a
// BlockIo (io_uring). Moves are cut into ops of at most one chunk (chunk_bytes); up to
// queue_depth ops are in flight, across move boundaries, so the disk never idles
// while work is queued. Each chunk of an NVMe extent carries a CRC32C: computed from
// DRAM before the write is issued, stored in the TierStore once the whole move landed,
// and verified as soon as a read chunk completes. A short transfer is resubmitted for
// its remainder; an error fails the move (its source is untouched: nothing is lost).
//
// Thread-safe: Enqueue and Drain from any thread; callbacks run on the link's thread.
#ifndef TIERD_RUNTIME_NVME_LINK_H_
#define TIERD_RUNTIME_NVME_LINK_H_

#include <deque>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "runtime/block_io.h"
#include "runtime/gpu_link.h"
#include "runtime/link_meter.h"
#include "runtime/tier_store.h"

namespace tierd {

class NvmeLink {
 public:
  // With `register_buffers`, registers the DRAM segment with `io` as fixed buffers
  // when it can (see buffer_registration()).
  // `chunk_bytes`: a power of two in [kNvmeChunkBytesMin, kNvmeChunkBytesMax].
  NvmeLink(TierStore& store, std::unique_ptr<BlockIo> io, Clock& clock, bool register_buffers,
           uint64_t chunk_bytes);
  ~NvmeLink();  // drains, then stops

  // kWrite: DRAM -> NVMe; kRead: NVMe -> DRAM. `bytes` is a multiple of 4 KiB and a
  // move always starts at its NVMe extent's first byte (checksums are per extent).
  void Enqueue(IoKind kind, uint8_t* dram, uint64_t nvme_offset, uint64_t bytes, MoveCallback done);
  void Drain();
  LinkStats Stats(IoKind kind) const { return meters_[static_cast<int>(kind)]->Stats(); }
  // Both directions together: their bytes, and the time the device was busy with either.
  LinkStats DeviceStats() const { return device_meter_->Stats(); }
  // OK if the DRAM tier is registered with io_uring (fixed buffers), else why not.
  const absl::Status& buffer_registration() const { return buffer_registration_; }
  uint64_t short_transfers() const;

 private:
  struct Move {
    IoKind kind;
    uint8_t* dram;
    uint64_t nvme_offset;
    uint64_t bytes;
    MoveCallback done;
    std::vector<uint32_t> checksums;   // per chunk; write: computed, read: expected
    std::vector<uint8_t> chunk_ops_left;
    uint64_t issued_bytes = 0;
    uint32_t ops_outstanding = 0;
    absl::Status status;
  };
  struct OpSlot {
    Move* move = nullptr;
    uint32_t chunk = 0;
    IoOp op;
  };

  absl::Status RegisterDram();
  void Run();
  void Start(Move& move);
  bool IssueNext(Move& move, uint32_t slot);
  void OnCompletion(const IoCompletion& completion);
  void VerifyReadChunks();
  void Refill(std::deque<std::unique_ptr<Move>>& active);
  void Finish(Move& move);
  std::string Describe(const Move& move, const IoOp& op) const;

  uint64_t ChunkCount(uint64_t bytes) const { return (bytes + chunk_bytes_ - 1) / chunk_bytes_; }

  TierStore& store_;
  std::unique_ptr<BlockIo> io_;
  const uint64_t chunk_bytes_;
  std::unique_ptr<LinkMeter> meters_[2];
  std::unique_ptr<LinkMeter> device_meter_;
  absl::Status buffer_registration_;
  uint8_t* registered_base_ = nullptr;  // the default DRAM arena, if any
  uint64_t registered_bytes_ = 0;

  // Owned by the link thread.
  std::vector<OpSlot> slots_;
  std::vector<uint32_t> free_slots_;
  std::deque<uint32_t> retry_slots_;
  std::vector<std::pair<Move*, uint32_t>> chunks_to_verify_;

  mutable absl::Mutex mutex_;
  std::deque<std::unique_ptr<Move>> queue_ ABSL_GUARDED_BY(mutex_);
  uint64_t unfinished_ ABSL_GUARDED_BY(mutex_) = 0;
  uint64_t short_transfers_ ABSL_GUARDED_BY(mutex_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mutex_) = false;
  std::thread worker_;
};

}  // namespace tierd

#endif  // TIERD_RUNTIME_NVME_LINK_H_
