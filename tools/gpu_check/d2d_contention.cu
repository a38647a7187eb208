// d2d_contention: what a copy within the GPU costs when another process keeps the GPU busy,
// as tierd's copies to join free space do beside a trainer (two CUDA contexts, no MPS).
// A child process launches spin kernels on every SM without pause (the trainer); this
// process copies within one device allocation three ways, alone and then beside the child:
//   plain:   cudaMemcpyAsync device to device (what tierd's Mover does);
//   hinted:  cudaMemcpyBatchAsync with cudaMemcpyFlagPreferOverlapWithCompute (a hint to use
//            a copy engine, so the copy need not wait for the other context's time slice);
//   bounce:  device to pinned host and back on the two PCIe copy engines, in 8 MiB chunks.
// Prints each way's median and worst latency per size, and the child's spin kernels per
// second while each way ran (what the trainer lost).
//   d2d_contention [--sizes_mib=16,64,256] [--repeats=20]
#include <cuda_runtime.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

#define CHECK_CUDA(call)                                                                 \
  do {                                                                                   \
    cudaError_t err_ = (call);                                                            \
    if (err_ != cudaSuccess) {                                                            \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(err_)); \
      std::exit(1);                                                                      \
    }                                                                                    \
  } while (0)

double Now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

__global__ void Spin(long long cycles, int* sink) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
  if (threadIdx.x == 0 && blockIdx.x == 0) *sink = 1;
}

// The child: spin kernels (about 1 ms each) on every SM for `seconds`; every 100 ms it writes
// (time, kernels done) to `fd`.
void Busy(int fd, double seconds) {
  CHECK_CUDA(cudaSetDevice(0));
  int sms = 0, clock_khz = 0;
  CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  CHECK_CUDA(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0));
  int* sink;
  CHECK_CUDA(cudaMalloc(&sink, sizeof(int)));
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  const long long cycles = static_cast<long long>(clock_khz) * 1;  // ~1 ms
  const double end = Now() + seconds;
  long done = 0;
  while (Now() < end) {
    for (int k = 0; k < 20; ++k) Spin<<<sms * 4, 128, 0, stream>>>(cycles, sink);
    CHECK_CUDA(cudaStreamSynchronize(stream));
    done += 20;
    double sample[2] = {Now(), static_cast<double>(done)};
    if (write(fd, sample, sizeof(sample)) != sizeof(sample)) break;
  }
  close(fd);
}

struct Way {
  const char* name;
  double start = 0, end = 0;
};

