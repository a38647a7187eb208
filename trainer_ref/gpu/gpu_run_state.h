// How a GPU run keeps its state, from its flags: where it lives (plain GPU buffers or tierd),
// the step order, whether it is kept compact, where the optimizer runs, and FP8's settings. Each choice is
// said in a line; flags that do not go together are INVALID_ARGUMENT with the reason.
#ifndef TIERD_TRAINER_REF_GPU_GPU_RUN_STATE_H_
#define TIERD_TRAINER_REF_GPU_GPU_RUN_STATE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "trainer_ref/gpu/gpu_home.h"
#include "trainer_ref/gpu/gpu_model.h"
#include "trainer_ref/run_plan.h"
#include "trainer_ref/train_flags.h"

namespace tierd::trainer::gpu {

// The state's form: the step order (--step_order) and whether it is kept compact
// (--compact_state). `fp8_workspace`: the FP8 maps' extra GPU bytes.
struct StateChoice {
  StateOptions state;
  GpuHomeLayout layout;
  std::string step_source, state_source, activations_source;  // "--flag" or "auto"
};
absl::StatusOr<StateChoice> ChooseState(const RunSettings& s, uint64_t fp8_workspace);

// What the CUDA contexts of the run's processes take of the device, measured through NVML's
// per-process figures (this process's, and tierd's beyond its sessions' regions) plus room for
// kernels loaded as they are first used; an assumed 1 GiB without NVML. `how` says which.
struct ContextBytes {
  uint64_t own = 0, tierd = 0, total = 0;
  std::string how;
};
ContextBytes MeasureContexts(const std::string& tierd_dir);

// tierd's quotas for the session: --gpu_budget = the CUDA contexts + `workspace` + the GPU
// quota; DRAM --tierd_dram, or what the state needs beyond the GPU quota. INVALID_ARGUMENT
// with the numbers when the budget leaves nothing, or the quotas cannot hold the state.
struct Quotas {
  uint64_t gpu = 0, dram = 0, nvme = 0;
  ContextBytes contexts;
  std::string room;  // what CheckQuotasHold said
};
absl::StatusOr<Quotas> ChooseQuotas(const RunSettings& s, const GpuHomeLayout& layout, uint64_t workspace);

// --optimizer_place: gpu, cpu, or auto's choice (a cost model) with its reason printed.
absl::StatusOr<bool> ChooseOptimizerOnCpu(const RunSettings& s, const GpuHomeLayout& layout, uint64_t gpu_quota,
                                          uint64_t dram_quota, int layer_major);

// --optimizer_place=split: how many of the last groups the host steps (HostGroupsForSplit:
// the fewest whose master weights and moments free what the state exceeds `gpu_quota` by),
// said in a line; 0 for any other place.
absl::StatusOr<int> ChooseHostGroups(const RunSettings& s, const GpuHomeLayout& layout, uint64_t gpu_quota);

// Every choice of a GPU run, made once from the settings and this GPU's facts before anything
// is allocated; nothing in it is "auto". Each automatic choice says its reasons in a line as it
// is made; `table` then lists the whole plan (printed once, and the first line of --metrics).
struct GpuPlan {
  bool fp8 = false;
  std::string fp8_why;  // --precision=auto's reason ("" when --precision was given)
  uint64_t fp8_workspace = 0, workspace = 0;
  StateOptions state;
  GpuHomeLayout layout;
  Quotas quotas;  // through tierd
  bool optimizer_on_cpu = false;
  int host_optimizer_groups = 0;    // the last groups the host steps: all of them on the CPU, some in a split
  bool optimizer_deferred = false;  // the optimizer on the GPU under tierd: each layer's update before its next forward
  RunPlan table;
};
absl::StatusOr<GpuPlan> ResolveGpuPlan(const RunSettings& s);

// The home the plan chose: plain GPU buffers (null), or leased from tierd with its quotas.
absl::StatusOr<std::unique_ptr<GpuHome>> MakeHome(const RunSettings& s, const GpuPlan& plan);

// The FP8 flags as the model takes them, and said in words for the precision line.
Fp8ScalingOptions Fp8Scaling(const RunSettings& s);
std::string DescribeFp8Scaling(const RunSettings& s);
// --precision=auto's choice for this GPU (ChooseAutoPrecision); `why` says it.
bool AutoFp8(const RunSettings& s, std::string* why);

}  // namespace tierd::trainer::gpu

#endif  // TIERD_TRAINER_REF_GPU_GPU_RUN_STATE_H_
