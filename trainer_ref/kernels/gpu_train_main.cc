// tierd-train-gpu: the reference trainer on one GPU, the whole model in GPU memory
// (--offload_policy=none; bf16 weights and activations, fp32 master weights, gradients and
// Adam state). See --help.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <deque>
#include <fstream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_format.h"
#include "base/units.h"
#include "trainer_ref/data.h"
#include "trainer_ref/kernels/gpu_model.h"
#include "trainer_ref/model_config.h"
#include "trainer_ref/optimizer.h"

ABSL_FLAG(std::string, model_size, "tiny", "tiny | 124m | 350m | 1.3b | 7b | 13b");
ABSL_FLAG(std::string, data, "embedded", "embedded | a directory of .txt files | a .u16/.u32 token shard");
ABSL_FLAG(int, batch_size, 8, "sequences per micro-batch");
ABSL_FLAG(int, seq_len, 0, "tokens per sequence (0: the model's longest, at most 2048)");
ABSL_FLAG(int, grad_accum_steps, 1, "micro-batches per optimizer step");
ABSL_FLAG(int64_t, steps, 50, "optimizer steps");
ABSL_FLAG(int64_t, warmup, 10, "linear warmup steps, then cosine decay to lr / 10");
ABSL_FLAG(double, lr, 3e-4, "peak learning rate");
ABSL_FLAG(double, clip, 1.0, "global gradient-norm clip (0: off)");
ABSL_FLAG(double, weight_decay, 0.1, "AdamW's decoupled weight decay");
ABSL_FLAG(uint64_t, seed, 1, "seed of the initial weights and the data order");
ABSL_FLAG(std::string, metrics, "", "a JSONL file: one line per step");
ABSL_FLAG(int64_t, timing_skip, 2, "steps left out of the tokens/s summary (warm-up)");
ABSL_FLAG(bool, profile, false,
          "time every kernel and GEMM with CUDA events and say where each step's time goes (adds a little)");

namespace tt = tierd::trainer;

