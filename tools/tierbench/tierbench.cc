// tierbench: the storage engine's link bandwidth, tierd's Mover side by side with the
// raw ceiling of each link, measured in the same run on the same machine.
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>
#include <fstream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_format.h"
#include "base/clock.h"
#include "base/units.h"
#include "base/crc32c.h"
#include "runtime/gpu_factory.h"
#include "runtime/mover.h"
#include "runtime/tier_store.h"
#include "runtime/uring_block_io.h"
#include "tools/tierbench/mover_bench.h"
#include "tools/tierbench/raw_ceiling.h"
#include "tools/tierbench/stats.h"

ABSL_FLAG(std::string, gpu, "auto", "auto (CUDA if usable, else the fake GPU), cuda, or fake");
ABSL_FLAG(std::string, bytes, "256MiB", "bytes moved per link, direction and repeat");
ABSL_FLAG(std::string, transfer_bytes, "32MiB", "size of one tensor (one move)");
ABSL_FLAG(int, repeats, 3, "timed repeats per measurement (the median is reported)");
ABSL_FLAG(std::string, nvme_dir, "/var/tmp", "directory on the disk for the NVMe tier");
ABSL_FLAG(bool, nvme, true, "measure the DRAM<->NVMe link too");
ABSL_FLAG(int, nvme_queue_depth, 32, "io_uring queue depth (power of two, <= 64)");
ABSL_FLAG(bool, register_buffers, true, "register the DRAM tier with io_uring (fixed buffers)");
ABSL_FLAG(std::string, nvme_chunk_bytes, "1MiB", "NVMe op size and checksum granularity");
ABSL_FLAG(bool, nvme_sweep, false,
          "also sweep NVMe chunk size x queue depth, and the raw loop's block size");

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

// target 0: no target applies (the fake GPU: its "link" is memcpy on a shared core).
void Row(const char* link, uint64_t bytes, double tierd, double raw, double target) {
  const double ratio = raw > 0 ? tierd / raw : 0;
  std::printf("%-22s %10s %12s %12s %8.1f%% %8s %s\n", link, FormatBytes(bytes).c_str(),
              FormatRate(tierd).c_str(), FormatRate(raw).c_str(), 100 * ratio,
              target > 0 ? absl::StrFormat(">=%.0f%%", 100 * target).c_str() : "-",
              target <= 0 ? "" : ratio >= target ? "ok" : "BELOW");
}

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "tierbench: %s\n", status.ToString().c_str());
  return 1;
}

double CrcRate() {
  std::vector<uint8_t> data(64 * kMiB, 0x3C);
  const auto start = std::chrono::steady_clock::now();
  uint32_t crc = 0;
  for (int i = 0; i < 8; ++i) crc = Crc32c(crc, data.data(), data.size());
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return crc == 0x12345678 ? 0 : 8.0 * data.size() / seconds;  // use crc: keep the loop
}

absl::StatusOr<std::unique_ptr<Mover>> MakeMover(TierStore& store, bool nvme, int queue_depth,
                                                 uint64_t chunk_bytes) {
  std::unique_ptr<BlockIo> io;
  if (nvme) {
    auto uring = CreateUringBlockIo(store.nvme()->fd(), queue_depth);
    if (!uring.ok()) return uring.status();
    io = std::move(*uring);
  }
  return Mover::Create(store, std::move(io), RealClock(),
                       {.register_nvme_buffers = absl::GetFlag(FLAGS_register_buffers),
                        .nvme_chunk_bytes = chunk_bytes});
}

