// FaultInjectingBlockIo: wraps a BlockIo and makes chosen ops fail with an errno or
// transfer only part of their bytes (as a real disk may: EIO, ENOSPC, short writes).
// Like LevelDB's ErrorEnv: the code under test runs unchanged on top of it.
#ifndef TIERD_RUNTIME_FAULT_INJECTING_BLOCK_IO_H_
#define TIERD_RUNTIME_FAULT_INJECTING_BLOCK_IO_H_

#include <deque>
#include <memory>
#include <vector>

#include "runtime/block_io.h"

namespace tierd {

struct IoFault {
  IoKind kind = IoKind::kWrite;
  uint64_t nth = 0;          // the nth op of this kind (0-based) since creation
  int error_number = 0;      // non-zero: the op fails with -error_number, nothing transferred
  uint32_t short_bytes = 0;  // else: the op transfers only this many bytes
};

class FaultInjectingBlockIo final : public BlockIo {
 public:
  FaultInjectingBlockIo(std::unique_ptr<BlockIo> inner, std::vector<IoFault> faults)
      : inner_(std::move(inner)), faults_(std::move(faults)) {}

  uint32_t queue_depth() const override { return inner_->queue_depth(); }
  absl::Status RegisterBuffers(const std::vector<iovec>& buffers) override {
    return inner_->RegisterBuffers(buffers);
  }
  absl::Status Queue(const IoOp& op) override;
  absl::Status Submit() override { return inner_->Submit(); }
  absl::StatusOr<size_t> Reap(IoCompletion* out, size_t max, bool wait) override;

  // How many faults fired so far (tests assert their fault was exercised).
  uint64_t faults_fired() const { return faults_fired_; }

 private:
  std::unique_ptr<BlockIo> inner_;
  std::vector<IoFault> faults_;
  uint64_t ops_seen_[2] = {0, 0};
  std::deque<IoCompletion> injected_;  // failed ops, completed without touching the disk
  uint64_t faults_fired_ = 0;
};

}  // namespace tierd

#endif  // TIERD_RUNTIME_FAULT_INJECTING_BLOCK_IO_H_
