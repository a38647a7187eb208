// The CPU trainer's tensors in a home (home/home.h), by (entry, kind). Per parameter tensor
// of the layout there are four: the parameter, its gradient and its two Adam moments (fp32,
// or with 8-bit moments each moment's codes and scales, adamw8bit.h); then the saved
// activations and the sparse sync's residuals. Their names in the home: "layers.3.attn.wq",
// "grad.layers.3.attn.wq", "opt.m.layers.3.attn.wq", "opt.v.layers.3.attn.wq", the saved
// activations "act.layers.3", "act.head", residuals "ef.layers.3.attn.wq". The trainer
// acquires them on the host.
#ifndef TIERD_TRAINER_REF_TENSOR_HOME_H_
#define TIERD_TRAINER_REF_TENSOR_HOME_H_

#include <cstddef>
#include <array>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "trainer_ref/home/home.h"
#include "trainer_ref/model.h"

namespace tierd::trainer {

// kSaved: a saved activation; its entry indexes the saved layout, not the parameters'.
// kResidual: the part of a gradient a sparse data-parallel sync has not sent yet (error
// feedback), kept between steps.
enum class Kind { kParam = 0, kGrad = 1, kAdamM = 2, kAdamV = 3, kSaved = 4, kResidual = 5 };
constexpr int kKinds = 6;

// What a home holds: per parameter tensor its parameter, gradient and moments; the saved
// activations; with ZeRO-2 the moments of this rank's slice of each tensor only; with a
// sparse sync a residual per tensor.
struct HomeShape {
  std::vector<TensorLayout> layout, saved;
  bool moments_8bit = false;
  std::vector<TensorLayout> moments;  // count: this rank's slice (ZeRO-2 and 3); empty: the layout's
  std::vector<TensorLayout> params;   // count: this rank's slice (ZeRO-3); empty: the layout's
  bool residuals = false;
  bool second_moment = true;  // false: Lion keeps one moment
  const std::vector<TensorLayout>& MomentLayout() const { return moments.empty() ? layout : moments; }
  // The tensors of a kind: the layout's, the moments', the saved ones, or none.
  const std::vector<TensorLayout>& Of(Kind kind) const;
  // The home's table: every tensor of every kind, kind by kind in Kind's order.
  HomeTable Table() const;
};

// The trainer's view of a home made for its shape: (entry, kind) -> the home's tensor.
class TensorHome {
 public:
  // INVALID_ARGUMENT when the home's table is not the shape's (made for another model or
  // other options).
  static absl::StatusOr<TensorHome> Over(const HomeShape& shape, Home& home);
  // A pointer to the tensor's floats (an 8-bit moment's bytes) on the host, valid until
  // Release. kOverwrite: the old values may be gone (nothing is fetched).
  absl::StatusOr<float*> Acquire(size_t entry, Kind kind, Access access);
  absl::Status Release(size_t entry, Kind kind);
  Home& home() { return *home_; }
  // The name this home leases a tensor under.
  static std::string Name(const std::vector<TensorLayout>& layout, const std::vector<TensorLayout>& saved,
                          size_t entry, Kind kind);

 private:
  TensorHome(Home& home, std::array<size_t, kKinds> first) : home_(&home), first_(first) {}
  Home* home_;
  std::array<size_t, kKinds> first_;  // the index of each kind's entry 0
};

// A tensor's bytes: count floats, but Moment8bitBytes(count) for a moment when moments_8bit.
uint64_t TensorBytes(const TensorLayout& t, Kind kind, bool moments_8bit);

}  // namespace tierd::trainer

#endif  // TIERD_TRAINER_REF_TENSOR_HOME_H_
