// Alloc+free pair latency with 10k live blocks: OffsetAllocator vs malloc/free on the
// same size pattern. Target: <= 100 ns per pair.
//   bazel run -c opt //allocator:offset_allocator_bench
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <random>
#include <vector>

#include "allocator/offset_allocator.h"

namespace tierd {
namespace {

constexpr int kLiveBlocks = 10000;
constexpr int kPatternLength = 4096;

// Sizes from 256 B up to 256 B + span: state.range(0) is the span. 1 MiB spreads the
// blocks over ~400 bins (tensor-like); 256 B keeps them in a few.
std::vector<uint64_t> SizePattern(uint64_t span) {
  std::mt19937_64 rng(42);
  std::vector<uint64_t> sizes(kPatternLength);
  for (auto& size : sizes) size = 256 + rng() % span;
  return sizes;
}

void BM_OffsetAllocatorPair(benchmark::State& state) {
  const std::vector<uint64_t> sizes = SizePattern(state.range(0));
  OffsetAllocator allocator(uint64_t{64} << 30, 256, 2 * kLiveBlocks);
  std::vector<Allocation> live;
  for (int i = 0; i < kLiveBlocks; ++i) live.push_back(*allocator.Allocate(sizes[i % kPatternLength]));
  size_t i = 0;
  for (auto _ : state) {
    const size_t slot = (i * 7919) % kLiveBlocks;
    if (!allocator.Free(live[slot]).ok()) state.SkipWithError("free failed");
    auto next = allocator.Allocate(sizes[i % kPatternLength]);
    if (!next.ok()) state.SkipWithError("allocate failed");
    live[slot] = *next;
    ++i;
  }
  state.counters["fragmentation"] = allocator.Stats().fragmentation;
}
BENCHMARK(BM_OffsetAllocatorPair)->Arg(1 << 20)->Arg(256);

void BM_MallocPair(benchmark::State& state) {
  const std::vector<uint64_t> sizes = SizePattern(state.range(0));
  std::vector<void*> live;
  for (int i = 0; i < kLiveBlocks; ++i) live.push_back(std::malloc(sizes[i % kPatternLength]));
  size_t i = 0;
  for (auto _ : state) {
    const size_t slot = (i * 7919) % kLiveBlocks;
    std::free(live[slot]);
    live[slot] = std::malloc(sizes[i % kPatternLength]);
    benchmark::DoNotOptimize(live[slot]);
    ++i;
  }
  for (void* p : live) std::free(p);
}
BENCHMARK(BM_MallocPair)->Arg(1 << 20)->Arg(256);

}  // namespace
}  // namespace tierd
