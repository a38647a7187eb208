#include "trainer_ref/tensor_home.h"

#include "trainer_ref/adamw8bit.h"

namespace tierd::trainer {
namespace {

const char* const kPrefix[kKinds] = {"", "grad.", "opt.m.", "opt.v.", "", "ef."};

TensorClass ClassOf(Kind kind) {
  switch (kind) {
    case Kind::kParam:
      return TensorClass::kParam;
    case Kind::kGrad:
    case Kind::kResidual:
      return TensorClass::kGrad;
    case Kind::kSaved:
      return TensorClass::kActivation;
    case Kind::kAdamM:
    case Kind::kAdamV:
      break;
  }
  return TensorClass::kOptState;
}

}  // namespace

std::string TensorHome::Name(const std::vector<TensorLayout>& layout, const std::vector<TensorLayout>& saved,
                             size_t entry, Kind kind) {
  if (kind == Kind::kSaved) return saved[entry].name;
  return kPrefix[static_cast<int>(kind)] + layout[entry].name;
}

uint64_t TensorBytes(const TensorLayout& t, Kind kind, bool moments_8bit) {
  const bool moment = kind == Kind::kAdamM || kind == Kind::kAdamV;
  return moment && moments_8bit ? Moment8bitBytes(t.count) : t.count * sizeof(float);
}

const std::vector<TensorLayout>& HomeShape::Of(Kind kind) const {
  static const std::vector<TensorLayout> kNone;
  switch (kind) {
    case Kind::kAdamM:
      return MomentLayout();
    case Kind::kAdamV:
      return second_moment ? MomentLayout() : kNone;
    case Kind::kSaved:
      return saved;
    case Kind::kResidual:
      return residuals ? layout : kNone;
    case Kind::kParam:
      if (!params.empty()) return params;
      break;
    case Kind::kGrad:
      break;
  }
  return layout;
}

HomeTable HomeShape::Table() const {
  HomeTable table;
  for (int k = 0; k < kKinds; ++k) {
    for (const TensorLayout& t : Of(Kind(k))) {
      table.push_back({kPrefix[k] + t.name, ClassOf(Kind(k)), TensorBytes(t, Kind(k), moments_8bit)});
    }
  }
  return table;
}

absl::StatusOr<TensorHome> TensorHome::Over(const HomeShape& shape, Home& home) {
  if (absl::Status s = CheckTable(home.table(), shape.Table(), "this trainer's"); !s.ok()) return s;
  std::array<size_t, kKinds> first{};
  size_t index = 0;
  for (int k = 0; k < kKinds; ++k) {
    first[k] = index;
    index += shape.Of(Kind(k)).size();
  }
  return TensorHome(home, first);
}

absl::StatusOr<float*> TensorHome::Acquire(size_t entry, Kind kind, Access access) {
  auto p = home_->Acquire(first_[static_cast<int>(kind)] + entry, access, Place::kHost);
  if (!p.ok()) return p.status();
  return static_cast<float*>(*p);
}

absl::Status TensorHome::Release(size_t entry, Kind kind) {
  return home_->Release(first_[static_cast<int>(kind)] + entry);
}

}  // namespace tierd::trainer
