#include "trainer_ref/home/home.h"

#include <cstdlib>
#include <cstring>

#include "absl/strings/str_format.h"
#include "base/units.h"

namespace tierd::trainer {
namespace {

class PlainHome final : public Home {
 public:
  PlainHome(HomeTable table, PlainMemory memory) : table_(std::move(table)), memory_(std::move(memory)) {}
  ~PlainHome() override {
    for (void* p : pointers_) memory_.free(p);
  }
  absl::Status Init() {
    const uint64_t total = TableBytes(table_);
    for (const HomeTensor& t : table_) {
      auto p = memory_.allocate(t, held_, total);
      if (!p.ok()) return p.status();
      pointers_.push_back(*p);
      held_ += t.bytes;
    }
    return absl::OkStatus();
  }
  const HomeTable& table() const override { return table_; }
  bool Holds(Place place) const override { return place == memory_.place; }
  absl::StatusOr<void*> Acquire(size_t index, Access, Place place) override {
    if (index >= pointers_.size()) {
      return absl::OutOfRangeError(absl::StrFormat("tensor %d of a home of %d", index, pointers_.size()));
    }
    if (place != memory_.place) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "%s are in %s memory only: %s was asked for on the %s", memory_.describe,
          memory_.place == Place::kGpu ? "device" : "host", table_[index].name,
          place == Place::kGpu ? "GPU" : "host"));
    }
    return pointers_[index];
  }
  absl::Status Release(size_t, void*) override { return absl::OkStatus(); }
  uint64_t OwnDeviceBytes() const override { return memory_.place == Place::kGpu ? held_ : 0; }
  std::string Describe() override { return memory_.describe; }

 private:
  HomeTable table_;
  PlainMemory memory_;
  std::vector<void*> pointers_;
  uint64_t held_ = 0;
};

}  // namespace

uint64_t TableBytes(const HomeTable& table) {
  uint64_t sum = 0;
  for (const HomeTensor& t : table) sum += t.bytes;
  return sum;
}

absl::Status CheckTable(const HomeTable& held, const HomeTable& wanted, const std::string& what) {
  if (held == wanted) return absl::OkStatus();
  std::string first;
  for (size_t i = 0; i < std::max(held.size(), wanted.size()); ++i) {
    if (i >= held.size()) {
      first = absl::StrFormat("it lacks tensor %d, %s", i, wanted[i].name);
    } else if (i >= wanted.size()) {
      first = absl::StrFormat("it has a tensor %d more, %s", i, held[i].name);
    } else if (!(held[i] == wanted[i])) {
      first = absl::StrFormat("tensor %d is %s of %d bytes (%s), not %s of %d bytes (%s)", i, held[i].name,
                              held[i].bytes, TensorClassName(held[i].cls), wanted[i].name, wanted[i].bytes,
                              TensorClassName(wanted[i].cls));
    } else {
      continue;
    }
    break;
  }
  return absl::InvalidArgumentError(absl::StrFormat(
      "the home was made for another layout (%d tensors, %s) than %s (%d tensors, %s): %s", held.size(),
      FormatBytes(TableBytes(held)), what, wanted.size(), FormatBytes(TableBytes(wanted)), first));
}

PlainMemory HostMemory() {
  PlainMemory m;
  m.allocate = [](const HomeTensor& t, uint64_t held, uint64_t total) -> absl::StatusOr<void*> {
    constexpr size_t kAlign = 64;
    const size_t bytes = (std::max<uint64_t>(t.bytes, 1) + kAlign - 1) / kAlign * kAlign;
    void* p = std::aligned_alloc(kAlign, bytes);
    if (p == nullptr) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "the state needs %s of host memory; %s for %s did not fit after %s", FormatBytes(total),
          FormatBytes(t.bytes), t.name, FormatBytes(held)));
    }
    std::memset(p, 0, bytes);
    return p;
  };
  m.free = [](void* p) { std::free(p); };
  return m;
}

absl::StatusOr<std::unique_ptr<Home>> MakePlainHome(HomeTable table, PlainMemory memory) {
  auto home = std::make_unique<PlainHome>(std::move(table), std::move(memory));
  if (absl::Status s = home->Init(); !s.ok()) return s;
  return std::unique_ptr<Home>(std::move(home));
}

}  // namespace tierd::trainer
