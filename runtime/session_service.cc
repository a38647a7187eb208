#include "runtime/session_service.h"

#include <utility>

namespace tierd {

absl::StatusOr<Placement> SessionService::Acquire(SessionId session, TensorId tensor, Access access, Place place) {
  const int64_t start = clock_.NowNanos();
  auto placement = leases_.Acquire(session, tensor, access, place);
  if (placement.ok() && observer_ != nullptr) {
    observer_->Acquired(session, tensor, access, place, clock_.NowNanos() - start);
  }
  return placement;
}

absl::Status SessionService::Release(SessionId session, TensorId tensor, std::unique_ptr<GpuFence> fence) {
  const absl::Status released = leases_.Release(session, tensor, std::move(fence));
  if (released.ok() && observer_ != nullptr) observer_->Released(session, tensor);
  return released;
}

absl::Status SessionService::OpBegin(SessionId session, uint32_t op) {
  if (observer_ == nullptr) return absl::UnimplementedError("this tierd has no planner");
  return observer_->OpBegin(session, op);
}

}  // namespace tierd
