#include "runtime/uring_block_io.h"

#include <liburing.h>

#include <cstring>

#include "absl/strings/str_format.h"
#include "base/check.h"
#include "base/limits.h"

namespace tierd {
namespace {

absl::Status UringError(int negative_errno, const char* what) {
  return absl::InternalError(absl::StrFormat("io_uring %s: %s", what, std::strerror(-negative_errno)));
}

class UringBlockIo final : public BlockIo {
 public:
  UringBlockIo(int fd, uint32_t queue_depth) : fd_(fd), queue_depth_(queue_depth) {}
  ~UringBlockIo() override {
    // Ops still in flight would DMA into memory that may be freed: drain them.
    while (in_flight_ > 0) {
      io_uring_cqe* cqe = nullptr;
      if (io_uring_wait_cqe(&ring_, &cqe) != 0) break;
      io_uring_cqe_seen(&ring_, cqe);
      --in_flight_;
    }
    if (buffers_registered_) io_uring_unregister_buffers(&ring_);
    io_uring_queue_exit(&ring_);
  }

  absl::Status Init() {
    if (const int error = io_uring_queue_init(queue_depth_, &ring_, 0); error < 0) {
      return UringError(error, "setup (is io_uring disabled by the kernel or seccomp?)");
    }
    return absl::OkStatus();
  }

  uint32_t queue_depth() const override { return queue_depth_; }

  absl::Status RegisterBuffers(const std::vector<iovec>& buffers) override {
    if (buffers_registered_) io_uring_unregister_buffers(&ring_);
    buffers_registered_ = false;
    const int error = io_uring_register_buffers(&ring_, buffers.data(), buffers.size());
    if (error < 0) return UringError(error, "registering buffers");
    buffers_registered_ = true;
    return absl::OkStatus();
  }

  absl::Status Queue(const IoOp& op) override {
    TIERD_CHECK(in_flight_ + queued_ < queue_depth_);
    io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
    TIERD_CHECK(sqe != nullptr);  // the ring has queue_depth entries
    const bool fixed = op.buffer_index >= 0 && buffers_registered_;
    if (op.kind == IoKind::kRead) {
      if (fixed) io_uring_prep_read_fixed(sqe, fd_, op.buffer, op.bytes, op.file_offset, op.buffer_index);
      else io_uring_prep_read(sqe, fd_, op.buffer, op.bytes, op.file_offset);
    } else {
      if (fixed) io_uring_prep_write_fixed(sqe, fd_, op.buffer, op.bytes, op.file_offset, op.buffer_index);
      else io_uring_prep_write(sqe, fd_, op.buffer, op.bytes, op.file_offset);
    }
    io_uring_sqe_set_data64(sqe, op.tag);
    ++queued_;
    return absl::OkStatus();
  }

  absl::Status Submit() override {
    if (queued_ == 0) return absl::OkStatus();
    const int submitted = io_uring_submit(&ring_);
    if (submitted < 0) return UringError(submitted, "submit");
    in_flight_ += static_cast<uint32_t>(submitted);
    queued_ -= static_cast<uint32_t>(submitted);
    return absl::OkStatus();
  }

  absl::StatusOr<size_t> Reap(IoCompletion* out, size_t max, bool wait) override {
    size_t reaped = 0;
    while (reaped < max && in_flight_ > 0) {
      io_uring_cqe* cqe = nullptr;
      const int error = (wait && reaped == 0) ? io_uring_wait_cqe(&ring_, &cqe)
                                              : io_uring_peek_cqe(&ring_, &cqe);
      if (error == -EAGAIN || cqe == nullptr) break;
      if (error < 0 && error != -EINTR) return UringError(error, "waiting for a completion");
      if (error == -EINTR) continue;
      out[reaped++] = IoCompletion{io_uring_cqe_get_data64(cqe), cqe->res};
      io_uring_cqe_seen(&ring_, cqe);
      --in_flight_;
    }
    return reaped;
  }

 private:
  const int fd_;
  const uint32_t queue_depth_;
  io_uring ring_{};
  uint32_t queued_ = 0;
  uint32_t in_flight_ = 0;
  bool buffers_registered_ = false;
};

}  // namespace

absl::StatusOr<std::unique_ptr<BlockIo>> CreateUringBlockIo(int fd, uint32_t queue_depth) {
  if (queue_depth == 0 || queue_depth > limits::kNvmeQueueDepthMax ||
      (queue_depth & (queue_depth - 1)) != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "NVMe queue depth %d: must be a power of two from 1 to %d", queue_depth,
        limits::kNvmeQueueDepthMax));
  }
  auto io = std::make_unique<UringBlockIo>(fd, queue_depth);
  if (absl::Status status = io->Init(); !status.ok()) return status;
  return std::unique_ptr<BlockIo>(std::move(io));
}

}  // namespace tierd
