// Where the trainer's tensors live between uses. Per parameter tensor of the layout there
// are four: the parameter, its gradient and its two Adam moments (fp32, or with 8-bit
// moments each moment's codes and scales, adamw8bit.h). The trainer
// acquires one for as long as an op uses it and releases it after, so a home that is
// smaller than the whole (tierd's tiers) moves the rest away meanwhile.
//   PlainHome: plain buffers in this process (--offload_policy=none, the baseline).
//   TierdHome: every tensor leased from tierd by name ("layers.3.attn.wq",
//              "grad.layers.3.attn.wq", "opt.m.layers.3.attn.wq", "opt.v.layers.3.attn.wq",
//              the saved activations "act.layers.3", "act.head", residuals "ef.layers.3.attn.wq").
#ifndef TIERD_TRAINER_REF_TENSOR_HOME_H_
#define TIERD_TRAINER_REF_TENSOR_HOME_H_

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "prefetcher/graph.h"
#include "runtime/tensor.h"
#include "trainer_ref/model.h"

namespace tierd {
class Client;
struct ClientOptions;
}  // namespace tierd

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
};

class TensorHome {
 public:
  virtual ~TensorHome() = default;
  // A pointer to the tensor's floats (an 8-bit moment's bytes), valid until Release.
  // kOverwrite: the old values may be gone (nothing is fetched).
  virtual absl::StatusOr<float*> Acquire(size_t entry, Kind kind, Access access) = 0;
  virtual absl::Status Release(size_t entry, Kind kind) = 0;
  // One line on where the bytes went (tier traffic), for the summary.
  virtual std::string Describe() = 0;
  // Bytes the tiers have moved so far (0 for plain buffers).
  virtual uint64_t MovedBytes() = 0;
  // The planner: the step as ops over this home's tensor names, registered once; then the
  // op about to run. A home without a planner (plain buffers) says "" and ignores progress.
  // Returns the planner's prediction in words.
  virtual absl::StatusOr<std::string> RegisterGraph(const prefetcher::Graph&) { return std::string(); }
  virtual absl::Status OpBegin(uint32_t) { return absl::OkStatus(); }
  // Or, without a graph: the start of each step; the home records the first step and plans
  // from it (tierd's MarkIteration). Returns what it did in words ("" without a planner).
  virtual absl::StatusOr<std::string> MarkIteration() { return std::string(); }
  // After a step: its loss (not finite: skipped), seconds and tokens, for tierd's statistics
  // (tierctl stats, Prometheus). Nothing without tierd.
  virtual absl::Status ReportStep(int64_t, double, double, double) { return absl::OkStatus(); }
  // The name this home leases a tensor under.
  static std::string Name(const std::vector<TensorLayout>& layout, const std::vector<TensorLayout>& saved,
                          size_t entry, Kind kind);
};

// A tensor's bytes: count floats, but Moment8bitBytes(count) for a moment when moments_8bit.
uint64_t TensorBytes(const TensorLayout& t, Kind kind, bool moments_8bit);

std::unique_ptr<TensorHome> MakePlainHome(const HomeShape& shape);

// Connects to the tierd at `runtime_dir` with these quotas and leases every tensor.
absl::StatusOr<std::unique_ptr<TensorHome>> MakeTierdHome(const HomeShape& shape, const ClientOptions& options);

}  // namespace tierd::trainer

#endif  // TIERD_TRAINER_REF_TENSOR_HOME_H_
