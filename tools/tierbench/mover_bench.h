// Timed runs of tierd's Mover over a TierStore: each GPU direction alone and both at
// once, and one NVMe write + read pass, as many tensors of transfer_bytes moved together.
#ifndef TIERD_TOOLS_TIERBENCH_MOVER_BENCH_H_
#define TIERD_TOOLS_TIERBENCH_MOVER_BENCH_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "runtime/mover.h"
#include "runtime/tier_store.h"
#include "tools/tierbench/raw_ceiling.h"

namespace tierd::bench {

class MoverBench {
 public:
  // Allocates the tensors: 2 x bytes in the GPU and DRAM tiers, bytes in NVMe (if any).
  static absl::StatusOr<std::unique_ptr<MoverBench>> Create(TierStore& store, uint64_t bytes,
                                                            uint64_t transfer_bytes, bool nvme);
  // Medians over `repeats` after one warm-up round.
  absl::StatusOr<GpuRates> MeasureGpu(Mover& mover, int repeats);
  // One DRAM->NVMe pass over every tensor, then NVMe->DRAM into other tensors.
  absl::StatusOr<NvmeRates> MeasureNvmeOnce(Mover& mover);

 private:
  explicit MoverBench(TierStore& store) : store_(store) {}
  TierStore& store_;
  std::vector<Extent> gpu_a_, gpu_b_, dram_a_, dram_b_, nvme_;
};

}  // namespace tierd::bench

#endif  // TIERD_TOOLS_TIERBENCH_MOVER_BENCH_H_
