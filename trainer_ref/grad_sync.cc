#include "trainer_ref/grad_sync.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <regex>

#include "absl/strings/str_format.h"
#include "trainer_ref/host_adamw.h"

namespace tierd::trainer {
namespace {

float FromBf16(uint16_t bits) {
  const uint32_t word = static_cast<uint32_t>(bits) << 16;
  float x;
  std::memcpy(&x, &word, 4);
  return x;
}

bool IsSparse(double ratio) { return ratio > 0 && ratio < 1; }

}  // namespace

bool DataParallelOptions::sparse() const {
  if (IsSparse(sparse_ratio)) return true;
  for (const auto& [pattern, ratio] : sparse_ratio_by) {
    if (IsSparse(ratio)) return true;
  }
  return false;
}

void TopKPack(float* acc, int64_t count, int64_t k, uint8_t* out) {
  std::vector<uint32_t> index(static_cast<size_t>(count));
  std::iota(index.begin(), index.end(), 0u);
  auto larger = [acc](uint32_t a, uint32_t b) {
    const float x = std::fabs(acc[a]), y = std::fabs(acc[b]);
    return x > y || (x == y && a < b);
  };
  if (k < count) std::nth_element(index.begin(), index.begin() + k, index.end(), larger);
  std::sort(index.begin(), index.begin() + k);
  for (int64_t j = 0; j < k; ++j) {
    const uint32_t i = index[j];
    const uint16_t value = Bf16Bits(acc[i]);
    std::memcpy(out + j * kSparseEntryBytes, &i, 4);
    std::memcpy(out + j * kSparseEntryBytes + 4, &value, 2);
    acc[i] -= FromBf16(value);
  }
}

void UnpackAdd(const uint8_t* in, int64_t k, float* sum) {
  for (int64_t j = 0; j < k; ++j) {
    uint32_t i;
    uint16_t value;
    std::memcpy(&i, in + j * kSparseEntryBytes, 4);
    std::memcpy(&value, in + j * kSparseEntryBytes + 4, 2);
    sum[i] += FromBf16(value);
  }
}

absl::StatusOr<GradSync> GradSync::Create(const DataParallelOptions& options, const std::vector<TensorLayout>& layout,
                                          int64_t slice_align) {
  if (options.sparse_ratio < 0 || options.sparse_ratio > 1) {
    return absl::InvalidArgumentError(
        absl::StrFormat("--sparse_grad_ratio=%g: a fraction in [0, 1] (0 or 1: dense)", options.sparse_ratio));
  }
  if (options.sync_every < 1) {
    return absl::InvalidArgumentError(absl::StrFormat("--sync_every=%d: at least 1", options.sync_every));
  }
  const int stage = options.zero3 ? 3 : 2;
  if (options.sharded() && options.sparse()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "--zero=%d with --sparse_grad_ratio: ZeRO-%d reduce-scatters dense slices; use one or the other", stage,
        stage));
  }
  if (options.sparse_momentum && (options.sparse_update || options.sparse_warmup <= 0)) {
    return absl::InvalidArgumentError(
        "--sparse_sync=momentum freezes AdamW's second moment after a dense warm-up: give --sparse_warmup=N "
        "(steps; a quarter of the run came within 1.2% of dense, a tenth 11%: docs/BENCHMARKS.md)");
  }
  if (options.sync_every > 1 && (options.sharded() || options.sparse())) {
    return absl::InvalidArgumentError(
        "--sync_every > 1 averages whole parameters between local steps: it goes with the dense sync only "
        "(not --zero=2 or 3, nor --sparse_grad_ratio)");
  }
  GradSync s;
  s.options_ = options;
  s.layout_ = layout;
  std::vector<std::pair<std::regex, double>> patterns;
  for (const auto& [pattern, ratio] : options.sparse_ratio_by) {
    if (ratio < 0 || ratio > 1) {
      return absl::InvalidArgumentError(
          absl::StrFormat("--sparse_grad_ratio_by: '%s=%g': a fraction in [0, 1]", pattern, ratio));
    }
    try {
      patterns.emplace_back(std::regex(pattern), ratio);
    } catch (const std::regex_error& e) {
      return absl::InvalidArgumentError(
          absl::StrFormat("--sparse_grad_ratio_by: '%s' is not a regex: %s", pattern, e.what()));
    }
  }
  const int ranks = options.ranks();
  for (const TensorLayout& t : layout) {
    const int64_t count = static_cast<int64_t>(t.count);
    s.slices_.push_back(options.sharded() ? comm::Slices::Even(count, ranks, slice_align)
                                          : comm::Slices::Even(count, 1));
    double ratio = options.sparse_ratio;
    for (const auto& [re, r] : patterns) {
      if (std::regex_match(t.name, re)) {
        ratio = r;
        break;
      }
    }
    const int64_t k = IsSparse(ratio) ? std::clamp<int64_t>(std::llround(ratio * count), 1, count) : 0;
    s.k_.push_back(k);
    s.sparse_ = s.sparse_ || k > 0;
  }
  return s;
}

