// ParallelFor: the reference trainer's host-side loops on a few threads.
#ifndef TIERD_TRAINER_REF_PARALLEL_H_
#define TIERD_TRAINER_REF_PARALLEL_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <thread>
#include <vector>

namespace tierd::trainer {

// Threads for host loops: TIERD_CPU_THREADS, else the machine's cores (at most 16).
inline int CpuThreads() {
  static const int threads = [] {
    const char* env = std::getenv("TIERD_CPU_THREADS");
    const int hw = static_cast<int>(std::thread::hardware_concurrency());
    const int n = env != nullptr ? std::atoi(env) : std::min(hw, 16);
    return std::max(1, n);
  }();
  return threads;
}

// Runs fn(begin, end) over [0, count) on up to `threads` threads (0: CpuThreads()) when the
// work is large enough to pay for them (2e5 units): the range cut into 8 pieces a thread,
// which the threads take in turn, so a thread the OS descheduled (the cores shared with the
// trainer's own threads, a CUDA driver spinning) delays one piece, not a fixed share of the
// whole. Every element is computed by one thread in the order a serial loop would, so results
// do not depend on the thread count.
template <typename Fn>
void ParallelFor(int64_t count, double work, Fn&& fn, int threads = 0) {
  const int64_t wanted = work < 2e5 ? 1 : (threads > 0 ? threads : CpuThreads());
  const int64_t used = std::max<int64_t>(1, std::min(wanted, count));
  if (used <= 1) {
    fn(int64_t{0}, count);
    return;
  }
  const int64_t pieces = std::min<int64_t>(count, used * 8);
  std::atomic<int64_t> next{0};
  auto take = [&] {
    for (int64_t k = next.fetch_add(1); k < pieces; k = next.fetch_add(1)) {
      const int64_t begin = count * k / pieces, end = count * (k + 1) / pieces;
      if (begin < end) fn(begin, end);
    }
  };
  std::vector<std::thread> pool;
  for (int64_t t = 1; t < used; ++t) pool.emplace_back(take);
  take();
  for (std::thread& th : pool) th.join();
}
}  // namespace tierd::trainer

#endif  // TIERD_TRAINER_REF_PARALLEL_H_
