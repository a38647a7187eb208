#include "runtime/mover.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/synchronization/notification.h"
#include "base/limits.h"
#include "base/units.h"

namespace tierd {
namespace {

// A bounce's chunks: each goes back up while the next comes down, so the two links overlap;
// more chunks overlap more but pay a copy's launch and fence each (~10 us).
constexpr uint64_t kBounceChunkBytes = 4 * kMiB;
constexpr uint64_t kBounceChunksMax = 8;

}  // namespace

absl::StatusOr<std::unique_ptr<Mover>> Mover::Create(TierStore& store,
                                                     std::unique_ptr<BlockIo> nvme_io,
                                                     Clock& clock, const MoverOptions& options) {
  std::unique_ptr<Mover> mover(new Mover(store));
  if (store.HasTier(Tier::kGpu)) {
    auto up = store.gpu().CreateCopyStream();
    if (!up.ok()) return up.status();
    auto down = store.gpu().CreateCopyStream();
    if (!down.ok()) return down.status();
    mover->to_gpu_ = std::make_unique<GpuLink>(CopyDirection::kHostToDevice, std::move(*up), clock);
    mover->from_gpu_ = std::make_unique<GpuLink>(CopyDirection::kDeviceToHost, std::move(*down), clock);
    auto within = store.gpu().CreateCopyStream();
    if (!within.ok()) return within.status();
    mover->within_gpu_ = std::make_unique<GpuLink>(CopyDirection::kDeviceToDevice, std::move(*within), clock);
    if (options.gpu_bounce_bytes > 0) {
      const uint64_t bytes = AlignUp(options.gpu_bounce_bytes, static_cast<uint64_t>(sysconf(_SC_PAGESIZE)));
      void* buffer = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (buffer == MAP_FAILED) {
        return absl::ResourceExhaustedError(absl::StrFormat(
            "the %s host buffer for moves within the GPU: %s", FormatBytes(bytes), std::strerror(errno)));
      }
      if (absl::Status pinned = store.gpu().RegisterHostMemory(buffer, bytes); !pinned.ok()) {
        munmap(buffer, bytes);
        return absl::Status(pinned.code(), absl::StrFormat("pinning the %s host buffer for moves within the GPU: %s",
                                                           FormatBytes(bytes), pinned.message()));
      }
      mover->bounce_buffer_ = static_cast<uint8_t*>(buffer);
      mover->bounce_bytes_ = bytes;
    }
  }
  if (store.HasTier(Tier::kNvme)) {
    if (nvme_io == nullptr) return absl::InvalidArgumentError("the NVMe tier needs a BlockIo");
    if (!store.HasTier(Tier::kDram)) {  // NVMe data is staged through DRAM
      return absl::InvalidArgumentError("the NVMe tier needs a DRAM tier to stage through");
    }
    const uint64_t chunk = options.nvme_chunk_bytes;
    if (!IsPowerOfTwo(chunk) || chunk < limits::kNvmeChunkBytesMin ||
        chunk > limits::kNvmeChunkBytesMax) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "NVMe chunk of %s: must be a power of two from %s to %s", FormatBytes(chunk),
          FormatBytes(limits::kNvmeChunkBytesMin), FormatBytes(limits::kNvmeChunkBytesMax)));
    }
    mover->nvme_ = std::make_unique<NvmeLink>(store, std::move(nvme_io), clock,
                                               options.register_nvme_buffers, chunk);
  }
  return mover;
}

Mover::~Mover() {
  Drain();
  if (bounce_buffer_ != nullptr) {
    store_.gpu().UnregisterHostMemory(bounce_buffer_).IgnoreError();  // the process is done with it either way
    munmap(bounce_buffer_, bounce_bytes_);
  }
}

