#include "trainer_ref/gpu/gpu_run.h"

#include <cuda_runtime_api.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>
#include <string>
#include <utility>

#include "absl/flags/flag.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/units.h"
#include "comm/launch_env.h"
#include "comm/nccl_communicator.h"
#include "runtime/gpu_utilisation.h"
#include "trainer_ref/checkpoint.h"
#include "trainer_ref/data.h"
#include "trainer_ref/gpu/gpu_model.h"
#include "trainer_ref/gpu/gpu_run_checkpoint.h"
#include "trainer_ref/gpu/gpu_run_state.h"
#include "trainer_ref/hf/hf_checkpoint.h"
#include "trainer_ref/optimizer.h"
#include "trainer_ref/plot.h"
#include "trainer_ref/run_report.h"

namespace tierd::trainer::gpu {
namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Launch-to-first-step time by phase, said in one line before the first step.
struct Startup {
  Clock::time_point start = Clock::now(), phase = start;
  std::vector<std::string> phases;
  void Done(const char* what) {
    phases.push_back(absl::StrFormat("%s %.1f s", what, Since(phase)));
    phase = Clock::now();
  }
  std::string Line() const {
    return absl::StrFormat("startup: %.1f s (%s)", Since(start), absl::StrJoin(phases, ", "));
  }
};

// The share of `seconds` each PCIe direction had a copy in flight between two readings of
// tierd's links (at most 1: the readings and the step's clock are a few microseconds apart).
std::pair<double, double> PcieBusy(const GpuHome::Traffic& from, const GpuHome::Traffic& to, double seconds) {
  auto share = [&](double busy) { return std::clamp(busy / std::max(seconds, 1e-9), 0.0, 1.0); };
  return {share(to.host_to_gpu_busy - from.host_to_gpu_busy), share(to.gpu_to_host_busy - from.gpu_to_host_busy)};
}

// One run: set up, the steps, the summary. Members hold what the phases share.
class GpuRun {
 public:
  explicit GpuRun(const RunSettings& s) : s_(s), ck_{s.checkpoint_dir, "", 0}, spikes_(s.loss_spike_sds) {}
  int Run();

 private:
  int Setup();
  int Step(int64_t step);  // 0, or the exit status of a failure
  // The mean loss of `batches` held-out batches, forward only, the same windows every time.
  absl::StatusOr<double> ValidationLoss(int batches);
  int Validate(int64_t step);  // prints, plots and records it; 0, or the exit status
  void Summary();
  int Export();  // --export: the master weights as a Hugging Face checkpoint
  std::string Progress(int64_t step, double loss, double lr, double grad_norm, double seconds,
                       const GpuHome::Traffic& after, std::optional<double> util);
  std::pair<uint64_t, std::string> GpuMemory(const GpuHome::Traffic& t) const;
  GpuHome::Traffic Traffic() {
    auto t = model_->home().Moved();
    return t.ok() ? *t : GpuHome::Traffic{};
  }

  // Data-parallel GPU ranks (one a GPU, from the launcher's environment): NCCL, the
  // gradients summed each step; rank 0 prints, writes the metrics and the checkpoints (every
  // rank holds the same state) and every rank resumes from them.
  int SetupRanks();
  int ConnectRanks();

