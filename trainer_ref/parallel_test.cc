#include "trainer_ref/parallel.h"

#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

namespace tierd::trainer {
namespace {

// Each index in exactly one call, calls within [0, count), for counts below, at and above the
// pieces the threads share, and a small work that stays on the caller's thread.
TEST(ParallelForTest, EveryIndexOnceWhateverTheCountAndThreads) {
  for (int64_t count : {1, 3, 16, 127, 128, 129, 100000}) {
    for (int threads : {1, 2, 4, 16}) {
      std::vector<std::atomic<int>> seen(static_cast<size_t>(count));
      std::atomic<int> calls{0};
      ParallelFor(
          count, 1e9,
          [&](int64_t begin, int64_t end) {
            ASSERT_LE(0, begin);
            ASSERT_LT(begin, end);
            ASSERT_LE(end, count);
            calls.fetch_add(1);
            for (int64_t i = begin; i < end; ++i) seen[static_cast<size_t>(i)].fetch_add(1);
          },
          threads);
      for (int64_t i = 0; i < count; ++i) ASSERT_EQ(seen[static_cast<size_t>(i)].load(), 1) << count << " " << i;
      EXPECT_LE(calls.load(), std::min<int64_t>(count, 8 * threads)) << count << " " << threads;
    }
  }
  int calls = 0;
  ParallelFor(1000, 10.0, [&](int64_t begin, int64_t end) {
    ++calls;
    EXPECT_EQ(begin, 0);
    EXPECT_EQ(end, 1000);
  });
  EXPECT_EQ(calls, 1);
}

// A call runs on at most `threads` threads (the caller one of them), however many pool threads
// earlier calls started.
TEST(ParallelForTest, AtMostTheThreadsAsked) {
  ParallelFor(1 << 16, 1e9, [](int64_t, int64_t) {}, 16);  // a pool of 15
  for (int threads : {2, 3, 5}) {
    for (int round = 0; round < 20; ++round) {
      std::mutex mu;
      std::set<std::thread::id> ids;
      ParallelFor(
          1 << 12, 1e9,
          [&](int64_t, int64_t) {
            std::this_thread::sleep_for(std::chrono::microseconds(50));  // time for every helper to join
            std::lock_guard<std::mutex> lock(mu);
            ids.insert(std::this_thread::get_id());
          },
          threads);
      EXPECT_LE(ids.size(), static_cast<size_t>(threads)) << threads;
    }
  }
}

// Several threads calling at once (the optimizer's update thread beside its gradient thread),
// and calls from inside a piece: every index once, each call's sum its own.
TEST(ParallelForTest, ConcurrentAndNestedCalls) {
  constexpr int kCallers = 4;
  std::vector<int64_t> sums(kCallers, 0);
  std::vector<std::thread> callers;
  for (int c = 0; c < kCallers; ++c) {
    callers.emplace_back([&, c] {
      for (int round = 0; round < 50; ++round) {
        const int64_t count = 1000 + 37 * c + round;
        std::vector<std::atomic<int>> seen(static_cast<size_t>(count));
        ParallelFor(
            count, 1e9,
            [&](int64_t begin, int64_t end) {
              for (int64_t i = begin; i < end; ++i) seen[static_cast<size_t>(i)].fetch_add(1);
            },
            3);
        int64_t ones = 0;
        for (auto& s : seen) ones += s.load() == 1;
        sums[static_cast<size_t>(c)] += ones - count;  // 0 when every index was seen once
      }
    });
  }
  for (auto& t : callers) t.join();
  for (int c = 0; c < kCallers; ++c) EXPECT_EQ(sums[static_cast<size_t>(c)], 0) << c;

  std::atomic<int64_t> inner{0};
  ParallelFor(
      8, 1e9,
      [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) {
          ParallelFor(
              100, 1e9, [&](int64_t b, int64_t e) { inner.fetch_add(e - b); }, 4);
        }
      },
      4);
  EXPECT_EQ(inner.load(), 800);
}

// A child of fork() (a data loader's worker, say) has none of its parent's pool threads: its
// calls still finish, on a pool of its own.
TEST(ParallelForTest, WorksInAForkedChild) {
  std::atomic<int64_t> before{0};
  ParallelFor(1000, 1e9, [&](int64_t b, int64_t e) { before.fetch_add(e - b); }, 4);
  ASSERT_EQ(before.load(), 1000);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    std::atomic<int64_t> total{0};
    ParallelFor(1000, 1e9, [&](int64_t b, int64_t e) { total.fetch_add(e - b); }, 4);
    _exit(total.load() == 1000 ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

}  // namespace
}  // namespace tierd::trainer
