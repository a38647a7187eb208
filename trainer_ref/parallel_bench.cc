// What ParallelFor's thread pool saves against starting the threads on every call (as it did
// before the pool), side by side in one run: a memory pass (a = b + s c) over a parameter of
// each size a model's optimizer steps one at a time (a norm, 1.3B's attention and MLP
// matrices, 7B's), then HostAdamW8bit with the pool at the same sizes, for the scale of the
// per-call overhead against the step itself.
//   parallel_bench [THREADS, default CpuThreads()] [CALLS, default 200]
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "trainer_ref/adamw8bit.h"
#include "trainer_ref/host_adamw.h"
#include "trainer_ref/parallel.h"

namespace tt = tierd::trainer;

namespace {

// ParallelFor's split, each call starting and joining its threads.
template <typename Fn>
void SpawnFor(int64_t count, Fn&& fn, int threads) {
  const int64_t pieces = std::min<int64_t>(count, threads * 8);
  std::atomic<int64_t> next{0};
  auto take = [&] {
    for (int64_t k = next.fetch_add(1); k < pieces; k = next.fetch_add(1)) {
      const int64_t begin = count * k / pieces, end = count * (k + 1) / pieces;
      if (begin < end) fn(begin, end);
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(take);
  take();
  for (std::thread& th : pool) th.join();
}

template <typename Run>
double MicrosecondsPerCall(int calls, Run&& run) {
  double best = 1e30;
  for (int round = 0; round < 3; ++round) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int c = 0; c < calls; ++c) run();
    best = std::min(best, std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
  }
  return best / calls;
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : tt::CpuThreads();
  const int calls = argc > 2 ? std::atoi(argv[2]) : 200;
  if (threads < 1 || calls < 1) {
    std::fprintf(stderr, "usage: parallel_bench [THREADS >= 1] [CALLS >= 1]\n");
    return 2;
  }
  std::printf("parallel_bench: %d threads a call, best of 3 rounds of %d calls, %u hardware threads\n", threads, calls,
              std::thread::hardware_concurrency());
  std::printf("%-34s %12s %12s %8s %14s\n", "values a call", "started, us", "pool, us", "ratio", "8-bit step, us");
  const struct {
    const char* what;
    int64_t n;
  } sizes[] = {{"16384 (a small tensor)", 16384},
               {"2048x2048 (1.3B attention)", 2048 * 2048},
               {"5504x2048 (1.3B MLP)", 5504 * 2048},
               {"4096x4096 (7B attention)", 4096 * 4096}};
  for (const auto& size : sizes) {
    const int64_t n = size.n;
    std::vector<float> a(n, 0.f), b(n, 1.f), c(n, 2.f);
    auto pass = [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) a[i] = b[i] + 0.5f * c[i];
    };
    const int per_size = static_cast<int>(std::max<int64_t>(3, calls * (int64_t{1} << 20) / std::max<int64_t>(n, 1 << 20)));
    const double started = MicrosecondsPerCall(per_size, [&] { SpawnFor(n, pass, threads); });
    const double pooled = MicrosecondsPerCall(per_size, [&] { tt::ParallelFor(n, 1e9, pass, threads); });
    std::vector<float> master(n, 0.01f), grads(n, 1e-3f);
    std::vector<uint16_t> weights(n);
    std::vector<uint8_t> m8(tt::Moment8bitBytes(n), 0), v8(tt::Moment8bitBytes(n), 0);
    tt::HostAdamWParams p;
    int step = 0;
    const double adam = MicrosecondsPerCall(per_size, [&] {
      p.step = ++step;
      tt::HostAdamW8bit(master.data(), m8.data(), v8.data(), weights.data(), grads.data(), n, p, threads);
    });
    std::printf("%-34s %12.1f %12.1f %7.2fx %14.1f\n", size.what, started, pooled, started / pooled, adam);
  }
  return 0;
}
