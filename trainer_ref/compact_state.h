// Whether the GPU trainer keeps its state compact (--compact_state): gradients kept as bf16
// after fp32 accumulation on the GPU and no bf16 weight copy (the GPU rounds the fp32 master
// copy when a layer is used), 4 bytes a parameter less. Worth it when the full state does not
// fit tierd's GPU and DRAM quotas: every byte over them goes through NVMe each step (13B in 24
// GiB: 158 GiB of state against 119 GiB of quotas, ~10 GiB of disk traffic a step), while
// the compact state costs 2 bytes a parameter more over PCIe in the backward and a rounding
// of the gradients (2^-9 relative).
#ifndef TIERD_TRAINER_REF_COMPACT_STATE_H_
#define TIERD_TRAINER_REF_COMPACT_STATE_H_

#include <string>

#include "absl/status/statusor.h"

namespace tierd::trainer {

struct CompactStateInputs {
  std::string flag = "auto";                 // --compact_state: auto | on | off
  bool tierd = false;                        // the state is leased from tierd
  bool one_backward_per_group = false;       // layer-major, or one micro-batch a step
  bool optimizer_on_cpu = false;             // --optimizer_place=cpu
  double full_bytes = 0, compact_bytes = 0;  // the state either way
  double gpu_bytes = 0, dram_bytes = 0;      // tierd's GPU and DRAM quotas
};

struct CompactStateChoice {
  bool compact = false;
  std::string why;  // one line with the numbers; "" when there is nothing to say
};

// INVALID_ARGUMENT for a flag value it does not know, or `on` where the step cannot keep it.
absl::StatusOr<CompactStateChoice> ChooseCompactState(const CompactStateInputs& in);

}  // namespace tierd::trainer

#endif  // TIERD_TRAINER_REF_COMPACT_STATE_H_
