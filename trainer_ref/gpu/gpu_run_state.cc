// How a GPU run keeps its state (gpu_run_state.h): the home, the step order, the compact
// state and the optimizer's place, each choice said in a line.
#include "trainer_ref/gpu/gpu_run_state.h"

#include <algorithm>
#include <cstdio>
#include <unistd.h>
#include <vector>

#include <cuda_runtime.h>

#include "absl/strings/str_format.h"
#include "base/units.h"
#include "base/gpu_utilisation.h"
#include "clients/client.h"
#include "trainer_ref/checkpoint_policy.h"
#include "trainer_ref/compact_state.h"
#include "trainer_ref/gpu/gpu_tierd_home.h"
#include "trainer_ref/model_config.h"
#include "trainer_ref/optimizer_place.h"
#include "trainer_ref/step_order.h"

namespace tierd::trainer::gpu {
namespace {

// The state's form as the settings give it, before the step order, the compact state and
// the kept activations are chosen: the one place settings become StateOptions.
StateOptions BaseState(const RunSettings& s, int layer_major_micro_batches = 0, bool compact = false) {
  return {.checkpointing = s.checkpointing,
          .bf16_checkpoints = s.bf16_checkpoints,
          .layer_major_micro_batches = layer_major_micro_batches,
          .moments_8bit = s.moments_8bit,
          .moments_8bit_min = s.moments_8bit_min,
          .compact = compact,
          .lion = s.lion,
          .adafactor = s.adafactor,
          .gemm_candidates = s.gemm_candidates,
          .gemm_workspace_bytes = static_cast<size_t>(s.gemm_workspace_mib) << 20,
          .gemm_cache_dir = s.gemm_cache_dir,
          .attention = s.attention,
          .fused_norms = s.fused_norms,
          .optimizer_one_launch = s.optimizer_one_launch};
}

// Without --tierd_dram the DRAM quota is what the state needs beyond the GPU, at most this.
constexpr uint64_t kAutoDramCap = 64 * kGiB;
// Beyond the contexts measured at startup: the kernels CUDA loads as they are first used
// (cuBLASLt's among them), cudaMalloc's rounding of the workspace's buffers, and what the device
// holds for neither process (on the H200 box nvidia-smi's peak for the 8B run was 259 MiB above
// NVML's two processes at its end: 22,377 MiB against 22,118).
constexpr uint64_t kContextGrowth = 384 * kMiB;
// Without NVML's per-process figures: what two processes' contexts took on the H200 box.
constexpr uint64_t kContextsAssumed = 1 * kGiB;

}  // namespace

ContextBytes MeasureContexts(const std::string& tierd_dir) {
  ContextBytes c;
  int device = 0;
  char bus_id[64] = {};
  cudaGetDevice(&device);
  cudaFree(nullptr);  // this process's context exists now, so NVML lists it
  auto nvml = cudaDeviceGetPCIBusId(bus_id, sizeof(bus_id), device) == cudaSuccess
                  ? GpuUtilisation::Open(bus_id)
                  : absl::UnavailableError("CUDA gave no PCI bus id for the GPU");
  auto processes = nvml.ok() ? (*nvml)->ProcessMemory() : nvml.status();
  if (!processes.ok()) {
    c.total = kContextsAssumed;
    c.how = absl::StrFormat("CUDA contexts %s (assumed: %s)", FormatBytes(c.total), processes.status().message());
    return c;
  }
  c.own = ProcessBytes(*processes, static_cast<uint32_t>(getpid()));
  const uint64_t daemon = NamedProcessesBytes(*processes, "tierd");
  // tierd's GPU regions are sessions' quotas (other runs'), not its overhead.
  uint64_t regions = 0;
  ClientOptions watch;
  watch.runtime_dir = tierd_dir;
  watch.label = "tierd-train (budget)";
  watch.observer = true;
  if (auto client = Client::Connect(watch); client.ok()) {
    if (auto stats = (*client)->Stats(); stats.ok()) {
      for (const auto& tier : stats->tiers()) {
        if (tier.tier() == v1::TIER_GPU) regions += tier.reserved_bytes();
      }
    }
  }
  c.tierd = daemon > regions ? daemon - regions : 0;
  c.total = c.own + c.tierd + kContextGrowth;
  c.how = absl::StrFormat("CUDA contexts %s (this process %s and tierd %s as NVML counts them, + %s for kernels "
                          "loaded when first used)",
                          FormatBytes(c.total), FormatBytes(c.own), FormatBytes(c.tierd), FormatBytes(kContextGrowth));
  return c;
}

absl::StatusOr<Quotas> ChooseQuotas(const RunSettings& s, const GpuHomeLayout& layout, uint64_t workspace) {
  Quotas q;
  const uint64_t budget = s.gpu_budget;  // ReadRunSettings refused a --gpu_budget that is not a size
  // The budget is the device memory the run takes as nvidia-smi counts it: both processes'
  // CUDA contexts, the trainer's workspace and tierd's GPU quota for the session.
  q.contexts = MeasureContexts(s.tierd_dir);
  if (budget <= workspace + q.contexts.total) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--gpu_budget %s leaves nothing for tierd: the trainer's workspace is %s for %d x %d tokens and the %s (a "
        "smaller --batch_size or --seq_len shrinks the workspace)",
        FormatBytes(budget), FormatBytes(workspace), s.batch, s.seq, q.contexts.how));
  }
  q.gpu = budget - workspace - q.contexts.total;
  q.dram = s.tierd_dram;
  if (q.dram == 0) {  // what the state needs beyond the GPU quota, with room to spare
    const uint64_t need = layout.Total() > q.gpu ? layout.Total() - q.gpu : 0;
    q.dram = std::min<uint64_t>(kAutoDramCap, (need + need / 4 + kGiB + kGiB - 1) / kGiB * kGiB);
    std::printf("offload: DRAM quota %s (the state beyond the GPU quota, +25%% and 1 GiB; --tierd_dram to set)\n",
                FormatBytes(q.dram).c_str());
  }
  q.nvme = s.tierd_nvme;
  auto room = CheckQuotasHold(layout, q.gpu, q.dram, q.nvme);
  if (!room.ok()) return room.status();
  q.room = *room;
  return q;
}

