// tierd-train-gpu: the reference trainer on one GPU (bf16 weights and activations, fp32
// master weights, gradients and Adam state): the whole model in GPU memory
// (--offload_policy=none), or its state leased from tierd within a GPU budget
// (--offload_policy=tierd). See --help.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <deque>
#include <fstream>
#include <string>

#include "absl/debugging/failure_signal_handler.h"
#include "absl/debugging/symbolize.h"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "base/units.h"
#include "trainer_ref/data.h"
#include "clients/client.h"
#include "trainer_ref/kernels/gpu_model.h"
#include "trainer_ref/kernels/gpu_tierd_home.h"
#include "trainer_ref/model_config.h"
#include "trainer_ref/optimizer_place.h"
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
ABSL_FLAG(std::string, offload_policy, "none",
          "none: every tensor in GPU memory (the baseline); tierd: weights, master weights, gradients, Adam moments "
          "and saved activations leased from the tierd at --tierd_dir, layer by layer, within --gpu_budget");
ABSL_FLAG(std::string, gpu_budget, "24GiB",
          "--offload_policy=tierd: the GPU memory this run may use, all of it: the trainer's workspace (one layer's "
          "scratch, the logits) and tierd's GPU quota for the session (the rest)");
ABSL_FLAG(std::string, tierd_dir, "/tmp/tierd", "tierd's runtime directory (--offload_policy=tierd)");
ABSL_FLAG(std::string, tierd_dram, "64GiB", "the session's DRAM quota (--offload_policy=tierd)");
ABSL_FLAG(std::string, tierd_nvme, "64GiB", "the session's NVMe quota (--offload_policy=tierd)");
ABSL_FLAG(bool, tierd_plan, true,
          "register the step's ops with tierd so its planner moves each layer's tensors ahead of use "
          "(--offload_policy=tierd); off: they move when acquired");
ABSL_FLAG(std::string, optimizer_place, "auto",
          "where AdamW runs: gpu (the state streams to the GPU and back), cpu (with --offload_policy=tierd: on "
          "the host's threads, in tierd's DRAM tier where the master weights and moments stay, overlapping the "
          "next forward; only gradients come down and bf16 weights go up), or auto (with tierd, a cost model "
          "from the sizes, the tiers' quotas, --pcie_gbps, --nvme_gbps, --gpu_tflops and the host's AdamW rate "
          "measured at start picks one and says why; without tierd, gpu)");
ABSL_FLAG(double, pcie_gbps, 55, "the host<->GPU link each way in GB/s, for --optimizer_place=auto (55: the lent "
          "H200's PCIe 5; ~25 on PCIe 4)");
ABSL_FLAG(double, nvme_gbps, 2, "NVMe GB/s, reads and writes sharing it, for --optimizer_place=auto");
ABSL_FLAG(double, gpu_tflops, 300, "sustained bf16 TFLOP/s, for --optimizer_place=auto's estimate of the forward "
          "the host's AdamW overlaps");
ABSL_FLAG(bool, grad_checkpointing, false,
          "activation checkpointing: a layer keeps only its input and its backward recomputes the rest (a third "
          "more compute; the saved activations shrink ~10x, so far less to hold or move)");
