// How fast AdamW runs on the host, for the choice between stepping DRAM-resident optimizer
// state on the CPU or streaming it through the GPU: HostAdamW (fp32, vectorised, threaded)
// side by side with the double-precision reference (AdamWStep, one thread), same arrays.
//   host_adamw_bench [ELEMENTS, default 2^26] [REPEATS, default 3]
// Prints parameters/s and the memory traffic that implies (HostAdamW reads grads, master,
// m, v and writes master, m, v and bf16 weights: 30 bytes a parameter).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "trainer_ref/host_adamw.h"
#include "trainer_ref/optimizer.h"
#include "trainer_ref/parallel.h"

namespace tt = tierd::trainer;

int main(int argc, char** argv) {
  const int64_t n = argc > 1 ? std::atoll(argv[1]) : int64_t{1} << 26;
  const int repeats = argc > 2 ? std::atoi(argv[2]) : 3;
  if (n <= 0 || repeats <= 0) {
    std::fprintf(stderr, "usage: host_adamw_bench [ELEMENTS > 0] [REPEATS > 0]\n");
    return 2;
  }
  std::vector<float> master(n, 0.01f), m(n, 0.f), v(n, 0.f), grads(n);
  for (int64_t i = 0; i < n; ++i) grads[i] = static_cast<float>((i % 1000) - 500) * 1e-3f;
  std::vector<uint16_t> weights(n);
  auto best_of = [&](auto&& run) {
    double best = 1e30;
    for (int r = 0; r < repeats; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      run(r + 1);
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    return best;
  };
  const double host = best_of([&](int step) {
    tt::HostAdamWParams p;
    p.step = step;
    tt::HostAdamW(master.data(), m.data(), v.data(), weights.data(), grads.data(), n, p);
  });
  const double one = best_of([&](int step) {
    tt::HostAdamWParams p;
    p.step = step;
    tt::HostAdamW(master.data(), m.data(), v.data(), weights.data(), grads.data(), n, p, /*threads=*/1);
  });
  const double reference = best_of([&](int step) {
    tt::AdamWStep(master.data(), grads.data(), m.data(), v.data(), n, 1e-3, step, tt::AdamWOptions{}, true);
  });
  std::printf("AdamW on the host, %ld parameters, best of %d, %u hardware threads (HostAdamW uses %d)\n",
              static_cast<long>(n), repeats, std::thread::hardware_concurrency(), tt::CpuThreads());
  auto line = [n](const char* what, double s) {
    std::printf("  %-44s %8.1f ms  %7.2f G params/s  %6.1f GB/s\n", what, s * 1e3, n / s / 1e9, 30.0 * n / s / 1e9);
  };
  line("HostAdamW (fp32, vectorised, all threads)", host);
  line("HostAdamW (fp32, vectorised, one thread)", one);
  line("AdamWStep reference (double, one thread)", reference);
  std::printf("ratio: HostAdamW %.1fx the reference, %.1fx its own one-thread run\n", reference / host, one / host);
  return 0;
}
