#include "trainer_ref/cpu_run.h"

#include <sys/stat.h>

#include <chrono>
#include <cstdio>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_format.h"
#include "base/units.h"
#include "clients/client.h"
#include "trainer_ref/checkpoint.h"
#include "trainer_ref/plot.h"
#include "trainer_ref/run_report.h"
#include "trainer_ref/trainer.h"

namespace tierd::trainer {
namespace {

absl::StatusOr<std::string> Save(Trainer& trainer, const LossWindow& window, const RunSettings& s) {
  auto state = trainer.SaveState();
  if (!state.ok()) return state.status();
  auto writer = CheckpointWriter::Create(s.checkpoint_dir, trainer.step());
  if (!writer.ok()) return writer.status();
  const std::vector<double> losses = window.values();
  if (auto st = (*writer)->Append("state", state->data(), state->size()); !st.ok()) return st;
  if (auto st = (*writer)->Append("losses", losses.data(), losses.size() * sizeof(double)); !st.ok()) return st;
  auto path = (*writer)->Commit();
  if (path.ok()) PruneCheckpoints(s.checkpoint_dir, s.checkpoint_keep);
  return path;
}

absl::Status Resume(Trainer& trainer, LossWindow& window, const RunSettings& s, CheckpointTrail& ck) {
  auto reader = OpenNewestCheckpoint(s.checkpoint_dir);
  if (!reader.ok()) return reader.status();
  auto state = (*reader)->ReadString("state");
  if (!state.ok()) return state.status();
  if (absl::Status st = trainer.LoadState(*state); !st.ok()) return st;
  auto next = (*reader)->Peek();
  if (next.ok() && next->first == "losses") {
    std::vector<double> losses(next->second / sizeof(double));
    if (absl::Status st = (*reader)->Read("losses", losses.data(), next->second); !st.ok()) return st;
    window.Restore(losses);
  }
  ck.last_path = (*reader)->path();
  ck.last_step = trainer.step();
  std::printf("resumed from %s at step %ld\n", ck.last_path.c_str(), static_cast<long>(trainer.step()));
  return absl::OkStatus();
}

TrainOptions OptionsFrom(const RunSettings& s) {
  TrainOptions o;
  o.batch = s.batch;
  o.seq = s.seq;
  o.grad_accum = s.accum;
  o.steps = s.steps;
  o.warmup = s.warmup;
  o.lr = s.lr;
  o.min_lr = s.lr / 10;
  o.clip = s.clip;
  o.adam.weight_decay = s.weight_decay;
  o.seed = s.seed;
  o.data_seed = s.data_seed;
  o.checkpointing = s.checkpointing;
  o.plan = absl::GetFlag(FLAGS_tierd_plan);
  o.record_plan = absl::GetFlag(FLAGS_tierd_record);
  o.moments_8bit = s.moments_8bit;
  return o;
}

}  // namespace

int RunOnCpu(const RunSettings& s) {
  const ModelConfig& config = s.config;
  if (config.Params() > 50'000'000) {
    return Fail(
        absl::StrFormat("model %s has %.2fB parameters: too big for the CPU trainer (use tiny or 124m here, "
                        "or a GPU)",
                        config.name, config.Params() / 1e9));
  }
  const TrainOptions o = OptionsFrom(s);
  auto data = LoadDataset(s.data, config.vocab, o.seq, 0.05);
  if (!data.ok()) return Fail(std::string(data.status().message()));
  std::unique_ptr<TensorHome> home;
  const auto saved = SavedLayout(config, o.batch, o.seq, o.checkpointing);
  if (s.tierd) {
    ClientOptions client;
    client.runtime_dir = s.tierd_dir;
    client.label = "tierd-train";
    client.quota = {0, s.tierd_dram, s.tierd_nvme};
    auto made = MakeTierdHome(ParamLayout(config), saved, client, o.moments_8bit);
    if (!made.ok()) return Fail("tierd: " + std::string(made.status().message()));
    home = std::move(*made);
  } else {
    home = MakePlainHome(ParamLayout(config), saved, o.moments_8bit);
  }
  auto created = Trainer::Create(config, o, *data, *home);
  if (!created.ok()) return Fail(std::string(created.status().message()));
  Trainer& trainer = **created;
  if (!trainer.plan_note().empty()) std::printf("tierd: %s\n", trainer.plan_note().c_str());
  CheckpointTrail ck{s.checkpoint_dir, "", 0};
  if (!ck.dir.empty()) mkdir(ck.dir.c_str(), 0755);
  LossWindow window;
  if (s.resume) {
    if (absl::Status st = Resume(trainer, window, s, ck); !st.ok()) return Fail(std::string(st.message()));
  }
  std::ofstream metrics;
  if (!s.metrics.empty()) {
    std::string note;
    auto opened = OpenMetrics(s.metrics, s.resume ? trainer.step() : 0, &note);
    if (!opened.ok()) return Fail(std::string(opened.status().message()));
    metrics = std::move(*opened);
    if (!note.empty()) std::printf("%s\n", note.c_str());
  }
  std::printf(
      "model %s; data %s; %d x %d tokens x %d micro-batches per step; offload: %s%s\n", DescribeConfig(config).c_str(),
      data->source.c_str(), o.batch, o.seq, o.grad_accum, s.tierd ? "tierd" : "none",
      ck.dir.empty() ? "" : absl::StrFormat("; checkpoint every %d steps in %s", s.checkpoint_every, ck.dir).c_str());
  const double tokens_per_step = static_cast<double>(o.batch) * o.seq * o.grad_accum;
  const auto run_start = std::chrono::steady_clock::now();
  const int64_t first_step = trainer.step();
  double last_loss = 0;
  RunCurves curves;
  uint64_t moved_before = trainer.home().MovedBytes();
  std::string plan_note = trainer.plan_note();
  while (trainer.step() < o.steps) {
    const auto t0 = std::chrono::steady_clock::now();
    auto stepped = trainer.Step();
    if (!stepped.ok()) {
      return FailMidRun(absl::StrFormat("step %d: %s", trainer.step() + 1, stepped.status().message()), ck);
    }
    if (o.record_plan && trainer.plan_note() != plan_note && trainer.step() <= 2) {  // recording, then the plan
      plan_note = trainer.plan_note();
      std::printf("tierd: %s\n", plan_note.c_str());
    }
    const StepResult& r = *stepped;
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
    window.Add(r.loss);
    // Tier traffic of the step: bytes tierd moved between its tiers (all links).
    const std::string traffic = s.tierd ? "  tiers moved " + FormatBytes(moved_step) : "";
    const std::string ckpt_note =
        ck.dir.empty() ? "" : absl::StrFormat("  ckpt %d (every %d)", ck.last_step, s.checkpoint_every);
    std::printf(
        "step %5ld/%ld  loss %.4f  (last %zu: mean %.4f, sd %.4f)  lr %.2e  |g| %.3f  %.0f ms  %.0f tok/s%s%s\n",
        static_cast<long>(r.step), static_cast<long>(o.steps), r.loss, window.size(), window.mean(), window.sd(), r.lr,
        r.grad_norm, seconds * 1e3, tokens_per_step / seconds, traffic.c_str(), ckpt_note.c_str());
    std::fflush(stdout);
    if (metrics) {
      metrics << absl::StrFormat(
          "{\"step\": %d, \"loss\": %.6f, \"lr\": %.6g, \"grad_norm\": %.6f, \"seconds\": %.6f, \"tokens\": %.0f, "
          "\"moved_bytes\": %d}\n",
          r.step, r.loss, r.lr, r.grad_norm, seconds, tokens_per_step, moved_step);
      metrics.flush();
    }
    MaybeKillForTest(r.step);
    if (s.eval_every > 0 && r.step % s.eval_every == 0) {
      auto val = trainer.ValidationLoss(8);
      if (!val.ok()) return FailMidRun(std::string(val.status().message()), ck);
      std::printf("validation loss %.4f\n", *val);
      curves.validation.push_back({static_cast<int>(curves.loss.size()), *val});
    }
    if (!ck.dir.empty() && (r.step % s.checkpoint_every == 0 || r.step == o.steps)) {
      auto path = Save(trainer, window, s);
      if (!path.ok()) return FailMidRun("checkpoint: " + std::string(path.status().message()), ck);
      ck.last_path = *path;
      ck.last_step = r.step;
      std::printf("checkpoint %s\n", path->c_str());
    }
  }
  const double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - run_start).count();
  absl::StatusOr<double> val = -1.0;
  if (s.eval_every >= 0) val = trainer.ValidationLoss(8);
  if (!val.ok()) return FailMidRun(std::string(val.status().message()), ck);
  if (!s.plot.empty()) {
    if (!s.tierd) curves.moved_bytes.clear();
    curves.title = absl::StrFormat("tierd-train, model %s on the CPU%s", config.name, s.tierd ? " through tierd" : "");
    if (auto st = WritePlot(s.plot, curves); !st.ok()) return Fail(std::string(st.message()));
    std::printf("plot: %s\n", s.plot.c_str());
  }
  const double steps_run = static_cast<double>(o.steps - first_step);
  const std::string validation = s.eval_every >= 0 ? absl::StrFormat(", validation loss %.4f", *val) : "";
  std::printf("done: %ld steps, final loss %.4f%s, %.0f tokens/s; %s\n", static_cast<long>(o.steps), last_loss,
              validation.c_str(), tokens_per_step * steps_run / std::max(total, 1e-9),
              trainer.home().Describe().c_str());
  return 0;
}

}  // namespace tierd::trainer
