// StepBoard: what tierd knows of each session's training, from the steps its trainer reports
// (ReportStep): the last step, its time and tokens/s, and the mean and standard deviation of
// the last 100 finite losses — the users' "step time, loss variance" in tierctl stats and
// Prometheus, beside the tiers' statistics. A session's entry goes when the session does.
//
// Thread-safety: every method may be called from any thread.
#ifndef TIERD_IPC_STEP_BOARD_H_
#define TIERD_IPC_STEP_BOARD_H_

#include <cstdint>
#include <deque>
#include <map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "proto/tierd.pb.h"
#include "runtime/session.h"

namespace tierd::ipc {

class StepBoard {
 public:
  static constexpr size_t kWindow = 100;
  // INVALID_ARGUMENT (saying which) for a step below 1, or seconds or tokens that are
  // negative or not finite; a non-finite loss is a skipped step.
  absl::Status Report(SessionId session, const v1::StepReport& report);
  void Forget(SessionId session);
  // One entry per session that reported, by session id.
  std::vector<v1::SessionSteps> Snapshot() const;

 private:
  struct Entry {
    v1::SessionSteps last;
    std::deque<double> losses;
  };
  mutable absl::Mutex mutex_;
  std::map<SessionId, Entry> entries_ ABSL_GUARDED_BY(mutex_);
};

}  // namespace tierd::ipc

#endif  // TIERD_IPC_STEP_BOARD_H_
