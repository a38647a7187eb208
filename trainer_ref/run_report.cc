#include "trainer_ref/run_report.h"

#include <signal.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "absl/strings/numbers.h"
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

absl::StatusOr<std::ofstream> OpenMetrics(const std::string& path, int64_t resumed_step, std::string* note) {
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
  std::ofstream out(path, std::ios::app);
  if (!out) return absl::InvalidArgumentError("cannot open --metrics " + path);
  return out;
}

absl::StatusOr<std::vector<double>> ReadLossCurve(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrFormat("--compare_metrics: cannot read '%s'", path));
  std::vector<double> loss;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    const size_t at = line.find("\"loss\": ");
    if (line.find("\"validation_loss\"") != std::string::npos || line.empty()) continue;
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
