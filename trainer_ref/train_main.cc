// tierd-train: the reference trainer. See --help.
#include <sys/stat.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <deque>
#include <fstream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "base/units.h"
#include "clients/client.h"
#include "trainer_ref/checkpoint.h"
#include "trainer_ref/plot.h"
#include "trainer_ref/trainer.h"

ABSL_FLAG(std::string, model_size, "tiny", "tiny | 124m | 350m | 1.3b | 7b | 13b (the big ones are for the GPU)");
ABSL_FLAG(std::string, offload_policy, "none",
          "none: plain buffers (the baseline); tierd: every parameter, gradient and Adam moment leased from the tierd "
          "at --tierd_dir by name, acquired only while an op uses it");
ABSL_FLAG(std::string, tierd_dir, "/tmp/tierd", "tierd's runtime directory (--offload_policy=tierd)");
ABSL_FLAG(std::string, tierd_dram, "64MiB", "the session's DRAM quota (--offload_policy=tierd)");
ABSL_FLAG(bool, tierd_plan, true,
          "register the step's ops with tierd so its planner moves tensors between DRAM and NVMe ahead of "
          "them (--offload_policy=tierd); off: they move when acquired");
ABSL_FLAG(bool, tierd_record, false,
          "instead of registering the step's ops (--tierd_plan), mark each step's start: tierd records the first "
          "step's acquires and releases and plans from the second on (--offload_policy=tierd)");
ABSL_FLAG(std::string, tierd_nvme, "1GiB", "the session's NVMe quota (--offload_policy=tierd)");
ABSL_FLAG(std::string, precision, "fp32", "fp32 on the CPU (bf16/fp8 are the GPU trainer's)");
ABSL_FLAG(bool, grad_checkpointing, false,
          "keep only each layer's input from forward (the saved activations shrink to batch x seq x d_model "
          "per layer) and recompute the rest in backward: about a third more compute");
ABSL_FLAG(std::string, opt, "adamw", "the optimizer: adamw (decoupled weight decay, fp32 moments)");
ABSL_FLAG(std::string, data, "embedded",
          "embedded | a directory of .txt | FILE.u16 / FILE.u32 token shards | any file (bytes)");
ABSL_FLAG(int, batch_size, 4, "sequences per micro-batch");
ABSL_FLAG(int, seq_len, 64, "tokens per sequence");
ABSL_FLAG(int, grad_accum_steps, 1, "micro-batches per optimizer step");
ABSL_FLAG(int64_t, steps, 200, "optimizer steps");
ABSL_FLAG(int64_t, warmup, 20, "linear warmup steps, then cosine decay to lr / 10");
ABSL_FLAG(double, lr, 3e-3, "peak learning rate");
ABSL_FLAG(double, clip, 1.0, "global gradient-norm clip (0: off)");
ABSL_FLAG(double, weight_decay, 0.1, "AdamW's decoupled weight decay");
ABSL_FLAG(uint64_t, seed, 1, "seed of the initial weights and the data order");
ABSL_FLAG(std::string, checkpoint_dir, "", "where checkpoints go (crash-safe); empty: none");
ABSL_FLAG(int64_t, checkpoint_every, 50, "steps between checkpoints");
ABSL_FLAG(bool, resume, false, "continue from the newest checkpoint in --checkpoint_dir that verifies");
ABSL_FLAG(std::string, metrics, "", "a JSONL file: one line per step (loss, lr, grad norm, time)");
ABSL_FLAG(int64_t, eval_every, 50, "steps between validation losses (0: only at the end)");
ABSL_FLAG(std::string, plot, "", "a PNG at the end: loss per step, validation losses, bytes the tiers moved per step");

namespace tt = tierd::trainer;

