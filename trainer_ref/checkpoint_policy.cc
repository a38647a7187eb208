#include "trainer_ref/checkpoint_policy.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_format.h"

namespace tierd::trainer {
namespace {

std::string GiB(double bytes) { return absl::StrFormat("%.2f GiB", bytes / (1024.0 * 1024 * 1024)); }

// "layers 12-23", "layer 23".
std::string LayerRange(int first, int last) {
  if (first == last) return absl::StrFormat("layer %d", first);
  return absl::StrFormat("layers %d-%d", first, last);
}

}  // namespace

CheckpointChoice ChooseCheckpointing(const CheckpointInputs& in) {
  const int l = std::max(0, in.layers);
  const double extra = std::max(0.0, in.kept_layer_bytes - in.recompute_layer_bytes);  // what keeping adds a layer
  const double all_recompute = in.other_bytes + l * in.recompute_layer_bytes;
  const double none_bytes = in.other_bytes + l * in.kept_layer_bytes;
  const double offload_seconds = in.pcie_bytes_per_s > 0 ? 2 * extra / in.pcie_bytes_per_s : INFINITY;
  const double full_step = in.step_seconds + l * in.layer_forward_seconds;
  const std::string recompute_vs_offload = absl::StrFormat(
      "a layer recomputes in %.1f ms a step; moving its activations (%s) out and back over PCIe "
      "would take %.1f ms",
      1e3 * in.layer_forward_seconds, GiB(extra), 1e3 * offload_seconds);
  std::string none;  // the predicted step without checkpointing
  if (none_bytes <= in.gpu_bytes) {
    none = absl::StrFormat("%.3f s", in.step_seconds);
  } else if (in.tierd) {
    none = absl::StrFormat("%.3f s with %s offloaded",
                           in.step_seconds + 2 * (none_bytes - in.gpu_bytes) / in.pcie_bytes_per_s,
                           GiB(none_bytes - in.gpu_bytes));
  } else {
    none = absl::StrFormat("does not fit (%s over)", GiB(none_bytes - in.gpu_bytes));
  }
  CheckpointChoice out;
  std::string how;
  if (in.tierd && offload_seconds < in.layer_forward_seconds) {
    out.kept_layers = l;
    how = "offloading beats recomputing: every layer keeps its activations and tierd moves what does not fit";
  } else if (all_recompute > in.gpu_bytes) {
    out.kept_layers = 0;
    how = absl::StrFormat(
        "the state with every layer recomputing (%s) is more than the room (%s): keeping would "
        "push state off the GPU, so every layer recomputes",
        GiB(all_recompute), GiB(in.gpu_bytes));
  } else {
    const double room = in.gpu_bytes - all_recompute;
    out.kept_layers = extra > 0 ? static_cast<int>(std::min<double>(l, std::floor(room / extra))) : l;
    how = absl::StrFormat("%s of room beside the state and every layer's input, %s more a layer kept", GiB(room),
                          GiB(extra));
  }
  const int recomputing = l - out.kept_layers;
  const double dynamic_step = in.step_seconds + recomputing * in.layer_forward_seconds;
  std::string split;
  if (recomputing == 0) {
    split = absl::StrFormat("every layer keeps its activations (%s)", GiB(l * in.kept_layer_bytes));
  } else if (out.kept_layers == 0) {
    split = "every layer recomputes its activations from its input";
  } else {
    split = absl::StrFormat("%s keep their activations (%s), %s recompute theirs from their input",
                            LayerRange(recomputing, l - 1), GiB(out.kept_layers * in.kept_layer_bytes),
                            LayerRange(0, recomputing - 1));
  }
  out.why = absl::StrFormat(
      "checkpointing: dynamic: %s: %s; %s. Predicted step: dynamic %.3f s, full checkpointing "
      "%.3f s, none %s",
      split, how, recompute_vs_offload, dynamic_step, full_step, none);
  return out;
}

}  // namespace tierd::trainer