  const RunSettings& s_;
  comm::LaunchInfo launch_;
  std::unique_ptr<comm::Communicator> comm_;
  int ranks_ = 1, device_ = 0;
  bool lead_ = true;
  double comm_seconds_before_ = 0, comm_bytes_before_ = 0;
  CheckpointTrail ck_;
  Startup startup_;
  std::unique_ptr<GpuModel> model_;
  std::unique_ptr<Dataset> data_;
  std::unique_ptr<Batcher> batcher_;
  bool optimizer_on_cpu_ = false;
  bool fp8_ = false;     // the layers' matmuls in FP8 (--precision=fp8, or auto's choice)
  int layer_major_ = 0;  // K micro-batches a step in layer-major order; 0: one after the other
  RunState run_;
  LossWindow window_;
  SpikeGuard spikes_;
  StepReporter reporter_;
  std::ofstream metrics_;
  RunCurves curves_;
  std::vector<int32_t> inputs_, targets_;
  std::vector<std::pair<std::string, double>> profile_;  // ms summed over the timed steps
  // NVML's GPU-Util (null: no NVML), with marks where each step's and the timed steps' samples begin.
  std::unique_ptr<GpuUtilisation> util_;
  uint64_t step_mark_ = 0, timed_mark_ = 0;
  double timed_seconds_ = 0, last_loss_ = 0, timed_waits_ = 0, timed_releases_ = 0, last_validation_ = 0;
  int64_t timed_steps_ = 0;
  uint64_t device_bytes_ = 0;  // NVML's figure for this process and tierd at the end of the run
  GpuHome::Traffic before_, timed_from_, timed_to_;  // tierd's counters around the timed steps
};

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
  if (ranks_ == 1) return 0;
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
  fp8_ = s_.fp8;
  std::string auto_why;
  if (s_.precision_auto) fp8_ = AutoFp8(s_, &auto_why);
  const uint64_t fp8_workspace = fp8_ ? GpuModel::Fp8WorkspaceBytesFor(config, s_.batch, s_.seq, Fp8Scaling(s_)) : 0;
  auto chosen = ChooseState(s_, fp8_workspace);
  if (!chosen.ok()) return Fail(std::string(chosen.status().message()));
  const StateOptions state = chosen->state;
  const GpuHomeLayout& layout = chosen->layout;
  layer_major_ = state.layer_major_micro_batches;
  const uint64_t workspace = GpuModel::WorkspaceBytesFor(config, s_.batch, s_.seq, state) + fp8_workspace;
  uint64_t gpu_quota = 0, dram_quota = 0;
  auto home = MakeHome(s_, layout, workspace, &gpu_quota, &dram_quota);
  if (!home.ok()) return Fail(std::string(home.status().message()));
  if (s_.tierd) startup_.Done("tierd session and leases");
  auto model = GpuModel::Create(config, s_.batch, s_.seq, std::move(*home), state);
  if (!model.ok()) return Fail(std::string(model.status().message()));
  model_ = std::move(*model);
  if (int failed = ConnectRanks(); failed != 0) return failed;
  std::vector<bool> fp8_layers;  // empty: bf16 throughout
  if (fp8_) {
    auto layers = Fp8Layers(config, s_.bf16_layers);
    if (!layers.ok()) return Fail(std::string(layers.status().message()));
    fp8_layers = *layers;
    if (absl::Status st = model_->UseFp8(fp8_layers, Fp8Scaling(s_)); !st.ok()) {
      return Fail(std::string(s_.precision_auto ? "--precision=auto chose FP8, but: " : "--precision=fp8: ") +
                  std::string(st.message()));
    }
  }
  std::printf("precision: %s%s%s\n", DescribePrecision(config, fp8_layers, DescribeFp8Scaling(s_)).c_str(),
              fp8_ ? absl::StrFormat("; the FP8 codes take %s of GPU workspace, nothing is kept in FP8 between "
                                     "steps",
                                     FormatBytes(fp8_workspace))
                         .c_str()
                   : "",
              s_.precision_auto ? absl::StrFormat(" (--precision=auto: %s)", auto_why).c_str() : "");
  startup_.Done("GPU workspace");
  auto on_cpu = ChooseOptimizerOnCpu(s_, layout, gpu_quota, dram_quota, layer_major_);
  if (!on_cpu.ok()) return Fail(std::string(on_cpu.status().message()));
  optimizer_on_cpu_ = *on_cpu;
  model_->SetOptimizerOnCpu(optimizer_on_cpu_);
  if (const int coded = model_->LayersReadingWeightCodes(); coded > 0) {
    const uint64_t codes = GpuModel::WeightCodesBytes(config) * coded,
                   bf16 = layout.bytes[1][static_cast<int>(Part::kWeights)] * coded;
    std::printf(
        "FP8 weight codes: the host's optimizer also writes the %d FP8 layers' weights as E4M3 codes (current "
        "scaling), which their matmuls read: %s a pass over PCIe instead of %s of bf16 (--fp8_weight_codes)\n",
        coded, FormatBytes(codes).c_str(), FormatBytes(bf16).c_str());
  } else if (fp8_ && optimizer_on_cpu_ && absl::GetFlag(FLAGS_fp8_weight_codes) &&
             absl::GetFlag(FLAGS_optimizer_place) == "auto") {
    std::printf(
        "FP8 weight codes: not written (the host's optimizer writes them when --optimizer_place=cpu is given, "
        "known before the state is laid out)\n");
  }
  if (s_.tierd && !optimizer_on_cpu_ && absl::GetFlag(FLAGS_optimizer_deferred)) {
    model_->SetOptimizerDeferred(true);
    std::printf("optimizer: on the GPU, each layer's update just before its next forward (--optimizer_deferred)\n");
  }
  if (absl::GetFlag(FLAGS_optimizer_place) == "auto" && s_.tierd) startup_.Done("optimizer cost model");
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
  if (s_.tierd && absl::GetFlag(FLAGS_tierd_plan)) {
    auto note = model_->RegisterStep(s_.accum);
    if (!note.ok()) return Fail("registering the step with tierd: " + std::string(note.status().message()));
    std::printf("tierd: %s\n", note->c_str());
    startup_.Done("planning the step");
  }
  if (!s_.metrics.empty() && lead_) {
    std::string note;
    auto opened = OpenMetrics(s_.metrics, run_.step, &note);
    if (!opened.ok()) return Fail(std::string(opened.status().message()));
    metrics_ = std::move(*opened);
    if (!note.empty()) std::printf("%s\n", note.c_str());
  }
  batcher_ = std::make_unique<Batcher>(data_->train, s_.batch, s_.seq, s_.data_seed * 7919 + 1, &data_->train_mask);
  batcher_->Skip(run_.batches_drawn);
  inputs_.resize(static_cast<size_t>(s_.batch) * s_.seq * std::max(1, layer_major_));
  targets_.resize(inputs_.size());
  model_->EnableProfile(absl::GetFlag(FLAGS_profile));
  curves_.first_step = run_.step + 1;
  curves_.title =
      absl::StrFormat("tierd-train, model %s on %s%s", config.name, prop.name, s_.tierd ? " through tierd" : "");
  std::printf("%s\n", startup_.Line().c_str());
  return 0;
}

