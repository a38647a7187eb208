#include "runtime/session_service.h"

#include <utility>

#include "absl/strings/str_format.h"

namespace tierd {

absl::StatusOr<Placement> SessionService::Acquire(SessionId session, TensorId tensor, Access access, Place place) {
  const int64_t start = clock_.NowNanos();
  auto placement = leases_.Acquire(session, tensor, access, place);
  if (placement.ok() && observer_ != nullptr) {
    observer_->Acquired(session, tensor, access, place, clock_.NowNanos() - start);
  }
  Count(0, start);
  return placement;
}

absl::Status SessionService::Release(SessionId session, TensorId tensor, std::unique_ptr<GpuFence> fence) {
  const int64_t start = clock_.NowNanos();
  const absl::Status released = leases_.Release(session, tensor, std::move(fence));
  if (released.ok() && observer_ != nullptr) observer_->Released(session, tensor);
  Count(1, start);
  return released;
}

absl::Status SessionService::OpBegin(SessionId session, uint32_t op) {
  if (observer_ == nullptr) return absl::UnimplementedError("this tierd has no planner");
  const int64_t start = clock_.NowNanos();
  absl::Status begun = observer_->OpBegin(session, op);
  Count(2, start);
  return begun;
}

void SessionService::Count(int kind, int64_t start) {
  count_[kind].fetch_add(1, std::memory_order_relaxed);
  nanos_[kind].fetch_add(clock_.NowNanos() - start, std::memory_order_relaxed);
}

HotPathTimes SessionService::times() const {
  HotPathTimes t;
  t.acquires = count_[0].load();
  t.releases = count_[1].load();
  t.op_begins = count_[2].load();
  t.acquire_seconds = nanos_[0].load() * 1e-9;
  t.release_seconds = nanos_[1].load() * 1e-9;
  t.op_begin_seconds = nanos_[2].load() * 1e-9;
  return t;
}

std::string HotPathTimes::Describe() const {
  auto one = [](const char* name, int64_t n, double seconds) {
    return absl::StrFormat("%s %d x %.1f us (%.2f s)", name, n, n > 0 ? seconds / n * 1e6 : 0.0, seconds);
  };
  return one("acquire", acquires, acquire_seconds) + ", " + one("release", releases, release_seconds) + ", " +
         one("op begin", op_begins, op_begin_seconds);
}

}  // namespace tierd
