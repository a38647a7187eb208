#include "runtime/fault_injecting_block_io.h"

namespace tierd {

absl::Status FaultInjectingBlockIo::Queue(const IoOp& op) {
  const uint64_t index = ops_seen_[static_cast<int>(op.kind)]++;
  for (const IoFault& fault : faults_) {
    if (fault.kind != op.kind || fault.nth != index) continue;
    ++faults_fired_;
    if (fault.error_number != 0) {
      injected_.push_back(IoCompletion{op.tag, -fault.error_number});
      return absl::OkStatus();
    }
    IoOp shortened = op;
    if (fault.short_bytes < op.bytes) shortened.bytes = fault.short_bytes;
    return inner_->Queue(shortened);
  }
  return inner_->Queue(op);
}

absl::StatusOr<size_t> FaultInjectingBlockIo::Reap(IoCompletion* out, size_t max, bool wait) {
  size_t reaped = 0;
  while (reaped < max && !injected_.empty()) {
    out[reaped++] = injected_.front();
    injected_.pop_front();
  }
  if (reaped == max) return reaped;
  auto more = inner_->Reap(out + reaped, max - reaped, wait && reaped == 0);
  if (!more.ok()) return more.status();
  return reaped + *more;
}

}  // namespace tierd
