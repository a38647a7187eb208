#include "trainer_ref/cpu_run.h"

#include <sys/stat.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>

#include "absl/strings/str_format.h"
#include "base/units.h"
#include "clients/client.h"
#include "trainer_ref/checkpoint.h"
#include "trainer_ref/cpu_data_parallel.h"
#include "trainer_ref/hf/hf_checkpoint.h"
#include "trainer_ref/home/tierd_home.h"
#include "trainer_ref/plot.h"
#include "trainer_ref/run_plan.h"
#include "trainer_ref/run_report.h"
#include "trainer_ref/trainer.h"

namespace tierd::trainer {
namespace {

// Every link's bytes so far (0 for plain buffers, or when tierd does not answer).
uint64_t MovedBytes(Home& home) {
  auto t = home.Moved();
  return t.ok() ? t->all_links : 0;
}

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

absl::Status Resume(Trainer& trainer, LossWindow& window, const RunSettings& s, CheckpointTrail& ck,
                    comm::Communicator* comm) {
  auto path = AgreedCheckpoint(comm, s.checkpoint_dir);
  if (!path.ok()) return path.status();
  auto reader = CheckpointReader::Open(*path);
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
  SetStopAdvice(CheckpointAdvice(ck.dir, ck.last_path, ck.last_step));
  return absl::OkStatus();
}

std::string DescribeSync(Trainer& trainer, const TrainOptions& o) {
  const GradSync& sync = trainer.sync();
  std::string how = o.dp.zero2 ? "ZeRO-2 (gradients reduce-scattered, each rank steps 1/N of the state, "
                                 "parameters all-gathered)"
                               : "dense (gradients all-reduced)";
  if (o.dp.zero3) {
    int64_t kept = 0, whole = 0;
    for (size_t e = 0; e < trainer.layout().size(); ++e) {
      const auto [lo, hi] = sync.Owned(e);
      kept += hi - lo;
      whole += static_cast<int64_t>(trainer.layout()[e].count);
    }
    how = absl::StrFormat(
        "ZeRO-3 (gradients reduce-scattered, each rank steps 1/N of the state and keeps %d of the %d parameters, "
        "all-gathering each tensor as the forward and the backward reach it)",
        kept, whole);
  }
  if (sync.sparse()) {
    int64_t sparse = 0, elements = 0, sent = 0;
    for (size_t e = 0; e < trainer.layout().size(); ++e) {
      elements += static_cast<int64_t>(trainer.layout()[e].count);
      if (sync.SparseK(e) > 0) ++sparse;
      sent += sync.SparseK(e) > 0 ? sync.SparseK(e) : static_cast<int64_t>(trainer.layout()[e].count);
    }
    how = absl::StrFormat(
        "sparse %s: %d of %d tensors TopK (%.1f%% of the elements a step, index + bf16), the "
        "rest in residuals; the others dense",
        o.dp.sparse_update     ? "updates"
        : o.dp.sparse_momentum ? "momenta"
                               : "gradients",
        sparse, trainer.layout().size(), 100.0 * sent / std::max<int64_t>(elements, 1));
    if (o.dp.sparse_momentum) {
      how += absl::StrFormat("; dense AdamW for %d steps, then its second moment frozen", o.dp.sparse_warmup);
    } else if (o.dp.sparse_warmup > 0) {
      how += absl::StrFormat("; dense at first, down to that over %d steps", o.dp.sparse_warmup);
    }
  }
  if (o.dp.sync_every > 1) how += absl::StrFormat("; local steps, parameters averaged every %d", o.dp.sync_every);
  return how;
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
  o.plan = s.tierd_plan;
  o.record_plan = s.tierd_record;
  o.moments_8bit = s.moments_8bit;
  o.lion = s.lion;
  o.adafactor = s.adafactor;
  return o;
}

}  // namespace

int RunOnCpu(const RunSettings& settings) {
  RunSettings s = settings;
  const ModelConfig& config = s.config;
  // The largest preset the CPU trainer takes is 124m (0.13B parameters with its 32000-token
  // vocabulary: ~2 GB of fp32 state, seconds a step); 350m and up are for a GPU.
  if (config.Params() > 200'000'000) {
    return Fail(
        absl::StrFormat("model %s has %.2fB parameters: too big for the CPU trainer (use tiny or 124m here, "
                        "or a GPU)",
                        config.name, config.Params() / 1e9));
  }
  comm::LaunchInfo launch;
  auto comm = MakeCpuCommunicator(s, &launch);
  if (!comm.ok()) return Fail(std::string(comm.status().message()));
  TrainOptions o = OptionsFrom(s);
  o.dp = DataParallelFrom(s, comm->get());
  const int rank = o.dp.rank(), ranks = o.dp.ranks();
  const bool lead = rank == 0;  // prints the steps and writes the metrics and the plot
  CheckpointTrail ck{s.checkpoint_dir, "", 0};
  if (!ck.dir.empty()) mkdir(ck.dir.c_str(), 0755);
  if (ranks > 1) {
    InstallStopHandler(rank, ranks);
    std::printf("rank %d: %s\n", rank, launch.Describe().c_str());
    // Each rank keeps its own state (its moments' slice with ZeRO-2, its residuals).
    if (!s.checkpoint_dir.empty()) s.checkpoint_dir += absl::StrFormat("/rank-%d", rank);
  }
  auto data = LoadDataset(s.data, config.vocab, o.seq, 0.05);
  if (!data.ok()) return Fail(std::string(data.status().message()));
  std::unique_ptr<Home> home;
  if (s.tierd) {
    ClientOptions client;
    client.runtime_dir = s.tierd_dir;
    client.label = ranks > 1 ? absl::StrFormat("tierd-train-rank-%d", rank) : "tierd-train";
    client.quota = {0, s.tierd_dram, s.tierd_nvme};
    auto made = MakeTierdHome(HomeShapeFor(config, o).Table(), client);
    if (!made.ok()) return Fail("tierd: " + std::string(made.status().message()));
    home = std::move(*made);
    std::printf("%stierd session %s: quotas DRAM %s, NVMe %s (each rank its own, out of the node's budgets)\n",
                ranks > 1 ? absl::StrFormat("rank %d: ", rank).c_str() : "", client.label.c_str(),
                FormatBytes(s.tierd_dram).c_str(), FormatBytes(s.tierd_nvme).c_str());
  } else {
    auto made = MakePlainHome(HomeShapeFor(config, o).Table());
    if (!made.ok()) return Fail(std::string(made.status().message()));
    home = std::move(*made);
  }
  std::unique_ptr<hf::HfCheckpointReader> init_from;
  if (!s.init_from.empty()) {
    auto reader = hf::HfCheckpointReader::Open(s.init_from, config);
    if (!reader.ok()) return Fail(std::string(reader.status().message()));
    init_from = std::move(*reader);
    o.init_params = [&init_from, &config](std::vector<float>* params) {
      const std::vector<TensorLayout> layout = ParamLayout(config);
      for (size_t e = 0; e < layout.size(); ++e) {
        if (absl::Status st = init_from->Read(e, params->data() + layout[e].offset); !st.ok()) return st;
      }
      return absl::OkStatus();
    };
  }
  if (!s.export_dir.empty() && o.dp.zero3) {
    return Fail("--export with --zero=3: each rank holds a slice of each parameter; export from a dense or ZeRO-2 run");
  }
  const auto init_start = std::chrono::steady_clock::now();
  auto created = Trainer::Create(config, o, *data, *home);
  if (!created.ok()) return Fail(std::string(created.status().message()));
  Trainer& trainer = **created;
  if (!trainer.plan_note().empty() && lead) std::printf("tierd: %s\n", trainer.plan_note().c_str());
  if (!s.checkpoint_dir.empty()) mkdir(s.checkpoint_dir.c_str(), 0755);
  LossWindow window;
  SpikeGuard spikes(s.loss_spike_sds);
  StepReporter reporter;
  if (s.resume) {
    if (absl::Status st = Resume(trainer, window, s, ck, comm->get()); !st.ok()) return Fail(std::string(st.message()));
  }
  RunPlan plan;
  plan.Add("device", "cpu (the fp32 reference)", s.Given("device") ? "--device" : "auto: no usable GPU");
  AddCommonRows(s, &plan);
  plan.Add("activations", s.checkpointing ? "full checkpointing (each layer's input kept)" : "all kept",
           s.Given("grad_checkpointing") ? "--grad_checkpointing" : "default");
  if (s.tierd) {
    plan.Add("tierd quotas", absl::StrFormat("DRAM %s, NVMe %s", FormatBytes(s.tierd_dram), FormatBytes(s.tierd_nvme)),
             s.Given("tierd_dram") || s.Given("tierd_nvme") ? "--tierd_dram, --tierd_nvme" : "default");
    plan.Add("tierd plan", s.tierd_plan ? "the step's graph registered" : "none (tierd's online policy)",
             s.Given("tierd_plan") ? "--tierd_plan" : "default");
  }
  if (ranks > 1) plan.Add("data-parallel", DescribeSync(trainer, o), "the launcher's ranks");
  if (lead) std::fputs(plan.Table().c_str(), stdout);
  std::ofstream metrics;
  if (!s.metrics.empty() && lead) {
    std::string note;
    auto opened = OpenMetrics(s.metrics, s.resume ? trainer.step() : 0, &note, plan.JsonLine());
    if (!opened.ok()) return Fail(std::string(opened.status().message()));
    metrics = std::move(*opened);
    if (!note.empty()) std::printf("%s\n", note.c_str());
  }
  if (lead) {
    std::printf(
        "model %s; data %s; %d x %d tokens x %d micro-batches per step%s; offload: %s%s\n",
        DescribeConfig(config).c_str(), data->source.c_str(), o.batch, o.seq, o.grad_accum,
        ranks > 1 ? absl::StrFormat(" x %d ranks", ranks).c_str() : "", s.tierd ? "tierd" : "none",
        ck.dir.empty() ? "" : absl::StrFormat("; checkpoint every %d steps in %s", s.checkpoint_every, ck.dir).c_str());
    if (ranks > 1) std::printf("data-parallel: %s\n", DescribeSync(trainer, o).c_str());
    if (init_from != nullptr) {
      std::printf("init: weights of %s (%s) in %.1f s\n", s.init_from.c_str(), init_from->Describe().c_str(),
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - init_start).count());
    }
    std::printf("schedule: %s\n", s.schedule_note.c_str());
  }
  const double tokens_per_step = static_cast<double>(o.batch) * o.seq * o.grad_accum * ranks;
  const comm::CommStats none;
  const comm::CommStats* traffic_of = ranks > 1 ? &(*comm)->stats() : &none;
  comm::CommStats comm_before = *traffic_of;
  const comm::CommStats comm_start = *traffic_of;
  const auto run_start = std::chrono::steady_clock::now();
  const int64_t first_step = trainer.step();
  double last_loss = 0;
  RunCurves curves;
  uint64_t moved_before = MovedBytes(trainer.home());
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
    const comm::CommStats comm_now = *traffic_of;
    const double comm_seconds = comm_now.seconds - comm_before.seconds;
    const double sent = comm_now.bytes_sent - comm_before.bytes_sent;
    comm_before = comm_now;
    // For tierd's statistics (tierctl stats, Prometheus): this rank's step.
    reporter.Send([&] {
      return trainer.home().ReportStep(r.step, r.skipped ? std::nan("") : r.loss, seconds, tokens_per_step / ranks);
    });
    if (r.skipped) {
      std::printf("step %ld skipped: %s\n", static_cast<long>(r.step), r.why.c_str());
      continue;
    }
    last_loss = r.loss;
    curves.loss.push_back(r.loss);
    const uint64_t moved = MovedBytes(trainer.home());
    const uint64_t moved_step = moved - moved_before;
    curves.moved_bytes.push_back(static_cast<double>(moved_step));
    moved_before = moved;
    const double spike = spikes.Check(r.step, r.loss, window);
    const std::string spike_note = spikes.Words(spike);
    window.Add(r.loss);
    // Tier traffic of the step: bytes tierd moved between its tiers (all links).
    const std::string traffic = s.tierd ? "  tiers moved " + FormatBytes(moved_step) : "";
    const std::string ckpt_note =
        ck.dir.empty() ? "" : absl::StrFormat("  ckpt %d (every %d)", ck.last_step, s.checkpoint_every);
    // Data-parallel: this rank's time in collectives and bytes it put on the wire.
    const std::string comm_note = ranks > 1 ? absl::StrFormat("  comm %.0f ms (%.0f%%) sent %s%s", comm_seconds * 1e3,
                                                              100 * comm_seconds / std::max(seconds, 1e-9),
                                                              FormatBytes(sent), r.synced ? "" : " (local step)")
                                            : "";
    if (lead) {
      std::printf(
          "step %5ld/%ld  loss %.4f  (last %zu: mean %.4f, sd %.4f)  lr %.2e  |g| %.3f  %.0f ms  %.0f tok/s%s%s%s%s\n",
          static_cast<long>(r.step), static_cast<long>(o.steps), r.loss, window.size(), window.mean(), window.sd(),
          r.lr, r.grad_norm, seconds * 1e3, tokens_per_step / seconds, traffic.c_str(), comm_note.c_str(),
          ckpt_note.c_str(), spike_note.c_str());
      std::fflush(stdout);
    }
    if (metrics) {
      std::string dp =
          ranks > 1 ? absl::StrFormat(", \"comm_seconds\": %.6f, \"bytes_sent\": %.0f", comm_seconds, sent) : "";
      if (spike > 0) absl::StrAppendFormat(&dp, ", \"loss_spike_sds\": %.2f", spike);
      metrics << absl::StrFormat(
          "{\"step\": %d, \"loss\": %.6f, \"lr\": %.6g, \"grad_norm\": %.6f, \"seconds\": %.6f, \"tokens\": %.0f, "
          "\"moved_bytes\": %d%s}\n",
          r.step, r.loss, r.lr, r.grad_norm, seconds, tokens_per_step, moved_step, dp);
      metrics.flush();
    }
    MaybeKillForTest(r.step);
    if (s.eval_every > 0 && r.step % s.eval_every == 0) {
      auto val = trainer.ValidationLoss(8);
      if (!val.ok()) return FailMidRun(std::string(val.status().message()), ck);
      if (lead) std::printf("validation loss %.4f\n", *val);
      curves.validation.push_back({static_cast<int>(curves.loss.size()), *val});
    }
    if (!ck.dir.empty() && (r.step % s.checkpoint_every == 0 || r.step == o.steps)) {
      auto path = Save(trainer, window, s);
      if (!path.ok()) return FailMidRun("checkpoint: " + std::string(path.status().message()), ck);
      ck.last_path = *path;
      ck.last_step = r.step;
      if (lead) std::printf("checkpoint %s\n", path->c_str());
      SetStopAdvice(CheckpointAdvice(ck.dir, ck.last_path, ck.last_step));
    }
  }
  const double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - run_start).count();
  absl::StatusOr<double> val = -1.0;
  if (s.eval_every >= 0) val = trainer.ValidationLoss(8);
  if (!val.ok()) return FailMidRun(std::string(val.status().message()), ck);
  if (!s.validation_out.empty() && lead) {
    const absl::Status st = WriteValidationWindows(s.validation_out, data->val, o.batch, o.seq, 8, trainer.step(), *val, &data->val_mask);
    if (!st.ok()) return FailMidRun(std::string(st.message()), ck);
  }
  if (!lead) return 0;  // rank 0 reports the run
  std::string compared;
  if (!s.compare_metrics.empty()) {
    auto reference = ReadLossCurve(s.compare_metrics);
    if (!reference.ok()) return Fail(std::string(reference.status().message()));
    curves.reference = *reference;
    curves.reference_name = "loss of " + s.compare_metrics.substr(s.compare_metrics.rfind('/') + 1);
    if (static_cast<int64_t>(reference->size()) >= o.steps) {
      const double theirs = (*reference)[o.steps - 1];
      compared = absl::StrFormat("; %s at step %d: %.4f (this run %+.1f%%)", s.compare_metrics, o.steps, theirs,
                                 100 * (last_loss - theirs) / theirs);
    }
  }
  if (!s.plot.empty()) {
    if (!s.tierd) curves.moved_bytes.clear();
    curves.title = absl::StrFormat("tierd-train, model %s on the CPU%s", config.name, s.tierd ? " through tierd" : "");
    if (auto st = WritePlot(s.plot, curves); !st.ok()) return Fail(std::string(st.message()));
    std::printf("plot: %s\n", s.plot.c_str());
  }
  const double steps_run = static_cast<double>(o.steps - first_step);
  const std::string validation = s.eval_every >= 0 ? absl::StrFormat(", validation loss %.4f", *val) : "";
  std::printf("done: %ld steps, final loss %.4f%s, %.0f tokens/s; %s%s%s\n", static_cast<long>(o.steps), last_loss,
              validation.c_str(), tokens_per_step * steps_run / std::max(total, 1e-9),
              trainer.home().Describe().c_str(), compared.c_str(), spikes.Summary().c_str());
  if (!s.export_dir.empty()) {
    hf::ExportOptions eo;
    eo.dtype = s.export_fp32 ? hf::Dtype::kF32 : hf::Dtype::kBF16;
    eo.max_shard_bytes = s.export_shard_bytes;
    eo.source_dir = s.init_from;
    eo.progress = [](const std::string& line) { std::printf("%s\n", line.c_str()); };
    const absl::Status exported = hf::ExportHfCheckpoint(
        config, s.export_dir, [&trainer](size_t e, float* out) { return trainer.ReadParam(e, out); }, eo);
    if (!exported.ok()) return FailMidRun("export: " + std::string(exported.message()), ck);
    std::printf("exported: %s (a Hugging Face checkpoint, %s)\n", s.export_dir.c_str(), s.export_fp32 ? "fp32" : "bf16");
  }
  if (ranks > 1) {
    const double sent = (traffic_of->bytes_sent - comm_start.bytes_sent) / std::max(steps_run, 1.0);
    const double dense = trainer.sync().DenseBytesPerStep();
    std::printf(
        "data-parallel: %d ranks; rank 0 in collectives %.2f s of %.2f s (%.0f%%); sent %s a step, a dense "
        "all-reduce of every gradient %s (%.1f%%)\n",
        ranks, traffic_of->seconds - comm_start.seconds, total,
        100 * (traffic_of->seconds - comm_start.seconds) / std::max(total, 1e-9),
        FormatBytes(static_cast<uint64_t>(sent)).c_str(), FormatBytes(static_cast<uint64_t>(dense)).c_str(),
        100 * sent / std::max(dense, 1.0));
  }
  return 0;
}

}  // namespace tierd::trainer