std::pair<uint64_t, std::string> GpuRun::GpuMemory(const GpuHome::Traffic& t) const {
  // What the model allocated itself (plain: everything), plus with tierd the most its GPU
  // tier has held (since the daemon started: one run per daemon).
  const uint64_t own = model_->DeviceBytes();
  if (!s_.tierd) return {own, FormatBytes(own)};
  return {own + t.gpu_peak, absl::StrFormat("%s (tierd peak %s + workspace %s)", FormatBytes(own + t.gpu_peak),
                                            FormatBytes(t.gpu_peak), FormatBytes(own))};
}

std::string GpuRun::Progress(int64_t step, double loss, double lr, double grad_norm, double seconds,
                             const GpuHome::Traffic& after, std::optional<double> util) {
  std::string moves;
  if (s_.tierd) {
    auto step_peak = model_->home().TakeGpuPeak();
    if (step_peak.ok()) moves = absl::StrFormat("  step peak %s", FormatBytes(*step_peak + model_->DeviceBytes()));
    moves += absl::StrFormat(
        "  moved in %s out %s (NVMe r %s w %s)", FormatBytes(after.host_to_gpu - before_.host_to_gpu),
        FormatBytes(after.gpu_to_host - before_.gpu_to_host), FormatBytes(after.nvme_read - before_.nvme_read),
        FormatBytes(after.nvme_write - before_.nvme_write));
    const auto [in, out] = PcieBusy(before_, after, seconds);
    moves += absl::StrFormat(", PCIe busy in %.0f%% out %.0f%%", 100 * in, 100 * out);
  }
  const std::string ckpt =
      ck_.dir.empty() ? "" : absl::StrFormat("  ckpt %d (every %d)", ck_.last_step, s_.checkpoint_every);
  const double tokens = static_cast<double>(s_.batch) * s_.seq * s_.accum * ranks_;  // every rank's
  return absl::StrFormat(
      "step %5d/%d  loss %.4f  (last %d: mean %.4f, sd %.4f)  lr %.2e  |g| %.3f  %.0f ms  %.0f tok/s%s"
      "  GPU %s%s%s",
      step, s_.steps, loss, window_.size(), window_.mean(), window_.sd(), lr, grad_norm, seconds * 1e3,
      tokens / seconds, util ? absl::StrFormat("  GPU-Util %.0f%%", *util) : "", GpuMemory(after).second, moves, ckpt);
}

