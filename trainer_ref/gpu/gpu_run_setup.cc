// Setting a GPU run up (gpu_run_internal.h's GpuRun): the ranks, the data, the state's home and
// its choices, the model and its weights (seeded, resumed, or --init_from's checkpoint).
#include <algorithm>

#include "trainer_ref/gpu/gpu_run_internal.h"

namespace tierd::trainer::gpu {

int GpuRun::SetupRanks() {
  auto launch = comm::LaunchFromEnv();
  if (!launch.ok()) return Fail(std::string(launch.status().message()));
  launch_ = *launch;
  ranks_ = launch_.size;
  lead_ = launch_.rank == 0;
  if (ranks_ == 1) return 0;
  if (s_.tierd) {
    return Fail(absl::StrFormat(
        "%s: data-parallel GPU ranks through tierd are not built (one tierd drives one GPU's tier); train the ranks "
        "with --offload_policy=none, each on its own GPU, or one rank through tierd",
        launch_.Describe()));
  }
  if (s_.zero != 0 || s_.sparse_ratio > 0 || !s_.sparse_ratio_by.empty() || s_.sync_every > 1) {
    return Fail(absl::StrFormat(
        "%s: GPU ranks sum every gradient (dense); --zero, --sparse_grad_ratio and --sync_every are the CPU "
        "trainer's (--device=cpu under mpirun)",
        launch_.Describe()));
  }
  int devices = 0;
  cudaGetDeviceCount(&devices);
  device_ = launch_.local_rank % std::max(1, devices);
  if (cudaError_t e = cudaSetDevice(device_); e != cudaSuccess) {
    return Fail(absl::StrFormat("rank %d: GPU %d: %s", launch_.rank, device_, cudaGetErrorString(e)));
  }
  return 0;
}

int GpuRun::ConnectRanks() {
  if (ranks_ == 1) {  // one rank: the model still takes the gradient norm in the step's last micro-batch only
    model_->SetDataParallel(nullptr, layer_major_ > 0 ? 1 : s_.accum);
    return 0;
  }
  auto made = comm::MakeNcclCommunicator(
      launch_, {.timeout_seconds = s_.comm_timeout, .device = device_, .stream = model_->stream()});
  if (!made.ok()) return Fail(std::string(made.status().message()));
  comm_ = std::move(*made);
  model_->SetDataParallel(comm_.get(), layer_major_ > 0 ? 1 : s_.accum);
  auto version = comm::NcclVersion();
  std::printf("data-parallel: %s on GPU %d, %s; each step sums every gradient over the %d ranks (dense)%s\n",
              launch_.Describe().c_str(), device_, version.ok() ? version->c_str() : "NCCL", ranks_,
              lead_ ? "" : "; rank 0 reports the run");
  if (!lead_) {  // the same state on every rank: one report
    std::fflush(stdout);
    if (std::freopen("/dev/null", "w", stdout) == nullptr) return Fail("cannot quiet this rank's output");
  }
  return 0;
}

int GpuRun::Setup() {
  const ModelConfig& config = s_.config;
  if (int failed = SetupRanks(); failed != 0) return failed;
  auto data = LoadDataset(s_.data, config.vocab, s_.seq, 0.05);
  if (!data.ok()) return Fail(std::string(data.status().message()));
  data_ = std::make_unique<Dataset>(std::move(*data));
  startup_.Done("data");
  // Every choice made once, before anything is allocated (gpu_run_state.h).
  auto resolved = ResolveGpuPlan(s_);
  if (!resolved.ok()) return Fail(std::string(resolved.status().message()));
  plan_ = std::move(*resolved);
  startup_.Done("the run's choices");
  fp8_ = plan_.fp8;
  const StateOptions& state = plan_.state;
  const GpuHomeLayout& layout = plan_.layout;
  layer_major_ = state.layer_major_micro_batches;
  auto home = MakeHome(s_, plan_);
  if (!home.ok()) return Fail(std::string(home.status().message()));
  if (s_.tierd) startup_.Done("tierd session and leases");
  auto model = GpuModel::Create(config, s_.batch, s_.seq, std::move(*home), state);
  if (!model.ok()) return Fail(std::string(model.status().message()));
  model_ = std::move(*model);
  if (int failed = ConnectRanks(); failed != 0) return failed;
  // The layers the layout was made for (ChooseState: Fp8Layers); empty: bf16 throughout.
  const std::vector<bool>& fp8_layers = state.fp8_layers;
  if (fp8_) {
    if (absl::Status st = model_->UseFp8(fp8_layers, Fp8Scaling(s_)); !st.ok()) {
      return Fail(std::string(s_.precision_auto ? "--precision=auto chose FP8, but: " : "--precision=fp8: ") +
                  std::string(st.message()));
    }
  }
  std::printf("attention: %s\n", model_->attention_note().c_str());
  std::printf("precision: %s%s%s\n", DescribePrecision(config, fp8_layers, DescribeFp8Scaling(s_)).c_str(),
              fp8_ ? absl::StrFormat("; the FP8 codes take %s of GPU workspace, nothing is kept in FP8 between "
                                     "steps",
                                     FormatBytes(plan_.fp8_workspace))
                         .c_str()
                   : "",
              s_.precision_auto ? absl::StrFormat(" (--precision=auto: %s)", plan_.fp8_why).c_str() : "");
  startup_.Done("GPU workspace");
  optimizer_on_cpu_ = plan_.optimizer_on_cpu;
  host_optimizer_ = plan_.host_optimizer_groups > 0;
  model_->SetHostOptimizerGroups(plan_.host_optimizer_groups);
  if (const int coded = model_->LayersReadingWeightCodes(); coded > 0) {
    const uint64_t codes = GpuModel::WeightCodesBytes(config, state.transposed_weight_codes) * coded,
                   bf16 = layout.bytes[1][static_cast<int>(Part::kWeights)] * coded;
    // The host's groups are the last ones: the head, then layers (every group: the embedding too).
    const int host_layers = std::min(coded, std::max(0, plan_.host_optimizer_groups - 1));
    std::printf(
        "FP8 weight codes: the optimizer's step also writes the %d FP8 layers' weights as E4M3 codes (current "
        "scaling)%s, which their matmuls read (--fp8_weight_codes): %s in all against %s of bf16; %s\n",
        coded,
        state.transposed_weight_codes ? " and their transposes, for each micro-batch's backward "
                                        "(--fp8_transposed_weight_codes)"
                                      : "",
        FormatBytes(codes).c_str(), FormatBytes(bf16).c_str(),
        host_layers == coded ? "the host writes them, and the GPU fetches those instead of the bf16 weights"
        : host_layers == 0
            ? "the GPU writes them after each update, once for the step's micro-batches, and the bf16 weights "
              "need not stay on the GPU between updates"
            : "the host writes those of the layers it steps, the GPU those of the others");
  }
  if (plan_.optimizer_deferred) {
    model_->SetOptimizerDeferred(true);
    std::printf("optimizer: on the GPU, each layer's update just before its next forward (--optimizer_deferred)\n");
  }
  if (!ck_.dir.empty()) mkdir(ck_.dir.c_str(), 0755);
  if (s_.resume) {
    auto resumed = Resume(*model_, s_, ck_);
    if (!resumed.ok()) return Fail(std::string(resumed.status().message()));
    run_ = *resumed;
    window_.Restore(run_.losses);
    std::printf("resumed from %s at step %ld\n", ck_.last_path.c_str(), static_cast<long>(run_.step));
    startup_.Done("checkpoint load");
  } else if (!s_.init_from.empty()) {
    // The checkpoint's tensors, a group at a time, into the model's home (tierd's tiers).
    auto reader = hf::HfCheckpointReader::Open(s_.init_from, config);
    if (!reader.ok()) return Fail(std::string(reader.status().message()));
    if (absl::Status st = model_->LoadParams([&](size_t e, float* out) { return (*reader)->Read(e, out); }); !st.ok()) {
      return Fail("loading " + s_.init_from + ": " + std::string(st.message()));
    }
    std::printf("init: weights of %s (%s)\n", s_.init_from.c_str(), (*reader)->Describe().c_str());
    startup_.Done("reading --init_from");
  } else {
    if (absl::Status st = model_->InitParams(s_.seed); !st.ok()) return Fail(std::string(st.message()));
    startup_.Done("initial weights");
  }
  std::printf("schedule: %s\n", s_.schedule_note.c_str());
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, device_);
  std::printf("model %s on %s; %d x %d tokens x %d micro-batches%s per step%s; GPU memory held %s%s\n",
              DescribeConfig(config).c_str(), prop.name, s_.batch, s_.seq, s_.accum,
              ranks_ > 1 ? absl::StrFormat(" x %d ranks", ranks_).c_str() : "",
              s_.checkpointing ? " (activation checkpointing)" : "", FormatBytes(model_->DeviceBytes()).c_str(),
              ck_.dir.empty()
                  ? ""
                  : absl::StrFormat("; checkpoint every %d steps in %s", s_.checkpoint_every, ck_.dir).c_str());
  char bus_id[64] = {};
  auto util = cudaDeviceGetPCIBusId(bus_id, sizeof(bus_id), device_) == cudaSuccess
                  ? GpuUtilisation::Open(bus_id)
                  : absl::UnavailableError("CUDA gave no PCI bus id for the GPU");
  if (util.ok()) {
    util_ = std::move(*util);
    step_mark_ = util_->Mark();
  } else {
    std::printf("GPU-Util: not shown (%s)\n", std::string(util.status().message()).c_str());
  }
  if (s_.tierd && s_.tierd_plan) {
    auto note = model_->RegisterStep(s_.accum);
    if (!note.ok()) return Fail("registering the step with tierd: " + std::string(note.status().message()));
    std::printf("tierd: %s\n", note->c_str());
    startup_.Done("planning the step");
  }
  if (!s_.metrics.empty() && lead_) {
    std::string note;
    auto opened = OpenMetrics(s_.metrics, run_.step, &note, plan_.table.JsonLine());
    if (!opened.ok()) return Fail(std::string(opened.status().message()));
    metrics_ = std::move(*opened);
    if (!note.empty()) std::printf("%s\n", note.c_str());
  }
  batcher_ = std::make_unique<Batcher>(data_->train, s_.batch, s_.seq, s_.data_seed * 7919 + 1, &data_->train_mask);
  batcher_->Skip(run_.batches_drawn);
  inputs_.resize(static_cast<size_t>(s_.batch) * s_.seq * std::max(1, layer_major_));
  targets_.resize(inputs_.size());
  model_->EnableProfile(s_.profile);
  curves_.first_step = run_.step + 1;
  curves_.title =
      absl::StrFormat("tierd-train, model %s on %s%s", config.name, prop.name, s_.tierd ? " through tierd" : "");
  std::fputs(plan_.table.Table().c_str(), stdout);
  std::printf("%s\n", startup_.Line().c_str());
  return 0;
}

}  // namespace tierd::trainer::gpu
