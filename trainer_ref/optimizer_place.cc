#include "trainer_ref/optimizer_place.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include "absl/strings/str_format.h"
#include "trainer_ref/adamw8bit.h"
#include "trainer_ref/host_adamw.h"

namespace tierd::trainer {

OptimizerChoice ChooseOptimizerPlace(const OptimizerCostInputs& in) {
  OptimizerChoice out;
  const double optimizer_bytes = (4.0 + in.moment_bytes_per_param) * in.params;  // master + two moments
  const double excess = std::max(0.0, in.state_bytes - in.gpu_bytes);
  out.offloaded_fraction = optimizer_bytes > 0 ? std::min(1.0, excess / optimizer_bytes) : 0.0;
  const double moved = out.offloaded_fraction * optimizer_bytes;
  const double dram = in.dram_bytes > 0 ? in.dram_bytes : 1e300;
  out.gpu_nvme_bytes = std::max(0.0, excess - dram);
  const double host_state = (10.0 + in.moment_bytes_per_param) * in.params;
  out.cpu_nvme_bytes = std::max(0.0, host_state + std::max(0.0, in.activation_bytes - in.gpu_bytes) - dram);
  auto nvme_seconds = [&](double bytes) { return 2 * bytes / in.nvme_bytes_per_s; };  // out and back in
  const double streamed = std::max(moved / in.h2d_bytes_per_s, moved / in.d2h_bytes_per_s);
  out.gpu_seconds = std::max(
      std::max(0.0, streamed - (in.gpu_overlaps_forward ? in.forward_seconds : 0.0)) + in.params / in.gpu_params_per_s,
      nvme_seconds(out.gpu_nvme_bytes));
  const double host = std::max(0.0, in.params / in.host_params_per_s - in.forward_seconds);
  out.cpu_seconds = std::max({4.0 * in.params / in.d2h_bytes_per_s, 2.0 * in.params / in.h2d_bytes_per_s, host,
                              nvme_seconds(out.cpu_nvme_bytes)});
  out.on_cpu = out.cpu_seconds < out.gpu_seconds;
  out.why = absl::StrFormat(
      "%.0f%% of master weights and moments (%.1f GB) cannot stay on the GPU: through the GPU %.2f s a step "
      "(%.1f GB each way over PCIe%s, %.1f GB through NVMe), on the host %.2f s (host %s %.2f G params/s less a "
      "%.2f s forward, gradients down %.1f GB, %.1f GB through NVMe) -> %s",
      100 * out.offloaded_fraction, optimizer_bytes / 1e9, out.gpu_seconds, moved / 1e9,
      in.gpu_overlaps_forward ? " under the forward" : "", out.gpu_nvme_bytes / 1e9, out.cpu_seconds, in.host_optimizer,
      in.host_params_per_s / 1e9, in.forward_seconds, 4.0 * in.params / 1e9, out.cpu_nvme_bytes / 1e9,
      out.on_cpu ? "cpu" : "gpu");
  return out;
}

int HostGroupsForSplit(const std::vector<double>& group_optimizer_bytes, double excess) {
  const int groups = static_cast<int>(group_optimizer_bytes.size());
  double covered = 0;
  int n = 0;
  while (n < groups && covered < excess) covered += group_optimizer_bytes[groups - 1 - n++];
  return n;
}

double CalibrateHostAdamW(int64_t elements, bool moments_8bit) {
  std::vector<float> master(elements, 0.01f), m(elements, 0.f), v(elements, 0.f), grads(elements, 1e-3f);
  std::vector<uint16_t> weights(elements);
  std::vector<uint8_t> m8(moments_8bit ? Moment8bitBytes(elements) : 0), v8(m8.size());
  double best = 1e30;
  for (int run = 1; run <= 2; ++run) {
    HostAdamWParams p;
    p.step = run;
    const auto start = std::chrono::steady_clock::now();
    if (moments_8bit) {
      HostAdamW8bit(master.data(), m8.data(), v8.data(), weights.data(), grads.data(), elements, p);
    } else {
      HostAdamW(master.data(), m.data(), v.data(), weights.data(), grads.data(), elements, p);
    }
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return elements / std::max(best, 1e-9);
}

}  // namespace tierd::trainer