absl::Status Mover::Check(const Extent& source, const Extent& destination, uint64_t bytes) const {
  const bool nvme = source.tier == Tier::kNvme || destination.tier == Tier::kNvme;
  const uint64_t moved = nvme ? AlignUp(bytes, limits::kDirectIoAlignmentBytes) : bytes;
  if (bytes == 0 || moved > source.bytes() || moved > destination.bytes()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "move of %s from a %s %s extent to a %s %s extent: the size must be positive and fit both",
        FormatBytes(moved), FormatBytes(source.bytes()), TierName(source.tier),
        FormatBytes(destination.bytes()), TierName(destination.tier)));
  }
  if (source.tier == destination.tier && source.arena == destination.arena &&
      source.offset() < destination.offset() + bytes && destination.offset() < source.offset() + bytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "move of %s within the %s tier: the source and destination ranges overlap", FormatBytes(bytes),
        TierName(source.tier)));
  }
  return absl::OkStatus();
}

absl::Status Mover::Move(const Extent& source, const Extent& destination, uint64_t bytes,
                         MoveCallback done) {
  if (absl::Status checked = Check(source, destination, bytes); !checked.ok()) return checked;
  const bool nvme = source.tier == Tier::kNvme || destination.tier == Tier::kNvme;
  const uint64_t moved = nvme ? AlignUp(bytes, limits::kDirectIoAlignmentBytes) : bytes;
  auto not_a_link = [&] {
    return absl::InvalidArgumentError(absl::StrFormat(
        "no link from the %s tier to the %s tier (GPU<->NVMe goes through DRAM; only the GPU moves copies within itself)",
        TierName(source.tier), TierName(destination.tier)));
  };
  if (source.tier == Tier::kDram && destination.tier == Tier::kGpu && to_gpu_) {
    to_gpu_->Enqueue(store_.Address(destination), store_.Address(source), bytes, std::move(done));
  } else if (source.tier == Tier::kGpu && destination.tier == Tier::kDram && from_gpu_) {
    from_gpu_->Enqueue(store_.Address(destination), store_.Address(source), bytes, std::move(done));
  } else if (source.tier == Tier::kGpu && destination.tier == Tier::kGpu && within_gpu_) {
    within_gpu_->Enqueue(store_.Address(destination), store_.Address(source), bytes, std::move(done));
  } else if (source.tier == Tier::kDram && destination.tier == Tier::kNvme && nvme_) {
    nvme_->Enqueue(IoKind::kWrite, store_.Address(source), destination.offset(), moved, std::move(done));
  } else if (source.tier == Tier::kNvme && destination.tier == Tier::kDram && nvme_) {
    nvme_->Enqueue(IoKind::kRead, store_.Address(destination), source.offset(), moved, std::move(done));
  } else {
    return not_a_link();
  }
  return absl::OkStatus();
}

bool Mover::Bounces(const Extent& source, const Extent& destination, uint64_t bytes) const {
  // The links' queues are the bounce's wait: only while both have room for it within the
  // buffer's size, which keeps the bounce under what a device copy costs beside a trainer.
  return bounce_buffer_ != nullptr && source.tier == Tier::kGpu && destination.tier == Tier::kGpu &&
         bytes <= bounce_bytes_ && from_gpu_->UnfinishedBytes() + bytes <= bounce_bytes_ &&
         to_gpu_->UnfinishedBytes() + bytes <= bounce_bytes_;
}