namespace {

int Fail(const std::string& what) {
  std::fprintf(stderr, "tierd-train: %s\n", what.c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  absl::FlagsUsageConfig usage;  // --help lists this file's flags (the binary's name differs from the file's)
  usage.contains_help_flags = [](absl::string_view file) { return absl::EndsWith(file, "/train_main.cc"); };
  absl::SetFlagsUsageConfig(usage);
  absl::SetProgramUsageMessage(
      "trains the reference GPT-style decoder (RMSNorm, RoPE attention, SwiGLU) with AdamW.\n"
      "  tierd-train                                  the tiny model on the embedded corpus\n"
      "  tierd-train --data=corpus/ --steps=2000 --checkpoint_dir=ckpt --metrics=run.jsonl\n"
      "  tierd-train --checkpoint_dir=ckpt --resume    continue exactly where a killed run was\n"
      "Each step prints loss, loss spread over the last 100 steps, step time and tokens/s.");
  // --model-size and --model_size both work: dashes in flag names become underscores.
  std::vector<std::string> args(argv, argv + argc);
  for (size_t i = 1; i < args.size(); ++i) {
    std::string& a = args[i];
    if (a == "--") break;
    if (a.size() < 3 || a[0] != '-' || a[1] != '-') continue;
    for (size_t k = 2; k < a.size() && a[k] != '='; ++k) {
      if (a[k] == '-') a[k] = '_';
    }
  }
  std::vector<char*> argv2;
  for (std::string& a : args) argv2.push_back(a.data());
  argv2.push_back(nullptr);
  absl::ParseCommandLine(argc, argv2.data());
  const std::string policy = absl::GetFlag(FLAGS_offload_policy);
  if (policy != "none" && policy != "tierd") return Fail("--offload_policy is none or tierd, not '" + policy + "'");
  if (absl::GetFlag(FLAGS_precision) != "fp32") return Fail("the CPU trainer runs --precision=fp32");
  if (absl::GetFlag(FLAGS_opt) != "adamw") {
    return Fail("--opt is adamw (the only optimizer of the reference trainer), not '" + absl::GetFlag(FLAGS_opt) + "'");
  }
  auto config = tt::ModelPreset(absl::GetFlag(FLAGS_model_size));
  if (!config.ok()) return Fail(std::string(config.status().message()));
  tt::TrainOptions o;
  o.batch = absl::GetFlag(FLAGS_batch_size);
  o.seq = absl::GetFlag(FLAGS_seq_len);
  o.grad_accum = absl::GetFlag(FLAGS_grad_accum_steps);
  o.steps = absl::GetFlag(FLAGS_steps);
  o.warmup = absl::GetFlag(FLAGS_warmup);
  o.lr = absl::GetFlag(FLAGS_lr);
  o.min_lr = o.lr / 10;
  o.clip = absl::GetFlag(FLAGS_clip);
  o.adam.weight_decay = absl::GetFlag(FLAGS_weight_decay);
  o.seed = absl::GetFlag(FLAGS_seed);
  o.checkpointing = absl::GetFlag(FLAGS_grad_checkpointing);
  o.plan = absl::GetFlag(FLAGS_tierd_plan);
  o.record_plan = absl::GetFlag(FLAGS_tierd_record);
  if (o.batch < 1 || o.seq < 1 || o.grad_accum < 1 || o.steps < 1) {
    return Fail("--batch_size, --seq_len, --grad_accum_steps and --steps must be at least 1");
  }
  if (o.seq > config->max_seq) {
    return Fail(absl::StrFormat("--seq_len %d is longer than model %s's %d", o.seq, config->name, config->max_seq));
  }
  if (config->Params() > 50'000'000) {
    return Fail(absl::StrFormat("model %s has %.2fB parameters: too big for the CPU trainer (use tiny or 124m here)",
                                config->name, config->Params() / 1e9));
  }
  auto data = tt::LoadDataset(absl::GetFlag(FLAGS_data), config->vocab, o.seq, 0.05);
  if (!data.ok()) return Fail(std::string(data.status().message()));
  std::unique_ptr<tt::TensorHome> home;
  const auto saved = tt::SavedLayout(*config, o.batch, o.seq, o.checkpointing);
  if (policy == "tierd") {
    tierd::ClientOptions client;
    client.runtime_dir = absl::GetFlag(FLAGS_tierd_dir);
    client.label = "tierd-train";
    auto dram = tierd::ParseBytes(absl::GetFlag(FLAGS_tierd_dram));
    auto nvme = tierd::ParseBytes(absl::GetFlag(FLAGS_tierd_nvme));
    if (!dram.ok() || !nvme.ok()) return Fail("--tierd_dram / --tierd_nvme: sizes like 64MiB");
    client.quota = {0, *dram, *nvme};
    auto made = tt::MakeTierdHome(tt::ParamLayout(*config), saved, client);
    if (!made.ok()) return Fail("tierd: " + std::string(made.status().message()));
    home = std::move(*made);
  } else {
    home = tt::MakePlainHome(tt::ParamLayout(*config), saved);
  }
  auto created = tt::Trainer::Create(*config, o, *data, *home);
  if (!created.ok()) return Fail(std::string(created.status().message()));
  tt::Trainer& trainer = **created;
  if (!trainer.plan_note().empty()) std::printf("tierd: %s\n", trainer.plan_note().c_str());
  const std::string ckpt_dir = absl::GetFlag(FLAGS_checkpoint_dir);
  if (!ckpt_dir.empty()) mkdir(ckpt_dir.c_str(), 0755);
  if (absl::GetFlag(FLAGS_resume)) {
    if (ckpt_dir.empty()) return Fail("--resume needs --checkpoint_dir");
    std::string skipped;
    auto latest = tt::LatestCheckpoint(ckpt_dir, &skipped);
    if (!skipped.empty()) std::fprintf(stderr, "tierd-train: skipped damaged checkpoints:\n%s", skipped.c_str());
    if (!latest.ok()) return Fail(std::string(latest.status().message()));
    auto payload = tt::ReadCheckpoint(*latest);
    if (!payload.ok()) return Fail(std::string(payload.status().message()));
    if (auto s = trainer.LoadState(*payload); !s.ok()) return Fail(std::string(s.message()));
    std::printf("resumed from %s at step %ld\n", latest->c_str(), static_cast<long>(trainer.step()));
  }
  std::ofstream metrics;
  if (!absl::GetFlag(FLAGS_metrics).empty()) {
    metrics.open(absl::GetFlag(FLAGS_metrics), std::ios::app);
    if (!metrics) return Fail("cannot open --metrics " + absl::GetFlag(FLAGS_metrics));
  }
  std::printf("model %s: %lu parameters; data %s; %d x %d tokens x %d micro-batches per step; offload: %s\n",
              config->name.c_str(), static_cast<unsigned long>(config->Params()), data->source.c_str(), o.batch, o.seq,
              o.grad_accum, policy.c_str());
  const double tokens_per_step = static_cast<double>(o.batch) * o.seq * o.grad_accum;
  std::deque<double> recent;
  const auto run_start = std::chrono::steady_clock::now();
  double last_loss = 0;
  tt::RunCurves curves;
  uint64_t moved_before = trainer.home().MovedBytes();
  std::string plan_note = trainer.plan_note();
  while (trainer.step() < o.steps) {
    const auto t0 = std::chrono::steady_clock::now();
    auto stepped = trainer.Step();
    if (!stepped.ok()) return Fail("step " + std::to_string(trainer.step() + 1) + ": " + std::string(stepped.status().message()));
    if (o.record_plan && trainer.plan_note() != plan_note && trainer.step() <= 2) {  // recording, then the plan
      plan_note = trainer.plan_note();
      std::printf("tierd: %s\n", plan_note.c_str());
    }
    const tt::StepResult& r = *stepped;
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r.skipped) {
      std::printf("step %ld skipped: %s\n", static_cast<long>(r.step), r.why.c_str());
      continue;
    }
    last_loss = r.loss;
    curves.loss.push_back(r.loss);
    const uint64_t moved = trainer.home().MovedBytes();
    const uint64_t moved_step = moved - moved_before;
    curves.moved_bytes.push_back(static_cast<double>(moved_step));
    moved_before = moved;
    recent.push_back(r.loss);
    if (recent.size() > 100) recent.pop_front();
    double mean = 0, var = 0;
    for (double l : recent) mean += l / recent.size();
    for (double l : recent) var += (l - mean) * (l - mean) / recent.size();
    // Tier traffic of the step: bytes tierd moved between its tiers (all links).
    const std::string traffic = policy == "tierd" ? "  tiers moved " + tierd::FormatBytes(moved_step) : "";
    std::printf("step %5ld/%ld  loss %.4f  (last %zu: mean %.4f, sd %.4f)  lr %.2e  |g| %.3f  %.0f ms  %.0f tok/s%s\n",
                static_cast<long>(r.step), static_cast<long>(o.steps), r.loss, recent.size(), mean, std::sqrt(var),
                r.lr, r.grad_norm, seconds * 1e3, tokens_per_step / seconds, traffic.c_str());
    std::fflush(stdout);
    if (metrics) {
      metrics << absl::StrFormat(
          "{\"step\": %d, \"loss\": %.6f, \"lr\": %.6g, \"grad_norm\": %.6f, \"seconds\": %.6f, \"tokens\": %.0f, "
          "\"moved_bytes\": %d}\n",
          r.step, r.loss, r.lr, r.grad_norm, seconds, tokens_per_step, moved_step);
      metrics.flush();
    }
    const int64_t eval_every = absl::GetFlag(FLAGS_eval_every);
    if (eval_every > 0 && r.step % eval_every == 0) {
      auto val = trainer.ValidationLoss(8);
      if (!val.ok()) return Fail(std::string(val.status().message()));
      std::printf("validation loss %.4f\n", *val);
      curves.validation.push_back({static_cast<int>(curves.loss.size()), *val});
    }
    if (!ckpt_dir.empty() && (r.step % absl::GetFlag(FLAGS_checkpoint_every) == 0 || r.step == o.steps)) {
      auto state = trainer.SaveState();
      if (!state.ok()) return Fail("checkpoint: " + std::string(state.status().message()));
      auto path = tt::WriteCheckpoint(ckpt_dir, r.step, *state);
      if (!path.ok()) return Fail("checkpoint: " + std::string(path.status().message()));
      std::printf("checkpoint %s\n", path->c_str());
    }
  }
  const double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - run_start).count();
  auto val = trainer.ValidationLoss(8);
  if (!val.ok()) return Fail(std::string(val.status().message()));
  if (!absl::GetFlag(FLAGS_plot).empty()) {
    if (policy == "none") curves.moved_bytes.clear();
    if (auto s = tt::WritePlot(absl::GetFlag(FLAGS_plot), curves); !s.ok()) return Fail(std::string(s.message()));
    std::printf("plot: %s (loss per step in blue, validation in red, bytes moved per step in green)\n",
                absl::GetFlag(FLAGS_plot).c_str());
  }
  std::printf("done: %ld steps, final loss %.4f, validation loss %.4f, %.0f tokens/s; %s\n", static_cast<long>(o.steps),
              last_loss, *val, tokens_per_step * o.steps / std::max(total, 1e-9), trainer.home().Describe().c_str());
  return 0;
}
