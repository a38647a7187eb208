// A PNG of the run, readable on its own: a title; the training loss per step (blue line) and
// validation losses (red dots) against the step, with axes, ticks, numbers, axis labels, a
// grid and a legend; under it, when there is traffic, the bytes the tiers moved per step
// (green) on its own axis. Written with no plotting library: a built-in 6x10 font, the PNG
// deflated by zlib. tools/plot_metrics.py draws the same
// from the metrics JSONL with matplotlib, where it is installed.
#ifndef TIERD_TRAINER_REF_PLOT_H_
#define TIERD_TRAINER_REF_PLOT_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace tierd::trainer {

struct RunCurves {
  std::string title = "tierd-train";
  int64_t first_step = 1;                          // the step of loss[0] (a resumed run starts later)
  std::vector<double> loss;                        // per step
  std::vector<std::pair<int, double>> validation;  // (step, loss)
  std::vector<double> moved_bytes;                 // per step; empty: no panel
  // Another run's training loss per step from step 1 (e.g. the dense run a sparse one is
  // held against), drawn in grey under this run's; empty: none.
  std::vector<double> reference;
  std::string reference_name;
};

absl::Status WritePlot(const std::string& path, const RunCurves& curves, int width = 960, int height = 600);

// The PNG bytes (for tests and for WritePlot).
std::string EncodePng(const std::vector<unsigned char>& rgb, int width, int height);

// Axis ticks over [lo, hi]: about `target` round values (1, 2 or 5 times a power of ten
// apart) from at or below lo to at or above hi.
std::vector<double> NiceTicks(double lo, double hi, int target);
// A tick's label: as few decimals as the spacing needs ("0.5", "1.5", "2000", "1e+06").
std::string TickLabel(double value, double spacing);

}  // namespace tierd::trainer

#endif  // TIERD_TRAINER_REF_PLOT_H_
