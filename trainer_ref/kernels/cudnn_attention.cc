#include "trainer_ref/kernels/cudnn_attention.h"

#include <dlfcn.h>

#include <cmath>
#include <exception>
#include <mutex>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "absl/strings/str_format.h"
#include "cudnn_frontend.h"

// The frontend's dynamic-loading shim looks every cuDNN call up in this handle.
namespace cudnn_frontend {
void* cudnn_dlhandle = nullptr;
}  // namespace cudnn_frontend

namespace tierd::trainer::gpu {
namespace fe = cudnn_frontend;

namespace {

enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV };

// A (B, T, heads, D) row-major tensor as cuDNN's (B, heads, T, D) dims and strides.
fe::graph::Tensor_attributes Rows(const char* name, int64_t uid, const CudnnAttention::Shape& s, int heads) {
  const int64_t t = s.seq, d = s.head_dim;
  return fe::graph::Tensor_attributes()
      .set_name(name)
      .set_uid(uid)
      .set_dim({s.batch, heads, t, d})
      .set_stride({t * heads * d, d, heads * d, 1});
}

// A graph of bf16 tensors, fp32 inside.
std::shared_ptr<fe::graph::Graph> NewGraph() {
  auto graph = std::make_shared<fe::graph::Graph>();
  graph->set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  return graph;
}

absl::Status Unavailable(const std::string& what, fe::error_t e) {
  return absl::UnavailableError(absl::StrFormat("cuDNN attention: %s: %s", what, e.get_message()));
}

// The two graphs' tensors by uid, as their execute calls (and Autotune's) take them.
using Pack = std::unordered_map<int64_t, void*>;
Pack ForwardPack(Bf16* out, float* stats, const Bf16* q, const Bf16* k, const Bf16* v) {
  return {{kQ, const_cast<Bf16*>(q)}, {kK, const_cast<Bf16*>(k)}, {kV, const_cast<Bf16*>(v)}, {kO, out},
          {kStats, stats}};
}
Pack BackwardPack(Bf16* dq, Bf16* dk, Bf16* dv, const Bf16* dout, const Bf16* out, const float* stats, const Bf16* q,
                  const Bf16* k, const Bf16* v) {
  return {{kQ, const_cast<Bf16*>(q)},   {kK, const_cast<Bf16*>(k)},     {kV, const_cast<Bf16*>(v)},
          {kO, const_cast<Bf16*>(out)}, {kDO, const_cast<Bf16*>(dout)}, {kStats, const_cast<float*>(stats)},
          {kDQ, dq},                    {kDK, dk},                      {kDV, dv}};
}

}  // namespace

struct CudnnAttention::Impl {
  Shape shape;
  cudnnHandle_t handle = nullptr;
  std::shared_ptr<fe::graph::Graph> forward, backward;
  int64_t workspace = 0;
  size_t version = 0;
  ~Impl() {
    if (handle != nullptr) fe::detail::destroy_handle(handle);
  }
};

