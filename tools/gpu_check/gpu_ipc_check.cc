// gpu_ipc_check: the real CUDA GPU tier, end to end, on a machine with a GPU.
//   1. kernels vs their CPU reference (pattern fill, mismatch count) on random data;
//   2. the daemon's GPU region (one IPC-exportable physical allocation) is exported
//      and imported by a second process;
//   3. that process writes it with a kernel; the daemon's copy out is ordered after the
//      kernel by a CUDA IPC event alone (a control copy without the wait sees stale data);
//   4. the Mover takes the data GPU -> DRAM -> NVMe -> DRAM -> GPU, checksummed;
//   5. the daemon copies new data in and records an IPC event; the other process's
//      kernels, ordered only by that event, find every byte right.
// Exit 0 and "gpu_ipc_check: PASS" when all hold.
#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "base/clock.h"
#include "base/units.h"
#include "runtime/gpu_factory.h"
#include "runtime/mover.h"
#include "runtime/tier_store.h"
#include "runtime/uring_block_io.h"
#include "tools/gpu_check/check_util.h"
#include "tools/gpu_check/ipc_child.h"
#include "tools/gpu_check/kernels.h"
#include "tools/gpu_check/pattern.h"

ABSL_FLAG(bool, child, false, "internal: run as the client process");
ABSL_FLAG(int, pool_fd, -1, "internal");
ABSL_FLAG(std::string, pointer, "", "internal");
ABSL_FLAG(int, to_parent_fd, -1, "internal");
ABSL_FLAG(int, from_parent_fd, -1, "internal");
ABSL_FLAG(uint64_t, a_offset, 0, "internal");
ABSL_FLAG(uint64_t, b_offset, 0, "internal");
ABSL_FLAG(uint64_t, c_offset, 0, "internal");
ABSL_FLAG(std::string, nvme_dir, "/var/tmp", "directory for the NVMe tier");
ABSL_FLAG(std::string, bytes, "64MiB", "bytes per test buffer");

