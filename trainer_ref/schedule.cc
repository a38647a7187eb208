#include "trainer_ref/schedule.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_format.h"

namespace tierd::trainer {
namespace {

// GPT-3's table (Brown et al. 2020, table 2.1): parameters and peak learning rate.
constexpr double kGpt3[][2] = {{125e6, 6e-4}, {350e6, 3e-4}, {760e6, 2.5e-4}, {1.3e9, 2e-4},
                               {2.7e9, 1.6e-4}, {6.7e9, 1.2e-4}, {13e9, 1e-4}};

double Gpt3Rate(double params) {
  constexpr int n = sizeof(kGpt3) / sizeof(kGpt3[0]);
  if (params <= kGpt3[0][0]) return kGpt3[0][1];
  if (params >= kGpt3[n - 1][0]) return kGpt3[n - 1][1];
  for (int i = 1; i < n; ++i) {
    if (params <= kGpt3[i][0]) {
      const double t = std::log(params / kGpt3[i - 1][0]) / std::log(kGpt3[i][0] / kGpt3[i - 1][0]);
      return std::exp(std::log(kGpt3[i - 1][1]) + t * std::log(kGpt3[i][1] / kGpt3[i - 1][1]));
    }
  }
  return kGpt3[n - 1][1];
}

}  // namespace

Schedule ChooseSchedule(const ModelConfig& config, int64_t steps, bool fine_tune, bool gpu, bool lion, double lr,
                        int64_t warmup) {
  Schedule s;
  const double params = static_cast<double>(config.Params());
  std::string rate_why, warmup_why;
  if (fine_tune) {
    s.lr = 2e-5;
    rate_why = "2e-05, full fine-tuning's usual AdamW rate (--init_from)";
    s.warmup = std::max<int64_t>(1, std::llround(0.03 * static_cast<double>(steps)));
    warmup_why = "3% of the steps";
  } else if (gpu) {
    s.lr = Gpt3Rate(params);
    rate_why = absl::StrFormat("%.2g, GPT-3's rate for %.2gB parameters from scratch", s.lr, params / 1e9);
    s.warmup = std::clamp<int64_t>(10 * static_cast<int64_t>(std::ceil(params / 1e9)), 10, std::max<int64_t>(1, steps / 2));
    warmup_why = "10 steps a billion parameters, at most half the steps";
  } else {
    s.lr = 3e-3;
    rate_why = "3e-03, the CPU's tiny reference models' rate";
    s.warmup = 20;
    warmup_why = "the CPU's default";
  }
  if (lion) {
    s.lr /= 3;
    rate_why += ", a third for Lion";
  }
  if (lr > 0) {
    s.lr = lr;
    rate_why = "--lr";
  }
  if (warmup >= 0) {
    s.warmup = warmup;
    warmup_why = "--warmup";
  }
  s.why = absl::StrFormat("lr %.3g (%s), warmup %d steps (%s), then cosine to %.3g at step %d", s.lr, rate_why,
                          s.warmup, warmup_why, s.lr / 10, steps);
  return s;
}

}  // namespace tierd::trainer
