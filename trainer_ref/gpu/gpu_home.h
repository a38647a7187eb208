// The GPU model's state in a home (home/home.h), by (group, part, chunk). The model's
// tensors come in groups — 0: the embedding, 1..L: the layers, L + 1: the final norm and the
// head (as Model::GroupEntries) — and each group has up to seven parts: its bf16 weights,
// fp32 master weights, fp32 gradients, the two fp32 Adam moments, (layers only) the
// activations its forward saves for backward, and (FP8 layers whose optimizer runs on the
// host) the FP8 codes of its weights. The model acquires a part on the GPU for as long as
// the kernels it queues use it and releases it with the stream those kernels run on, so a
// home smaller than the whole (tierd's GPU tier) can move the rest away meanwhile.
//   plain: every part in its own cudaMalloc, always there (--offload_policy=none);
//   tierd: every part leased from tierd by name (gpu_tierd_home.h).
#ifndef TIERD_TRAINER_REF_GPU_GPU_HOME_H_
#define TIERD_TRAINER_REF_GPU_GPU_HOME_H_

#include <cuda_runtime_api.h>

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "trainer_ref/home/home.h"

namespace tierd::trainer::gpu {

enum class Part { kWeights = 0, kMaster, kGrads, kAdamM, kAdamV, kActs, kWeightCodes };
constexpr int kParts = 7;

// Master weights and the two moments: what the optimizer step reads and writes, and what
// may be leased in sub-groups.
inline bool IsOptimizerState(Part part) {
  return part == Part::kMaster || part == Part::kAdamM || part == Part::kAdamV;
}

// The bytes of every (group, part); 0 where a group has no such part (the embedding and
// the head save no activations here: the model keeps those in its workspace).
struct GpuHomeLayout {
  std::vector<std::string> groups;  // "embed", "layers.0", ..., "final"
  std::vector<std::array<uint64_t, kParts>> bytes;
  // The optimizer's state of each group in up to this many sub-groups, one lease each
  // (DeepSpeed's sub-groups): the planner then moves and places it in pieces, and the
  // optimizer step updates one piece while the next arrives. Other parts are one lease.
  int state_chunks = 1;
  // The saved activations of each layer in this many slots, one lease each: one per
  // micro-batch of a layer-major step (GpuModel::ForwardBackwardLayerMajor).
  int act_slots = 1;
  // The moments as 8-bit blockwise codes (adamw8bit.h), one moment per tensor of the
  // group, back to back in the group's order (GpuModel::MomentOffset): the two moment
  // parts are then ~1/4 of fp32's bytes. Such state is one lease a part (no sub-groups).
  bool moments_8bit = false;
  // The compact state (StateOptions::compact): no weights parts (0 bytes), bf16 gradients.
  bool compact = false;
  uint64_t Total() const;
  uint64_t TotalOf(Part part) const;
  // How many leases the part of a group is in: 1; for the optimizer's state state_chunks of
  // whole 256-byte blocks (fewer when the group has fewer blocks; 1 with 8-bit moments);
  // for the activations act_slots of equal size.
  int Chunks(int group, Part part) const;
  // Chunk `chunk`'s bytes [offset, offset + bytes) within the group's part.
  struct Range {
    uint64_t offset = 0, bytes = 0;
  };
  Range Chunk(int group, Part part, int chunk) const;
  // The home's table: every chunk of every part of every group that has bytes, in that
  // order, by its PartName.
  HomeTable Table() const;
};

// The name a part is leased under: "layers.3.w", "layers.3.w8" (FP8 codes), "master.layers.3", "grad.layers.3",
// "opt.m.layers.3", "opt.v.layers.3", "act.layers.3"; a chunk of state in sub-groups adds
// its index: "opt.m.layers.3.5".
std::string PartName(const GpuHomeLayout& layout, int group, Part part, int chunk = 0);

// The model's view of a home made for a layout: (group, part, chunk) -> the home's tensor.
class GpuHome {
 public:
  // INVALID_ARGUMENT when the home's table is not layout.Table().
  static absl::StatusOr<std::unique_ptr<GpuHome>> Over(GpuHomeLayout layout, std::unique_ptr<Home> home);
  // The layout the home was made for (the model checks it against its own).
  const GpuHomeLayout& layout() const { return layout_; }
  // The home itself: its planner, statistics and traffic.
  Home& home() { return *home_; }
  // A device pointer to chunk `chunk` of the part (0 for parts in one lease), valid until
  // Release. kOverwrite: nothing is fetched.
  absl::StatusOr<void*> Acquire(int group, Part part, int chunk, Access access);
  // After the work queued on `stream` (tierd waits for it before it moves the bytes).
  absl::Status Release(int group, Part part, int chunk, cudaStream_t stream);
  // A host pointer to the chunk in the DRAM tier (for the optimizer step on the CPU), valid
  // until ReleaseHost. NoHostTier() for a home without one (plain GPU buffers).
  absl::StatusOr<void*> AcquireHost(int group, Part part, int chunk, Access access);
  absl::Status ReleaseHost(int group, Part part, int chunk);
  bool HasHostTier() const { return home_->Holds(Place::kHost); }
  static absl::Status NoHostTier() {
    return absl::UnimplementedError("this home has no host tier: the CPU optimizer needs tierd's DRAM tier");
  }

 private:
  GpuHome(GpuHomeLayout layout, std::unique_ptr<Home> home);
  size_t Index(int group, Part part, int chunk) const { return first_[group][static_cast<int>(part)] + chunk; }
  GpuHomeLayout layout_;
  std::unique_ptr<Home> home_;
  std::vector<std::array<size_t, kParts>> first_;  // the table index of each part's chunk 0
};

// Every part's device memory in its own cudaMalloc; an allocation that fails says how much
// the state needs, what the device has free and what to do.
PlainMemory DeviceMemory();

// RESOURCE_EXHAUSTED (with the bytes) when the device cannot hold it all.
absl::StatusOr<std::unique_ptr<GpuHome>> MakePlainGpuHome(const GpuHomeLayout& layout);

// Whether a tierd session's quotas hold the layout: RESOURCE_EXHAUSTED when the state is
// larger than GPU + DRAM + NVMe together; a warning line when less than a tenth of them would
// stay free (the tiers' allocators fragment around leases of up to the largest one's size,
// and a copy may then find no room in any tier); "" otherwise.
absl::StatusOr<std::string> CheckQuotasHold(const GpuHomeLayout& layout, uint64_t gpu_bytes, uint64_t dram_bytes,
                                            uint64_t nvme_bytes);

}  // namespace tierd::trainer::gpu

#endif  // TIERD_TRAINER_REF_GPU_GPU_HOME_H_
