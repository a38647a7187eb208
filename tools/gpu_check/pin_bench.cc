// pin_bench: what a session's DRAM quota costs to set up on this machine, step by step —
// reserving a POSIX shm segment (posix_fallocate), touching its pages from several threads
// instead, transparent huge pages on it (where the kernel offers them for shmem), and
// cudaHostRegister of the result — so tierd's hello can be made as cheap as the machine allows.
//   pin_bench [GiB (default 16)] [threads (default 16)]
#include <cuda_runtime_api.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

void Touch(char* base, size_t bytes, int threads) {
  std::vector<std::thread> pool;
  const size_t per = (bytes / threads + 4095) / 4096 * 4096;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([=] {
      const size_t from = std::min(bytes, per * t), to = std::min(bytes, per * (t + 1));
      for (size_t at = from; at < to; at += 4096) base[at] = 1;
    });
  }
  for (auto& th : pool) th.join();
}

// One way of making the segment: prints each step's seconds and GB/s.
void Populate(char* base, size_t bytes, int threads) {
  std::vector<std::thread> pool;
  const size_t per = (bytes / threads + 4095) / 4096 * 4096;
  for (int t = 0; t < threads; ++t) {
    pool.emplace_back([=] {
      const size_t from = std::min(bytes, per * t), to = std::min(bytes, per * (t + 1));
      if (from < to) madvise(base + from, to - from, MADV_POPULATE_WRITE);
    });
  }
  for (auto& th : pool) th.join();
}

void Run(const char* how, size_t bytes, int threads, bool fallocate_first, bool touch, bool huge,
         bool populate = false) {
  const std::string name = "/pin-bench-" + std::to_string(getpid());
  const int fd = shm_open(name.c_str(), O_CREAT | O_RDWR | O_EXCL, 0600);
  if (fd < 0) {
    std::perror("shm_open");
    return;
  }
  shm_unlink(name.c_str());
  const double gb = bytes / 1e9;
  std::printf("%-44s", how);
  auto t = Clock::now();
  if (fallocate_first) {
    if (posix_fallocate(fd, 0, bytes) != 0) std::printf(" fallocate failed");
    std::printf(" fallocate %.2f s (%.1f GB/s)", Since(t), gb / Since(t));
  } else if (ftruncate(fd, bytes) != 0) {
    std::perror("ftruncate");
  }
  void* base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (huge) madvise(base, bytes, MADV_HUGEPAGE);
  if (populate) {
    t = Clock::now();
    Populate(static_cast<char*>(base), bytes, threads);
    std::printf(" populate %.2f s (%.1f GB/s)", Since(t), gb / Since(t));
  }
  if (touch) {
    t = Clock::now();
    Touch(static_cast<char*>(base), bytes, threads);
    std::printf(" touch %.2f s (%.1f GB/s)", Since(t), gb / Since(t));
    t = Clock::now();
    if (posix_fallocate(fd, 0, bytes) != 0) std::printf(" fallocate failed");
    std::printf(" then fallocate %.2f s", Since(t));
  }
  t = Clock::now();
  const cudaError_t e = cudaHostRegister(base, bytes, cudaHostRegisterPortable);
  std::printf(" register %.2f s (%.1f GB/s)%s", Since(t), gb / Since(t), e == cudaSuccess ? "" : cudaGetErrorString(e));
  t = Clock::now();
  cudaHostUnregister(base);
  munmap(base, bytes);
  close(fd);
  std::printf(" release %.2f s\n", Since(t));
}

}  // namespace

int main(int argc, char** argv) {
  const size_t gib = argc > 1 ? std::atoi(argv[1]) : 16;
  const int threads = argc > 2 ? std::atoi(argv[2]) : 16;
  const size_t bytes = gib << 30;
  std::ifstream thp("/sys/kernel/mm/transparent_hugepage/shmem_enabled");
  std::stringstream mode;
  mode << thp.rdbuf();
  std::printf("pin_bench: %zu GiB, %d threads; shmem THP: %s", gib, threads, mode.str().c_str());
  cudaFree(nullptr);  // the context first, so no step pays for it
  Run("fallocate, register (tierd today)", bytes, threads, true, false, false);
  Run("touch in parallel, fallocate, register", bytes, threads, false, true, false);
  Run("MADV_HUGEPAGE, touch, fallocate, register", bytes, threads, false, true, true);
  Run("fallocate, populate in parallel, register", bytes, threads, true, false, false, true);
  Run("populate in parallel (allocates), register", bytes, threads, false, false, false, true);
  Run("fallocate, register (again)", bytes, threads, true, false, false);
  return 0;
}
