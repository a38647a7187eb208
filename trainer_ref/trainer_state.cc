// A trainer's state for a checkpoint: the step, the data order, each tensor's parameters,
// moments and residuals, with the moments' format and the data-parallel layout in the header
// so that a resume into another kind of run is refused by name.
#include <cstring>

#include "absl/strings/str_format.h"
#include "trainer_ref/adamw8bit.h"
#include "trainer_ref/trainer.h"
#include "trainer_ref/trainer_internal.h"
#include "trainer_ref/trainer_state_format.h"

namespace tierd::trainer {
namespace {

// The moments' formats: 0 fp32; 1 8-bit with v itself (refused); 2 8-bit with v's root in
// blocks of 2048 (refused); 5 the same in blocks of q8::kQuantBlock (256).
constexpr uint32_t kMoments8bitRoot2048 = 2;
constexpr uint32_t kMoments8bitRoot = 5;
constexpr uint32_t kLionMoment = 3;      // Lion's one fp32 moment
constexpr uint32_t kAdafactorState = 4;  // Adafactor's row and column means (a vector's own)
// What a state holds, in order (a kind the run does not have, none: residuals without a
// sparse sync).
constexpr Kind kStateKinds[] = {Kind::kParam, Kind::kAdamM, Kind::kAdamV, Kind::kResidual};

}  // namespace

uint32_t Trainer::MomentsFormat() const {
  return options_.lion           ? kLionMoment
         : options_.adafactor    ? kAdafactorState
         : options_.moments_8bit ? kMoments8bitRoot
                                 : 0u;
}

// The sync's part of a state's header: 1 ZeRO-2, 4 ZeRO-3; 2 sparse, with 8 in update mode and
// 16 in momentum mode (a rank's own moments, which another mode would take for the shared ones).
uint32_t Trainer::DpFlags() const {
  const bool sparse = sync_.sparse();
  return (options_.dp.zero2 ? 1u : 0u) | (sparse ? 2u : 0u) | (options_.dp.zero3 ? 4u : 0u) |
         (sparse && options_.dp.sparse_update ? 8u : 0u) | (sparse && options_.dp.sparse_momentum ? 16u : 0u);
}

namespace {
std::string DescribeDpFlags(uint32_t flags) {
  return std::string(flags & 1   ? ", ZeRO-2"
                     : flags & 4 ? ", ZeRO-3"
                                 : "") +
         (flags & 16  ? ", sparse sync of momenta"
          : flags & 8 ? ", sparse sync of updates"
          : flags & 2 ? ", sparse sync of gradients"
                      : "");
}
}  // namespace

absl::StatusOr<std::string> Trainer::SaveState() {
  std::string out;
  auto put = [&out](const void* p, size_t n) { out.append(static_cast<const char*>(p), n); };
  uint64_t count = 0;
  for (const TensorLayout& t : model_.layout()) count += t.count;
  put(&kStateMagic, 4);
  put(&step_, 8);
  put(&batches_drawn_, 8);
  put(&count, 8);
  const uint32_t format = MomentsFormat();
  put(&format, 4);
  const uint32_t dp[3] = {static_cast<uint32_t>(options_.dp.ranks()), static_cast<uint32_t>(options_.dp.rank()),
                          DpFlags()};
  put(dp, sizeof(dp));
  for (Kind k : kStateKinds) {
    for (size_t e = 0; e < shape_.Of(k).size(); ++e) {
      Held held(home_, e);
      auto p = held.Get(k, Access::kRead);
      if (!p.ok()) return p.status();
      put(*p, TensorBytes(shape_.Of(k)[e], k, options_.moments_8bit));
    }
  }
  return out;
}

absl::Status Trainer::LoadState(const std::string& bytes) {
  auto header = ReadTrainerStateHeader(bytes);
  if (!header.ok()) return header.status();
  size_t at = header->bytes;
  auto take = [&](void* p, size_t n) {
    if (at + n > bytes.size()) return false;
    std::memcpy(p, bytes.data() + at, n);
    at += n;
    return true;
  };
  const int64_t step = header->step, drawn = header->drawn;
  const uint64_t count = header->count;
  const uint32_t format = header->format;
  const uint32_t* dp = header->dp;
  uint64_t expected = 0, state_bytes = 0;
  for (const TensorLayout& t : model_.layout()) expected += t.count;
  for (Kind k : kStateKinds) {
    for (const TensorLayout& t : shape_.Of(k)) state_bytes += TensorBytes(t, k, options_.moments_8bit);
  }
  if (dp[0] != static_cast<uint32_t>(options_.dp.ranks()) || dp[1] != static_cast<uint32_t>(options_.dp.rank()) ||
      dp[2] != DpFlags()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the state is rank %d of %d%s; this run is rank %d of %d%s: resume with the ranks and sync it was saved "
        "with",
        dp[1], dp[0], DescribeDpFlags(dp[2]), options_.dp.rank(), options_.dp.ranks(), DescribeDpFlags(DpFlags())));
  }
  if (count != expected) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the state holds %d parameters; model '%s' has %d (another --model_size?)", count, config_.name, expected));
  }
  if (format == 1 || format == kMoments8bitRoot2048) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the state's 8-bit moments are of an earlier 8-bit format (%s; this build quantizes in blocks of %d): this "
        "trainer cannot continue it; start afresh or use the build that wrote it",
        format == 1 ? "the second moment itself, not its root" : "blocks of 2048", q8::kQuantBlock));
  }
  if (format != MomentsFormat()) {
    auto name = [](uint32_t f) {
      return f == kLionMoment        ? "Lion's"
             : f == kAdafactorState  ? "Adafactor's"
             : f == kMoments8bitRoot ? "8-bit"
                                     : "fp32";
    };
    return absl::InvalidArgumentError(
        absl::StrFormat("the state's moments are %s; this run's are %s (--opt)", name(format), name(MomentsFormat())));
  }
  if (bytes.size() != at + state_bytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("trainer state of %d bytes; %d expected", bytes.size(), at + state_bytes));
  }
  for (Kind k : kStateKinds) {
    for (size_t e = 0; e < shape_.Of(k).size(); ++e) {
      Held held(home_, e);
      auto p = held.Get(k, Access::kOverwrite);
      if (!p.ok()) return p.status();
      take(*p, TensorBytes(shape_.Of(k)[e], k, options_.moments_8bit));
    }
  }
  step_ = step;
  // The data order continues where it was.
  batcher_ = std::make_unique<Batcher>(data_.train, options_.batch, options_.seq, batcher_seed_, &data_.train_mask);
  batcher_->Skip(drawn);
  batches_drawn_ = drawn;
  return absl::OkStatus();
}

}  // namespace tierd::trainer
