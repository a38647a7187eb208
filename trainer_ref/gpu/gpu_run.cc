// The GPU run's steps (gpu_run_internal.h's GpuRun): each step's micro-batches, the progress
// line, the run from its setup to its end.
#include "trainer_ref/gpu/gpu_run.h"

#include "trainer_ref/gpu/gpu_run_internal.h"

namespace tierd::trainer::gpu {

// The share of `seconds` each PCIe direction had a copy in flight between two readings of
// tierd's links (at most 1: the readings and the step's clock are a few microseconds apart).
std::pair<double, double> PcieBusy(const HomeTraffic& from, const HomeTraffic& to, double seconds) {
  auto share = [&](double busy) { return std::clamp(busy / std::max(seconds, 1e-9), 0.0, 1.0); };
  return {share(to.host_to_gpu_busy - from.host_to_gpu_busy), share(to.gpu_to_host_busy - from.gpu_to_host_busy)};
}

std::pair<uint64_t, std::string> GpuRun::GpuMemory(const HomeTraffic& t) const {
  // What the model allocated itself (plain: everything), plus with tierd the most its GPU
  // tier has held (since the daemon started: one run per daemon).
  const uint64_t own = model_->DeviceBytes();
  if (!s_.tierd) return {own, FormatBytes(own)};
  return {own + t.gpu_peak, absl::StrFormat("%s (tierd peak %s + workspace %s)", FormatBytes(own + t.gpu_peak),
                                            FormatBytes(t.gpu_peak), FormatBytes(own))};
}

std::string GpuRun::Progress(int64_t step, double loss, double lr, double grad_norm, double seconds,
                             const HomeTraffic& after, std::optional<double> util) {
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
  const int64_t first_timed = curves_.first_step + s_.timing_skip;
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
  // A layer that read its FP8 weight codes reads its bf16 weights now: a graph that still had
  // them dead after the optimizer's update would let the plan drop them.
  if (!fell_back.empty() && s_.tierd && s_.tierd_plan && model_->WeightCodesOn()) {
    auto note = model_->RegisterStep(s_.accum);
    if (!note.ok()) {
      return FailMidRun(absl::StrFormat("step %d: registering the step anew after the FP8 fall back: %s", step,
                                        note.status().message()),
                        ck_);
    }
    std::printf("tierd: the step registered anew (a layer reads its bf16 weights now): %s\n", note->c_str());
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
  const HomeTraffic after = Traffic();
  const std::optional<double> util = util_ ? util_->Since(&step_mark_) : std::nullopt;
  const std::pair<double, double> busy = PcieBusy(before_, after, seconds);
  if (step >= first_timed) {
    timed_seconds_ += seconds;
    timed_waits_ += waited;
    timed_releases_ += model_->ReleaseSeconds() - released0;
    timed_to_ = after;
    ++timed_steps_;
    if (profile_.empty()) profile_.assign(spent.size(), {});
    for (size_t k = 0; k < spent.size(); ++k) {
      profile_[k] = {spent[k].name, profile_[k].ms + spent[k].ms, profile_[k].flops + spent[k].flops};
    }
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

int RunOnGpu(const RunSettings& settings) { return GpuRun(settings).Run(); }

}  // namespace tierd::trainer::gpu