CudnnAttention::CudnnAttention(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CudnnAttention::~CudnnAttention() = default;

absl::StatusOr<std::unique_ptr<CudnnAttention>> CudnnAttention::Create(const Shape& s, bool deterministic,
                                                                       bool all_plans) {
  if (s.batch < 1 || s.seq < 1 || s.heads < 1 || s.kv_heads < 1 || s.heads % s.kv_heads != 0 || s.head_dim < 1) {
    return absl::InvalidArgumentError(absl::StrFormat("cuDNN attention: batch %d, sequence %d, %d heads of %d, %d key/value heads",
                                                      s.batch, s.seq, s.heads, s.head_dim, s.kv_heads));
  }
  if (std::string why; !Loadable(&why)) return absl::UnavailableError("cuDNN attention: " + why);
  auto impl = std::make_unique<Impl>();
  impl->shape = s;
  // The dynamic-loading shim throws when libcudnn.so.9 (or a symbol) is missing.
  try {
    impl->version = fe::detail::get_backend_version();
    if (impl->version < 90000) {
      return absl::UnavailableError(absl::StrFormat("cuDNN attention: cuDNN %d is older than 9.0", impl->version));
    }
    if (fe::detail::create_handle(&impl->handle) != CUDNN_STATUS_SUCCESS) {
      impl->handle = nullptr;
      return absl::UnavailableError("cuDNN attention: cudnnCreate failed (no usable GPU for cuDNN?)");
    }
    const float scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
    // Forward: O and the softmax statistics.
    auto forward = NewGraph();
    auto q = forward->tensor(Rows("Q", kQ, s, s.heads));
    auto k = forward->tensor(Rows("K", kK, s, s.kv_heads));
    auto v = forward->tensor(Rows("V", kV, s, s.kv_heads));
    auto options = fe::graph::SDPA_attributes()
                       .set_name("attention")
                       .set_generate_stats(true)
                       .set_causal_mask(true)
                       .set_attn_scale(scale);
    auto [o, stats] = forward->sdpa(q, k, v, options);
    const int64_t t = s.seq, d = s.head_dim, h = s.heads;
    o->set_output(true).set_uid(kO).set_dim({s.batch, h, t, d}).set_stride({t * h * d, d, h * d, 1});
    stats->set_output(true).set_uid(kStats).set_data_type(fe::DataType_t::FLOAT);
    // Backward: dQ, dK, dV from O, dO and the statistics.
    auto backward = NewGraph();
    auto bq = backward->tensor(Rows("Q", kQ, s, s.heads));
    auto bk = backward->tensor(Rows("K", kK, s, s.kv_heads));
    auto bv = backward->tensor(Rows("V", kV, s, s.kv_heads));
    auto bo = backward->tensor(Rows("O", kO, s, s.heads));
    auto bdo = backward->tensor(Rows("dO", kDO, s, s.heads));
    auto bstats = backward->tensor(fe::graph::Tensor_attributes()
                                       .set_name("stats")
                                       .set_uid(kStats)
                                       .set_dim({s.batch, h, t, 1})
                                       .set_stride({h * t, t, 1, 1})
                                       .set_data_type(fe::DataType_t::FLOAT));
    auto backward_options = fe::graph::SDPA_backward_attributes()
                                .set_name("attention backward")
                                .set_causal_mask(true)
                                .set_attn_scale(scale)
                                .set_deterministic_algorithm(deterministic);
    auto [dq, dk, dv] = backward->sdpa_backward(bq, bk, bv, bo, bdo, bstats, backward_options);
    dq->set_output(true).set_uid(kDQ).set_dim({s.batch, h, t, d}).set_stride({t * h * d, d, h * d, 1});
    const int64_t kv = s.kv_heads;
    dk->set_output(true).set_uid(kDK).set_dim({s.batch, kv, t, d}).set_stride({t * kv * d, d, kv * d, 1});
    dv->set_output(true).set_uid(kDV).set_dim({s.batch, kv, t, d}).set_stride({t * kv * d, d, kv * d, 1});
    for (auto* graph : {forward.get(), backward.get()}) {
      const char* which = graph == forward.get() ? "forward" : "backward";
      if (auto e = graph->validate(); e.is_bad()) return Unavailable(std::string(which) + " graph", e);
      if (auto e = graph->build_operation_graph(impl->handle); e.is_bad()) return Unavailable(which, e);
      const std::vector<fe::HeurMode_t> modes =
          all_plans ? std::vector{fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK} : std::vector{fe::HeurMode_t::A};
      if (auto e = graph->create_execution_plans(modes); e.is_bad()) return Unavailable(which, e);
      if (auto e = graph->check_support(impl->handle); e.is_bad()) {
        return Unavailable(std::string(which) + " not supported here", e);
      }
      const auto policy = all_plans ? fe::BuildPlanPolicy_t::ALL : fe::BuildPlanPolicy_t::HEURISTICS_CHOICE;
      if (auto e = graph->build_plans(impl->handle, policy); e.is_bad()) return Unavailable(which, e);
      int64_t bytes = 0;  // every plan's, for Autotune to run each; else the chosen one's
      if (all_plans) {
        bytes = graph->get_autotune_workspace_size();
      } else if (auto e = graph->get_workspace_size(bytes); e.is_bad()) {
        return Unavailable(which, e);
      }
      impl->workspace = std::max(impl->workspace, bytes);
    }
    impl->forward = std::move(forward);
    impl->backward = std::move(backward);
  } catch (const std::exception& e) {
    return absl::UnavailableError(std::string("cuDNN attention: ") + e.what());
  }
  return std::unique_ptr<CudnnAttention>(new CudnnAttention(std::move(impl)));
}

bool CudnnAttention::Loadable(std::string* why) {
  // Opened once for the process and kept (the frontend's calls look up its symbols).
  static std::once_flag opened;
  static std::string open_error;
  std::call_once(opened, [] {
    fe::cudnn_dlhandle = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_GLOBAL);
    if (fe::cudnn_dlhandle == nullptr) {
      const char* error = dlerror();
      open_error = std::string(error != nullptr ? error : "libcudnn.so.9 not found") +
                   " (put cuDNN 9's lib directory on LD_LIBRARY_PATH, e.g. pip's nvidia/cudnn/lib)";
    }
  });
  if (why != nullptr) *why = open_error;
  return fe::cudnn_dlhandle != nullptr;
}