namespace tierd::gpu_check {
namespace {

int failures = 0;
void Expect(bool ok, const std::string& what) {
  std::printf("  [%s] %s\n", ok ? " ok " : "FAIL", what.c_str());
  if (!ok) ++failures;
}

// Kernels vs the CPU reference on random data (never zeros).
void CheckKernels(size_t words) {
  std::vector<uint32_t> host(words);
  uint32_t* device = nullptr;
  unsigned long long* count = nullptr;
  CHECK_CUDA(cudaMalloc(&device, words * 4));
  CHECK_CUDA(cudaMalloc(&count, sizeof(*count)));
  CHECK_CUDA(LaunchFillPattern(0, device, words, 7));
  CHECK_CUDA(cudaMemcpy(host.data(), device, words * 4, cudaMemcpyDeviceToHost));
  size_t wrong = 0;
  for (size_t i = 0; i < words; ++i) wrong += host[i] != PatternWord(i, 7);
  Expect(wrong == 0, "fill kernel == CPU PatternWord on " + std::to_string(words) + " words");
  std::mt19937_64 rng(99);
  size_t corrupted = 0;
  for (int k = 0; k < 1000; ++k) {
    const size_t i = rng() % words;
    const uint32_t fresh = static_cast<uint32_t>(rng()) | 1u;
    corrupted += (host[i] == PatternWord(i, 7)) && (fresh != PatternWord(i, 7));
    if (fresh != PatternWord(i, 7)) host[i] = fresh;
  }
  size_t cpu_count = 0;
  for (size_t i = 0; i < words; ++i) cpu_count += host[i] != PatternWord(i, 7);
  CHECK_CUDA(cudaMemcpy(device, host.data(), words * 4, cudaMemcpyHostToDevice));
  CHECK_CUDA(cudaMemset(count, 0, sizeof(*count)));
  CHECK_CUDA(LaunchCountMismatches(0, device, words, 7, count));
  unsigned long long gpu_count = 0;
  CHECK_CUDA(cudaMemcpy(&gpu_count, count, sizeof(gpu_count), cudaMemcpyDeviceToHost));
  Expect(gpu_count == cpu_count && cpu_count > 900,
         "mismatch-count kernel == CPU count (" + std::to_string(gpu_count) + " vs " +
             std::to_string(cpu_count) + ")");
  cudaFree(device);
  cudaFree(count);
}

pid_t SpawnChild(const GpuRegionExport& exported, int to_parent, int from_parent,
                 uint64_t a, uint64_t b, uint64_t c, const std::string& bytes) {
  const pid_t pid = fork();
  if (pid != 0) return pid;
  // Only the pool fd and our two pipe ends cross the exec (no CLOEXEC on them).
  for (int fd : {exported.pool_fd, to_parent, from_parent}) fcntl(fd, F_SETFD, 0);
  std::vector<std::string> args = {
      "/proc/self/exe", "--child", "--pool_fd=" + std::to_string(exported.pool_fd),
      "--pointer=" + ToHex(exported.pointer_data.data(), exported.pointer_data.size()),
      "--to_parent_fd=" + std::to_string(to_parent), "--from_parent_fd=" + std::to_string(from_parent),
      "--a_offset=" + std::to_string(a), "--b_offset=" + std::to_string(b),
      "--c_offset=" + std::to_string(c), "--bytes=" + bytes};
  std::vector<char*> argv;
  for (auto& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  execv("/proc/self/exe", argv.data());
  std::perror("exec");
  _exit(127);
}

int RunParent() {
  const uint64_t bytes = *ParseBytes(absl::GetFlag(FLAGS_bytes));
  const size_t words = bytes / 4;
  auto gpu = OpenGpu({.choice = GpuChoice::kCuda});
  if (!gpu.ok()) {
    std::fprintf(stderr, "gpu_ipc_check: needs a CUDA GPU: %s\n", gpu.status().ToString().c_str());
    return 1;
  }
  std::printf("gpu_ipc_check on %s\n", gpu->device->Describe().c_str());
  CheckKernels(words);
  TierStoreOptions options{.gpu_bytes = 4 * bytes, .dram_bytes = 3 * bytes,
                           .nvme_directory = absl::GetFlag(FLAGS_nvme_dir), .nvme_bytes = 2 * bytes,
                           .instance_name = "gpu-ipc-check-" + std::to_string(getpid())};
  auto store = TierStore::Open(options, *gpu->device);
  if (!store.ok()) {
    std::fprintf(stderr, "gpu_ipc_check: %s\n", store.status().ToString().c_str());
    return 1;
  }
  auto io = CreateUringBlockIo((*store)->nvme()->fd(), 32);
  auto mover = Mover::Create(**store, std::move(*io), RealClock());
  TierStore& s = **store;
  Extent a = *s.Allocate(Tier::kGpu, bytes), b = *s.Allocate(Tier::kGpu, bytes);
  Extent c = *s.Allocate(Tier::kGpu, bytes);
  Extent dram1 = *s.Allocate(Tier::kDram, bytes), dram2 = *s.Allocate(Tier::kDram, bytes);
  Extent dram3 = *s.Allocate(Tier::kDram, bytes), nvme = *s.Allocate(Tier::kNvme, bytes);
  CHECK_CUDA(cudaMemset(s.gpu_region()->base(), 0xEE, s.gpu_region()->bytes()));  // poison
  CHECK_CUDA(cudaDeviceSynchronize());

  auto exported = s.gpu_region()->Export();
  Expect(exported.ok(), "GPU region exported (POSIX fd + pointer record)");
  if (!exported.ok()) return 1;
  int to_parent[2], from_parent[2];
  if (pipe2(to_parent, O_CLOEXEC) != 0 || pipe2(from_parent, O_CLOEXEC) != 0) return 1;
  const pid_t child = SpawnChild(*exported, to_parent[1], from_parent[0], a.offset(), b.offset(),
                                 c.offset(), absl::GetFlag(FLAGS_bytes));
  close(exported->pool_fd);
  close(to_parent[1]);
  close(from_parent[0]);

  // 3. The child's kernel writes A; our copy out waits on its IPC event only.
  cudaIpcEventHandle_t child_handle;
  FromHex(ReadLine(to_parent[0]), &child_handle, sizeof(child_handle));
  cudaEvent_t child_written;
  CHECK_CUDA(cudaIpcOpenEventHandle(&child_written, child_handle));
  Expect(ReadLine(to_parent[0]) == "written", "second process imported the region and queued its kernel");
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  uint32_t control = 0;
  CHECK_CUDA(cudaMemcpy(&control, s.Address(a), 4, cudaMemcpyDeviceToHost));  // no wait: stale
  CHECK_CUDA(cudaStreamWaitEvent(stream, child_written, 0));
  CHECK_CUDA(cudaMemcpyAsync(s.Address(dram1), s.Address(a), bytes, cudaMemcpyDeviceToHost, stream));
  CHECK_CUDA(cudaStreamSynchronize(stream));
  const auto* copied = reinterpret_cast<const uint32_t*>(s.Address(dram1));
  size_t wrong = 0;
  for (size_t i = 0; i < words; ++i) wrong += copied[i] != PatternWord(i, 1);
  Expect(control == 0xEEEEEEEEu, "control: a copy that does not wait reads stale bytes");
  Expect(wrong == 0, "copy ordered by the other process's IPC event reads its kernel's bytes");

  // 4. Through every tier with the Mover and back into B.
  Expect((*mover)->MoveAndWait(dram1, nvme, bytes).ok(), "mover dram->nvme");
  Expect((*mover)->MoveAndWait(nvme, dram2, bytes).ok(), "mover nvme->dram (checksums verified)");
  Expect((*mover)->MoveAndWait(dram2, b, bytes).ok(), "mover dram->gpu");
  Expect((*mover)->MoveAndWait(b, dram3, bytes).ok() &&
             std::memcmp(s.Address(dram3), s.Address(dram1), bytes) == 0,
         "mover gpu->dram returns the same bytes");

  // 5. New data into C after a spin; the other process reads it ordered by our event.
  auto* fresh = reinterpret_cast<uint32_t*>(s.Address(dram3));
  for (size_t i = 0; i < words; ++i) fresh[i] = PatternWord(i, 2);
  cudaEvent_t moved;
  CHECK_CUDA(cudaEventCreateWithFlags(&moved, cudaEventDisableTiming | cudaEventInterprocess));
  cudaIpcEventHandle_t moved_handle;
  CHECK_CUDA(cudaIpcGetEventHandle(&moved_handle, moved));
  CHECK_CUDA(LaunchSpin(stream, 300'000'000));
  CHECK_CUDA(cudaMemcpyAsync(s.Address(c), fresh, bytes, cudaMemcpyHostToDevice, stream));
  CHECK_CUDA(cudaEventRecord(moved, stream));
  SendLine(from_parent[1], ToHex(&moved_handle, sizeof(moved_handle)));
  SendLine(from_parent[1], "moved");
  const std::string counts = ReadLine(to_parent[0]);
  Expect(counts == "mismatches 0 0",
         "other process, ordered by our IPC event, sees every byte we moved (" + counts + ")");
  int status = 0;
  waitpid(child, &status, 0);
  Expect(WIFEXITED(status) && WEXITSTATUS(status) == 0, "second process exited cleanly");
  CHECK_CUDA(cudaStreamSynchronize(stream));
  std::printf("gpu_ipc_check: %s (%d failure(s))\n", failures == 0 ? "PASS" : "FAIL", failures);
  return failures == 0 ? 0 : 1;
}

}  // namespace
}  // namespace tierd::gpu_check

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (absl::GetFlag(FLAGS_child)) {
    tierd::gpu_check::ChildArgs args;
    args.pool_fd = absl::GetFlag(FLAGS_pool_fd);
    args.pointer_hex = absl::GetFlag(FLAGS_pointer);
    args.to_parent_fd = absl::GetFlag(FLAGS_to_parent_fd);
    args.from_parent_fd = absl::GetFlag(FLAGS_from_parent_fd);
    args.a_offset = absl::GetFlag(FLAGS_a_offset);
    args.b_offset = absl::GetFlag(FLAGS_b_offset);
    args.c_offset = absl::GetFlag(FLAGS_c_offset);
    args.words = *tierd::ParseBytes(absl::GetFlag(FLAGS_bytes)) / 4;
    return tierd::gpu_check::RunChild(args);
  }
  return tierd::gpu_check::RunParent();
}
