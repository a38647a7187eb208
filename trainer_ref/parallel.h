// ParallelFor: the reference trainer's host-side loops on a few threads.
#ifndef TIERD_TRAINER_REF_PARALLEL_H_
#define TIERD_TRAINER_REF_PARALLEL_H_

#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace tierd::trainer {

// Threads for host loops: TIERD_CPU_THREADS, else the machine's cores (at most 16).
int CpuThreads();

namespace parallel_internal {
// Runs piece(context, k) once for each k in [0, pieces) on the calling thread and up to
// `helpers` threads of a process-wide pool, which take pieces in turn; returns when every
// piece is done and no pool thread touches the call any more. The pool's threads are started
// at first need and kept: starting 15 threads a call cost ~0.2-0.5 ms, paid on every optimizer
// step of every parameter. Any thread may call it, concurrently and from inside a piece.
void RunPieces(int64_t pieces, int helpers, void (*piece)(void* context, int64_t k), void* context);
}  // namespace parallel_internal

// Runs fn(begin, end) over [0, count) on up to `threads` threads (0: CpuThreads()) when the
// work is large enough to pay for them (2e5 units): the range cut into 8 pieces a thread,
// which the threads take in turn, so a thread the OS descheduled (the cores shared with the
// trainer's own threads, a CUDA driver spinning) delays one piece, not a fixed share of the
// whole. Every element is computed by one thread in the order a serial loop would, so results
// do not depend on the thread count. fn must not throw.
template <typename Fn>
void ParallelFor(int64_t count, double work, Fn&& fn, int threads = 0) {
  const int64_t wanted = work < 2e5 ? 1 : (threads > 0 ? threads : CpuThreads());
  const int64_t used = std::max<int64_t>(1, std::min(wanted, count));
  if (used <= 1) {
    fn(int64_t{0}, count);
    return;
  }
  struct Call {
    std::remove_reference_t<Fn>* fn;
    int64_t count, pieces;
  } call{&fn, count, std::min<int64_t>(count, used * 8)};
  parallel_internal::RunPieces(call.pieces, static_cast<int>(used - 1), [](void* context, int64_t k) {
    const Call& c = *static_cast<const Call*>(context);
    const int64_t begin = c.count * k / c.pieces, end = c.count * (k + 1) / c.pieces;
    if (begin < end) (*c.fn)(begin, end);
  }, &call);
}
}  // namespace tierd::trainer

#endif  // TIERD_TRAINER_REF_PARALLEL_H_