absl::StatusOr<std::unique_ptr<GpuHome>> MakeHome(const RunSettings& s, const GpuPlan& plan) {
  if (!s.tierd) return std::unique_ptr<GpuHome>();
  const GpuHomeLayout& layout = plan.layout;
  const Quotas& q = plan.quotas;
  ClientOptions client;
  client.runtime_dir = s.tierd_dir;
  client.label = "tierd-train";
  client.quota = {q.gpu, q.dram, q.nvme};
  std::fputs(q.room.c_str(), stdout);
  auto made = MakeTierdGpuHome(layout, client);
  if (!made.ok()) return absl::Status(made.status().code(), "tierd: " + std::string(made.status().message()));
  const int chunks = layout.state_chunks;
  std::printf(
      "offload: tierd at %s; GPU budget %s (the device memory of this process and tierd, as nvidia-smi counts "
      "it) = %s + workspace %s + tierd's GPU quota %s, for a state of %s "
      "(weights %s, master %s, gradients %s, moments %s%s, saved activations %s)%s\n",
      client.runtime_dir.c_str(), FormatBytes(s.gpu_budget).c_str(), q.contexts.how.c_str(),
      FormatBytes(plan.workspace).c_str(), FormatBytes(q.gpu).c_str(), FormatBytes(layout.Total()).c_str(),
      layout.compact ? "from the master" : FormatBytes(layout.TotalOf(Part::kWeights)).c_str(),
      FormatBytes(layout.TotalOf(Part::kMaster)).c_str(),
      (FormatBytes(layout.TotalOf(Part::kGrads)) + (layout.compact ? " bf16" : "")).c_str(),
      FormatBytes(layout.TotalOf(Part::kAdamM) + layout.TotalOf(Part::kAdamV)).c_str(),
      layout.moments_8bit ? " (8-bit)"
      : s.adafactor       ? " (Adafactor's factored)"
      : s.lion            ? " (Lion's one)"
                          : "",
      FormatBytes(layout.TotalOf(Part::kActs)).c_str(),
      chunks > 1 ? absl::StrFormat("; master weights and moments in %d sub-groups a layer (%s each)", chunks,
                                   FormatBytes(layout.Chunk(1, Part::kMaster, 0).bytes))
                       .c_str()
                 : "");
  return made;
}

