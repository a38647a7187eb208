#include "trainer_ref/checkpoint_policy.h"

#include <algorithm>
#include <cmath>

#include <vector>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

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
  const double full_step = in.step_seconds + l * in.layer_recompute_seconds;
  const std::string recompute_vs_offload = absl::StrFormat(
      "a layer recomputes in %.1f ms a step; moving its activations (%s) out and back over PCIe "
      "would take %.1f ms",
      1e3 * in.layer_recompute_seconds, GiB(extra), 1e3 * offload_seconds);
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
  if (in.tierd && offload_seconds < in.layer_recompute_seconds) {
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
    const double lean_extra = in.lean_layer_bytes - in.recompute_layer_bytes;  // what a lean keep adds a layer
    if (extra <= 0 || room >= l * extra) {
      out.kept_layers = l;
    } else if (in.lean_layer_bytes <= 0 || lean_extra <= 0 || lean_extra >= extra) {
      out.kept_layers = static_cast<int>(std::floor(room / extra));
    } else {
      // As many layers as fit keep lean; the room left over turns the last of them into full keeps.
      const int keeping = static_cast<int>(std::min<double>(l, std::floor(room / lean_extra)));
      const double left = room - keeping * lean_extra;
      out.kept_layers = static_cast<int>(std::min<double>(keeping, std::floor(left / (extra - lean_extra))));
      out.lean_layers = keeping - out.kept_layers;
    }
    how = absl::StrFormat("%s of room beside the state and every layer's input, %s more a layer kept", GiB(room),
                          GiB(extra));
    if (out.lean_layers > 0) absl::StrAppendFormat(&how, " (%s kept lean)", GiB(lean_extra));
  }
  const int recomputing = l - out.kept_layers - out.lean_layers;
  const double dynamic_step =
      in.step_seconds + recomputing * in.layer_recompute_seconds + out.lean_layers * in.lean_layer_seconds;
  std::string split;
  if (recomputing == 0 && out.lean_layers == 0) {
    split = absl::StrFormat("every layer keeps its activations (%s)", GiB(l * in.kept_layer_bytes));
  } else if (out.kept_layers == 0 && out.lean_layers == 0) {
    split = "every layer recomputes its activations from its input";
  } else {
    // "layers 3-5 keep their", "layer 5 keeps its".
    auto subject = [](int first, int last, const char* verb) {
      return absl::StrFormat("%s %s%s %s", LayerRange(first, last), verb, first == last ? "s" : "",
                             first == last ? "its" : "their");
    };
    std::vector<std::string> parts;
    if (out.kept_layers > 0) {
      parts.push_back(absl::StrFormat("%s activations (%s)", subject(l - out.kept_layers, l - 1, "keep"),
                                      GiB(out.kept_layers * in.kept_layer_bytes)));
    }
    if (out.lean_layers > 0) {
      parts.push_back(
          absl::StrFormat("%s activations but the norms' and SwiGLU's outputs (%s; %.1f ms a layer to "
                          "recompute those)",
                          subject(recomputing, l - out.kept_layers - 1, "keep"),
                          GiB(out.lean_layers * in.lean_layer_bytes), 1e3 * in.lean_layer_seconds));
    }
    if (recomputing > 0) {
      parts.push_back(absl::StrFormat("%s activations from %s input", subject(0, recomputing - 1, "recompute"),
                                      recomputing == 1 ? "its" : "their"));
    }
    split = absl::StrJoin(parts, ", ");
  }
  out.why = absl::StrFormat(
      "checkpointing: dynamic: %s: %s; %s. Predicted step: dynamic %.3f s, full checkpointing "
      "%.3f s, none %s",
      split, how, recompute_vs_offload, dynamic_step, full_step, none);
  return out;
}

}  // namespace tierd::trainer
