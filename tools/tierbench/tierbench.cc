// tierbench: the storage engine's link bandwidth, tierd's Mover side by side with the
// raw ceiling of each link, measured in the same run on the same machine.
#include <sys/utsname.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_format.h"
#include "base/clock.h"
#include "base/units.h"
#include "runtime/gpu_factory.h"
#include "runtime/mover.h"
#include "runtime/tier_store.h"
#include "runtime/uring_block_io.h"
#include "tools/tierbench/mover_bench.h"
#include "tools/tierbench/raw_ceiling.h"

ABSL_FLAG(std::string, gpu, "auto", "auto (CUDA if usable, else the fake GPU), cuda, or fake");
ABSL_FLAG(std::string, bytes, "256MiB", "bytes moved per link, direction and repeat");
ABSL_FLAG(std::string, transfer_bytes, "32MiB", "size of one tensor (one move)");
ABSL_FLAG(int, repeats, 3, "timed repeats per measurement (the median is reported)");
ABSL_FLAG(std::string, nvme_dir, "/var/tmp", "directory on the disk for the NVMe tier");
ABSL_FLAG(bool, nvme, true, "measure the DRAM<->NVMe link too");
ABSL_FLAG(int, nvme_queue_depth, 32, "io_uring queue depth (power of two, <= 64)");
ABSL_FLAG(bool, register_buffers, true, "register the DRAM tier with io_uring (fixed buffers)");

namespace tierd {
namespace {

std::string CpuModel() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  }
  return "unknown CPU";
}

void Row(const char* link, uint64_t bytes, double tierd, double raw, double target) {
  const double ratio = raw > 0 ? tierd / raw : 0;
  std::printf("%-22s %10s %12s %12s %8.1f%% %8s %s\n", link, FormatBytes(bytes).c_str(),
              FormatRate(tierd).c_str(), FormatRate(raw).c_str(), 100 * ratio,
              absl::StrFormat(">=%.0f%%", 100 * target).c_str(), ratio >= target ? "ok" : "BELOW");
}