// gpu, cpu, or auto's choice with its reason printed.
absl::StatusOr<bool> ChooseOptimizerOnCpu(const RunSettings& s, const GpuHomeLayout& layout, uint64_t gpu_quota,
                                          uint64_t dram_quota, int layer_major) {
  const std::string& place = s.optimizer_place;
  if (place != "gpu" && place != "cpu" && place != "split" && place != "auto") {
    return absl::InvalidArgumentError("--optimizer_place is gpu, cpu, split or auto, not '" + place + "'");
  }
  if (place == "split") return false;  // ChooseHostGroups
  if (layout.compact) {  // ChooseCompactState refused cpu already
    if (place == "auto" && s.tierd) {
      std::printf("optimizer: on the GPU (the compact state keeps no bf16 weight copy for the host's step to write)\n");
    }
    return false;
  }
  if (place == "cpu" && !s.tierd) {
    return absl::InvalidArgumentError(
        "--optimizer_place=cpu steps the state on the host, where tierd keeps it in DRAM: it needs "
        "--offload_policy=tierd");
  }
  if (place != "auto" || !s.tierd) return place == "cpu";
  OptimizerCostInputs costs;
  costs.params = static_cast<double>(s.config.Params());
  costs.state_bytes = static_cast<double>(layout.Total());
  costs.gpu_bytes = static_cast<double>(gpu_quota);
  costs.dram_bytes = static_cast<double>(dram_quota);
  costs.h2d_bytes_per_s = costs.d2h_bytes_per_s = s.pcie_gbps * 1e9;
  costs.nvme_bytes_per_s = s.nvme_gbps * 1e9;
  // What either optimizer overlaps: the forward of the first micro-batch, or layer-major all K.
  costs.forward_seconds =
      2.0 * s.config.Params() * s.batch * s.seq * std::max(1, layer_major) / (s.gpu_tflops * 1e12);
  costs.gpu_overlaps_forward = s.optimizer_deferred;
  // Lion's host loop reads and writes a moment fewer than fp32 AdamW's: AdamW's speed bounds it from below.
  costs.host_params_per_s = CalibrateHostAdamW(int64_t{1} << 23, s.moments_8bit);
  costs.host_optimizer = s.lion           ? "Lion (at fp32 AdamW's measured speed)"
                         : s.adafactor    ? "Adafactor (at fp32 AdamW's measured speed)"
                         : s.moments_8bit ? "AdamW 8-bit"
                                          : "AdamW";
  costs.moment_bytes_per_param =
      static_cast<double>(layout.TotalOf(Part::kAdamM) + layout.TotalOf(Part::kAdamV)) / s.config.Params();
  costs.activation_bytes = static_cast<double>(layout.TotalOf(Part::kActs));
  const OptimizerChoice choice = ChooseOptimizerPlace(costs);
  std::printf("optimizer: %s\n", choice.why.c_str());
  return choice.on_cpu;
}