int main_impl(int argc, char** argv) {
  std::vector<size_t> sizes_mib = {16, 64, 256};
  int repeats = 20;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--repeats=", 0) == 0) repeats = std::atoi(a.c_str() + 10);
    if (a.rfind("--sizes_mib=", 0) == 0) {
      sizes_mib.clear();
      for (const char* p = a.c_str() + 12; *p;) {
        sizes_mib.push_back(std::strtoul(p, const_cast<char**>(&p), 10));
        if (*p == ',') ++p;
      }
    }
    if (a == "--help") {
      std::printf("d2d_contention [--sizes_mib=16,64,256] [--repeats=20]\n");
      return 0;
    }
  }
  int pipe_fd[2], go_fd[2];  // the child's samples; the parent's word to start spinning
  if (pipe(pipe_fd) != 0 || pipe(go_fd) != 0) return 1;
  const double busy_seconds = 4.0 + 3.0 * sizes_mib.size() * 3 * repeats * 0.01 + 6.0;
  const pid_t child = fork();
  if (child == 0) {  // no CUDA in this process before the fork
    close(pipe_fd[0]);
    close(go_fd[1]);
    char go;
    if (read(go_fd[0], &go, 1) != 1) return 1;
    return (Busy(pipe_fd[1], busy_seconds), 0);
  }
  close(pipe_fd[1]);
  close(go_fd[0]);
  CHECK_CUDA(cudaSetDevice(0));
  cudaDeviceProp prop;
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  const size_t max_bytes = *std::max_element(sizes_mib.begin(), sizes_mib.end()) << 20;
  char* region;
  CHECK_CUDA(cudaMalloc(&region, 2 * max_bytes));
  CHECK_CUDA(cudaMemset(region, 1, 2 * max_bytes));
  void* host;
  CHECK_CUDA(cudaHostAlloc(&host, max_bytes, cudaHostAllocDefault));
  cudaStream_t within, down, up;
  CHECK_CUDA(cudaStreamCreateWithFlags(&within, cudaStreamNonBlocking));
  CHECK_CUDA(cudaStreamCreateWithFlags(&down, cudaStreamNonBlocking));
  CHECK_CUDA(cudaStreamCreateWithFlags(&up, cudaStreamNonBlocking));
  cudaEvent_t chunk_down[64];
  for (cudaEvent_t& e : chunk_down) CHECK_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));

  auto copy = [&](int way, size_t bytes) {
    char* src = region;
    char* dst = region + max_bytes;
    if (way == 0) {
      CHECK_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, within));
      CHECK_CUDA(cudaStreamSynchronize(within));
    } else if (way == 1) {
      void* dsts[1] = {dst};
      const void* srcs[1] = {src};
      size_t counts[1] = {bytes};
      cudaMemcpyAttributes attrs = {};
      attrs.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
      attrs.flags = cudaMemcpyFlagPreferOverlapWithCompute;
      size_t index = 0;
      CHECK_CUDA(cudaMemcpyBatchAsync(dsts, srcs, counts, 1, &attrs, &index, 1, within));
      CHECK_CUDA(cudaStreamSynchronize(within));
    } else {
      const size_t chunk = size_t{8} << 20;
      int n = 0;
      for (size_t at = 0; at < bytes; at += chunk, ++n) {
        const size_t b = std::min(chunk, bytes - at);
        CHECK_CUDA(cudaMemcpyAsync(static_cast<char*>(host) + at, src + at, b, cudaMemcpyDeviceToHost, down));
        CHECK_CUDA(cudaEventRecord(chunk_down[n % 64], down));
        CHECK_CUDA(cudaStreamWaitEvent(up, chunk_down[n % 64], 0));
        CHECK_CUDA(cudaMemcpyAsync(dst + at, static_cast<char*>(host) + at, b, cudaMemcpyHostToDevice, up));
      }
      CHECK_CUDA(cudaStreamSynchronize(up));
    }
  };
  const char* names[3] = {"plain cudaMemcpyAsync", "hinted cudaMemcpyBatchAsync", "bounce through host"};
  std::vector<Way> ways;
  auto measure = [&](const char* when) {
    for (size_t mib : sizes_mib) {
      for (int way = 0; way < 3; ++way) {
        copy(way, mib << 20);  // warm
        std::vector<double> ms;
        Way w{names[way], Now(), 0};
        for (int r = 0; r < repeats; ++r) {
          const double t0 = Now();
          copy(way, mib << 20);
          ms.push_back(1e3 * (Now() - t0));
        }
        w.end = Now();
        if (std::string(when) == "beside") ways.push_back(w);
        std::sort(ms.begin(), ms.end());
        std::printf("%-7s %4zu MiB  %-28s median %7.3f ms (%6.1f GB/s), worst %7.3f ms\n", when, mib, names[way],
                    ms[ms.size() / 2], static_cast<double>(mib << 20) / (ms[ms.size() / 2] * 1e6), ms.back());
        std::fflush(stdout);
      }
    }
  };
  std::printf("machine: %s; copies within the GPU alone, then beside another process's spin kernels\n", prop.name);
  measure("alone");  // the child has not started its context yet
  if (write(go_fd[1], "g", 1) != 1) return 1;
  double sample[2];
  std::vector<std::pair<double, double>> samples;
  // Wait until the child is spinning.
  while (read(pipe_fd[0], sample, sizeof(sample)) == sizeof(sample)) {
    samples.push_back({sample[0], sample[1]});
    if (samples.size() >= 5) break;
  }
  const double idle_start = Now();
  usleep(1000000);  // a second of the child alone: its undisturbed rate
  const double idle_end = Now();
  measure("beside");
  while (read(pipe_fd[0], sample, sizeof(sample)) == sizeof(sample)) samples.push_back({sample[0], sample[1]});
  waitpid(child, nullptr, 0);
  auto rate = [&](double a, double b) {
    double k0 = -1, k1 = 0, t0 = 0, t1 = 0;
    for (auto& [t, k] : samples) {
      if (t >= a && k0 < 0) k0 = k, t0 = t;
      if (t <= b) k1 = k, t1 = t;
    }
    return (k0 < 0 || t1 <= t0) ? 0.0 : (k1 - k0) / (t1 - t0);
  };
  const double alone = rate(idle_start, idle_end);
  std::printf("the other process: %.0f spin kernels/s alone\n", alone);
  for (const Way& w : ways) {
    const double r = rate(w.start, w.end);
    std::printf("  while %-28s ran: %.0f/s (%.3fx)\n", w.name, r, alone > 0 ? r / alone : 0.0);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return main_impl(argc, argv); }
