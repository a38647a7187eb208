#include "trainer_ref/tensor_home.h"

#include "absl/strings/str_format.h"
#include "base/units.h"
#include "clients/client.h"
#include "clients/graph_spec.h"
#include "trainer_ref/adamw8bit.h"

namespace tierd::trainer {
namespace {

const char* const kPrefix[kKinds] = {"", "grad.", "opt.m.", "opt.v.", "", "ef."};

class PlainHome final : public TensorHome {
 public:
  explicit PlainHome(const HomeShape& shape) {
    for (int k = 0; k < kKinds; ++k) {
      for (const TensorLayout& t : shape.Of(Kind(k))) {
        buffers_[k].emplace_back((TensorBytes(t, Kind(k), shape.moments_8bit) + 3) / 4, 0.f);
      }
    }
  }
  absl::StatusOr<float*> Acquire(size_t entry, Kind kind, Access) override {
    return buffers_[static_cast<int>(kind)][entry].data();
  }
  absl::Status Release(size_t, Kind) override { return absl::OkStatus(); }
  std::string Describe() override { return "plain buffers (no offload)"; }
  uint64_t MovedBytes() override { return 0; }

 private:
  std::vector<std::vector<float>> buffers_[kKinds];
};

class TierdHome final : public TensorHome {
 public:
  absl::Status Init(const HomeShape& shape, const ClientOptions& options) {
    auto client = Client::Connect(options);
    if (!client.ok()) return client.status();
    client_ = std::move(*client);
    for (int k = 0; k < kKinds; ++k) {
      for (const TensorLayout& t : shape.Of(Kind(k))) {
        const TensorClass cls = k == 0             ? TensorClass::kParam
                                : k == 1 || k == 5 ? TensorClass::kGrad
                                : k == 4           ? TensorClass::kActivation
                                                   : TensorClass::kOptState;
        const bool bytes = shape.moments_8bit && (k == 2 || k == 3);
        TensorSpec spec{kPrefix[k] + t.name, cls, bytes ? DType::kU8 : DType::kF32,
                        {static_cast<int64_t>(bytes ? TensorBytes(t, Kind(k), true) : t.count)}};
        auto lease = client_->Lease(spec);
        if (!lease.ok()) return lease.status();
        tensors_[k].push_back(*lease);
      }
    }
    return absl::OkStatus();
  }
  absl::StatusOr<float*> Acquire(size_t entry, Kind kind, Access access) override {
    auto p = client_->Acquire(tensors_[static_cast<int>(kind)][entry], access, Place::kHost);
    if (!p.ok()) return p.status();
    return static_cast<float*>(*p);
  }
  absl::Status Release(size_t entry, Kind kind) override {
    return client_->Release(tensors_[static_cast<int>(kind)][entry]);
  }
  std::string Describe() override {
    auto stats = client_->Stats();
    if (!stats.ok()) return "tierd: " + std::string(stats.status().message());
    std::string out = "tierd:";
    for (const auto& link : stats->links()) {
      if (link.bytes() > 0) out += absl::StrFormat(" %s %s", link.link(), FormatBytes(link.bytes()));
    }
    out += absl::StrFormat(", %d demand fetches; peak", stats->stalls());
    for (const auto& tier : stats->tiers()) {
      out += absl::StrFormat(" %s %s", tier.tier() == v1::TIER_GPU ? "gpu" : tier.tier() == v1::TIER_DRAM ? "dram" : "nvme",
                             FormatBytes(tier.peak_used_bytes()));
    }
    return out;
  }
  absl::StatusOr<std::string> RegisterGraph(const prefetcher::Graph& graph) override {
    auto reply = client_->RegisterGraph(ToGraphSpec(graph));
    if (!reply.ok()) return reply.status();
    return absl::StrFormat("planned %d ops over DRAM and NVMe: predicted %.3f s a step, %.3f s of it waiting; "
                           "NVMe reads %s, writes %s a step",
                           graph.ops.size(), reply->predicted_step_seconds(), reply->predicted_stall_seconds(),
                           FormatBytes(reply->predicted_h2d_bytes()), FormatBytes(reply->predicted_d2h_bytes()));
  }
  absl::Status OpBegin(uint32_t op) override { return client_->OpBegin(op); }
  absl::Status ReportStep(int64_t step, double loss, double seconds, double tokens) override {
    return client_->ReportStep(step, loss, seconds, tokens);
  }
  absl::StatusOr<std::string> MarkIteration() override {
    auto reply = client_->MarkIteration();
    if (!reply.ok()) return reply.status();
    std::string first = reply->summary().substr(0, reply->summary().find('\n'));
    if (reply->predicted_step_seconds() > 0) {
      first += absl::StrFormat("; predicted %.3f s a step, %.3f s of it waiting", reply->predicted_step_seconds(),
                               reply->predicted_stall_seconds());
    }
    return first;
  }
  uint64_t MovedBytes() override {
    auto stats = client_->Stats();
    if (!stats.ok()) return 0;
    uint64_t total = 0;
    for (const auto& link : stats->links()) total += link.bytes();
    return total;
  }

 private:
  std::unique_ptr<Client> client_;
  std::vector<Client::Tensor> tensors_[kKinds];
};

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

std::unique_ptr<TensorHome> MakePlainHome(const HomeShape& shape) { return std::make_unique<PlainHome>(shape); }

absl::StatusOr<std::unique_ptr<TensorHome>> MakeTierdHome(const HomeShape& shape, const ClientOptions& options) {
  auto home = std::make_unique<TierdHome>();
  if (absl::Status s = home->Init(shape, options); !s.ok()) return s;
  return std::unique_ptr<TensorHome>(std::move(home));
}

}  // namespace tierd::trainer