absl::StatusOr<int> ChooseHostGroups(const RunSettings& s, const GpuHomeLayout& layout, uint64_t gpu_quota) {
  if (s.optimizer_place != "split") return 0;
  if (!s.tierd) {
    return absl::InvalidArgumentError(
        "--optimizer_place=split steps part of the state on the host, where tierd keeps it in DRAM: it needs "
        "--offload_policy=tierd");
  }
  if (layout.compact) {  // ChooseCompactState refused it already when asked for
    std::printf("optimizer: on the GPU (the compact state keeps no bf16 weight copy for the host's step to write)\n");
    return 0;
  }
  const int groups = static_cast<int>(layout.groups.size());
  std::vector<double> bytes(groups);
  double optimizer_bytes = 0;
  for (int g = 0; g < groups; ++g) {
    for (Part part : {Part::kMaster, Part::kAdamM, Part::kAdamV}) bytes[g] += layout.bytes[g][static_cast<int>(part)];
    optimizer_bytes += bytes[g];
  }
  const double excess = static_cast<double>(layout.Total()) - static_cast<double>(gpu_quota);
  const int n = HostGroupsForSplit(bytes, excess);
  double host_bytes = 0;
  for (int g = groups - n; g < groups; ++g) host_bytes += bytes[g];
  if (n == 0) {
    std::printf("optimizer: split: the state (%s) fits tierd's GPU quota (%s): all of it on the GPU\n",
                FormatBytes(layout.Total()).c_str(), FormatBytes(gpu_quota).c_str());
  } else {
    const std::string which = n == 1        ? std::string("the head")
                              : n == groups ? std::string("every one: the excess is more than the last groups hold")
                                            : absl::StrFormat("the head and the last %d layers", n - 1);
    std::printf(
        "optimizer: split: the state (%s) is %s more than tierd's GPU quota (%s): the last %d of %d groups (%s, "
        "%.0f%% of the master weights and moments) step on the host in tierd's DRAM, the others on the GPU just "
        "before their next forward (--optimizer_place=split)\n",
        FormatBytes(layout.Total()).c_str(), FormatBytes(static_cast<uint64_t>(excess)).c_str(),
        FormatBytes(gpu_quota).c_str(), n, groups, which.c_str(), 100 * host_bytes / std::max(1.0, optimizer_bytes));
  }
  return n;
}

