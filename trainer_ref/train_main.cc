// tierd-train: the reference trainer, on the GPU when there is a usable one, on the CPU
// reference otherwise (--device). See --help.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/debugging/failure_signal_handler.h"
#include "absl/debugging/symbolize.h"
#include "absl/flags/flag.h"
#include "comm/launch_env.h"
#include "absl/strings/str_format.h"
#include "base/units.h"
#include "trainer_ref/cpu_run.h"
#include "trainer_ref/export_checkpoint.h"
#include "trainer_ref/train_flags.h"

#ifdef TIERD_HAVE_CUDA
#include "trainer_ref/gpu/gpu_run.h"
#endif


namespace tt = tierd::trainer;

namespace {

constexpr char kUsage[] =
    "trains the reference GPT-style decoder (RMSNorm, RoPE attention, SwiGLU MLP) with AdamW, on a GPU when there\n"
    "is a usable one (bf16, fp32 master weights), else on the CPU (fp32, the reference).\n"
    "  tierd-train                                     the tiny model on the embedded corpus\n"
    "  tierd-train --model_config=config.json --data=corpus/ --steps=2000 --checkpoint_dir=ckpt --metrics=run.jsonl\n"
    "  tierd-train --checkpoint_dir=ckpt --resume      continue exactly where a killed run stopped\n"
    "  tierd --gpu=cuda --gpu_bytes=24GiB --dram_bytes=100GiB --nvme_dir=/var/tmp/tierd --nvme_bytes=64GiB &\n"
    "  tierd-train --model_size=7b --batch_size=2 --offload_policy=tierd --gpu_budget=24GiB --tierd_dram=90GiB\n"
    "  tierd-train --init_from=Llama-3.1-8B --data=shards/ --offload_policy=tierd --gpu_budget=22GiB --export=tuned\n"
    "  tierd-train export --checkpoint=ckpt --to=tuned --init_from=Llama-3.1-8B   a checkpoint's weights as HF's\n"
    "Each step prints loss, its spread over the last 100 steps, step time, tokens/s (on a GPU the memory held and,\n"
    "with tierd, the bytes moved each way). Flags take dashes or underscores (--model-size = --model_size).";

// tierd-train export --checkpoint=PATH --to=DIR and the run's model flags (--init_from, or
// --model_size / --model_config ...): no GPU, the state never whole in memory.
int RunExport() {
  std::string init_from;
  auto config = tt::ReadModelFlags(&init_from);
  if (!config.ok()) {
    std::fprintf(stderr, "tierd-train export: %s\n", std::string(config.status().message()).c_str());
    return 1;
  }
  auto flags = tt::ReadExportFlags();
  if (!flags.ok()) {
    std::fprintf(stderr, "tierd-train export: %s\n", std::string(flags.status().message()).c_str());
    return 1;
  }
  const std::string& checkpoint = flags->checkpoint;
  const std::string& to = flags->to;
  const std::string dtype = flags->fp32 ? "fp32" : "bf16";
  tt::hf::ExportOptions options;
  options.source_dir = init_from;
  options.dtype = flags->fp32 ? tt::hf::Dtype::kF32 : tt::hf::Dtype::kBF16;
  options.max_shard_bytes = flags->shard_bytes;
  options.progress = [](const std::string& line) { std::printf("%s\n", line.c_str()); };
  std::printf("export: model %s from %s\n", tt::DescribeConfig(*config).c_str(), checkpoint.c_str());
  const absl::Status st = tt::ExportTrainerCheckpoint(*config, checkpoint, to, options);
  if (!st.ok()) {
    std::fprintf(stderr, "tierd-train export: %s\n", std::string(st.message()).c_str());
    return 1;
  }
  std::printf("exported: %s (a Hugging Face checkpoint, %s)\n", to.c_str(), dtype.c_str());
  return 0;
}

// The device to train on, said once; false with a message when --device=gpu cannot be had.
bool PickDevice(const tt::DeviceFlags& flags, bool* gpu) {
  const std::string& device = flags.device;
  if (device != "auto" && device != "gpu" && device != "cpu") {
    std::fprintf(stderr, "tierd-train: --device is auto, gpu or cpu, not '%s'\n", device.c_str());
    return false;
  }
  std::string why = "this tierd-train was built without the CUDA toolkit";
  bool usable = false;
#ifdef TIERD_HAVE_CUDA
  if (device != "cpu") usable = tt::gpu::GpuUsable(&why);
#endif
  if (device == "gpu" && !usable) {
    std::fprintf(stderr, "tierd-train: --device=gpu, but no GPU can be used: %s\n", why.c_str());
    return false;
  }
  *gpu = usable;
  if (flags.print_device) return true;
  if (device == "cpu") {
    std::printf("device: CPU (--device=cpu)\n");
  } else {
    std::printf("device: %s\n",
                usable ? ("GPU " + why).c_str() : ("CPU, the reference (no usable GPU: " + why + ")").c_str());
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  absl::InitializeSymbolizer(argv[0]);
  absl::InstallFailureSignalHandler({});  // a crash prints its stack
  setvbuf(stdout, nullptr, _IOLBF, 0);    // lines reach a pipe (tee) as they are printed
  if (argc > 1 && std::string(argv[1]) == "export") {  // the subcommand: its own flags after it
    argv[1] = argv[0];
    tt::ParseTrainerFlags(argc - 1, argv + 1, kUsage);
    return RunExport();
  }
  tt::ParseTrainerFlags(argc, argv, kUsage);
  bool gpu = false;
  const tt::DeviceFlags device = tt::ReadDeviceFlags();
  if (!PickDevice(device, &gpu)) return 1;
  if (device.print_device) {
    std::printf("%s\n", gpu ? "gpu" : "cpu");
    return 0;
  }
  std::vector<std::string> notes;
  auto settings = tt::ReadRunSettings(gpu, &notes);
  for (const std::string& note : notes) std::printf("note: %s\n", note.c_str());
  if (!settings.ok()) {
    std::fprintf(stderr, "tierd-train: %s\n", std::string(settings.status().message()).c_str());
    return 1;
  }
#ifdef TIERD_HAVE_CUDA
  if (gpu) {
    return tt::gpu::RunOnGpu(*settings);  // data-parallel GPU ranks too (NCCL)
  }
#endif
  return tt::RunOnCpu(*settings);
}
