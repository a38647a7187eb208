#include "trainer_ref/parallel.h"

#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <thread>

namespace tierd::trainer {

int CpuThreads() {
  static const int threads = [] {
    const char* env = std::getenv("TIERD_CPU_THREADS");
    const int hw = static_cast<int>(std::thread::hardware_concurrency());
    const int n = env != nullptr ? std::atoi(env) : std::min(hw, 16);
    return std::max(1, n);
  }();
  return threads;
}

namespace parallel_internal {
namespace {

// Pool threads at most, whatever the callers ask (each caller works on its own call too).
constexpr int kPoolThreadsMax = 256;

// One RunPieces call, on its caller's stack: the pieces are taken by index; the caller
// returns only once no pool thread is inside the call (helpers_active 0) and none can join
// it (it has left the open queue).
struct Call {
  void (*piece)(void*, int64_t);
  void* context;
  int64_t pieces;
  std::atomic<int64_t> next{0};
  int helpers_wanted = 0;  // the rest guarded by Pool::mu_
  int helpers_joined = 0;
  int helpers_active = 0;
};

void TakePieces(Call& call) {
  for (int64_t k = call.next.fetch_add(1, std::memory_order_relaxed); k < call.pieces;
       k = call.next.fetch_add(1, std::memory_order_relaxed)) {
    call.piece(call.context, k);
  }
}

// Threads that sleep until a call is open, join it (up to the helpers it wants), take its
// pieces with its caller, and go back to sleep. They do not spin: the cores they would take
// are the ones the daemon, the trainer's own threads and the CUDA driver need between calls.
class Pool {
 public:
  void Run(Call& call) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      open_.push_back(&call);
      while (threads_ < std::min(call.helpers_wanted, kPoolThreadsMax)) {
        std::thread(&Pool::Serve, this).detach();
        ++threads_;
      }
    }
    for (int i = 0; i < call.helpers_wanted; ++i) wake_.notify_one();
    TakePieces(call);
    std::unique_lock<std::mutex> lock(mu_);
    if (auto it = std::find(open_.begin(), open_.end(), &call); it != open_.end()) open_.erase(it);
    left_.wait(lock, [&] { return call.helpers_active == 0; });
  }

 private:
  void Serve() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      wake_.wait(lock, [&] { return !open_.empty(); });
      Call* call = open_.front();
      ++call->helpers_active;
      if (++call->helpers_joined >= call->helpers_wanted) open_.pop_front();
      lock.unlock();
      TakePieces(*call);
      lock.lock();
      if (--call->helpers_active == 0) left_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable wake_;  // a call opened
  std::condition_variable left_;  // a call's last helper left it
  std::deque<Call*> open_;        // calls that want more helpers, oldest first
  int threads_ = 0;
};

// The process's pool, made at first use. A child of fork() has none of its parent's pool
// threads (and maybe a lock one of them held): it starts a pool of its own; the old one stays
// reachable, never touched again.
std::atomic<Pool*> the_pool{nullptr};
std::atomic<Pool*> abandoned_in_fork{nullptr};

void ForgetPoolAfterFork() { abandoned_in_fork.store(the_pool.exchange(nullptr)); }

const int at_fork_registered = pthread_atfork(nullptr, nullptr, ForgetPoolAfterFork);

Pool& ThePool() {
  (void)at_fork_registered;
  Pool* pool = the_pool.load(std::memory_order_acquire);
  if (pool != nullptr) return *pool;
  auto* fresh = new Pool();
  if (the_pool.compare_exchange_strong(pool, fresh, std::memory_order_acq_rel)) return *fresh;
  delete fresh;  // another thread made it first
  return *pool;
}

}  // namespace

void RunPieces(int64_t pieces, int helpers, void (*piece)(void*, int64_t), void* context) {
  Call call;
  call.piece = piece;
  call.context = context;
  call.pieces = pieces;
  call.helpers_wanted = static_cast<int>(std::min<int64_t>(helpers, pieces - 1));
  if (call.helpers_wanted <= 0) {
    TakePieces(call);
    return;
  }
  ThePool().Run(call);
}

}  // namespace parallel_internal
}  // namespace tierd::trainer
