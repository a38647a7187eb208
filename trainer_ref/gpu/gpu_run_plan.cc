// A GPU run's plan (gpu_run_state.h's GpuPlan): every choice made once, in order, from the
// settings and this GPU's facts, and the table that lists them.
#include <cuda_runtime.h>

#include "absl/strings/str_format.h"
#include "base/units.h"
#include "trainer_ref/gpu/gpu_run_state.h"
#include "trainer_ref/run_plan.h"

namespace tierd::trainer::gpu {

absl::StatusOr<GpuPlan> ResolveGpuPlan(const RunSettings& s) {
  GpuPlan plan;
  const ModelConfig& config = s.config;
  cudaDeviceProp prop{};
  int device = 0;
  cudaGetDevice(&device);
  cudaGetDeviceProperties(&prop, device);
  plan.fp8 = s.fp8;
  if (s.precision_auto) plan.fp8 = AutoFp8(s, &plan.fp8_why);
  plan.fp8_workspace = plan.fp8 ? GpuModel::Fp8WorkspaceBytesFor(config, s.batch, s.seq, Fp8Scaling(s)) : 0;
  auto chosen = ChooseState(s, plan.fp8_workspace);
  if (!chosen.ok()) return chosen.status();
  plan.state = chosen->state;
  plan.layout = chosen->layout;
  plan.workspace = GpuModel::WorkspaceBytesFor(config, s.batch, s.seq, plan.state) + plan.fp8_workspace;
  if (s.tierd) {
    auto quotas = ChooseQuotas(s, plan.layout, plan.workspace);
    if (!quotas.ok()) return quotas.status();
    plan.quotas = *quotas;
  }
  auto on_cpu = ChooseOptimizerOnCpu(s, plan.layout, plan.quotas.gpu, plan.quotas.dram,
                                     plan.state.layer_major_micro_batches);
  if (!on_cpu.ok()) return on_cpu.status();
  plan.optimizer_on_cpu = *on_cpu;
  auto split = ChooseHostGroups(s, plan.layout, plan.quotas.gpu);
  if (!split.ok()) return split.status();
  const int groups = static_cast<int>(plan.layout.groups.size());
  plan.host_optimizer_groups = plan.optimizer_on_cpu ? groups : *split;
  // A split defers its GPU groups itself (GpuModel::SetHostOptimizerGroups).
  plan.optimizer_deferred = s.tierd && plan.host_optimizer_groups == 0 && s.optimizer_deferred;

  RunPlan& t = plan.table;
  t.Add("device", absl::StrFormat("GPU %d: %s (compute capability %d.%d)", device, prop.name, prop.major, prop.minor),
        s.Given("device") ? "--device" : "auto");
  t.Add("precision",
        plan.fp8 ? std::string("fp8 matmuls in the decoder layers") + (s.bf16_layers.empty() ? "" : " but " +
                                                                             s.bf16_layers) + ", bf16 elsewhere"
                 : "bf16, fp32 master weights",
        s.precision_auto ? "auto (said above)" : "--precision");
  AddCommonRows(s, &t);
  const StateOptions& st = plan.state;
  t.Add("step order",
        st.layer_major_micro_batches > 0
            ? absl::StrFormat("layer-major over %d micro-batches", st.layer_major_micro_batches)
            : "one micro-batch after the other",
        chosen->step_source);
  t.Add("state",
        st.compact ? "compact (bf16 gradients, no bf16 weight copy)" : "full (fp32 gradients, a bf16 weight copy)",
        chosen->state_source);
  const int recompute = config.layers - st.kept_layers - st.lean_layers;
  t.Add("activations",
        !s.checkpointing ? std::string("all kept")
        : s.dynamic_checkpointing
            ? absl::StrFormat("%d layers keep, %d keep lean, %d recompute%s", st.kept_layers, st.lean_layers,
                              recompute, st.bf16_checkpoints ? " (from their input in bf16)" : "")
            : std::string(st.bf16_checkpoints ? "full checkpointing (each layer's input kept, in bf16)"
                                              : "full checkpointing (each layer's input kept)"),
        chosen->activations_source);
  t.Add("optimizer step",
        (plan.optimizer_on_cpu ? std::string("on the host, in tierd's DRAM")
         : plan.host_optimizer_groups > 0
             ? absl::StrFormat("split: the last %d groups on the host in tierd's DRAM, the other %d on the GPU, "
                               "each before its next forward",
                               plan.host_optimizer_groups, groups - plan.host_optimizer_groups)
         : plan.optimizer_deferred ? std::string("on the GPU, each layer's update before its next forward")
                                   : std::string("on the GPU, at the step's end")) +
            (st.transposed_weight_codes ? ", writing FP8 weight codes and their transposes"
             : st.fp8_weight_codes      ? ", writing FP8 weight codes"
                                        : ""),
        s.optimizer_place == "auto" && s.tierd ? "auto (said above)"
        : s.Given("optimizer_place")           ? "--optimizer_place"
                                               : "default");
  if (s.tierd) {
    const Quotas& q = plan.quotas;
    t.Add("GPU budget",
          absl::StrFormat("%s = contexts %s + workspace %s + tierd's GPU quota %s", FormatBytes(s.gpu_budget),
                          FormatBytes(q.contexts.total), FormatBytes(plan.workspace), FormatBytes(q.gpu)),
          s.Given("gpu_budget") ? "--gpu_budget" : "default");
    t.Add("tierd DRAM, NVMe", absl::StrFormat("%s, %s", FormatBytes(q.dram), FormatBytes(q.nvme)),
          s.Given("tierd_dram") ? "--tierd_dram" : "auto (the state beyond the GPU quota)");
    t.Add("tierd plan", s.tierd_plan ? "the step's graph registered" : "none (tierd's online policy)",
          s.Given("tierd_plan") ? "--tierd_plan" : "default");
  }
  t.Add("attention",
        s.attention == "auto"    ? std::string("cuDNN's fused attention if libcudnn.so.9 opens, else ours")
        : s.attention == "cudnn"      ? std::string("cuDNN's fused attention")
        : s.attention == "cudnn-fast" ? std::string("cuDNN's fused attention, non-deterministic backward")
                                      : std::string("ours (FlashAttention-2-style)"),
        s.Given("attention") ? "--attention" : "default");
  t.Add("GEMM algorithms",
        s.gemm_candidates > 1
            ? absl::StrFormat("the fastest of cuBLASLt's first %d a shape, cached in %s", s.gemm_candidates,
                              s.gemm_cache_dir)
            : std::string("cuBLASLt's heuristic first choice"),
        s.Given("gemm_candidates") ? "--gemm_candidates" : "default");
  t.Add("GEMM workspace", absl::StrFormat("%d MiB", s.gemm_workspace_mib),
        s.Given("gemm_workspace_mib") ? "--gemm_workspace_mib" : "default");
  if (!s.tierd) {
    t.Add("GPU memory", absl::StrFormat("plain buffers: state %s + workspace %s", FormatBytes(plan.layout.Total()),
                                        FormatBytes(plan.workspace)),
          "the state as laid out");
  }
  return plan;
}

}  // namespace tierd::trainer::gpu
