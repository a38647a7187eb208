#include "trainer_ref/gpu/gpu_home.h"

#include <algorithm>

#include "absl/strings/str_format.h"
#include "base/units.h"

namespace tierd::trainer::gpu {
namespace {

TensorClass ClassOf(Part part) {
  switch (part) {
    case Part::kWeights:
    case Part::kWeightCodes:
    case Part::kMaster:
      return TensorClass::kParam;
    case Part::kGrads:
      return TensorClass::kGrad;
    case Part::kAdamM:
    case Part::kAdamV:
      return TensorClass::kOptState;
    case Part::kActs:
      return TensorClass::kActivation;
  }
  return TensorClass::kScratch;
}

}  // namespace

PlainMemory DeviceMemory() {
  PlainMemory m;
  m.place = Place::kGpu;
  m.describe = "plain GPU buffers (no offload)";
  m.allocate = [](const HomeTensor& t, uint64_t held, uint64_t total) -> absl::StatusOr<void*> {
    void* p = nullptr;
    if (cudaMalloc(&p, t.bytes) != cudaSuccess) {
      cudaGetLastError();
      size_t free_bytes = 0, device = 0;
      cudaMemGetInfo(&free_bytes, &device);
      return absl::ResourceExhaustedError(absl::StrFormat(
          "the model's state needs %s on the GPU (%s for %s); it holds %s and the device has %s free of %s "
          "(train through tierd: --offload_policy=tierd)",
          FormatBytes(total), FormatBytes(t.bytes), t.name, FormatBytes(held), FormatBytes(free_bytes),
          FormatBytes(device)));
    }
    return p;
  };
  m.free = [](void* p) { cudaFree(p); };
  return m;
}

GpuHome::GpuHome(GpuHomeLayout layout, std::unique_ptr<Home> home)
    : layout_(std::move(layout)), home_(std::move(home)), first_(layout_.groups.size()) {
  size_t index = 0;
  for (size_t g = 0; g < layout_.groups.size(); ++g) {
    for (int k = 0; k < kParts; ++k) {
      first_[g][k] = index;
      if (layout_.bytes[g][k] > 0) index += layout_.Chunks(static_cast<int>(g), Part(k));
    }
  }
}

absl::StatusOr<std::unique_ptr<GpuHome>> GpuHome::Over(GpuHomeLayout layout, std::unique_ptr<Home> home) {
  if (absl::Status s = CheckTable(home->table(), layout.Table(), "its layout's"); !s.ok()) return s;
  return std::unique_ptr<GpuHome>(new GpuHome(std::move(layout), std::move(home)));
}

absl::StatusOr<void*> GpuHome::Acquire(int group, Part part, int chunk, Access access) {
  return home_->Acquire(Index(group, part, chunk), access, Place::kGpu);
}

absl::Status GpuHome::Release(int group, Part part, int chunk, cudaStream_t stream) {
  return home_->Release(Index(group, part, chunk), stream);
}

absl::StatusOr<void*> GpuHome::AcquireHost(int group, Part part, int chunk, Access access) {
  if (!HasHostTier()) return NoHostTier();
  return home_->Acquire(Index(group, part, chunk), access, Place::kHost);
}

absl::Status GpuHome::ReleaseHost(int group, Part part, int chunk) {
  if (!HasHostTier()) return NoHostTier();
  return home_->Release(Index(group, part, chunk));
}

uint64_t GpuHomeLayout::Total() const {
  uint64_t sum = 0;
  for (int k = 0; k < kParts; ++k) sum += TotalOf(Part(k));
  return sum;
}

uint64_t GpuHomeLayout::TotalOf(Part part) const {
  uint64_t sum = 0;
  for (const auto& b : bytes) sum += b[static_cast<int>(part)];
  return sum;
}

namespace {
constexpr uint64_t kChunkAlign = 256;  // a chunk holds whole blocks: offsets stay aligned
}  // namespace

int GpuHomeLayout::Chunks(int group, Part part) const {
  if (part == Part::kActs) return bytes[group][static_cast<int>(part)] > 0 ? std::max(1, act_slots) : 1;
  if (!IsOptimizerState(part) || state_chunks <= 1 || moments_8bit) return 1;
  const uint64_t blocks = (bytes[group][static_cast<int>(part)] + kChunkAlign - 1) / kChunkAlign;
  return static_cast<int>(std::max<uint64_t>(1, std::min<uint64_t>(state_chunks, blocks)));
}

GpuHomeLayout::Range GpuHomeLayout::Chunk(int group, Part part, int chunk) const {
  const uint64_t total = bytes[group][static_cast<int>(part)];
  const int chunks = Chunks(group, part);
  if (chunks == 1) return {0, total};
  if (part == Part::kActs) return {total / chunks * chunk, total / chunks};  // equal slots
  // Blocks shared out evenly, the first ones taking one more where they do not divide.
  const uint64_t blocks = (total + kChunkAlign - 1) / kChunkAlign;
  const uint64_t per = blocks / chunks, extra = blocks % chunks;
  const uint64_t c = static_cast<uint64_t>(chunk);
  const uint64_t first = c * per + std::min(c, extra), count = per + (c < extra ? 1 : 0);
  const uint64_t begin = first * kChunkAlign;
  return {begin, std::min(total, begin + count * kChunkAlign) - begin};
}

HomeTable GpuHomeLayout::Table() const {
  HomeTable table;
  for (int g = 0; g < static_cast<int>(groups.size()); ++g) {
    for (int k = 0; k < kParts; ++k) {
      if (bytes[g][k] == 0) continue;
      for (int c = 0; c < Chunks(g, Part(k)); ++c) {
        table.push_back({PartName(*this, g, Part(k), c), ClassOf(Part(k)), Chunk(g, Part(k), c).bytes});
      }
    }
  }
  return table;
}

std::string PartName(const GpuHomeLayout& layout, int group, Part part, int chunk) {
  static const char* const kPrefix[kParts] = {"", "master.", "grad.", "opt.m.", "opt.v.", "act.", ""};
  const std::string& g = layout.groups[group];
  const std::string name = part == Part::kWeights       ? g + ".w"
                           : part == Part::kWeightCodes ? g + ".w8"
                                                        : kPrefix[static_cast<int>(part)] + g;
  return layout.Chunks(group, part) > 1 ? absl::StrFormat("%s.%d", name, chunk) : name;
}

absl::StatusOr<std::string> CheckQuotasHold(const GpuHomeLayout& layout, uint64_t gpu_bytes, uint64_t dram_bytes,
                                            uint64_t nvme_bytes) {
  const uint64_t state = layout.Total(), quotas = gpu_bytes + dram_bytes + nvme_bytes;
  uint64_t largest = 0;
  for (int g = 0; g < static_cast<int>(layout.groups.size()); ++g) {
    for (int k = 0; k < kParts; ++k) {
      for (int c = 0; c < layout.Chunks(g, Part(k)); ++c)
        largest = std::max(largest, layout.Chunk(g, Part(k), c).bytes);
    }
  }
  const std::string sum = absl::StrFormat("GPU %s + DRAM %s + NVMe %s = %s", FormatBytes(gpu_bytes),
                                          FormatBytes(dram_bytes), FormatBytes(nvme_bytes), FormatBytes(quotas));
  // A tenth to spare: a 13B state (158 GiB, leases up to 1.2 GiB) found no room at its first
  // acquire with 3% of its quotas free, and trained with 12% (H200 box).
  const uint64_t wanted = state + state / 9;
  if (state > quotas) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "the model's state is %s, more than the session's quotas hold (%s): raise --tierd_nvme (or --tierd_dram) "
        "by at least %s, %s for a tenth to spare",
        FormatBytes(state), sum, FormatBytes(state - quotas), FormatBytes(wanted - quotas)));
  }
  if (quotas >= wanted) return std::string();
  return absl::StrFormat(
      "offload: warning: the state (%s) fills %.0f%% of the session's quotas (%s); with leases of up to %s the "
      "fragmented tiers may find no room for one: %s more (--tierd_nvme or --tierd_dram) leaves a tenth free\n",
      FormatBytes(state), 100.0 * static_cast<double>(state) / static_cast<double>(quotas), sum, FormatBytes(largest),
      FormatBytes(wanted - quotas));
}

absl::StatusOr<std::unique_ptr<GpuHome>> MakePlainGpuHome(const GpuHomeLayout& layout) {
  auto home = MakePlainHome(layout.Table(), DeviceMemory());
  if (!home.ok()) return home.status();
  return GpuHome::Over(layout, std::move(*home));
}

}  // namespace tierd::trainer::gpu