// Where NVMe throughput comes from: op size x queue depth for tierd, block size for raw.
int Sweep(TierStore& store, bench::MoverBench& bench, bench::RawNvme& raw, const std::string& dir) {
  std::printf("\nnvme sweep (%s, one pass each):\n%-28s %12s %12s\n", dir.c_str(), "config",
              "write", "read");
  for (uint64_t chunk : {1 * kMiB, 4 * kMiB, 16 * kMiB}) {
    for (int depth : {8, 32, 64}) {
      auto mover = MakeMover(store, true, depth, chunk);
      if (!mover.ok()) return Fail(mover.status());
      auto rates = bench.MeasureNvmeOnce(**mover);
      if (!rates.ok()) return Fail(rates.status());
      std::printf("%-28s %12s %12s\n",
                  absl::StrFormat("tierd %s ops, depth %d", FormatBytes(chunk), depth).c_str(),
                  FormatRate(rates->write).c_str(), FormatRate(rates->read).c_str());
      std::fflush(stdout);
    }
  }
  for (uint64_t block : {1 * kMiB, 16 * kMiB, 256 * kMiB}) {
    auto rates = raw.MeasureOnce(block);
    if (!rates.ok()) return Fail(rates.status());
    std::printf("%-28s %12s %12s\n",
                absl::StrFormat("raw pwrite/pread %s", FormatBytes(block)).c_str(),
                FormatRate(rates->write).c_str(), FormatRate(rates->read).c_str());
  }
  return 0;
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
  if (!store.ok()) return Fail(store.status());
  auto chunk = ParseBytes(absl::GetFlag(FLAGS_nvme_chunk_bytes));
  if (!chunk.ok()) return Fail(chunk.status());
  auto mover = MakeMover(**store, nvme, absl::GetFlag(FLAGS_nvme_queue_depth), *chunk);
  if (!mover.ok()) return Fail(mover.status());
  auto bench = bench::MoverBench::Create(**store, *bytes, *transfer, nvme);
  if (!bench.ok()) return Fail(bench.status());
  utsname host{};
  uname(&host);
  std::printf("tierbench: tierd's Mover vs the raw ceiling of each link, measured side by side\n");
  std::printf("machine:   %s, %s, %ld cores\n", host.nodename, CpuModel().c_str(),
              sysconf(_SC_NPROCESSORS_ONLN));
  std::printf("gpu:       %s%s\n", gpu->device->Describe().c_str(),
              gpu->fallback_reason.empty() ? "" : (" -- " + gpu->fallback_reason).c_str());
  if (nvme) {
    const absl::Status registration = (*mover)->NvmeBufferRegistration();
    std::printf("nvme:      %s, %s ops, queue depth %d, fixed buffers: %s\n",
                options.nvme_directory.c_str(), FormatBytes(*chunk).c_str(),
                absl::GetFlag(FLAGS_nvme_queue_depth),
                registration.ok() ? "yes" : std::string(registration.message()).c_str());
  }
  const int repeats = std::max(1, absl::GetFlag(FLAGS_repeats));
  std::printf("workload:  %s per link in tensors of %s, median of %d repeats after a warm-up\n",
              FormatBytes(*bytes).c_str(), FormatBytes(*transfer).c_str(), repeats);
  std::fflush(stdout);

  auto tierd_gpu = (*bench)->MeasureGpu(**mover, repeats);
  if (!tierd_gpu.ok()) return Fail(tierd_gpu.status());
  auto raw_gpu = bench::MeasureRawGpuCopies(!gpu->device->is_fake(), *bytes, *transfer, repeats);
  if (!raw_gpu.ok()) return Fail(raw_gpu.status());
  bench::NvmeRates tierd_nvme, raw_nvme;
  std::unique_ptr<bench::RawNvme> raw_file;
  if (nvme) {
    auto created = bench::RawNvme::Create(options.nvme_directory, *bytes);
    if (!created.ok()) return Fail(created.status());
    raw_file = std::move(*created);
    // Alternate tierd and raw passes so that the disk's drift hits both alike.
    std::vector<double> tw, tr, rw, rr;
    for (int r = 0; r < repeats + 1; ++r) {
      auto t = (*bench)->MeasureNvmeOnce(**mover);
      if (!t.ok()) return Fail(t.status());
      auto raw = raw_file->MeasureOnce(*transfer);
      if (!raw.ok()) return Fail(raw.status());
      if (r == 0) continue;
      tw.push_back(t->write), tr.push_back(t->read), rw.push_back(raw->write), rr.push_back(raw->read);
    }
    tierd_nvme = {bench::Median(tw), bench::Median(tr)};
    raw_nvme = {bench::Median(rw), bench::Median(rr)};
  }
  const char* raw_gpu_name = gpu->device->is_fake() ? "memcpy" : "cudaMemcpyAsync, pinned";
  std::printf("\n%-22s %10s %12s %12s %9s %8s\n", "link", "bytes", "tierd", "raw", "ratio", "target");
  // The targets are for a real GPU's copy engines; the fake GPU's numbers are informative.
  const double gpu_target = gpu->device->is_fake() ? 0 : 0.95;
  Row("dram->gpu", *bytes, tierd_gpu->host_to_device, raw_gpu->host_to_device, gpu_target);
  Row("gpu->dram", *bytes, tierd_gpu->device_to_host, raw_gpu->device_to_host, gpu_target);
  Row("dram<->gpu (both, sum)", 2 * *bytes, tierd_gpu->both_directions, raw_gpu->both_directions, gpu_target);
  if (nvme) {
    Row("dram->nvme", *bytes, tierd_nvme.write, raw_nvme.write, 0.90);
    Row("nvme->dram", *bytes, tierd_nvme.read, raw_nvme.read, 0.90);
  }
  std::printf("\nraw ceilings: gpu = %s, one per tensor on a bare stream; nvme = sequential O_DIRECT "
              "pwrite/pread of %s blocks, one thread.\n", raw_gpu_name, FormatBytes(*transfer).c_str());
  std::printf("tierd moves: GPU via the Mover's copy-engine links; NVMe via io_uring, CRC32C "
              "computed on write and verified on read.\n");
  std::printf("crc32c:    %s on one core\n", FormatRate(CrcRate()).c_str());
  if (nvme && absl::GetFlag(FLAGS_nvme_sweep)) {
    mover->reset();  // one NVMe link at a time on the file
    return Sweep(**store, **bench, *raw_file, options.nvme_directory);
  }
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
