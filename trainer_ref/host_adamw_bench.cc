// How fast AdamW runs on the host, for the choice between stepping DRAM-resident optimizer
// state on the CPU or streaming it through the GPU, against what the host's memory can do:
// a STREAM-like triad (a = b + s c, all threads) in the same run, then HostAdamW (fp32
// moments), HostAdamW8bit (8-bit moments) and the double-precision reference, same arrays.
//   host_adamw_bench [ELEMENTS, default 2^26] [REPEATS, default 3]
// Bytes a parameter: fp32 AdamW reads grads, master, m, v and writes master, m, v and the
// bf16 weights (30 B); 8-bit reads grads, master and two codes, writes master, two codes and
// the weights (18 B, plus a scale per 256). Then the FP8 codes of the bf16 weights (5 B).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "trainer_ref/adamw8bit.h"
#include "trainer_ref/fp8_codes.h"
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
  std::vector<uint8_t> m8(tt::Moment8bitBytes(n), 0), v8(tt::Moment8bitBytes(n), 0);
  auto best_of = [&](auto&& run) {
    double best = 1e30;
    for (int r = 0; r < repeats; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      run(r + 1);
      best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    return best;
  };
  // The triad over three of the same arrays (12 bytes an element), threads as HostAdamW's.
  const double triad = best_of([&](int) {
    tt::ParallelFor(n, 1e9, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) master[i] = m[i] + 0.5f * v[i];
    });
  });
  std::fill(master.begin(), master.end(), 0.01f);
  const double host = best_of([&](int step) {
    tt::HostAdamWParams p;
    p.step = step;
    tt::HostAdamW(master.data(), m.data(), v.data(), weights.data(), grads.data(), n, p);
  });
  const double host8 = best_of([&](int step) {
    tt::HostAdamWParams p;
    p.step = step;
    tt::HostAdamW8bit(master.data(), m8.data(), v8.data(), weights.data(), grads.data(), n, p);
  });
  // The 8-bit step's table lookups without vector gathers (the compiler's own loops), beside it.
  const std::string best = tt::HostLookupPath();
  tt::UseHostLookupPath("plain");
  const double plain8 = best_of([&](int step) {
    tt::HostAdamWParams p;
    p.step = step;
    tt::HostAdamW8bit(master.data(), m8.data(), v8.data(), weights.data(), grads.data(), n, p);
  });
  tt::UseHostLookupPath(best);
  const double one8 = best_of([&](int step) {
    tt::HostAdamWParams p;
    p.step = step;
    tt::HostAdamW8bit(master.data(), m8.data(), v8.data(), weights.data(), grads.data(), n, p, /*threads=*/1);
  });
  const double one = best_of([&](int step) {
    tt::HostAdamWParams p;
    p.step = step;
    tt::HostAdamW(master.data(), m.data(), v.data(), weights.data(), grads.data(), n, p, /*threads=*/1);
  });
  // The FP8 codes the step writes beside the weights with --fp8_weight_codes (fp8_codes.h):
  // a pass for the largest |x|, a pass of table lookups (5 bytes a parameter).
  std::vector<uint8_t> codes(n);
  const double encode = best_of([&](int) { tt::fp8::EncodeE4M3CurrentScaled(weights.data(), n, codes.data()); });
  const double encode1 = best_of([&](int) { tt::fp8::EncodeE4M3CurrentScaled(weights.data(), n, codes.data(), 1); });
  const double reference = best_of([&](int step) {
    tt::AdamWStep(master.data(), grads.data(), m.data(), v.data(), n, 1e-3, step, tt::AdamWOptions{}, true);
  });
  std::printf("AdamW on the host, %ld parameters, best of %d, %u hardware threads (HostAdamW uses %d)\n",
              static_cast<long>(n), repeats, std::thread::hardware_concurrency(), tt::CpuThreads());
  const double triad_gbs = 12.0 * n / triad / 1e9;
  auto line = [n, triad_gbs](const char* what, double s, double bytes) {
    const double gbs = bytes * n / s / 1e9;
    std::printf("  %-46s %8.1f ms  %7.2f G params/s  %6.1f GB/s  %5.0f%% of the triad\n", what, s * 1e3, n / s / 1e9,
                gbs, 100 * gbs / triad_gbs);
  };
  std::printf("  %-46s %8.1f ms  %29.1f GB/s\n", "triad a = b + s c (all threads)", triad * 1e3, triad_gbs);
  line("HostAdamW (fp32 moments, all threads)", host, 30.0);
  line(("HostAdamW8bit (8-bit moments, all threads, " + best + ")").c_str(), host8, 18.0);
  line("HostAdamW8bit (the same, plain loops)", plain8, 18.0);
  line("HostAdamW (fp32 moments, one thread)", one, 30.0);
  line("HostAdamW8bit (8-bit moments, one thread)", one8, 18.0);
  line("AdamWStep reference (double, one thread)", reference, 28.0);
  line("FP8 weight codes from bf16 (all threads)", encode, 5.0);
  line("FP8 weight codes from bf16 (one thread)", encode1, 5.0);
  std::printf(
      "ratio: HostAdamW %.1fx the reference, %.1fx its own one-thread run; 8-bit %.2fx fp32's time, %.1fx its "
      "own one-thread run, %.2fx its plain loops' speed\n",
      reference / host, one / host, host8 / host, one8 / host8, plain8 / host8);
  return 0;
}