namespace {

// --step_order=auto's choice (step_order.h), said in a line: layer-major when its state (full,
// or compact where the run may keep it so) fits the GPU quota and DRAM.
bool AutoLayerMajor(const RunSettings& s, const GpuHomeLayout& layout, const GpuHomeLayout& layered,
                    uint64_t fp8_workspace) {
  const ModelConfig& config = s.config;
  StepOrderInputs in;
  in.tierd = s.tierd;
  in.micro_batches = s.accum;
  in.micro_state_bytes = static_cast<double>(layout.Total());
  in.layer_state_bytes = static_cast<double>(layered.Total());
  if (s.compact_state != "off" && s.optimizer_place != "cpu" && s.optimizer_place != "split" &&
      !config.tied_embeddings) {
    in.layer_compact_state_bytes = static_cast<double>(
        GpuModel::HomeLayout(config, s.batch, s.seq, BaseState(s, s.accum, /*compact=*/true)).Total());
  }
  const double workspace = static_cast<double>(
      GpuModel::WorkspaceBytesFor(config, s.batch, s.seq,
                                  {.checkpointing = s.checkpointing, .layer_major_micro_batches = s.accum}) +
      fp8_workspace);
  in.gpu_bytes = s.gpu_budget > 0 ? std::max(0.0, static_cast<double>(s.gpu_budget) - workspace) : 0.0;
  in.dram_bytes = static_cast<double>(s.tierd_dram > 0 ? s.tierd_dram : kAutoDramCap);
  const StepOrderChoice choice = ChooseStepOrder(in);
  std::printf("step: %s (--step_order=auto)\n", choice.why.c_str());
  return choice.layer_major;
}

// Bytes a second element-wise kernels move on an H100/H200-class GPU (about two thirds of its
// HBM's peak): what the lean keep's recompute is estimated at.
constexpr double kElementwiseBytesPerSecond = 2.5e12;

// --grad_checkpointing=dynamic: how many of the last layers keep their activations, and how
// many before them keep lean (checkpoint_policy.h), from the state as chosen so far (every
// layer recomputing), the room (tierd's GPU quota, or the device's free memory) and a FLOP
// count at --gpu_tflops.
absl::StatusOr<CheckpointChoice> ChooseKeptLayers(const RunSettings& s, const StateOptions& state,
                                                  const GpuHomeLayout& layout, uint64_t fp8_workspace) {
  const ModelConfig& config = s.config;
  StateOptions keeping = state;
  keeping.kept_layers = config.layers;
  const GpuHomeLayout kept = GpuModel::HomeLayout(config, s.batch, s.seq, keeping);
  StateOptions lean = state;
  lean.lean_layers = config.layers;
  const GpuHomeLayout leaning = GpuModel::HomeLayout(config, s.batch, s.seq, lean);
  const int acts = static_cast<int>(Part::kActs);
  CheckpointInputs in;
  in.layers = config.layers;
  // The last layer's: kept layers are the last ones, and an FP8 one keeps its inputs as codes.
  in.kept_layer_bytes = static_cast<double>(kept.bytes[config.layers][acts]);
  in.lean_layer_bytes = static_cast<double>(leaning.bytes[1][acts]);
  in.recompute_layer_bytes = static_cast<double>(layout.bytes[1][acts]);
  in.other_bytes = static_cast<double>(layout.Total() - layout.TotalOf(Part::kActs));
  const double workspace =
      static_cast<double>(GpuModel::WorkspaceBytesFor(config, s.batch, s.seq, state) + fp8_workspace);
  if (s.tierd) {
    in.gpu_bytes = std::max(0.0, static_cast<double>(s.gpu_budget) - workspace);
  } else {
    size_t free = 0, total = 0;
    if (cudaMemGetInfo(&free, &total) != cudaSuccess) {
      return absl::FailedPreconditionError("--grad_checkpointing=dynamic: cannot read the GPU's free memory");
    }
    // A twentieth kept back for what the libraries allocate on their own (cuBLAS, the context's growth).
    in.gpu_bytes = std::max(0.0, 0.95 * static_cast<double>(free) - workspace);
  }
  const double tokens = static_cast<double>(s.batch) * s.seq * std::max(1, s.accum);
  const double flops = s.gpu_tflops * 1e12;
  // A recompute runs the layer's forward up to the down projection (GpuModel::LayerForward).
  const double recomputed_params = static_cast<double>(config.RecomputedLayerParams());
  in.layer_recompute_seconds = (2 * recomputed_params + 2.0 * s.seq * config.d_model) * tokens / flops;
  // Two norms (fp32 in, bf16 out) and SwiGLU (two bf16 in, one out) a token.
  in.lean_layer_seconds = (12.0 * config.d_model + 6.0 * config.d_ff) * tokens / kElementwiseBytesPerSecond;
  in.step_seconds = 3 * (2.0 * config.Params() + 2.0 * s.seq * config.d_model * config.layers) * tokens / flops;
  in.pcie_bytes_per_s = s.pcie_gbps * 1e9;
  in.tierd = s.tierd;
  const CheckpointChoice choice = ChooseCheckpointing(in);
  std::printf("%s (at --gpu_tflops=%g, --pcie_gbps=%g)\n", choice.why.c_str(), s.gpu_tflops, s.pcie_gbps);
  return choice;
}

}  // namespace

