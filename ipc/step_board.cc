#include "ipc/step_board.h"

#include <cmath>

#include "absl/strings/str_format.h"

namespace tierd::ipc {

absl::Status StepBoard::Report(SessionId session, const v1::StepReport& report) {
  const double seconds = report.step_seconds(), tokens = report.tokens();
  if (report.step() < 1 || !(seconds >= 0) || !std::isfinite(seconds) || !(tokens >= 0) || !std::isfinite(tokens)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "a step report needs a step of 1 or more and finite, non-negative seconds and tokens (got step %d, %g s, "
        "%g tokens)",
        report.step(), seconds, tokens));
  }
  absl::MutexLock lock(&mutex_);
  Entry& e = entries_[session];
  v1::SessionSteps& s = e.last;
  s.set_session_id(session);
  s.set_step(report.step());
  s.set_step_seconds(seconds);
  s.set_tokens_per_second(seconds > 0 ? tokens / seconds : 0);
  s.set_reports(s.reports() + 1);
  if (!std::isfinite(report.loss())) {
    s.set_skipped_steps(s.skipped_steps() + 1);
    return absl::OkStatus();
  }
  s.set_loss(report.loss());
  e.losses.push_back(report.loss());
  if (e.losses.size() > kWindow) e.losses.pop_front();
  double mean = 0, var = 0;
  for (double l : e.losses) mean += l;
  mean /= static_cast<double>(e.losses.size());
  for (double l : e.losses) var += (l - mean) * (l - mean);
  s.set_loss_mean(mean);
  s.set_loss_sd(std::sqrt(var / static_cast<double>(e.losses.size())));
  s.set_window(static_cast<uint32_t>(e.losses.size()));
  return absl::OkStatus();
}

void StepBoard::Forget(SessionId session) {
  absl::MutexLock lock(&mutex_);
  entries_.erase(session);
}

std::vector<v1::SessionSteps> StepBoard::Snapshot() const {
  absl::MutexLock lock(&mutex_);
  std::vector<v1::SessionSteps> out;
  for (const auto& [id, e] : entries_) out.push_back(e.last);
  return out;
}

}  // namespace tierd::ipc