int GpuRun::Step(int64_t step) {
  const auto t0 = Clock::now();
  const double waited0 = model_->AcquireSeconds(), released0 = model_->ReleaseSeconds();
  const int64_t first_timed = curves_.first_step + absl::GetFlag(FLAGS_timing_skip);
  if (step == first_timed) {
    timed_from_ = before_;
    timed_mark_ = step_mark_;  // where the last step's samples ended
  }
  if (absl::Status st = model_->ZeroGrads(); !st.ok()) return FailMidRun(std::string(st.message()), ck_);
  double loss = 0;
  // Data-parallel: rank r takes micro-batches [r K, r K + K) of the ranks' N K in a step.
  if (ranks_ > 1) batcher_->Skip(static_cast<int64_t>(launch_.rank) * s_.accum);
  if (layer_major_ > 0) {
    const size_t n = static_cast<size_t>(s_.batch) * s_.seq;
    for (int micro = 0; micro < s_.accum; ++micro) batcher_->Next(&inputs_[micro * n], &targets_[micro * n]);
    run_.batches_drawn += s_.accum;
    auto l = model_->ForwardBackwardLayerMajor(inputs_.data(), targets_.data());
    if (!l.ok()) return FailMidRun(absl::StrFormat("step %d: %s", step, l.status().message()), ck_);
    loss = *l;
  }
  for (int micro = 0; layer_major_ == 0 && micro < s_.accum; ++micro) {
    batcher_->Next(inputs_.data(), targets_.data());
    ++run_.batches_drawn;
    if (absl::Status st = model_->ForwardQueued(inputs_.data(), targets_.data()); !st.ok()) {
      return FailMidRun(absl::StrFormat("step %d: %s", step, st.message()), ck_);
    }
    if (absl::Status st = model_->Backward(); !st.ok()) {
      return FailMidRun(absl::StrFormat("step %d: %s", step, st.message()), ck_);
    }
  }
  if (ranks_ > 1) {  // every rank ends the step at the same place in the data
    batcher_->Skip(static_cast<int64_t>(ranks_ - 1 - launch_.rank) * s_.accum);
    run_.batches_drawn += static_cast<int64_t>(ranks_ - 1) * s_.accum;
  }
  model_->EndFp8Step();     // queued before the waits below, so its small copy comes back with them
  if (layer_major_ == 0) {  // the losses come back with the stream: one wait a step
    auto l = model_->TakeLoss();
    if (!l.ok()) return FailMidRun(absl::StrFormat("step %d: %s", step, l.status().message()), ck_);
    loss = *l;
  }
  if (comm_ != nullptr) {  // the step's loss: the mean of the ranks' (each the mean of its micro-batches)
    if (absl::Status st = comm_->AllReduce(&loss, 1); !st.ok()) return FailMidRun(std::string(st.message()), ck_);
    loss /= ranks_;
  }
  auto norm = model_->GradNorm();
  if (!norm.ok()) return FailMidRun(std::string(norm.status().message()), ck_);
  std::string fell_back;  // for the progress line; each layer's reason on a line of its own now
  for (const std::string& why : model_->Fp8FallBack(s_.fp8_fallback_after)) {
    std::printf("fp8 after step %ld: %s\n", static_cast<long>(step), why.c_str());
    absl::StrAppend(&fell_back, fell_back.empty() ? "  fp8: fell back to bf16: " : ", ",
                    why.substr(0, why.find(' ', 6)));
  }
  const double grad_norm = *norm / (s_.accum * ranks_);  // the gradients are summed over both
  const double lr = LearningRate(step - 1, s_.warmup, s_.steps, s_.lr, s_.lr / 10);
  run_.step = step;
  const double step_tokens = static_cast<double>(s_.batch) * s_.seq * s_.accum;  // this rank's
  if (!std::isfinite(loss) || !std::isfinite(grad_norm)) {
    std::printf("step %ld skipped: loss %g, gradient norm %g\n", static_cast<long>(step), loss, grad_norm);
    reporter_.Send([&] { return model_->home().ReportStep(step, std::nan(""), Since(t0), step_tokens); });
    return 0;
  }
  AdamWOptions adam;  // with --opt=lion, Lion's betas (the model steps Lion from them)
  adam.weight_decay = s_.weight_decay;
  if (s_.lion) {
    const LionOptions lion;
    adam.beta1 = lion.beta1;
    adam.beta2 = lion.beta2;
  }
  const double scale = ClipFactor(grad_norm, s_.clip) / (s_.accum * ranks_);
  if (absl::Status st = model_->AdamWStep(lr, step, adam, scale); !st.ok()) {
    return FailMidRun(absl::StrFormat("step %d: %s", step, st.message()), ck_);
  }
  const double seconds = Since(t0);
  reporter_.Send([&] { return model_->home().ReportStep(step, loss, seconds, step_tokens); });
  const auto spent = model_->TakeProfile();
  const double waited = model_->AcquireSeconds() - waited0;
  const GpuHome::Traffic after = Traffic();
  const std::optional<double> util = util_ ? util_->Since(&step_mark_) : std::nullopt;
  const std::pair<double, double> busy = PcieBusy(before_, after, seconds);
  if (step >= first_timed) {
    timed_seconds_ += seconds;
    timed_waits_ += waited;
    timed_releases_ += model_->ReleaseSeconds() - released0;
    timed_to_ = after;
    ++timed_steps_;
    if (profile_.empty()) profile_.assign(spent.size(), {"", 0.0});
    for (size_t k = 0; k < spent.size(); ++k) profile_[k] = {spent[k].first, profile_[k].second + spent[k].second};
  }
  last_loss_ = loss;
  const double spike = spikes_.Check(step, loss, window_);
  const std::string spike_note = spikes_.Words(spike);
  window_.Add(loss);
  curves_.loss.push_back(loss);
  std::string line = Progress(step, loss, lr, grad_norm, seconds, after, util);
  if (s_.tierd) line += absl::StrFormat(", waited %.0f ms", waited * 1e3);
  if (comm_ != nullptr) {  // this rank's time in the gradients' sums (it waits for them) and bytes sent
    const comm::CommStats& c = comm_->stats();
    line += absl::StrFormat("  comm %.0f ms (%.0f%%) sent %s", (c.seconds - comm_seconds_before_) * 1e3,
                            100 * (c.seconds - comm_seconds_before_) / std::max(seconds, 1e-9),
                            FormatBytes(static_cast<uint64_t>(c.bytes_sent - comm_bytes_before_)));
    comm_seconds_before_ = c.seconds;
    comm_bytes_before_ = c.bytes_sent;
  }
  line += fell_back + spike_note;
  std::printf("%s\n", line.c_str());
  before_ = after;
  if (metrics_) {
    std::string more;
    if (util) absl::StrAppendFormat(&more, ", \"gpu_util\": %.1f", *util);
    if (s_.tierd)
      absl::StrAppendFormat(&more, ", \"pcie_in_busy\": %.4f, \"pcie_out_busy\": %.4f", busy.first, busy.second);
    if (spike > 0) absl::StrAppendFormat(&more, ", \"loss_spike_sds\": %.2f", spike);
    metrics_ << absl::StrFormat(
        "{\"step\": %d, \"loss\": %.6f, \"lr\": %.6g, \"grad_norm\": %.6f, \"seconds\": %.6f, "
        "\"tokens\": %.0f%s}\n",
        step, loss, lr, grad_norm, seconds, static_cast<double>(s_.batch) * s_.seq * s_.accum * ranks_, more);
    metrics_.flush();
  }
  MaybeKillForTest(step);
  if (s_.eval_every > 0 && step % s_.eval_every == 0 && step < s_.steps) {  // the last one: Run's
    if (int failed = Validate(step); failed != 0) return failed;
  }
  if (!ck_.dir.empty() && lead_ && (step % s_.checkpoint_every == 0 || step == s_.steps)) {
    const auto saving = Clock::now();
    run_.losses = window_.values();
    auto path = SaveCheckpoint(*model_, run_, s_);
    if (!path.ok()) return FailMidRun("checkpoint: " + std::string(path.status().message()), ck_);
    ck_.last_path = *path;
    ck_.last_step = step;
    std::printf("checkpoint %s (%.1f s)\n", path->c_str(), Since(saving));
  }
  return 0;
}

