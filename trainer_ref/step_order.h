// The order of a step's micro-batches under tierd (--step_order=auto): one micro-batch's
// whole forward and backward after the other, or layer-major (each layer for every
// micro-batch before the next layer). Layer-major brings each layer's weights over PCIe
// twice a step and sends its gradients once, whatever the number K of micro-batches, but
// keeps every layer's input for all K micro-batches until the backward: worth it when that
// larger state still fits the GPU quota and DRAM, not when the excess goes through NVMe
// each step (at 7B with fp32 moments it did: 20 s a step against 13.9).
#ifndef TIERD_TRAINER_REF_STEP_ORDER_H_
#define TIERD_TRAINER_REF_STEP_ORDER_H_

#include <string>

namespace tierd::trainer {

struct StepOrderInputs {
  bool tierd = false;            // the state is leased from tierd (otherwise all of it is on the GPU)
  int micro_batches = 1;         // K, --grad_accum_steps
  double micro_state_bytes = 0;  // the home's bytes one micro-batch at a time
  double layer_state_bytes = 0;  // ... layer-major (K inputs kept per layer)
  // ... layer-major with the compact state (compact_state.h); 0 where it cannot be kept (the
  // host's optimizer, or --compact_state=off). Layer-major then also goes when only it fits.
  double layer_compact_state_bytes = 0;
  double gpu_bytes = 0;          // tierd's GPU quota
  double dram_bytes = 0;         // tierd's DRAM quota (0: unbounded)
};

struct StepOrderChoice {
  bool layer_major = false;
  std::string why;  // one line, with the numbers
};

StepOrderChoice ChooseStepOrder(const StepOrderInputs& in);

}  // namespace tierd::trainer

#endif  // TIERD_TRAINER_REF_STEP_ORDER_H_
