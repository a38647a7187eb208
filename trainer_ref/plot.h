// A PNG of the run: the training loss per step (blue), validation losses (red dots), and
// under it the bytes the tiers moved per step (green), each with its own scale. Written
// with no library: stored (uncompressed) deflate blocks inside a valid PNG.
#ifndef TIERD_TRAINER_REF_PLOT_H_
#define TIERD_TRAINER_REF_PLOT_H_

#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace tierd::trainer {

struct RunCurves {
  std::vector<double> loss;                        // per step
  std::vector<std::pair<int, double>> validation;  // (step, loss)
  std::vector<double> moved_bytes;                 // per step; empty: no panel
};

absl::Status WritePlot(const std::string& path, const RunCurves& curves, int width = 800, int height = 480);

// The PNG bytes (for tests and for WritePlot).
std::string EncodePng(const std::vector<unsigned char>& rgb, int width, int height);

}  // namespace tierd::trainer

#endif  // TIERD_TRAINER_REF_PLOT_H_