void GpuRun::Summary() {
  const double tokens_per_step = static_cast<double>(s_.batch) * s_.seq * s_.accum * ranks_;
  const double tps = timed_steps_ > 0 ? tokens_per_step * timed_steps_ / timed_seconds_ : 0;
  const GpuHome::Traffic end = Traffic();
  const auto [memory_bytes, memory] = GpuMemory(end);
  const double params = static_cast<double>(s_.config.Params());
  // The samples over the timed steps (none when they took less than NVML's sample period).
  const double util = util_ && timed_steps_ > 0 ? util_->Since(&timed_mark_).value_or(-1) : -1;  // -1: not measured
  const auto [in_busy, out_busy] = PcieBusy(timed_from_, timed_to_, timed_seconds_);
  std::string use;
  if (util >= 0) absl::StrAppendFormat(&use, ", GPU-Util %.0f%%", util);
  if (s_.tierd && timed_steps_ > 0)
    absl::StrAppendFormat(&use, ", PCIe busy in %.0f%% out %.0f%%", 100 * in_busy, 100 * out_busy);
  std::printf(
      "done: %ld steps, final loss %.4f%s, %.0f tokens/s over %ld timed steps, %.0f TFLOP/s (6N)%s, GPU memory %s%s\n",
      static_cast<long>(s_.steps), last_loss_,
      s_.eval_every >= 0 ? absl::StrFormat(", validation loss %.4f", last_validation_).c_str() : "", tps,
      static_cast<long>(timed_steps_), 6.0 * params * tps / 1e12, use.c_str(), memory.c_str(),
      spikes_.Summary().c_str());
  if (s_.tierd) std::printf("tierd: %s\n", model_->home().Describe().c_str());
  if (util_) {  // what nvidia-smi lists for the run's processes now (the state and contexts all held)
    auto processes = util_->ProcessMemory();
    if (processes.ok()) {
      const uint64_t own = ProcessBytes(*processes, static_cast<uint32_t>(getpid()));
      const uint64_t daemon = s_.tierd ? NamedProcessesBytes(*processes, "tierd") : 0;
      auto budget = ParseBytes(absl::GetFlag(FLAGS_gpu_budget));
      std::printf("device memory (NVML, as nvidia-smi lists it): this process %s%s = %s%s\n", FormatBytes(own).c_str(),
                  s_.tierd ? absl::StrFormat(" + tierd %s", FormatBytes(daemon)).c_str() : "",
                  FormatBytes(own + daemon).c_str(),
                  s_.tierd && budget.ok()
                      ? absl::StrFormat(" of the %s budget%s", FormatBytes(*budget),
                                        own + daemon > *budget ? " (OVER IT)" : "")
                            .c_str()
                      : "");
      device_bytes_ = own + daemon;
    } else {
      std::printf("device memory: not listed (%s)\n", std::string(processes.status().message()).c_str());
    }
  }
  if (optimizer_on_cpu_) {
    const double steps = static_cast<double>(std::max<int64_t>(1, s_.steps - curves_.first_step + 1));
    std::printf(
        "host optimizer: %.0f ms of arithmetic a step (over the run)%s\n", model_->HostOptimizerSeconds() * 1e3 / steps,
        model_->LayersReadingWeightCodes() > 0
            ? absl::StrFormat(", %.0f ms of it writing the FP8 weight codes", model_->HostCodesSeconds() * 1e3 / steps)
                  .c_str()
            : "");
  }
  // One JSON line for the benchmark harness; bytes per link and waits per timed step.
  const double per = timed_steps_ > 0 ? 1.0 / timed_steps_ : 0.0;
  std::printf(
      "result: {\"run\": \"ours %s\", \"model\": \"%s\", \"batch\": %d, \"micro_batches\": %d, "
      "\"tokens_per_s\": %.1f, \"tflops_6n\": %.1f, "
      "\"final_loss\": %.6f, \"peak_gpu_bytes\": %lu, \"step_seconds\": %.4f, \"acquire_wait_seconds\": %.4f, "
      "\"h2d_bytes\": %.0f, \"d2h_bytes\": %.0f, \"nvme_read_bytes\": %.0f, \"nvme_write_bytes\": %.0f, "
      "\"gpu_util\": %.1f, \"pcie_in_busy\": %.4f, \"pcie_out_busy\": %.4f, \"device_bytes\": %lu}\n",
      ((s_.tierd ? "tierd " + absl::GetFlag(FLAGS_gpu_budget) : std::string("none")) +
       (s_.checkpointing ? " + checkpointing" : "") + (optimizer_on_cpu_ ? " + CPU AdamW" : "") +
       (fp8_ ? " + fp8" : ""))
          .c_str(),
      s_.config.name.c_str(), s_.batch, s_.accum, tps, 6.0 * params * tps / 1e12, last_loss_,
      static_cast<unsigned long>(memory_bytes), timed_seconds_ * per, timed_waits_ * per,
      (timed_to_.host_to_gpu - timed_from_.host_to_gpu) * per, (timed_to_.gpu_to_host - timed_from_.gpu_to_host) * per,
      (timed_to_.nvme_read - timed_from_.nvme_read) * per, (timed_to_.nvme_write - timed_from_.nvme_write) * per, util,
      in_busy, out_busy, static_cast<unsigned long>(device_bytes_));
  if (absl::GetFlag(FLAGS_profile) && timed_steps_ > 0) {
    const double step_ms = timed_seconds_ * 1e3 / timed_steps_;
    std::string line = absl::StrFormat("where a step's %.0f ms go:", step_ms);
    double kernels = 0;
    for (const auto& [name, ms] : profile_) {
      line += absl::StrFormat(" %s %.0f ms (%.0f%%),", name, ms / timed_steps_, 100 * ms / timed_steps_ / step_ms);
      kernels += ms / timed_steps_;
    }
    line += absl::StrFormat(" the GPU idle (waiting for the host, moves, syncs) %.0f ms", step_ms - kernels);
    if (s_.tierd)
      line += absl::StrFormat("; the host waited in tierd's acquire %.0f ms and release %.0f ms",
                              timed_waits_ * 1e3 / timed_steps_, timed_releases_ * 1e3 / timed_steps_);
    if (optimizer_on_cpu_) {
      line += absl::StrFormat(
          "; AdamW on the host %.0f ms a step (over the run)",
          model_->HostOptimizerSeconds() * 1e3 / std::max<int64_t>(1, s_.steps - curves_.first_step + 1));
    }
    std::printf("%s\n", line.c_str());
  }
  if (s_.tierd)
    std::printf("tierd ring calls of this process (over the run): %s\n", model_->home().HotPathNote().c_str());
}