absl::Status Mover::Bounce(void* dst, const void* src, uint64_t bytes) {
  absl::MutexLock lock(&bounce_mutex_);
  const uint64_t chunk = std::max<uint64_t>(kBounceChunkBytes, (bytes + kBounceChunksMax - 1) / kBounceChunksMax);
  const size_t chunks = (bytes + chunk - 1) / chunk;
  struct Leg {
    absl::Notification done;
    absl::Status status;
  };
  std::vector<Leg> down(chunks), up(chunks);
  auto span = [&](size_t k) { return std::min(chunk, bytes - k * chunk); };
  for (size_t k = 0; k < chunks; ++k) {
    from_gpu_->Enqueue(bounce_buffer_ + k * chunk, static_cast<const uint8_t*>(src) + k * chunk, span(k),
                       [leg = &down[k]](absl::Status status) {
                         leg->status = std::move(status);
                         leg->done.Notify();
                       });
  }
  absl::Status result;
  size_t sent_up = 0;
  for (size_t k = 0; k < chunks; ++k) {
    down[k].done.WaitForNotification();  // every leg down ends before the legs (and this frame) go
    if (!down[k].status.ok() || !result.ok()) {
      if (result.ok()) result = down[k].status;
      continue;
    }
    to_gpu_->Enqueue(static_cast<uint8_t*>(dst) + k * chunk, bounce_buffer_ + k * chunk, span(k),
                     [leg = &up[k]](absl::Status status) {
                       leg->status = std::move(status);
                       leg->done.Notify();
                     });
    ++sent_up;
  }
  for (size_t k = 0; k < sent_up; ++k) {
    up[k].done.WaitForNotification();
    if (result.ok() && !up[k].status.ok()) result = up[k].status;
  }
  if (!result.ok()) {
    return absl::Status(result.code(), absl::StrFormat("moving %s within the GPU through host memory: %s",
                                                       FormatBytes(bytes), result.message()));
  }
  ++bounced_.moves;
  bounced_.bytes += bytes;
  return absl::OkStatus();
}

BounceStats Mover::Bounced() const {
  absl::MutexLock lock(&bounce_mutex_);
  return bounced_;
}

absl::Status Mover::MoveAndWait(const Extent& source, const Extent& destination, uint64_t bytes) {
  if (Bounces(source, destination, bytes)) {
    if (absl::Status checked = Check(source, destination, bytes); !checked.ok()) return checked;
    return Bounce(store_.Address(destination), store_.Address(source), bytes);
  }
  absl::Notification finished;
  absl::Status result;
  absl::Status submitted = Move(source, destination, bytes, [&](absl::Status status) {
    result = std::move(status);
    finished.Notify();
  });
  if (!submitted.ok()) return submitted;
  finished.WaitForNotification();
  return result;
}

std::vector<absl::Status> Mover::MoveAllAndWait(const std::vector<Request>& moves) {
  std::vector<absl::Status> results(moves.size());
  std::vector<absl::Notification> done(moves.size());
  for (size_t i = 0; i < moves.size(); ++i) {
    const Request& m = moves[i];
    if (Bounces(m.source, m.destination, m.bytes)) {  // through host memory: its own wait
      results[i] = MoveAndWait(m.source, m.destination, m.bytes);
      done[i].Notify();
      continue;
    }
    absl::Status submitted = Move(m.source, m.destination, m.bytes, [&results, &done, i](absl::Status status) {
      results[i] = std::move(status);
      done[i].Notify();
    });
    if (!submitted.ok()) {
      results[i] = std::move(submitted);
      done[i].Notify();
    }
  }
  for (absl::Notification& d : done) d.WaitForNotification();  // every callback is over
  return results;
}

void Mover::Drain() {
  if (to_gpu_) to_gpu_->Drain();
  if (from_gpu_) from_gpu_->Drain();
  if (within_gpu_) within_gpu_->Drain();
  if (nvme_) nvme_->Drain();
}

LinkStats Mover::Stats(Link link) const {
  switch (link) {
    case Link::kDramToGpu: return to_gpu_ ? to_gpu_->Stats() : LinkStats{};
    case Link::kGpuToDram: return from_gpu_ ? from_gpu_->Stats() : LinkStats{};
    case Link::kDramToNvme: return nvme_ ? nvme_->Stats(IoKind::kWrite) : LinkStats{};
    case Link::kNvmeToDram: return nvme_ ? nvme_->Stats(IoKind::kRead) : LinkStats{};
  }
  return LinkStats{};
}

LinkStats Mover::NvmeDeviceStats() const { return nvme_ ? nvme_->DeviceStats() : LinkStats{}; }

absl::Status Mover::NvmeBufferRegistration() const {
  if (!nvme_) return absl::FailedPreconditionError("no NVMe tier");
  return nvme_->buffer_registration();
}

}  // namespace tierd
