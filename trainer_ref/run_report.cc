#include "trainer_ref/run_report.h"

#include <signal.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tierd::trainer {

void LossWindow::Add(double loss) {
  losses_.push_back(loss);
  if (losses_.size() > kSteps) losses_.pop_front();
}

double LossWindow::mean() const {
  double sum = 0;
  for (double l : losses_) sum += l;
  return losses_.empty() ? 0 : sum / losses_.size();
}

double LossWindow::sd() const {
  const double m = mean();
  double var = 0;
  for (double l : losses_) var += (l - m) * (l - m);
  return losses_.empty() ? 0 : std::sqrt(var / losses_.size());
}

void LossWindow::Restore(const std::vector<double>& values) {
  losses_.clear();
  for (double v : values) Add(v);
}

double SpikeGuard::Check(int64_t step, double loss, const LossWindow& window) {
  if (sds_ <= 0 || window.size() < kMinSteps || !std::isfinite(loss)) return 0;
  const std::vector<double> w = window.values();
  level_ = 0;
  for (size_t i = w.size() - kLevelSteps; i < w.size(); ++i) level_ += w[i];
  level_ /= kLevelSteps;
  double mean_diff = 0, var = 0;
  for (size_t i = 1; i < w.size(); ++i) mean_diff += w[i] - w[i - 1];
  mean_diff /= static_cast<double>(w.size() - 1);
  for (size_t i = 1; i < w.size(); ++i) var += (w[i] - w[i - 1] - mean_diff) * (w[i] - w[i - 1] - mean_diff);
  noise_ = std::max(std::sqrt(var / static_cast<double>(w.size() - 1) / 2), 1e-3 * std::fabs(level_));
  window_steps_ = w.size();
  if (!(noise_ > 0)) return 0;
  const double above = (loss - level_) / noise_;
  if (!(above > sds_)) return 0;
  steps_.push_back(step);
  return above;
}

std::string SpikeGuard::Words(double sds) const {
  if (sds <= 0) return "";
  return absl::StrFormat(
      "  loss spike: %.1f sd above the last %d steps' mean %.4f (noise sd %.4f over the last %d steps)", sds,
      kLevelSteps, level_, noise_, window_steps_);
}

std::string SpikeGuard::Summary() const {
  if (steps_.empty()) return "";
  std::string which;
  for (size_t i = 0; i < steps_.size() && i < 10; ++i) absl::StrAppend(&which, i == 0 ? "" : ", ", steps_[i]);
  if (steps_.size() > 10) absl::StrAppend(&which, ", ...");
  return absl::StrFormat("; %d loss spike%s flagged (step%s %s)", steps_.size(), steps_.size() == 1 ? "" : "s",
                         steps_.size() == 1 ? "" : "s", which);
}

void StepReporter::Send(const std::function<absl::Status()>& report) {
  if (!on_) return;
  if (absl::Status st = report(); !st.ok()) {
    on_ = false;
    std::printf("note: tierd did not take the step's report (%s): its statistics will not show this run's steps\n",
                std::string(st.message()).c_str());
  }
}

absl::StatusOr<std::ofstream> OpenMetrics(const std::string& path, int64_t resumed_step, std::string* note,
                                          const std::string& plan_line) {
  if (resumed_step > 0) {
    std::ifstream in(path);
    if (in) {
      std::stringstream kept;
      std::string line;
      int dropped = 0;
      while (std::getline(in, line)) {
        // {"step": N, ...}: a line of a step after the checkpoint goes.
        int64_t step = 0;
        const size_t at = line.find("\"step\": ");
        const size_t end = at == std::string::npos ? at : line.find_first_of(",}", at);
        if (at != std::string::npos && end != std::string::npos &&
            absl::SimpleAtoi(line.substr(at + 8, end - at - 8), &step) && step > resumed_step) {
          ++dropped;
          continue;
        }
        kept << line << "\n";
      }
      in.close();
      if (dropped > 0) {
        const std::string tmp = path + ".tmp";
        std::ofstream(tmp) << kept.str();
        if (std::rename(tmp.c_str(), path.c_str()) != 0) {
          return absl::InternalError(absl::StrFormat("rewinding --metrics %s to step %d failed", path, resumed_step));
        }
        if (note != nullptr) {
          *note = absl::StrFormat("metrics %s: %d lines after step %d (the stopped run's) removed", path, dropped,
                                  resumed_step);
        }
      }
    }
  }
  std::string last_plan;
  {
    std::ifstream in(path);
    std::string line;
    while (in && std::getline(in, line)) {
      if (line.rfind("{\"plan\": ", 0) == 0) last_plan = line + "\n";
    }
  }
  std::ofstream out(path, std::ios::app);
  if (!out) return absl::InvalidArgumentError("cannot open --metrics " + path);
  if (!plan_line.empty() && plan_line != last_plan) {
    out << plan_line;
    out.flush();
  }
  return out;
}

absl::StatusOr<std::vector<double>> ReadLossCurve(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrFormat("--compare_metrics: cannot read '%s'", path));
  std::vector<double> loss;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    const size_t at = line.find("\"loss\": ");
    if (line.find("\"validation_loss\"") != std::string::npos || line.empty() || line.rfind("{\"plan\": ", 0) == 0) {
      continue;
    }
    double value = 0;
    const size_t end = at == std::string::npos ? at : line.find_first_of(",}", at);
    if (at == std::string::npos || end == std::string::npos ||
        !absl::SimpleAtod(line.substr(at + 8, end - at - 8), &value)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "--compare_metrics: '%s' line %d has no \"loss\": not a tierd-train metrics file", path, number));
    }
    loss.push_back(value);
  }
  if (loss.empty()) return absl::InvalidArgumentError(absl::StrFormat("--compare_metrics: '%s' has no steps", path));
  return loss;
}

std::string CheckpointAdvice(const std::string& dir, const std::string& last_path, int64_t last_step) {
  if (dir.empty()) {
    return "no checkpoint was kept (--checkpoint_dir=DIR keeps one every --checkpoint_every steps)";
  }
  if (last_path.empty()) {
    return absl::StrFormat("no checkpoint was written in %s yet by this run", dir);
  }
  return absl::StrFormat("last checkpoint %s (step %d); continue with --checkpoint_dir=%s --resume", last_path,
                         last_step, dir);
}

int Fail(const std::string& what) {
  std::fprintf(stderr, "tierd-train: %s\n", what.c_str());
  return 1;
}

int FailMidRun(const std::string& what, const CheckpointTrail& trail) {
  return Fail(what + "\n  " + CheckpointAdvice(trail.dir, trail.last_path, trail.last_step));
}

absl::StatusOr<std::unique_ptr<CheckpointReader>> OpenNewestCheckpoint(const std::string& dir) {
  std::string skipped;
  auto latest = LatestCheckpoint(dir, &skipped);
  if (!skipped.empty()) std::fprintf(stderr, "tierd-train: skipped damaged checkpoints:\n%s", skipped.c_str());
  if (!latest.ok()) return latest.status();
  return CheckpointReader::Open(*latest);
}

void MaybeKillForTest(int64_t step) {
  const char* at = std::getenv("TIERD_TRAIN_SIGKILL_AT_STEP");
  int64_t kill_step = 0;
  if (at == nullptr || !absl::SimpleAtoi(at, &kill_step) || kill_step != step) return;
  std::fflush(nullptr);
  kill(getpid(), SIGKILL);
}

}  // namespace tierd::trainer