absl::StatusOr<double> GpuRun::ValidationLoss(int batches) {
  Batcher val(data_->val, s_.batch, s_.seq, kValidationSeed, &data_->val_mask);  // the same windows every time
  double total = 0;
  for (int b = 0; b < batches; ++b) {
    val.Next(inputs_.data(), targets_.data());
    auto loss = model_->Forward(inputs_.data(), targets_.data());
    if (!loss.ok()) return loss.status();
    total += *loss;
  }
  return total / batches;
}

int GpuRun::Validate(int64_t step) {
  // Outside the step's time; its moves are taken out of the timed steps' bytes too.
  const GpuHome::Traffic from = Traffic();
  model_->SetFp8Recording(false);  // held-out batches must not steer the training's FP8 scales
  auto val = ValidationLoss(8);
  model_->SetFp8Recording(true);
  if (!val.ok()) return FailMidRun(absl::StrFormat("validation after step %d: %s", step, val.status().message()), ck_);
  const GpuHome::Traffic to = Traffic();
  if (step < s_.steps) {  // inside the timed steps' window (the last one's is already taken)
    timed_from_.host_to_gpu += to.host_to_gpu - from.host_to_gpu;
    timed_from_.gpu_to_host += to.gpu_to_host - from.gpu_to_host;
    timed_from_.nvme_read += to.nvme_read - from.nvme_read;
    timed_from_.nvme_write += to.nvme_write - from.nvme_write;
  }
  before_ = to;
  last_validation_ = *val;
  std::printf("validation loss %.4f\n", *val);
  curves_.validation.push_back({static_cast<int>(curves_.loss.size()), *val});
  if (metrics_) {
    metrics_ << absl::StrFormat("{\"step\": %d, \"validation_loss\": %.6f}\n", step, *val);
    metrics_.flush();
  }
  return 0;
}