absl::StatusOr<StateChoice> ChooseState(const RunSettings& s, uint64_t fp8_workspace) {
  const ModelConfig& config = s.config;
  GpuHomeLayout layout = GpuModel::HomeLayout(config, s.batch, s.seq, BaseState(s));
  const int chunks = s.optimizer_chunks;
  if (chunks < 1 || chunks > 1024) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--optimizer_chunks=%d: give 1 (one lease per layer's state) up to 1024", chunks));
  }
  if (chunks > 1 && !s.tierd) {
    return absl::InvalidArgumentError(
        "--optimizer_chunks leases the optimizer's state from tierd in pieces: it needs --offload_policy=tierd");
  }
  if (chunks > 1 && s.adafactor) {
    return absl::InvalidArgumentError(
        "--optimizer_chunks with --opt=adafactor: a matrix's factored state needs the whole matrix at once; leave "
        "--optimizer_chunks at 1");
  }
  if (chunks > 1 && s.moments_8bit) {
    return absl::InvalidArgumentError(
        "--optimizer_chunks with --opt=adamw8bit: 8-bit moments are one lease a layer (their blocks follow "
        "the tensors, not the sub-groups); leave --optimizer_chunks at 1");
  }
  layout.state_chunks = chunks;
  const std::string& order = s.step_order;
  if (order != "layer" && order != "micro" && order != "auto") {
    return absl::InvalidArgumentError("--step_order is auto, micro or layer, not '" + order + "'");
  }
  GpuHomeLayout layered = GpuModel::HomeLayout(config, s.batch, s.seq, BaseState(s, s.accum));
  layered.state_chunks = chunks;
  const bool layer_major = order == "layer" || (order == "auto" && AutoLayerMajor(s, layout, layered, fp8_workspace));
  if (order == "layer") {
    std::printf(
        "step: layer-major over %d micro-batches (each layer's weights come twice a step, its gradients "
        "leave once; it keeps an input per micro-batch)\n",
        s.accum);
  }
  const int layer_major_micro_batches = layer_major ? s.accum : 0;
  if (layer_major) layout = layered;
  StateOptions state = BaseState(s, layer_major_micro_batches);
  if (fp8_workspace > 0) {  // the FP8 layers that keep their activations keep h1, h2 and s as codes
    auto fp8_layers = Fp8Layers(config, s.bf16_layers);
    if (!fp8_layers.ok()) return fp8_layers.status();
    state.fp8_layers = *fp8_layers;
    layout = GpuModel::HomeLayout(config, s.batch, s.seq, state);
    layout.state_chunks = chunks;
  }
  {
    StateOptions compact = state;
    compact.compact = true;
    GpuHomeLayout compact_layout = GpuModel::HomeLayout(config, s.batch, s.seq, compact);
    compact_layout.state_chunks = chunks;
    CompactStateInputs in;
    in.flag = s.compact_state;
    in.tierd = s.tierd;
    // Tied embeddings: the embedding's matrix has two backwards a step (the head's, the embedding's).
    in.one_backward_per_group = (layer_major_micro_batches > 0 || s.accum == 1) && !config.tied_embeddings;
    in.optimizer_on_cpu = s.optimizer_place == "cpu" || s.optimizer_place == "split";
    in.full_bytes = static_cast<double>(layout.Total());
    in.compact_bytes = static_cast<double>(compact_layout.Total());
    const double full_workspace =
        static_cast<double>(GpuModel::WorkspaceBytesFor(config, s.batch, s.seq, state) + fp8_workspace);
    in.gpu_bytes =
        s.gpu_budget > 0 ? std::max(0.0, static_cast<double>(s.gpu_budget) - full_workspace) : 0.0;
    in.dram_bytes = static_cast<double>(s.tierd_dram > 0 ? s.tierd_dram : kAutoDramCap);
    auto choice = ChooseCompactState(in);
    if (!choice.ok()) return choice.status();
    if (!choice->why.empty()) std::printf("%s\n", choice->why.c_str());
    if (choice->compact) {
      state.compact = true;
      layout = compact_layout;
    }
  }
  if (s.dynamic_checkpointing) {
    auto kept = ChooseKeptLayers(s, state, layout, fp8_workspace);
    if (!kept.ok()) return kept.status();
    state.kept_layers = kept->kept_layers;
    state.lean_layers = kept->lean_layers;
    const int chunks_then = layout.state_chunks;
    layout = GpuModel::HomeLayout(config, s.batch, s.seq, state);
    layout.state_chunks = chunks_then;
  }
  // The optimizer's step writes the FP8 layers' weight codes (a part of ~1 byte a parameter
  // more in DRAM) wherever it runs: the host's, so the GPU fetches them instead of the bf16
  // weights; the GPU's, so the step's micro-batches share one conversion and the bf16 weights
  // need not stay on the GPU between updates.
  if (fp8_workspace > 0 && s.tierd && !state.compact && s.fp8_weight_codes) {
    state.fp8_weight_codes = true;
    // Their transposes too where each micro-batch's backward would make them again.
    state.transposed_weight_codes = s.fp8_transposed_weight_codes && layer_major_micro_batches == 0 && s.accum > 1;
    const int chunks_then = layout.state_chunks;
    layout = GpuModel::HomeLayout(config, s.batch, s.seq, state);
    layout.state_chunks = chunks_then;
  }
  StateChoice out{state, layout};
  out.step_source = order == "auto" ? "auto" : "--step_order";
  out.state_source = s.compact_state == "auto" ? "auto" : "--compact_state";
  out.activations_source = s.dynamic_checkpointing        ? "auto (--grad_checkpointing=dynamic)"
                           : s.Given("grad_checkpointing") ? "--grad_checkpointing"
                                                           : "default";
  return out;
}

