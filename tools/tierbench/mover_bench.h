// Timed runs of tierd's Mover over a TierStore: each link alone and both GPU
// directions at once, as many tensors of transfer_bytes moved together.
#ifndef TIERD_TOOLS_TIERBENCH_MOVER_BENCH_H_
#define TIERD_TOOLS_TIERBENCH_MOVER_BENCH_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/mover.h"
#include "runtime/tier_store.h"

namespace tierd::bench {

struct MoverRates {
  double dram_to_gpu = 0;  // bytes per second, median over repeats
  double gpu_to_dram = 0;
  double both_directions = 0;
  double dram_to_nvme = 0;
  double nvme_to_dram = 0;
};

struct MoverBenchOptions {
  uint64_t bytes = 0;           // per direction and repeat
  uint64_t transfer_bytes = 0;  // one tensor
  int repeats = 3;
  bool nvme = true;
};

// Needs a store with GPU and DRAM tiers holding 2 x bytes each, and NVMe holding bytes.
absl::StatusOr<MoverRates> MeasureMover(TierStore& store, Mover& mover,
                                        const MoverBenchOptions& options);

}  // namespace tierd::bench

#endif  // TIERD_TOOLS_TIERBENCH_MOVER_BENCH_H_
