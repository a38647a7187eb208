// What both trainers' main loops share: the loss window of the progress line, the metrics
// file (rewound on resume), and the words for a run that stops with an error (where its
// last checkpoint is).
#ifndef TIERD_TRAINER_REF_RUN_REPORT_H_
#define TIERD_TRAINER_REF_RUN_REPORT_H_

#include <cstdint>
#include <deque>
#include <fstream>
#include <memory>
#include <string>
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

// Opens `path` for appending one JSON line per step. On resume at `resumed_step` (> 0), the
// lines of later steps (written by the run that was stopped after its last checkpoint) are
// removed first, so the file holds each step once; `*note` says how many.
absl::StatusOr<std::ofstream> OpenMetrics(const std::string& path, int64_t resumed_step, std::string* note);

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