Fp8ScalingOptions Fp8Scaling(const RunSettings& s) {
  Fp8ScalingOptions o;
  o.delayed = s.fp8_delayed;
  o.window = s.fp8_window;
  o.margin = s.fp8_margin;
  o.fixed_scale = s.fp8_fixed_scale;
  o.fixed_grad_scale = s.fp8_fixed_grad_scale;
  o.fast_forward = s.fp8_fast_accumulation;
  return o;
}

std::string DescribeFp8Scaling(const RunSettings& s) {
  const std::string fast =
      s.fp8_fast_accumulation ? "; the forward's matmuls with fast accumulation (--fp8_fast_accumulation)" : "";
  std::string fallback =
      s.fp8_fallback_after == 0
          ? "no fallback"
          : absl::StrFormat("a layer falls back to bf16 after %d steps of overflow%s", s.fp8_fallback_after,
                            s.fp8_delayed || s.fp8_fixed_scale > 0 ? ", saturation or underflow" : "");
  fallback += fast;
  if (s.fp8_fixed_scale > 0) {
    return absl::StrFormat(
        "every weight and input at the fixed scale %g and every output gradient at %g, for the whole run "
        "(--fp8_scaling=fixed, a debugging mode; their largest |x| is still tracked); %s",
        s.fp8_fixed_scale, s.fp8_fixed_grad_scale, fallback);
  }
  if (!s.fp8_delayed) return "each tensor of each layer at its current scale (--fp8_scaling=current); " + fallback;
  return absl::StrFormat(
      "each tensor of each layer at a scale from its largest |x| over the last %d steps (delayed scaling%s; the "
      "first step at current scales); %s",
      s.fp8_window, s.fp8_margin > 0 ? absl::StrFormat(", margin 2^-%d", s.fp8_margin) : "", fallback);
}

// --precision=auto's choice for this GPU (ChooseAutoPrecision).
bool AutoFp8(const RunSettings& s, std::string* why) {
  cudaDeviceProp prop{};
  int device = 0;
  cudaGetDevice(&device);
  cudaGetDeviceProperties(&prop, device);
  const AutoPrecision choice = ChooseAutoPrecision(s.config, int64_t{s.batch} * s.seq, prop.major, prop.minor);
  *why = choice.why;
  return choice.fp8;
}

}  // namespace tierd::trainer::gpu
