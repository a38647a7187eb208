#include "tools/tierbench/mover_bench.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>

#include "absl/strings/str_format.h"

namespace tierd::bench {
namespace {

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

absl::StatusOr<std::vector<Extent>> AllocateTensors(TierStore& store, Tier tier,
                                                    const MoverBenchOptions& options) {
  std::vector<Extent> tensors;
  for (uint64_t done = 0; done < options.bytes; done += options.transfer_bytes) {
    auto extent = store.Allocate(tier, std::min(options.transfer_bytes, options.bytes - done));
    if (!extent.ok()) return extent.status();
    tensors.push_back(*extent);
  }
  return tensors;
}

// Submits every (source[i] -> destination[i]) of each pair of lists, waits for all,
// and returns the bytes per second over the wall time; an error if any move failed.
absl::StatusOr<double> TimeMoves(
    Mover& mover, const std::vector<std::pair<std::vector<Extent>*, std::vector<Extent>*>>& sets) {
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

absl::StatusOr<MoverRates> MeasureMover(TierStore& store, Mover& mover,
                                        const MoverBenchOptions& options) {
  auto gpu_a = AllocateTensors(store, Tier::kGpu, options);
  auto gpu_b = AllocateTensors(store, Tier::kGpu, options);
  auto dram_a = AllocateTensors(store, Tier::kDram, options);
  auto dram_b = AllocateTensors(store, Tier::kDram, options);
  for (auto* set : {&gpu_a, &gpu_b, &dram_a, &dram_b}) {
    if (!set->ok()) return set->status();
  }
  for (const Extent& e : *dram_a) std::memset(store.Address(e), 0x5A, e.bytes());
  for (const Extent& e : *dram_b) std::memset(store.Address(e), 0xA5, e.bytes());
  std::vector<double> up, down, both, write, read;
  absl::StatusOr<std::vector<Extent>> nvme = std::vector<Extent>{};
  if (options.nvme) {
    nvme = AllocateTensors(store, Tier::kNvme, options);
    if (!nvme.ok()) return nvme.status();
  }
  for (int r = 0; r < options.repeats + 1; ++r) {  // round 0 warms up and is dropped
    auto t_up = TimeMoves(mover, {{&*dram_a, &*gpu_a}});
    auto t_down = TimeMoves(mover, {{&*gpu_b, &*dram_b}});
    auto t_both = TimeMoves(mover, {{&*dram_a, &*gpu_a}, {&*gpu_b, &*dram_b}});
    for (auto* t : {&t_up, &t_down, &t_both}) {
      if (!t->ok()) return t->status();
    }
    if (r > 0) {
      up.push_back(*t_up);
      down.push_back(*t_down);
      both.push_back(*t_both);
    }
    if (!options.nvme) continue;
    auto t_write = TimeMoves(mover, {{&*dram_a, &*nvme}});
    if (!t_write.ok()) return t_write.status();
    auto t_read = TimeMoves(mover, {{&*nvme, &*dram_b}});
    if (!t_read.ok()) return t_read.status();
    if (r > 0) {
      write.push_back(*t_write);
      read.push_back(*t_read);
    }
  }
  MoverRates rates{Median(up), Median(down), Median(both), 0, 0};
  if (options.nvme) {
    rates.dram_to_nvme = Median(write);
    rates.nvme_to_dram = Median(read);
  }
  return rates;
}

}  // namespace tierd::bench
