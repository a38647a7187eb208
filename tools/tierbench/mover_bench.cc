#include "tools/tierbench/mover_bench.h"
#include "tools/tierbench/stats.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>

#include "absl/strings/str_format.h"

namespace tierd::bench {
namespace {

absl::Status AllocateTensors(TierStore& store, Tier tier, uint64_t bytes, uint64_t transfer_bytes,
                             std::vector<Extent>* tensors) {
  for (uint64_t done = 0; done < bytes; done += transfer_bytes) {
    auto extent = store.Allocate(tier, std::min(transfer_bytes, bytes - done));
    if (!extent.ok()) return extent.status();
    tensors->push_back(*extent);
  }
  return absl::OkStatus();
}

using Pairs = std::vector<std::pair<const std::vector<Extent>*, const std::vector<Extent>*>>;

// Submits every source[i] -> destination[i] of each pair of lists, waits for all, and
// returns bytes per second over the wall time; an error if any move failed.
absl::StatusOr<double> TimeMoves(Mover& mover, const Pairs& sets) {
  std::atomic<int> failures{0};
  uint64_t bytes = 0;
  const auto start = std::chrono::steady_clock::now();
  for (auto [sources, destinations] : sets) {
    for (size_t i = 0; i < sources->size(); ++i) {
      const uint64_t size = (*sources)[i].bytes();
      absl::Status submitted = mover.Move((*sources)[i], (*destinations)[i], size,
                                          [&failures](absl::Status s) { failures += !s.ok(); });
      if (!submitted.ok()) return submitted;
      bytes += size;
    }
  }
  mover.Drain();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (failures > 0) return absl::InternalError(absl::StrFormat("%d moves failed", failures.load()));
  return bytes / seconds;
}

}  // namespace

absl::StatusOr<std::unique_ptr<MoverBench>> MoverBench::Create(TierStore& store, uint64_t bytes,
                                                               uint64_t transfer_bytes, bool nvme) {
  std::unique_ptr<MoverBench> bench(new MoverBench(store));
  for (auto [tier, list] : {std::pair{Tier::kGpu, &bench->gpu_a_}, {Tier::kGpu, &bench->gpu_b_},
                            {Tier::kDram, &bench->dram_a_}, {Tier::kDram, &bench->dram_b_}}) {
    if (absl::Status s = AllocateTensors(store, tier, bytes, transfer_bytes, list); !s.ok()) return s;
  }
  if (nvme) {
    if (absl::Status s = AllocateTensors(store, Tier::kNvme, bytes, transfer_bytes, &bench->nvme_);
        !s.ok()) {
      return s;
    }
  }
  for (const Extent& e : bench->dram_a_) std::memset(store.Address(e), 0x5A, e.bytes());
  for (const Extent& e : bench->dram_b_) std::memset(store.Address(e), 0xA5, e.bytes());
  return bench;
}

absl::StatusOr<GpuRates> MoverBench::MeasureGpu(Mover& mover, int repeats) {
  std::vector<double> up, down, both;
  for (int r = 0; r < repeats + 1; ++r) {  // round 0 warms up and is dropped
    auto t_up = TimeMoves(mover, {{&dram_a_, &gpu_a_}});
    auto t_down = TimeMoves(mover, {{&gpu_b_, &dram_b_}});
    auto t_both = TimeMoves(mover, {{&dram_a_, &gpu_a_}, {&gpu_b_, &dram_b_}});
    for (auto* t : {&t_up, &t_down, &t_both}) {
      if (!t->ok()) return t->status();
    }
    if (r == 0) continue;
    up.push_back(*t_up);
    down.push_back(*t_down);
    both.push_back(*t_both);
  }
  return GpuRates{Median(up), Median(down), Median(both)};
}

absl::StatusOr<NvmeRates> MoverBench::MeasureNvmeOnce(Mover& mover) {
  auto write = TimeMoves(mover, {{&dram_a_, &nvme_}});
  if (!write.ok()) return write.status();
  auto read = TimeMoves(mover, {{&nvme_, &dram_b_}});
  if (!read.ok()) return read.status();
  return NvmeRates{*write, *read};
}

}  // namespace tierd::bench