int GpuRun::Export() {
  const auto start = Clock::now();
  hf::ExportOptions eo;
  eo.dtype = s_.export_fp32 ? hf::Dtype::kF32 : hf::Dtype::kBF16;
  eo.max_shard_bytes = s_.export_shard_bytes;
  eo.source_dir = s_.init_from;
  eo.progress = [](const std::string& line) { std::printf("%s\n", line.c_str()); };
  // The master copy a group at a time (the export reads the entries in layout order).
  int held = -1;
  std::vector<float> group;
  const std::vector<TensorLayout> layout = ParamLayout(s_.config);
  auto read = [&](size_t e, float* out) -> absl::Status {
    const int g = model_->GroupOf(e);
    if (g != held) {
      if (absl::Status st = model_->GroupParams(g, &group); !st.ok()) return st;
      held = g;
    }
    const TensorLayout& t = layout[e];
    std::copy_n(group.data() + (t.offset - model_->GroupFirst(g)), t.count, out);
    return absl::OkStatus();
  };
  const absl::Status exported = hf::ExportHfCheckpoint(s_.config, s_.export_dir, read, eo);
  if (!exported.ok()) return FailMidRun("export: " + std::string(exported.message()), ck_);
  std::printf("exported: %s (a Hugging Face checkpoint, %s) in %.1f s\n", s_.export_dir.c_str(),
              s_.export_fp32 ? "fp32" : "bf16", Since(start));
  return 0;
}

