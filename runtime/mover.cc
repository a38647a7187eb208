#include "runtime/mover.h"

#include "absl/strings/str_format.h"
#include "absl/synchronization/notification.h"
#include "base/limits.h"
#include "base/units.h"

namespace tierd {

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

Mover::~Mover() { Drain(); }

absl::Status Mover::Move(const Extent& source, const Extent& destination, uint64_t bytes,
                         MoveCallback done) {
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

absl::Status Mover::MoveAndWait(const Extent& source, const Extent& destination, uint64_t bytes) {
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