int64_t GradSync::KNow(size_t e) const {
  const int64_t count = static_cast<int64_t>(layout_[e].count);
  if (k_[e] == 0 || options_.sparse_warmup <= 0 || step_ > options_.sparse_warmup || options_.sparse_momentum)
    return k_[e];
  const double ratio = static_cast<double>(k_[e]) / static_cast<double>(count);
  const double now = std::pow(ratio, static_cast<double>(step_ - 1) / options_.sparse_warmup);
  return std::clamp<int64_t>(std::llround(now * count), k_[e], count);
}

std::pair<int64_t, int64_t> GradSync::Owned(size_t e) const {
  const comm::Slices& s = slices_[e];
  const int r = options_.sharded() ? options_.rank() : 0;
  return {s.offset[r], s.offset[r] + s.count[r]};
}

absl::Status GradSync::ExchangeTopK(size_t e, float* residual, float* mean) {
  const int64_t count = static_cast<int64_t>(layout_[e].count), k = KNow(e);
  const int ranks = options_.ranks();
  mine_.resize(static_cast<size_t>(k) * kSparseEntryBytes);
  all_.resize(mine_.size() * ranks);
  TopKPack(residual, count, k, mine_.data());
  if (options_.comm != nullptr) {
    if (absl::Status s = options_.comm->AllGatherBytes(mine_.data(), all_.data(), static_cast<int64_t>(mine_.size()));
        !s.ok()) {
      return s;
    }
  } else {
    all_ = mine_;
  }
  std::fill(mean, mean + count, 0.f);
  for (int r = 0; r < ranks; ++r) UnpackAdd(all_.data() + r * mine_.size(), k, mean);
  const float over = 1.0f / static_cast<float>(ranks);
  for (int64_t i = 0; i < count; ++i) mean[i] *= over;
  return absl::OkStatus();
}

absl::Status GradSync::SparseMomentum(size_t e, const float* velocity, float* residual, float* mean) {
  const int64_t count = static_cast<int64_t>(layout_[e].count);
  for (int64_t i = 0; i < count; ++i) residual[i] += velocity[i];
  return ExchangeTopK(e, residual, mean);
}

absl::Status GradSync::Sync(size_t e, float* g, float* residual, int micro_batches, bool local) {
  const int64_t count = static_cast<int64_t>(layout_[e].count);
  const bool warming = options_.sparse_momentum && step_ <= options_.sparse_warmup;  // dense
  if (k_[e] > 0 && !local && !warming) {
    const float mean = 1.0f / static_cast<float>(micro_batches);
    for (int64_t i = 0; i < count; ++i) residual[i] += g[i] * mean;
    return ExchangeTopK(e, residual, g);
  }
  const int ranks = options_.ranks();
  comm::Communicator* c = options_.comm;
  int divisor = micro_batches;
  if (c != nullptr && ranks > 1 && !local) {
    absl::Status s = options_.sharded() ? c->ReduceScatterSum(g, slices_[e]) : c->AllReduce(g, count);
    if (!s.ok()) return s;
    divisor *= ranks;
  }
  const auto [lo, hi] = Owned(e);
  for (int64_t i = lo; i < hi; ++i) g[i] /= divisor;
  return absl::OkStatus();
}

absl::Status GradSync::SparseUpdate(size_t e, float* params, const float* before, float* residual) {
  const int64_t count = static_cast<int64_t>(layout_[e].count);
  for (int64_t i = 0; i < count; ++i) residual[i] += params[i] - before[i];
  // params becomes the mean of what the ranks sent, then is added to `before`.
  if (absl::Status s = ExchangeTopK(e, residual, params); !s.ok()) return s;
  for (int64_t i = 0; i < count; ++i) params[i] += before[i];
  return absl::OkStatus();
}

absl::Status GradSync::GatherParams(size_t e, float* params) {
  if (!options_.zero2 || options_.ranks() == 1) return absl::OkStatus();
  return options_.comm->AllGather(params, slices_[e]);
}

absl::Status GradSync::GatherFull(size_t e, const float* slice, float* full) {
  const auto [lo, hi] = Owned(e);
  std::copy(slice, slice + (hi - lo), full + lo);
  if (options_.ranks() == 1) return absl::OkStatus();
  return options_.comm->AllGather(full, slices_[e]);
}

absl::Status GradSync::AverageParams(size_t e, float* params) {
  if (options_.ranks() == 1) return absl::OkStatus();
  const int64_t count = static_cast<int64_t>(layout_[e].count);
  if (absl::Status s = options_.comm->AllReduce(params, count); !s.ok()) return s;
  const float over = 1.0f / static_cast<float>(options_.ranks());
  for (int64_t i = 0; i < count; ++i) params[i] *= over;
  return absl::OkStatus();
}

double GradSync::DenseBytesPerStep() const {
  const int n = options_.ranks();
  double elements = 0;
  for (const TensorLayout& t : layout_) elements += static_cast<double>(t.count);
  return n > 1 ? elements * 4.0 * 2.0 * (n - 1) / n : 0.0;
}

}  // namespace tierd::trainer
