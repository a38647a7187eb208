// Shared by gpu_model*.cc (not part of the model's interface): CUDA errors as statuses, the
// profile's categories, the constants of the model's math, and Timed.
#ifndef TIERD_TRAINER_REF_GPU_GPU_MODEL_INTERNAL_H_
#define TIERD_TRAINER_REF_GPU_GPU_MODEL_INTERNAL_H_

#include <cstdio>
#include <cstdlib>
#include <string>

#include "absl/strings/str_format.h"
#include "trainer_ref/gpu/gpu_model.h"

namespace tierd::trainer::gpu {

inline absl::Status Cuda(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrFormat("CUDA %s: %s", what, cudaGetErrorString(error)));
}

enum Category { kGemm, kAttention, kElementwise, kLoss, kOptimizer, kFp8Cast, kComm, kCategories };
inline const char* const kCategoryNames[kCategories] = {"gemm",      "attention", "norm+elementwise",    "loss",
                                                        "optimizer", "fp8 casts", "ranks' gradient sums"};

// A decoder layer's linear maps, as Fp8Linear indexes them (GpuModel::UseFp8 gives the shapes).
enum LinearIndex { kLinearQ, kLinearK, kLinearV, kLinearO, kLinearGate, kLinearUp, kLinearDown, kLinears };
// Their shapes, (out features, in features), by LinearIndex.
Fp8Linear::Shapes LinearShapes(const ModelConfig& config);

// A layer's shapes for a micro-batch of `rows` rows: rows, model width, MLP width, heads, head
// size, key/value heads, q's and k's (v's) widths, and rows x width.
struct LayerDims {
  int n, c, f, h, d, kvh, qd, kd;
  size_t nc;
};
inline LayerDims DimsOf(const ModelConfig& config, int rows) {
  return {rows,           config.d_model,    config.d_ff,
          config.heads,   config.head_dim(), config.kv_head_count(),
          config.q_dim(), config.kv_dim(),   static_cast<size_t>(rows) * config.d_model};
}

// `base` + offset elements, or (a part used without being acquired: a bug) abort naming it.
template <typename T>
T* Inside(void* base, size_t offset, const char* what, const std::string& name) {
  if (base == nullptr) {
    std::fprintf(stderr, "GpuModel: %s of %s used without being acquired\n", what, name.c_str());
    std::abort();
  }
  return static_cast<T*>(base) + offset;
}

#define RETURN_IF_ERROR(expr)                          \
  do {                                                 \
    if (absl::Status _s = (expr); !_s.ok()) return _s; \
  } while (0)

template <typename Fn>
auto GpuModel::Timed(int category, Fn&& fn) {
  if (!profiling_) return fn();
  Span span{category, nullptr, nullptr};
  cudaEventCreate(&span.start);
  cudaEventCreate(&span.end);
  cudaEventRecord(span.start, stream_);
  auto result = fn();
  cudaEventRecord(span.end, stream_);
  spans_.push_back(span);
  return result;
}

template <typename Fn>
auto GpuModel::TimedFlops(int category, double flops, Fn&& fn) {
  if (profiling_) {
    flops_.resize(kCategories, 0.0);
    flops_[category] += flops;
  }
  return Timed(category, std::forward<Fn>(fn));
}

// The floating-point operations of causal attention over `batch` sequences of `seq` with
// `heads` query heads of `head_dim`: QK^T and PV, each 2 s^2 d a head, half of it under the
// mask; its backward does 2.5 times that (S again, dV, dP, dQ, dK), as FlashAttention counts.
inline double AttentionFlops(int batch, int seq, int heads, int head_dim, bool backward) {
  const double forward = 2.0 * batch * heads * static_cast<double>(seq) * seq * head_dim;
  return backward ? 2.5 * forward : forward;
}

}  // namespace tierd::trainer::gpu

#endif  // TIERD_TRAINER_REF_GPU_GPU_MODEL_INTERNAL_H_