int64_t CudnnAttention::workspace_bytes() const { return impl_->workspace; }

std::string CudnnAttention::Describe() const {
  const size_t v = impl_->version;
  return absl::StrFormat("cuDNN %d.%d.%d fused attention", v / 10000, v / 100 % 100, v % 100);
}

absl::Status CudnnAttention::Forward(Bf16* out, float* stats, const Bf16* q, const Bf16* k, const Bf16* v,
                                     void* workspace, cudaStream_t stream) {
  if (fe::detail::set_stream(impl_->handle, stream) != CUDNN_STATUS_SUCCESS) {
    return absl::InternalError("cuDNN attention: cudnnSetStream failed");
  }
  Pack pack = ForwardPack(out, stats, q, k, v);
  try {  // the dynamic-loading shim throws for a symbol it cannot find
    if (auto e = impl_->forward->execute(impl_->handle, pack, workspace); e.is_bad()) {
      return absl::InternalError(std::string("cuDNN attention forward: ") + e.get_message());
    }
  } catch (const std::exception& e) {
    return absl::InternalError(std::string("cuDNN attention forward: ") + e.what());
  }
  return absl::OkStatus();
}

absl::Status CudnnAttention::Backward(Bf16* dq, Bf16* dk, Bf16* dv, const Bf16* dout, const Bf16* out,
                                      const float* stats, const Bf16* q, const Bf16* k, const Bf16* v,
                                      void* workspace, cudaStream_t stream) {
  if (fe::detail::set_stream(impl_->handle, stream) != CUDNN_STATUS_SUCCESS) {
    return absl::InternalError("cuDNN attention: cudnnSetStream failed");
  }
  Pack pack = BackwardPack(dq, dk, dv, dout, out, stats, q, k, v);
  try {
    if (auto e = impl_->backward->execute(impl_->handle, pack, workspace); e.is_bad()) {
      return absl::InternalError(std::string("cuDNN attention backward: ") + e.get_message());
    }
  } catch (const std::exception& e) {
    return absl::InternalError(std::string("cuDNN attention backward: ") + e.what());
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> CudnnAttention::Autotune(Bf16* out, float* stats, Bf16* dq, Bf16* dk, Bf16* dv,
                                                     const Bf16* dout, const Bf16* q, const Bf16* k, const Bf16* v,
                                                     void* workspace, cudaStream_t stream) {
  if (fe::detail::set_stream(impl_->handle, stream) != CUDNN_STATUS_SUCCESS) {
    return absl::InternalError("cuDNN attention: cudnnSetStream failed");
  }
  Pack forward = ForwardPack(out, stats, q, k, v);
  Pack backward = BackwardPack(dq, dk, dv, dout, out, stats, q, k, v);
  std::string said;
  try {
    for (auto [graph, pack, which] : {std::tuple{impl_->forward.get(), &forward, "forward"},
                                      std::tuple{impl_->backward.get(), &backward, "backward"}}) {
      if (auto e = graph->autotune(impl_->handle, *pack, workspace); e.is_bad()) {
        return absl::InternalError(absl::StrFormat("cuDNN attention %s autotune: %s", which, e.get_message()));
      }
      said += absl::StrFormat("%s%s: %d plans", said.empty() ? "" : "; ", which, graph->get_execution_plan_count());
    }
  } catch (const std::exception& e) {
    return absl::InternalError(std::string("cuDNN attention autotune: ") + e.what());
  }
  return said + "; chosen " + PlanNames();
}

std::string CudnnAttention::PlanNames() const {
  std::string names[2];
  for (int i = 0; i < 2; ++i) {
    fe::graph::Graph* graph = i == 0 ? impl_->forward.get() : impl_->backward.get();
    if (graph->get_plan_name(names[i]).is_bad()) names[i] = "?";
  }
  return "forward: " + names[0] + "; backward: " + names[1];
}

}  // namespace tierd::trainer::gpu
