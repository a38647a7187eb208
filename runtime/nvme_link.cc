#include "runtime/nvme_link.h"

#include <sys/resource.h>

#include <cstring>

#include "absl/strings/str_format.h"
#include "base/check.h"
#include "base/limits.h"
#include "base/units.h"
#include "base/crc32c.h"

namespace tierd {
namespace {

constexpr uint64_t kPiece = limits::kNvmeRegisteredBufferBytesMax;
// Moves admitted at once: enough that the queue stays full across move boundaries.
constexpr size_t kActiveMovesMax = 4;

}  // namespace

NvmeLink::NvmeLink(TierStore& store, std::unique_ptr<BlockIo> io, Clock& clock,
                   bool register_buffers, uint64_t chunk_bytes)
    : store_(store), io_(std::move(io)), chunk_bytes_(chunk_bytes) {
  TIERD_CHECK(IsPowerOfTwo(chunk_bytes) && chunk_bytes >= limits::kNvmeChunkBytesMin &&
              chunk_bytes <= limits::kNvmeChunkBytesMax);
  meters_[0] = std::make_unique<LinkMeter>(clock);
  meters_[1] = std::make_unique<LinkMeter>(clock);
  device_meter_ = std::make_unique<LinkMeter>(clock);
  if (store_.dram() != nullptr) {
    registered_base_ = store_.dram()->base();
    registered_bytes_ = store_.dram()->bytes();
  }
  buffer_registration_ = !register_buffers ? absl::FailedPreconditionError("not asked for")
                         : registered_base_ == nullptr
                             ? absl::FailedPreconditionError("no default DRAM arena to register")
                             : RegisterDram();
  slots_.resize(io_->queue_depth());
  for (uint32_t i = io_->queue_depth(); i-- > 0;) free_slots_.push_back(i);
  worker_ = std::thread([this] { Run(); });
}

NvmeLink::~NvmeLink() {
  Drain();
  {
    absl::MutexLock lock(&mutex_);
    stopping_ = true;
  }
  worker_.join();
}

absl::Status NvmeLink::RegisterDram() {
  const uint64_t bytes = registered_bytes_;
  std::vector<iovec> pieces;
  for (uint64_t offset = 0; offset < bytes; offset += kPiece) {
    pieces.push_back(iovec{registered_base_ + offset, std::min(kPiece, bytes - offset)});
  }
  absl::Status status = io_->RegisterBuffers(pieces);
  if (status.ok()) return status;
  rlimit limit{};
  getrlimit(RLIMIT_MEMLOCK, &limit);
  return absl::Status(status.code(), absl::StrFormat(
      "io_uring fixed buffers not used for the %s DRAM tier (%s; the memlock limit is %s: raise "
      "`ulimit -l` or grant CAP_IPC_LOCK). NVMe I/O still works, unregistered.",
      FormatBytes(bytes), status.message(),
      limit.rlim_cur == RLIM_INFINITY ? std::string("unlimited") : FormatBytes(limit.rlim_cur)));
}

void NvmeLink::Enqueue(IoKind kind, uint8_t* dram, uint64_t nvme_offset, uint64_t bytes,
                       MoveCallback done) {
  TIERD_CHECK(bytes % limits::kDirectIoAlignmentBytes == 0 && bytes > 0);
  auto move = std::make_unique<Move>();
  move->kind = kind;
  move->dram = dram;
  move->nvme_offset = nvme_offset;
  move->bytes = bytes;
  move->done = std::move(done);
  absl::MutexLock lock(&mutex_);
  auto has_room = [this]() ABSL_SHARED_LOCKS_REQUIRED(mutex_) {
    return queue_.size() < limits::kMovesQueuedPerLinkMax;
  };
  mutex_.Await(absl::Condition(&has_room));
  queue_.push_back(std::move(move));
  ++unfinished_;
}

void NvmeLink::Drain() {
  absl::MutexLock lock(&mutex_);
  auto drained = [this]() ABSL_SHARED_LOCKS_REQUIRED(mutex_) { return unfinished_ == 0; };
  mutex_.Await(absl::Condition(&drained));
}

uint64_t NvmeLink::short_transfers() const {
  absl::MutexLock lock(&mutex_);
  return short_transfers_;
}

std::string NvmeLink::Describe(const Move& move, const IoOp& op) const {
  return absl::StrFormat("nvme tier: %s of %s at file offset %d (extent at %d)",
                         move.kind == IoKind::kWrite ? "write" : "read", FormatBytes(op.bytes),
                         op.file_offset, move.nvme_offset);
}

void NvmeLink::Start(Move& move) {
  const int64_t now = device_meter_->clock().NowNanos();
  meters_[static_cast<int>(move.kind)]->BeginAt(now);
  device_meter_->BeginAt(now);
  const uint64_t chunks = ChunkCount(move.bytes);
  move.chunk_ops_left.assign(chunks, 0);
  if (move.kind == IoKind::kWrite) {
    move.checksums.assign(chunks, 0);
    return;
  }
  auto expected = store_.NvmeChecksums(move.nvme_offset);
  if (!expected.ok()) {
    move.status = expected.status();
  } else if (expected->size() != chunks) {
    move.status = absl::InvalidArgumentError(absl::StrFormat(
        "nvme tier: read of %s from the extent at %d, but %d chunk(s) were written there",
        FormatBytes(move.bytes), move.nvme_offset, expected->size()));
  } else {
    move.checksums = std::move(*expected);
  }
  if (!move.status.ok()) move.issued_bytes = move.bytes;  // nothing to issue
}

// Queues the next op of `move` into `slot`: the rest of the current chunk, cut at a
// registered-buffer boundary. Returns false when the move has nothing left to issue.
bool NvmeLink::IssueNext(Move& move, uint32_t slot) {
  if (move.issued_bytes >= move.bytes || !move.status.ok()) return false;
  const uint64_t start = move.issued_bytes;
  const uint32_t chunk = static_cast<uint32_t>(start / chunk_bytes_);
  const uint64_t chunk_begin = uint64_t{chunk} * chunk_bytes_;
  const uint64_t chunk_end = std::min(chunk_begin + chunk_bytes_, move.bytes);
  // Fixed buffers cover the registered (default) DRAM arena in 1 GiB pieces; an op there
  // is cut at piece boundaries. Other arenas' addresses go unregistered.
  const bool registered = buffer_registration_.ok() && move.dram >= registered_base_ &&
                          move.dram + move.bytes <= registered_base_ + registered_bytes_;
  const uint64_t dram_offset =
      registered ? static_cast<uint64_t>(move.dram + start - registered_base_) : 0;
  const uint64_t piece_end =
      registered ? start + (dram_offset / kPiece + 1) * kPiece - dram_offset : chunk_end;
  const uint64_t end = std::min(chunk_end, piece_end);
  if (start == chunk_begin) {
    const uint64_t chunk_dram =
        registered ? static_cast<uint64_t>(move.dram + chunk_begin - registered_base_) : 0;
    const bool split = registered && (chunk_dram / kPiece) !=
                                         ((chunk_dram + (chunk_end - chunk_begin) - 1) / kPiece);
    move.chunk_ops_left[chunk] = split ? 2 : 1;
    if (move.kind == IoKind::kWrite) {
      // The checksum is of what we are about to write, taken before the disk sees it.
      move.checksums[chunk] = Crc32c(0, move.dram + chunk_begin, chunk_end - chunk_begin);
    }
  }
  OpSlot& op_slot = slots_[slot];
  op_slot.move = &move;
  op_slot.chunk = chunk;
  op_slot.op = IoOp{move.kind, move.dram + start, move.nvme_offset + start,
                    static_cast<uint32_t>(end - start),
                    registered ? static_cast<int>(dram_offset / kPiece) : -1, slot};
  TIERD_CHECK_OK(io_->Queue(op_slot.op));
  move.issued_bytes = end;
  ++move.ops_outstanding;
  return true;
}

void NvmeLink::OnCompletion(const IoCompletion& completion) {
  const uint32_t slot = static_cast<uint32_t>(completion.tag);
  OpSlot& op_slot = slots_[slot];
  Move& move = *op_slot.move;
  const IoOp& op = op_slot.op;
  if (completion.result > 0 && static_cast<uint32_t>(completion.result) < op.bytes &&
      move.status.ok()) {
    // Short transfer: the rest goes again, from where the disk stopped.
    op_slot.op.buffer = static_cast<uint8_t*>(op.buffer) + completion.result;
    op_slot.op.file_offset += completion.result;
    op_slot.op.bytes -= completion.result;
    retry_slots_.push_back(slot);
    absl::MutexLock lock(&mutex_);
    ++short_transfers_;
    return;
  }
  if (completion.result <= 0 && move.status.ok()) {
    const int error = -completion.result;
    move.status = completion.result == 0
                      ? absl::DataLossError(Describe(move, op) + ": the disk transferred nothing")
                  : error == ENOSPC
                      ? absl::ResourceExhaustedError(Describe(move, op) + ": no space left on the disk")
                      : absl::DataLossError(absl::StrFormat("%s: %s (errno %d)", Describe(move, op),
                                                            std::strerror(error), error));
  } else if (move.status.ok() && --move.chunk_ops_left[op_slot.chunk] == 0 &&
             move.kind == IoKind::kRead) {
    // Verified after the disk has new work (VerifyReadChunks); the op counts as
    // outstanding until then, so the move cannot finish unverified.
    chunks_to_verify_.push_back({&move, op_slot.chunk});
    op_slot.move = nullptr;
    free_slots_.push_back(slot);
    return;
  }
  --move.ops_outstanding;
  op_slot.move = nullptr;
  free_slots_.push_back(slot);
}

void NvmeLink::VerifyReadChunks() {
  for (auto [move, chunk] : chunks_to_verify_) {
    const uint64_t begin = uint64_t{chunk} * chunk_bytes_;
    const uint64_t length = std::min(chunk_bytes_, move->bytes - begin);
    const uint32_t actual = Crc32c(0, move->dram + begin, length);
    if (actual != move->checksums[chunk] && move->status.ok()) {
      move->status = absl::DataLossError(absl::StrFormat(
          "nvme tier: checksum mismatch in chunk %d of the extent at file offset %d (%s at offset "
          "%d): written crc32c %08x, read %08x. The data on disk is corrupt.",
          chunk, move->nvme_offset, FormatBytes(length), move->nvme_offset + begin,
          move->checksums[chunk], actual));
    }
    --move->ops_outstanding;
  }
  chunks_to_verify_.clear();
}

// Gives the disk every op it can take: remainders of short transfers first, then moves
// in arrival order. Each op is submitted at once, so a write's checksum (computed as the
// op is issued) never holds back the ops before it.
void NvmeLink::Refill(std::deque<std::unique_ptr<Move>>& active) {
  while (!retry_slots_.empty()) {
    const uint32_t slot = retry_slots_.front();
    retry_slots_.pop_front();
    TIERD_CHECK_OK(io_->Queue(slots_[slot].op));
    TIERD_CHECK_OK(io_->Submit());
  }
  for (auto& move : active) {
    while (!free_slots_.empty() && IssueNext(*move, free_slots_.back())) {
      free_slots_.pop_back();
      TIERD_CHECK_OK(io_->Submit());
    }
  }
}

void NvmeLink::Finish(Move& move) {
  if (move.kind == IoKind::kWrite && move.status.ok()) {
    store_.SetNvmeChecksums(move.nvme_offset, std::move(move.checksums));
  }
  const int64_t now = device_meter_->clock().NowNanos();
  meters_[static_cast<int>(move.kind)]->EndAt(now, move.bytes, move.status.ok());
  device_meter_->EndAt(now, move.bytes, move.status.ok());
  move.done(move.status);
  absl::MutexLock lock(&mutex_);
  --unfinished_;
}

void NvmeLink::Run() {
  std::deque<std::unique_ptr<Move>> active;
  std::vector<IoCompletion> completions(io_->queue_depth());
  for (;;) {
    {
      absl::MutexLock lock(&mutex_);
      auto ready = [this, &active]() ABSL_SHARED_LOCKS_REQUIRED(mutex_) {
        return !active.empty() || !queue_.empty() || stopping_;
      };
      mutex_.Await(absl::Condition(&ready));
      if (active.empty() && queue_.empty()) return;  // stopping, drained
      while (!queue_.empty() && active.size() < kActiveMovesMax) {
        active.push_back(std::move(queue_.front()));
        queue_.pop_front();
        Start(*active.back());
      }
    }
    Refill(active);
    const bool in_flight = free_slots_.size() < slots_.size();
    if (in_flight) {
      auto reaped = io_->Reap(completions.data(), completions.size(), /*wait=*/true);
      TIERD_CHECK_OK(reaped.status());
      for (size_t i = 0; i < *reaped; ++i) OnCompletion(completions[i]);
      Refill(active);  // the disk first, then the CPU work of checking what arrived
      VerifyReadChunks();
    }
    // Finish, in order, every move with nothing left to issue or to wait for.
    for (auto it = active.begin(); it != active.end();) {
      Move& move = **it;
      const bool done = (move.issued_bytes >= move.bytes || !move.status.ok()) &&
                        move.ops_outstanding == 0;
      if (!done) {
        ++it;
        continue;
      }
      Finish(move);
      it = active.erase(it);
    }
  }
}

}  // namespace tierd
