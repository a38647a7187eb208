// What both trainers' main loops share: the loss window of the progress line and its spike
// guard, the metrics
// file (rewound on resume), and the words for a run that stops with an error (where its
// last checkpoint is).
#ifndef TIERD_TRAINER_REF_RUN_REPORT_H_
#define TIERD_TRAINER_REF_RUN_REPORT_H_

#include <cstdint>
#include <deque>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "trainer_ref/checkpoint.h"

namespace tierd::trainer {

// The last (up to) 100 losses: their mean and standard deviation for the progress line.
class LossWindow {
 public:
  static constexpr size_t kSteps = 100;
  void Add(double loss);
  size_t size() const { return losses_.size(); }
  double mean() const;
  double sd() const;
  std::vector<double> values() const { return {losses_.begin(), losses_.end()}; }
  void Restore(const std::vector<double>& values);

 private:
  std::deque<double> losses_;
};

// The users' loss-spike guard: a step's loss is compared with the (up to) 100 before it, once
// kMinSteps of them are there: how far it is above their recent level (the mean of the last
// kLevelSteps) in units of their step-to-step noise (the standard deviation of the window's
// successive differences over sqrt 2, which a falling trend does not inflate as it does the
// window's own standard deviation: early in training that is mostly the fall). Past `sds` the
// step is flagged on its progress line and in its metrics line, and counted for the run's last
// line. The noise is floored at 0.1% of the level, so a flat loss that ticks up is no spike.
// sds 0: off.
class SpikeGuard {
 public:
  static constexpr size_t kMinSteps = 20, kLevelSteps = 10;
  explicit SpikeGuard(double sds) : sds_(sds) {}
  // Before `loss` joins `window`: how many noise deviations above the recent level the loss is,
  // if that is a spike (0 otherwise); a spike is remembered for Summary, and Words says it.
  double Check(int64_t step, double loss, const LossWindow& window);
  // For the progress line: "  loss spike: 37.0 sd above the last 10 steps' mean 0.6100 (noise
  // sd 0.0900 over the last 50 steps)" for the last Check, or "" when it was no spike.
  std::string Words(double sds) const;
  // For the run's last line: "; 2 loss spikes flagged (steps 31, 57)" (the first 10), or "".
  std::string Summary() const;
  const std::vector<int64_t>& steps() const { return steps_; }

 private:
  double sds_;
  std::vector<int64_t> steps_;
  double level_ = 0, noise_ = 0;  // the last Check's
  size_t window_steps_ = 0;
};

// Each step's report to tierd's statistics (a home's ReportStep: tierctl stats, Prometheus),
// until one fails: the first failure is said once and reporting stops, the run goes on (a tierd
// without ReportStep; one that is going away fails the run's next acquire, which says so).
class StepReporter {
 public:
  void Send(const std::function<absl::Status()>& report);
  bool on() const { return on_; }

 private:
  bool on_ = true;
};

// Opens `path` for appending one JSON line per step. On resume at `resumed_step` (> 0), the
// lines of later steps (written by the run that was stopped after its last checkpoint) are
// removed first, so the file holds each step once; `*note` says how many. `plan_line`
// (RunPlan::JsonLine) is written first unless the file's last plan line is the same (a resume
// of the same run).
absl::StatusOr<std::ofstream> OpenMetrics(const std::string& path, int64_t resumed_step, std::string* note,
                                          const std::string& plan_line = "");

// The training loss per step of another run's metrics file (its validation lines skipped), to
// draw beside this run's (--compare_metrics). Errors name the file and the line.
absl::StatusOr<std::vector<double>> ReadLossCurve(const std::string& path);

// Where the run's work is safe: "last checkpoint DIR/ckpt-00000100.bin (step 100); continue
// with --checkpoint_dir=DIR --resume", or that there is none and how to have one.
std::string CheckpointAdvice(const std::string& dir, const std::string& last_path, int64_t last_step);

// The run's checkpoints so far, for the words of a failure.
struct CheckpointTrail {
  std::string dir, last_path;
  int64_t last_step = 0;
};
// "tierd-train: <what>" on stderr; the process's exit status (1). FailMidRun adds where the
// work is safe (CheckpointAdvice).
int Fail(const std::string& what);
int FailMidRun(const std::string& what, const CheckpointTrail& trail);

// The newest checkpoint in `dir` that verifies, open at its first record; the damaged ones
// passed over are said on stderr.
absl::StatusOr<std::unique_ptr<CheckpointReader>> OpenNewestCheckpoint(const std::string& dir);

// Fault injection for the resume tests: with TIERD_TRAIN_SIGKILL_AT_STEP=N in the
// environment, the process sends itself SIGKILL once step N is done (its metrics line
// written, its checkpoint not yet), exactly as `kill -9` would.
void MaybeKillForTest(int64_t step);

}  // namespace tierd::trainer

#endif  // TIERD_TRAINER_REF_RUN_REPORT_H_