int GpuRun::Run() {
  if (int failed = Setup(); failed != 0) return failed;
  before_ = Traffic();
  for (int64_t step = run_.step + 1; step <= s_.steps; ++step) {
    if (int failed = Step(step); failed != 0) return failed;
  }
  // The CPU optimizer's last step (it overlaps the next forward; there is none): done before
  // anything reads the state. (Each timed step waited for the one before it, the first for
  // the untimed one's, so the timed seconds hold one optimizer step each.)
  if (absl::Status st = model_->FinishOptimizerStep(); !st.ok()) return FailMidRun(std::string(st.message()), ck_);
  if (s_.eval_every >= 0) {
    if (int failed = Validate(s_.steps); failed != 0) return failed;
  }
  if (!s_.validation_out.empty() && lead_) {
    const absl::Status st =
        WriteValidationWindows(s_.validation_out, data_->val, s_.batch, s_.seq, 8, s_.steps, last_validation_,
                               &data_->val_mask);
    if (!st.ok()) return FailMidRun(std::string(st.message()), ck_);
  }
  Summary();
  if (!s_.export_dir.empty() && lead_) {
    if (int failed = Export(); failed != 0) return failed;
  }
  if (!s_.plot.empty()) {
    if (absl::Status st = WritePlot(s_.plot, curves_); !st.ok()) return Fail(std::string(st.message()));
    std::printf("plot: %s\n", s_.plot.c_str());
  }
  return 0;
}

}  // namespace

bool GpuUsable(std::string* why) {
  int devices = 0;
  const cudaError_t error = cudaGetDeviceCount(&devices);
  if (error != cudaSuccess || devices == 0) {
    *why = error != cudaSuccess ? std::string("cudaGetDeviceCount: ") + cudaGetErrorString(error)
                                : std::string("no CUDA device");
    cudaGetLastError();
    return false;
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  *why = absl::StrFormat("%s (sm_%d%d, %s)", prop.name, prop.major, prop.minor, FormatBytes(prop.totalGlobalMem));
  return true;
}

}  // namespace tierd::trainer::gpu

namespace tierd::trainer::gpu {

int RunOnGpu(const RunSettings& settings) { return GpuRun(settings).Run(); }

}  // namespace tierd::trainer::gpu
