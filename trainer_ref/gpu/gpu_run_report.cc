// A GPU run's reports (gpu_run_internal.h's GpuRun): the held-out loss, the summary and the
// harness's result line, and --export.
#include "trainer_ref/gpu/gpu_run_internal.h"

namespace tierd::trainer::gpu {

void GpuRun::Summary() {
  const double tokens_per_step = static_cast<double>(s_.batch) * s_.seq * s_.accum * ranks_;
  const double tps = timed_steps_ > 0 ? tokens_per_step * timed_steps_ / timed_seconds_ : 0;
  const HomeTraffic end = Traffic();
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
      std::printf("device memory (NVML, as nvidia-smi lists it): this process %s%s = %s%s\n", FormatBytes(own).c_str(),
                  s_.tierd ? absl::StrFormat(" + tierd %s", FormatBytes(daemon)).c_str() : "",
                  FormatBytes(own + daemon).c_str(),
                  s_.tierd && s_.gpu_budget > 0
                      ? absl::StrFormat(" of the %s budget%s", FormatBytes(s_.gpu_budget),
                                        own + daemon > s_.gpu_budget ? " (OVER IT)" : "")
                            .c_str()
                      : "");
      device_bytes_ = own + daemon;
    } else {
      std::printf("device memory: not listed (%s)\n", std::string(processes.status().message()).c_str());
    }
  }
  if (host_optimizer_) {
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
  const std::string run = "ours " + (s_.tierd ? "tierd " + s_.gpu_budget_text : std::string("none")) +
                          (s_.checkpointing ? " + checkpointing" : "") +
                          (optimizer_on_cpu_ ? " + CPU AdamW"
                           : host_optimizer_ ? " + split AdamW"
                                             : "") +
                          (fp8_ ? " + fp8" : "");
  std::printf(
      "result: {\"run\": \"%s\", \"model\": \"%s\", \"batch\": %d, \"micro_batches\": %d, "
      "\"tokens_per_s\": %.1f, \"tflops_6n\": %.1f, "
      "\"final_loss\": %.6f, \"peak_gpu_bytes\": %lu, \"step_seconds\": %.4f, \"acquire_wait_seconds\": %.4f, "
      "\"h2d_bytes\": %.0f, \"d2h_bytes\": %.0f, \"nvme_read_bytes\": %.0f, \"nvme_write_bytes\": %.0f, "
      "\"gpu_util\": %.1f, \"pcie_in_busy\": %.4f, \"pcie_out_busy\": %.4f, \"device_bytes\": %lu}\n",
      run.c_str(),
      s_.config.name.c_str(), s_.batch, s_.accum, tps, 6.0 * params * tps / 1e12, last_loss_,
      static_cast<unsigned long>(memory_bytes), timed_seconds_ * per, timed_waits_ * per,
      (timed_to_.host_to_gpu - timed_from_.host_to_gpu) * per, (timed_to_.gpu_to_host - timed_from_.gpu_to_host) * per,
      (timed_to_.nvme_read - timed_from_.nvme_read) * per, (timed_to_.nvme_write - timed_from_.nvme_write) * per, util,
      in_busy, out_busy, static_cast<unsigned long>(device_bytes_));
  if (s_.profile && timed_steps_ > 0) {
    const double step_ms = timed_seconds_ * 1e3 / timed_steps_;
    std::string line = absl::StrFormat("where a step's %.0f ms go:", step_ms);
    double kernels = 0;
    for (const auto& [name, ms, flops] : profile_) {
      line += absl::StrFormat(" %s %.0f ms (%.0f%%%s),", name, ms / timed_steps_, 100 * ms / timed_steps_ / step_ms,
                              flops > 0 && ms > 0 ? absl::StrFormat(", %.0f TFLOP/s", flops / (ms * 1e-3) / 1e12) : "");
      kernels += ms / timed_steps_;
    }
    line += absl::StrFormat(" the GPU idle (waiting for the host, moves, syncs) %.0f ms", step_ms - kernels);
    if (s_.tierd)
      line += absl::StrFormat("; the host waited in tierd's acquire %.0f ms and release %.0f ms",
                              timed_waits_ * 1e3 / timed_steps_, timed_releases_ * 1e3 / timed_steps_);
    if (host_optimizer_) {
      line += absl::StrFormat(
          "; AdamW on the host %.0f ms a step (over the run)",
          model_->HostOptimizerSeconds() * 1e3 / std::max<int64_t>(1, s_.steps - curves_.first_step + 1));
    }
    std::printf("%s\n", line.c_str());
    // The same as one JSON line, for the benchmark harness's table beside PyTorch's profile.
    std::string json = absl::StrFormat("profile: {\"run\": \"%s\", \"model\": \"%s\", \"step_ms\": %.2f", run,
                                       s_.config.name, step_ms);
    for (const auto& [name, ms, flops] : profile_) {
      json += absl::StrFormat(", \"%s\": {\"ms\": %.2f, \"tflops\": %.1f}", name, ms / timed_steps_,
                              ms > 0 ? flops / (ms * 1e-3) / 1e12 : 0.0);
    }
    json += absl::StrFormat(", \"idle\": {\"ms\": %.2f, \"tflops\": 0}}", step_ms - kernels);
    std::printf("%s\n", json.c_str());
    if (s_.gemm_candidates > 1) {
      std::printf("GEMM shapes and their algorithms (--gemm_candidates=%d):\n", s_.gemm_candidates);
      for (const std::string& plan : model_->GemmPlans()) std::printf("  %s\n", plan.c_str());
    }
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
  const HomeTraffic from = Traffic();
  model_->SetFp8Recording(false);  // held-out batches must not steer the training's FP8 scales
  auto val = ValidationLoss(8);
  model_->SetFp8Recording(true);
  if (!val.ok()) return FailMidRun(absl::StrFormat("validation after step %d: %s", step, val.status().message()), ck_);
  const HomeTraffic to = Traffic();
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


}  // namespace tierd::trainer::gpu
