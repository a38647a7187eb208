#include "trainer_ref/step_order.h"

#include <algorithm>

#include "absl/strings/str_format.h"

namespace tierd::trainer {

StepOrderChoice ChooseStepOrder(const StepOrderInputs& in) {
  StepOrderChoice out;
  if (!in.tierd) {
    out.why = "one micro-batch after the other (without tierd the whole state is on the GPU: no bytes to save)";
    return out;
  }
  if (in.micro_batches <= 1) {
    out.why = "one micro-batch a step (--grad_accum_steps=1): the two orders are the same";
    return out;
  }
  const double beyond = std::max(0.0, in.layer_state_bytes - in.gpu_bytes);
  const double micro_beyond = std::max(0.0, in.micro_state_bytes - in.gpu_bytes);
  const double compact_beyond = std::max(0.0, in.layer_compact_state_bytes - in.gpu_bytes);
  if (in.dram_bytes > 0 && beyond > in.dram_bytes && in.layer_compact_state_bytes > 0 &&
      compact_beyond <= in.dram_bytes) {
    out.layer_major = true;
    out.why = absl::StrFormat(
        "layer-major over %d micro-batches with the compact state: each layer's weights cross PCIe twice a step "
        "instead of %d times, its gradients leave once; the full state would leave %.1f GB beyond the GPU's %.1f GB, "
        "more than DRAM's %.1f GB, the compact one %.1f GB",
        in.micro_batches, 2 * in.micro_batches, beyond / 1e9, in.gpu_bytes / 1e9, in.dram_bytes / 1e9,
        compact_beyond / 1e9);
    return out;
  }
  if (in.dram_bytes > 0 && beyond > in.dram_bytes) {
    out.why = absl::StrFormat(
        "one micro-batch after the other: layer-major keeps each layer's input for %d micro-batches, %.1f GB of "
        "state beyond the GPU's %.1f GB, more than DRAM's %.1f GB (the rest would cross NVMe each step); this "
        "order leaves %.1f GB beyond the GPU",
        in.micro_batches, beyond / 1e9, in.gpu_bytes / 1e9, in.dram_bytes / 1e9, micro_beyond / 1e9);
    return out;
  }
  out.layer_major = true;
  out.why = absl::StrFormat(
      "layer-major over %d micro-batches: each layer's weights cross PCIe twice a step instead of %d times, its "
      "gradients leave once; the state beyond the GPU's %.1f GB (%.1f GB with the kept inputs) fits DRAM%s",
      in.micro_batches, 2 * in.micro_batches, in.gpu_bytes / 1e9, beyond / 1e9,
      in.dram_bytes > 0 ? absl::StrFormat("'s %.1f GB", in.dram_bytes / 1e9).c_str() : "");
  return out;
}

}  // namespace tierd::trainer