int Run() {
  auto bytes = ParseBytes(absl::GetFlag(FLAGS_bytes));
  auto transfer = ParseBytes(absl::GetFlag(FLAGS_transfer_bytes));
  if (!bytes.ok() || !transfer.ok() || *transfer == 0) {
    std::fprintf(stderr, "tierbench: bad --bytes or --transfer_bytes: %s\n",
                 (!bytes.ok() ? bytes.status() : transfer.status()).ToString().c_str());
    return 2;
  }
  const std::string choice = absl::GetFlag(FLAGS_gpu);
  GpuOptions gpu_options;
  gpu_options.choice = choice == "cuda" ? GpuChoice::kCuda : choice == "fake" ? GpuChoice::kFake
                                                                             : GpuChoice::kAuto;
  auto gpu = OpenGpu(gpu_options);
  if (!gpu.ok()) {
    std::fprintf(stderr, "tierbench: %s\n", gpu.status().ToString().c_str());
    return 1;
  }
  const bool nvme = absl::GetFlag(FLAGS_nvme);
  TierStoreOptions options;
  options.gpu_bytes = 2 * *bytes;
  options.dram_bytes = 2 * *bytes;
  options.dram_headroom_bytes = 512 * kMiB;
  options.nvme_directory = absl::GetFlag(FLAGS_nvme_dir);
  options.nvme_bytes = nvme ? AlignUp(*bytes, 4096) + *bytes / *transfer * 4096 + 4096 : 0;
  options.instance_name = "tierbench-" + std::to_string(getpid());
  auto store = TierStore::Open(options, *gpu->device);
  if (!store.ok()) {
    std::fprintf(stderr, "tierbench: %s\n", store.status().ToString().c_str());
    return 1;
  }
  std::unique_ptr<BlockIo> io;
  if (nvme) {
    auto uring = CreateUringBlockIo((*store)->nvme()->fd(), absl::GetFlag(FLAGS_nvme_queue_depth));
    if (!uring.ok()) {
      std::fprintf(stderr, "tierbench: %s\n", uring.status().ToString().c_str());
      return 1;
    }
    io = std::move(*uring);
  }
  auto mover = Mover::Create(**store, std::move(io), RealClock(),
                             {.register_nvme_buffers = absl::GetFlag(FLAGS_register_buffers)});
  if (!mover.ok()) {
    std::fprintf(stderr, "tierbench: %s\n", mover.status().ToString().c_str());
    return 1;
  }
  utsname host{};
  uname(&host);
  std::printf("tierbench: tierd's Mover vs the raw ceiling of each link, measured side by side\n");
  std::printf("machine:   %s, %s, %ld cores\n", host.nodename, CpuModel().c_str(),
              sysconf(_SC_NPROCESSORS_ONLN));
  std::printf("gpu:       %s%s\n", gpu->device->Describe().c_str(),
              gpu->fallback_reason.empty() ? "" : (" -- " + gpu->fallback_reason).c_str());
  if (nvme) {
    std::printf("nvme:      %s, queue depth %d, fixed buffers: %s\n", options.nvme_directory.c_str(),
                absl::GetFlag(FLAGS_nvme_queue_depth),
                (*mover)->NvmeBufferRegistration().ok()
                    ? "yes"
                    : std::string((*mover)->NvmeBufferRegistration().message()).c_str());
  }
  std::printf("workload:  %s per link in tensors of %s, median of %d repeats after a warm-up\n",
              FormatBytes(*bytes).c_str(), FormatBytes(*transfer).c_str(),
              absl::GetFlag(FLAGS_repeats));
  std::fflush(stdout);

  const int repeats = std::max(1, absl::GetFlag(FLAGS_repeats));
  auto tierd_rates = bench::MeasureMover(**store, **mover, {*bytes, *transfer, repeats, nvme});
  auto raw_gpu = bench::MeasureRawGpuCopies(!gpu->device->is_fake(), *bytes, *transfer, repeats);
  absl::StatusOr<bench::NvmeRates> raw_nvme = bench::NvmeRates{};
  if (nvme) raw_nvme = bench::MeasureRawNvme(options.nvme_directory, *bytes, *transfer, repeats);
  for (const absl::Status& s : {tierd_rates.status(), raw_gpu.status(), raw_nvme.status()}) {
    if (!s.ok()) {
      std::fprintf(stderr, "tierbench: %s\n", s.ToString().c_str());
      return 1;
    }
  }
  const char* raw_gpu_name = gpu->device->is_fake() ? "memcpy" : "cudaMemcpyAsync, pinned";
  std::printf("\n%-22s %10s %12s %12s %9s %8s\n", "link", "bytes", "tierd", "raw", "ratio", "target");
  Row("dram->gpu", *bytes, tierd_rates->dram_to_gpu, raw_gpu->host_to_device, 0.95);
  Row("gpu->dram", *bytes, tierd_rates->gpu_to_dram, raw_gpu->device_to_host, 0.95);
  Row("dram<->gpu (both, sum)", 2 * *bytes, tierd_rates->both_directions, raw_gpu->both_directions, 0.95);
  if (nvme) {
    Row("dram->nvme", *bytes, tierd_rates->dram_to_nvme, raw_nvme->write, 0.90);
    Row("nvme->dram", *bytes, tierd_rates->nvme_to_dram, raw_nvme->read, 0.90);
  }
  std::printf("\nraw ceilings: gpu = %s per tensor on a bare stream; nvme = sequential O_DIRECT "
              "pwrite/pread of %s blocks, one thread.\n", raw_gpu_name, FormatBytes(*transfer).c_str());
  std::printf("tierd moves: GPU via the Mover's copy-engine links; NVMe via io_uring, 1 MiB ops, "
              "CRC32C computed on write and verified on read.\n");
  return 0;
}

}  // namespace
}  // namespace tierd

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "measures tierd's storage engine: the Mover's bandwidth on each link (DRAM->GPU, GPU->DRAM,\n"
      "both at once, DRAM->NVMe, NVMe->DRAM) beside the raw ceiling of the same link, in one run.\n"
      "Example (the lent H200): tierbench --gpu=cuda --bytes=4GiB --transfer_bytes=256MiB "
      "--nvme_dir=/var/tmp\n"
      "Without a GPU the fake GPU stands in and the GPU ceiling is memcpy.");
  absl::ParseCommandLine(argc, argv);
  return tierd::Run();
}