ABSL_FLAG(int, optimizer_chunks, 1,
          "with --offload_policy=tierd: lease each layer's master weights and Adam moments as this many "
          "sub-groups (DeepSpeed's sub-groups) so tierd moves and places the optimizer's state in pieces and "
          "AdamW updates one piece while the next arrives; 1: one lease per layer and part");
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
  absl::InitializeSymbolizer(argv[0]);
  absl::InstallFailureSignalHandler({});  // a crash prints its stack
  setvbuf(stdout, nullptr, _IOLBF, 0);     // lines reach a pipe (tee) as they are printed
  absl::FlagsUsageConfig usage;  // --help lists this file's flags (the binary's name differs from the file's)
  usage.contains_help_flags = [](absl::string_view file) { return absl::EndsWith(file, "/gpu_train_main.cc"); };
  absl::SetFlagsUsageConfig(usage);
  absl::SetProgramUsageMessage(
      "trains the reference decoder on one GPU: every tensor in GPU memory (the no-offload baseline), or\n"
      "its state leased from a running tierd within a GPU budget.\n"
      "  tierd-train-gpu --model_size=1.3b --seq_len=2048 --batch_size=8 --steps=20\n"
      "  tierd --gpu=cuda --gpu_bytes=24GiB --dram_bytes=100GiB --nvme_dir=/var/tmp/tierd --nvme_bytes=64GiB &\n"
      "  tierd-train-gpu --model_size=7b --batch_size=2 --offload_policy=tierd --gpu_budget=24GiB --tierd_dram=90GiB\n"
      "Each step prints loss, its spread over the last 100 steps, step time, tokens/s and the GPU memory\n"
      "the run holds (allocated, not cached; with tierd its GPU tier's peak plus the trainer's workspace) and\n"
      "with tierd the bytes moved each way; the last lines sum tokens/s and TFLOP/s (6 N per token).");
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
  const std::string policy = absl::GetFlag(FLAGS_offload_policy);
  if (policy != "none" && policy != "tierd") return Fail("--offload_policy is none or tierd, not '" + policy + "'");
  const std::string optimizer_place = absl::GetFlag(FLAGS_optimizer_place);
  if (optimizer_place != "gpu" && optimizer_place != "cpu" && optimizer_place != "auto") {
    return Fail("--optimizer_place is gpu, cpu or auto, not '" + optimizer_place + "'");
  }
  if (optimizer_place == "cpu" && policy != "tierd") {
    return Fail("--optimizer_place=cpu steps the state on the host, where tierd keeps it in DRAM: it needs "
                "--offload_policy=tierd");
  }
  std::unique_ptr<tt::gpu::GpuHome> home;  // null: plain GPU buffers
  uint64_t gpu_quota = 0;                   // tierd's, for the optimizer's cost model
  const bool checkpointing = absl::GetFlag(FLAGS_grad_checkpointing);
  tt::gpu::GpuHomeLayout layout = tt::gpu::GpuModel::HomeLayout(*config, batch, seq, checkpointing);
  const int chunks = absl::GetFlag(FLAGS_optimizer_chunks);
  if (chunks < 1 || chunks > 1024) {
    return Fail(absl::StrFormat("--optimizer_chunks=%d: give 1 (one lease per layer's state) up to 1024", chunks));
  }
  if (chunks > 1 && policy != "tierd") {
    return Fail("--optimizer_chunks leases the optimizer's state from tierd in pieces: it needs --offload_policy=tierd");
  }
  layout.state_chunks = chunks;
  const uint64_t workspace = tt::gpu::GpuModel::WorkspaceBytesFor(*config, batch, seq, checkpointing);
  if (policy == "tierd") {
    auto budget = tierd::ParseBytes(absl::GetFlag(FLAGS_gpu_budget));
    auto dram = tierd::ParseBytes(absl::GetFlag(FLAGS_tierd_dram));
    auto nvme = tierd::ParseBytes(absl::GetFlag(FLAGS_tierd_nvme));
    if (!budget.ok() || !dram.ok() || !nvme.ok()) return Fail("--gpu_budget, --tierd_dram, --tierd_nvme: sizes like 24GiB");
    if (*budget <= workspace) {
      return Fail(absl::StrFormat("--gpu_budget %s leaves nothing for tierd: the trainer's workspace alone is %s for "
                                  "%d x %d tokens (a smaller --batch_size or --seq_len shrinks it)",
                                  tierd::FormatBytes(*budget), tierd::FormatBytes(workspace), batch, seq));
    }
    tierd::ClientOptions client;
    client.runtime_dir = absl::GetFlag(FLAGS_tierd_dir);
    client.label = "tierd-train-gpu";
    client.quota = {*budget - workspace, *dram, *nvme};
    gpu_quota = client.quota.gpu_bytes;
    auto made = tt::gpu::MakeTierdGpuHome(layout, client);
    if (!made.ok()) return Fail("tierd: " + std::string(made.status().message()));
    home = std::move(*made);
    std::printf("offload: tierd at %s; GPU budget %s = workspace %s + tierd's GPU quota %s, for a state of %s "
                "(weights %s, master %s, gradients %s, moments %s, saved activations %s)%s\n",
                client.runtime_dir.c_str(), tierd::FormatBytes(*budget).c_str(), tierd::FormatBytes(workspace).c_str(),
                tierd::FormatBytes(client.quota.gpu_bytes).c_str(), tierd::FormatBytes(layout.Total()).c_str(),
                tierd::FormatBytes(layout.TotalOf(tt::gpu::Part::kWeights)).c_str(),
                tierd::FormatBytes(layout.TotalOf(tt::gpu::Part::kMaster)).c_str(),
                tierd::FormatBytes(layout.TotalOf(tt::gpu::Part::kGrads)).c_str(),
                tierd::FormatBytes(2 * layout.TotalOf(tt::gpu::Part::kAdamM)).c_str(),
                tierd::FormatBytes(layout.TotalOf(tt::gpu::Part::kActs)).c_str(),
                chunks > 1 ? absl::StrFormat("; master weights and moments in %d sub-groups a layer (%s each)", chunks,
                                             tierd::FormatBytes(layout.Chunk(1, tt::gpu::Part::kMaster, 0).bytes))
                                 .c_str()
                           : "");
  }
  auto model = tt::gpu::GpuModel::Create(*config, batch, seq, std::move(home), checkpointing);
  if (!model.ok()) return Fail(std::string(model.status().message()));
  if (absl::Status s = (*model)->InitParams(absl::GetFlag(FLAGS_seed)); !s.ok()) return Fail(std::string(s.message()));
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  std::printf("model %s: %.3fB parameters on %s; %d x %d tokens x %d micro-batches per step%s; GPU memory held %s\n",
              config->name.c_str(), config->Params() / 1e9, prop.name, batch, seq, accum,
              checkpointing ? " (activation checkpointing)" : "", tierd::FormatBytes((*model)->DeviceBytes()).c_str());
  bool optimizer_on_cpu = optimizer_place == "cpu";
  if (optimizer_place == "auto" && policy == "tierd") {
    tt::OptimizerCostInputs costs;
    costs.params = static_cast<double>(config->Params());
    costs.state_bytes = static_cast<double>(layout.Total());
    costs.gpu_bytes = static_cast<double>(gpu_quota);
    costs.dram_bytes = static_cast<double>(*tierd::ParseBytes(absl::GetFlag(FLAGS_tierd_dram)));  // checked above
    costs.h2d_bytes_per_s = costs.d2h_bytes_per_s = absl::GetFlag(FLAGS_pcie_gbps) * 1e9;
    costs.nvme_bytes_per_s = absl::GetFlag(FLAGS_nvme_gbps) * 1e9;
    costs.forward_seconds = 2.0 * config->Params() * batch * seq / (absl::GetFlag(FLAGS_gpu_tflops) * 1e12);
    costs.host_params_per_s = tt::CalibrateHostAdamW();
    const tt::OptimizerChoice choice = tt::ChooseOptimizerPlace(costs);
    optimizer_on_cpu = choice.on_cpu;
    std::printf("optimizer: %s\n", choice.why.c_str());
  }
  (*model)->SetOptimizerOnCpu(optimizer_on_cpu);
  if (policy == "tierd" && absl::GetFlag(FLAGS_tierd_plan)) {
    auto note = (*model)->RegisterStep(accum);
    if (!note.ok()) return Fail("registering the step with tierd: " + std::string(note.status().message()));
    std::printf("tierd: %s\n", note->c_str());
  }
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
  double timed_seconds = 0, last_loss = 0, timed_waits = 0;
  int64_t timed_steps = 0;
  tt::gpu::GpuHome::Traffic timed_from, timed_to;  // tierd's counters around the timed steps
  // GPU memory: what the model allocated itself (plain: everything), plus with tierd the
  // most its GPU tier has held (since the daemon started: one run per daemon).
  auto gpu_memory = [&](const tt::gpu::GpuHome::Traffic& t) {
    const uint64_t own = (*model)->DeviceBytes();
    if (policy != "tierd") return std::make_pair(own, tierd::FormatBytes(own));
    return std::make_pair(own + t.gpu_peak, absl::StrFormat("%s (tierd peak %s + workspace %s)",
                                                            tierd::FormatBytes(own + t.gpu_peak),
                                                            tierd::FormatBytes(t.gpu_peak), tierd::FormatBytes(own)));
  };
  auto traffic = [&]() {
    auto t = (*model)->home().Moved();
    return t.ok() ? *t : tt::gpu::GpuHome::Traffic{};
  };
  tt::gpu::GpuHome::Traffic before = traffic();
  for (int64_t step = 1; step <= steps; ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    const double waited0 = (*model)->AcquireSeconds();
    if (step == absl::GetFlag(FLAGS_timing_skip) + 1) timed_from = before;
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
    const double waited = (*model)->AcquireSeconds() - waited0;
    const tt::gpu::GpuHome::Traffic after = traffic();
    if (step > absl::GetFlag(FLAGS_timing_skip)) {
      timed_seconds += seconds;
      timed_waits += waited;
      timed_to = after;
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
    std::string moves;
    if (policy == "tierd") {
      auto step_peak = (*model)->home().TakeGpuPeak();
      if (step_peak.ok()) {
        moves = absl::StrFormat("  step peak %s", tierd::FormatBytes(*step_peak + (*model)->DeviceBytes()));
      }
      moves += absl::StrFormat("  moved in %s out %s (NVMe r %s w %s), waited %.0f ms",
                              tierd::FormatBytes(after.host_to_gpu - before.host_to_gpu),
                              tierd::FormatBytes(after.gpu_to_host - before.gpu_to_host),
                              tierd::FormatBytes(after.nvme_read - before.nvme_read),
                              tierd::FormatBytes(after.nvme_write - before.nvme_write), waited * 1e3);
    }
    before = after;
    std::printf("step %5ld/%ld  loss %.4f  (last %zu: mean %.4f, sd %.4f)  lr %.2e  |g| %.3f  %.0f ms  %.0f tok/s  "
                "GPU %s%s\n",
                static_cast<long>(step), static_cast<long>(steps), loss, recent.size(), mean, std::sqrt(var), lr,
                grad_norm, seconds * 1e3, tokens_per_step / seconds, gpu_memory(after).second.c_str(), moves.c_str());
    std::fflush(stdout);
    if (metrics) {
      metrics << absl::StrFormat("{\"step\": %d, \"loss\": %.6f, \"lr\": %.6g, \"grad_norm\": %.6f, \"seconds\": %.6f}\n",
                                 step, loss, lr, grad_norm, seconds);
    }
  }
  // The CPU optimizer's last step (it overlaps the next forward; there is none): done before
  // anything reads the state. (Each timed step waited for the one before it, the first for
  // the untimed one's, so the timed seconds hold one optimizer step each.)
  if (absl::Status s = (*model)->FinishOptimizerStep(); !s.ok()) return Fail(std::string(s.message()));
  const double tps = timed_steps > 0 ? tokens_per_step * timed_steps / timed_seconds : 0;
  const tt::gpu::GpuHome::Traffic end = traffic();
  const auto [memory_bytes, memory] = gpu_memory(end);
  std::printf("done: %ld steps, final loss %.4f, %.0f tokens/s over %ld timed steps, %.0f TFLOP/s (6N), GPU memory %s\n",
              static_cast<long>(steps), last_loss, tps, static_cast<long>(timed_steps), 6.0 * config->Params() * tps / 1e12,
              memory.c_str());
  if (policy == "tierd") std::printf("tierd: %s\n", (*model)->home().Describe().c_str());
  // One JSON line for the benchmark harness; bytes per link and waits per timed step.
  const double per = timed_steps > 0 ? 1.0 / timed_steps : 0.0;
  std::printf("result: {\"run\": \"ours %s\", \"model\": \"%s\", \"tokens_per_s\": %.1f, \"tflops_6n\": %.1f, "
              "\"final_loss\": %.6f, \"peak_gpu_bytes\": %lu, \"step_seconds\": %.4f, \"acquire_wait_seconds\": %.4f, "
              "\"h2d_bytes\": %.0f, \"d2h_bytes\": %.0f, \"nvme_read_bytes\": %.0f, \"nvme_write_bytes\": %.0f}\n",
              ((policy == "tierd" ? "tierd " + absl::GetFlag(FLAGS_gpu_budget) : std::string("none")) +
               (checkpointing ? " + checkpointing" : "") + (optimizer_on_cpu ? " + CPU AdamW" : ""))
                  .c_str(),
              config->name.c_str(), tps,
              6.0 * config->Params() * tps / 1e12, last_loss, static_cast<unsigned long>(memory_bytes),
              timed_seconds * per, timed_waits * per, (timed_to.host_to_gpu - timed_from.host_to_gpu) * per,
              (timed_to.gpu_to_host - timed_from.gpu_to_host) * per, (timed_to.nvme_read - timed_from.nvme_read) * per,
              (timed_to.nvme_write - timed_from.nvme_write) * per);
  if (absl::GetFlag(FLAGS_profile) && timed_steps > 0) {
    const double step_ms = timed_seconds * 1e3 / timed_steps;
    std::string line = absl::StrFormat("where a step's %.0f ms go:", step_ms);
    double kernels = 0;
    for (const auto& [name, ms] : profile) {
      line += absl::StrFormat(" %s %.0f ms (%.0f%%),", name, ms / timed_steps, 100 * ms / timed_steps / step_ms);
      kernels += ms / timed_steps;
    }
    line += absl::StrFormat(" the GPU idle (waiting for the host, moves, syncs) %.0f ms", step_ms - kernels);
    if (policy == "tierd") line += absl::StrFormat("; the host waited in tierd's acquire %.0f ms", timed_waits * 1e3 / timed_steps);
    if (optimizer_on_cpu) {
      line += absl::StrFormat("; AdamW on the host %.0f ms a step (over the run)",
                              (*model)->HostOptimizerSeconds() * 1e3 / steps);
    }
    std::printf("%s\n", line.c_str());
  }
  return 0;
}
