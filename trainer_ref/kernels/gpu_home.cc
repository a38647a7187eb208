#include "trainer_ref/kernels/gpu_home.h"

#include "absl/strings/str_format.h"
#include "base/units.h"

namespace tierd::trainer::gpu {
namespace {

class PlainGpuHome final : public GpuHome {
 public:
  ~PlainGpuHome() override {
    for (auto& parts : pointers_) {
      for (void* p : parts) cudaFree(p);
    }
  }
  absl::Status Init(const GpuHomeLayout& layout) {
    pointers_.resize(layout.groups.size());
    for (size_t g = 0; g < layout.groups.size(); ++g) {
      for (int k = 0; k < kParts; ++k) {
        const uint64_t bytes = layout.bytes[g][k];
        pointers_[g][k] = nullptr;
        if (bytes == 0) continue;
        if (cudaMalloc(&pointers_[g][k], bytes) != cudaSuccess) {
          cudaGetLastError();
          size_t free_bytes = 0, total = 0;
          cudaMemGetInfo(&free_bytes, &total);
          return absl::ResourceExhaustedError(absl::StrFormat(
              "the model's state needs %s on the GPU (%s for %s); it holds %s and the device has %s free of %s "
              "(train through tierd: --offload_policy=tierd)",
              FormatBytes(layout.Total()), FormatBytes(bytes), PartName(layout, static_cast<int>(g), Part(k)),
              FormatBytes(held_), FormatBytes(free_bytes), FormatBytes(total)));
        }
        held_ += bytes;
      }
    }
    return absl::OkStatus();
  }
  absl::StatusOr<void*> Acquire(int group, Part part, Access) override {
    return pointers_[group][static_cast<int>(part)];
  }
  absl::Status Release(int, Part, cudaStream_t) override { return absl::OkStatus(); }
  uint64_t OwnDeviceBytes() const override { return held_; }
  std::string Describe() override { return "plain GPU buffers (no offload)"; }

 private:
  std::vector<std::array<void*, kParts>> pointers_;
  uint64_t held_ = 0;
};

}  // namespace

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

std::string PartName(const GpuHomeLayout& layout, int group, Part part) {
  static const char* const kPrefix[kParts] = {"", "master.", "grad.", "opt.m.", "opt.v.", "act."};
  const std::string& g = layout.groups[group];
  return part == Part::kWeights ? g + ".w" : kPrefix[static_cast<int>(part)] + g;
}

absl::StatusOr<std::unique_ptr<GpuHome>> MakePlainGpuHome(const GpuHomeLayout& layout) {
  auto home = std::make_unique<PlainGpuHome>();
  if (absl::Status s = home->Init(layout); !s.ok()) return s;
  return home;
}

}  // namespace tierd::trainer::gpu