namespace {
int Fail(const std::string& message) {
  std::fprintf(stderr, "tierd-train-gpu: %s\n", message.c_str());
  return 1;
}
}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "trains the reference decoder on one GPU, every tensor in GPU memory (the no-offload baseline).\n"
      "  tierd-train-gpu --model_size=1.3b --seq_len=2048 --batch_size=8 --steps=20\n"
      "Each step prints loss, its spread over the last 100 steps, step time, tokens/s and the GPU memory\n"
      "the model holds (allocated, not cached); the last line sums tokens/s and TFLOP/s (6 N per token).");
  absl::ParseCommandLine(argc, argv);
  auto config = tt::ModelPreset(absl::GetFlag(FLAGS_model_size));
  if (!config.ok()) return Fail(std::string(config.status().message()));
  const int batch = absl::GetFlag(FLAGS_batch_size);
  const int seq = absl::GetFlag(FLAGS_seq_len) > 0 ? absl::GetFlag(FLAGS_seq_len) : std::min(config->max_seq, 2048);
  const int accum = absl::GetFlag(FLAGS_grad_accum_steps);
  const int64_t steps = absl::GetFlag(FLAGS_steps);
  if (batch < 1 || seq < 1 || accum < 1 || steps < 1) {
    return Fail("--batch_size, --seq_len, --grad_accum_steps and --steps must be at least 1");
  }
  if (seq > config->max_seq) return Fail(absl::StrFormat("--seq_len %d is longer than %d", seq, config->max_seq));
  auto data = tt::LoadDataset(absl::GetFlag(FLAGS_data), config->vocab, seq, 0.05);
  if (!data.ok()) return Fail(std::string(data.status().message()));
  auto model = tt::gpu::GpuModel::Create(*config, batch, seq);
  if (!model.ok()) return Fail(std::string(model.status().message()));
  {
    tt::Model<float> init(*config, 1, 1);  // the same initialisation as the CPU trainer
    init.InitParams(absl::GetFlag(FLAGS_seed));
    if (absl::Status s = (*model)->SetParams(init.params()); !s.ok()) return Fail(std::string(s.message()));
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  std::printf("model %s: %.3fB parameters on %s; %d x %d tokens x %d micro-batches per step; GPU memory held %s\n",
              config->name.c_str(), config->Params() / 1e9, prop.name, batch, seq, accum,
              tierd::FormatBytes((*model)->DeviceBytes()).c_str());
  std::ofstream metrics;
  if (!absl::GetFlag(FLAGS_metrics).empty()) {
    metrics.open(absl::GetFlag(FLAGS_metrics));
    if (!metrics) return Fail("cannot open --metrics " + absl::GetFlag(FLAGS_metrics));
  }
  tt::Batcher batcher(data->train, batch, seq, absl::GetFlag(FLAGS_seed) * 7919 + 1);
  tt::AdamWOptions adam;
  adam.weight_decay = absl::GetFlag(FLAGS_weight_decay);
  const double lr_max = absl::GetFlag(FLAGS_lr);
  const double tokens_per_step = static_cast<double>(batch) * seq * accum;
  std::vector<int32_t> inputs(static_cast<size_t>(batch) * seq), targets(inputs.size());
  std::deque<double> recent;
  (*model)->EnableProfile(absl::GetFlag(FLAGS_profile));
  std::vector<std::pair<std::string, double>> profile;  // ms summed over the timed steps
  double timed_seconds = 0, last_loss = 0;
  int64_t timed_steps = 0;
  for (int64_t step = 1; step <= steps; ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    if (absl::Status s = (*model)->ZeroGrads(); !s.ok()) return Fail(std::string(s.message()));
    double loss = 0;
    for (int micro = 0; micro < accum; ++micro) {
      batcher.Next(inputs.data(), targets.data());
      auto l = (*model)->Forward(inputs.data(), targets.data());
      if (!l.ok()) return Fail(std::string(l.status().message()));
      loss += *l / accum;
      if (absl::Status s = (*model)->Backward(); !s.ok()) return Fail(std::string(s.message()));
    }
    auto norm = (*model)->GradNorm();
    if (!norm.ok()) return Fail(std::string(norm.status().message()));
    const double grad_norm = *norm / accum;
    const double lr = tt::LearningRate(step - 1, absl::GetFlag(FLAGS_warmup), steps, lr_max, lr_max / 10);
    if (!std::isfinite(loss) || !std::isfinite(grad_norm)) {
      std::printf("step %ld skipped: loss %g, gradient norm %g\n", static_cast<long>(step), loss, grad_norm);
      continue;
    }
    const double scale = tt::ClipFactor(grad_norm, absl::GetFlag(FLAGS_clip)) / accum;
    if (absl::Status s = (*model)->AdamWStep(lr, step, adam, scale); !s.ok()) return Fail(std::string(s.message()));
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const auto spent = (*model)->TakeProfile();
    if (step > absl::GetFlag(FLAGS_timing_skip)) {
      timed_seconds += seconds;
      ++timed_steps;
      if (profile.empty()) profile.assign(spent.size(), {"", 0.0});
      for (size_t k = 0; k < spent.size(); ++k) profile[k] = {spent[k].first, profile[k].second + spent[k].second};
    }
    last_loss = loss;
    recent.push_back(loss);
    if (recent.size() > 100) recent.pop_front();
    double mean = 0, var = 0;
    for (double x : recent) mean += x / recent.size();
    for (double x : recent) var += (x - mean) * (x - mean) / recent.size();
    std::printf("step %5ld/%ld  loss %.4f  (last %zu: mean %.4f, sd %.4f)  lr %.2e  |g| %.3f  %.0f ms  %.0f tok/s  "
                "GPU %s\n",
                static_cast<long>(step), static_cast<long>(steps), loss, recent.size(), mean, std::sqrt(var), lr,
                grad_norm, seconds * 1e3, tokens_per_step / seconds, tierd::FormatBytes((*model)->DeviceBytes()).c_str());
    std::fflush(stdout);
    if (metrics) {
      metrics << absl::StrFormat("{\"step\": %d, \"loss\": %.6f, \"lr\": %.6g, \"grad_norm\": %.6f, \"seconds\": %.6f}\n",
                                 step, loss, lr, grad_norm, seconds);
    }
  }
  const double tps = timed_steps > 0 ? tokens_per_step * timed_steps / timed_seconds : 0;
  std::printf("done: %ld steps, final loss %.4f, %.0f tokens/s over %ld timed steps, %.0f TFLOP/s (6N), GPU memory %s\n",
              static_cast<long>(steps), last_loss, tps, static_cast<long>(timed_steps), 6.0 * config->Params() * tps / 1e12,
              tierd::FormatBytes((*model)->DeviceBytes()).c_str());
  if (absl::GetFlag(FLAGS_profile) && timed_steps > 0) {
    const double step_ms = timed_seconds * 1e3 / timed_steps;
    std::string line = absl::StrFormat("where a step's %.0f ms go:", step_ms);
    double kernels = 0;
    for (const auto& [name, ms] : profile) {
      line += absl::StrFormat(" %s %.0f ms (%.0f%%),", name, ms / timed_steps, 100 * ms / timed_steps / step_ms);
      kernels += ms / timed_steps;
    }
    line += absl::StrFormat(" the rest (host, copies, waits) %.0f ms", step_ms - kernels);
    std::printf("%s\n", line.c_str());
  }
  return 0;
}
