#include "trainer_ref/compact_state.h"

#include "absl/strings/str_format.h"

namespace tierd::trainer {
namespace {

std::string GiB(double bytes) { return absl::StrFormat("%.1f GiB", bytes / (1024.0 * 1024 * 1024)); }

constexpr char kNeedsLayerMajor[] =
    "one backward per layer a step (--step_order=layer, or --grad_accum_steps=1): a layer's gradients are rounded "
    "to bf16 once its backward is done";
constexpr char kNeedsGpuOptimizer[] =
    "the optimizer on the GPU (--optimizer_place=gpu or auto): the host's step writes the bf16 weight copy the "
    "compact state does not keep";

}  // namespace

absl::StatusOr<CompactStateChoice> ChooseCompactState(const CompactStateInputs& in) {
  if (in.flag != "auto" && in.flag != "on" && in.flag != "off") {
    return absl::InvalidArgumentError("--compact_state is auto, on or off, not '" + in.flag + "'");
  }
  const std::string sizes = absl::StrFormat("%s instead of %s", GiB(in.compact_bytes), GiB(in.full_bytes));
  const std::string what =
      "bf16 gradients after fp32 accumulation, bf16 weights rounded from the fp32 master on the GPU";
  if (in.flag == "on") {
    if (!in.one_backward_per_group)
      return absl::InvalidArgumentError(std::string("--compact_state=on needs ") + kNeedsLayerMajor);
    if (in.optimizer_on_cpu)
      return absl::InvalidArgumentError(std::string("--compact_state=on needs ") + kNeedsGpuOptimizer);
    return CompactStateChoice{true, absl::StrFormat("state: compact, %s (%s; --compact_state=on)", sizes, what)};
  }
  const double quotas = in.gpu_bytes + in.dram_bytes;
  if (in.flag == "off" || !in.tierd || in.full_bytes <= quotas) return CompactStateChoice{};
  const std::string over =
      absl::StrFormat("the full state (%s) is more than the GPU and DRAM quotas (%s), so %s of it goes through NVMe",
                      GiB(in.full_bytes), GiB(quotas), GiB(in.full_bytes - quotas));
  if (!in.one_backward_per_group || in.optimizer_on_cpu) {
    return CompactStateChoice{
        false, absl::StrFormat("state: full: %s; the compact state (%s) would need %s", over, GiB(in.compact_bytes),
                               in.one_backward_per_group ? kNeedsGpuOptimizer : kNeedsLayerMajor)};
  }
  return CompactStateChoice{
      true, absl::StrFormat("state: compact, %s (%s): %s (--compact_state=off keeps it full)", sizes, what, over)};
}

}  // namespace tierd::trainer
