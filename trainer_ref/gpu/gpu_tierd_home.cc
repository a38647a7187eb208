#include "trainer_ref/gpu/gpu_tierd_home.h"

#include "absl/strings/str_format.h"
#include "base/units.h"
#include "clients/graph_spec.h"

namespace tierd::trainer::gpu {
namespace {

TensorClass ClassOf(Part part) {
  switch (part) {
    case Part::kWeights:
    case Part::kWeightCodes:
    case Part::kMaster:
      return TensorClass::kParam;
    case Part::kGrads:
      return TensorClass::kGrad;
    case Part::kAdamM:
    case Part::kAdamV:
      return TensorClass::kOptState;
    case Part::kActs:
      return TensorClass::kActivation;
  }
  return TensorClass::kScratch;
}

class TierdGpuHome final : public GpuHome {
 public:
  std::string HotPathNote() override {
    const Client::RingTimes t = client_->ring_times();
    auto one = [](const char* name, int64_t n, double seconds) {
      return absl::StrFormat("%s %d x %.1f us", name, n, n > 0 ? seconds / n * 1e6 : 0.0);
    };
    return one("acquire", t.acquires, t.acquire_seconds) + ", " + one("release", t.releases, t.release_seconds) +
           absl::StrFormat(" (+ %.1f us recording its event)",
                           t.releases > 0 ? t.event_record_seconds / t.releases * 1e6 : 0.0) +
           ", " + one("op begin", t.op_begins, t.op_begin_seconds);
  }
  absl::Status Init(const GpuHomeLayout& layout, const ClientOptions& options) {
    auto client = Client::Connect(options);
    if (!client.ok()) return client.status();
    client_ = std::move(*client);
    quota_ = options.quota.gpu_bytes;
    layout_ = layout;
    tensors_.resize(layout.groups.size());
    for (size_t g = 0; g < layout.groups.size(); ++g) {
      for (int k = 0; k < kParts; ++k) {
        if (layout.bytes[g][k] == 0) continue;
        const Part part = static_cast<Part>(k);
        const int group = static_cast<int>(g);
        for (int c = 0; c < layout.Chunks(group, part); ++c) {
          auto lease = client_->Lease({PartName(layout, group, part, c),
                                       ClassOf(part),
                                       DType::kU8,
                                       {static_cast<int64_t>(layout.Chunk(group, part, c).bytes)}});
          if (!lease.ok()) return lease.status();
          tensors_[g][k].push_back(*lease);
        }
      }
    }
    if (client_->fake_gpu()) {
      return absl::FailedPreconditionError(
          "the tierd at " + options.runtime_dir +
          " has a fake GPU (started with --gpu=fake or without CUDA): the GPU trainer needs it on the real one "
          "(--gpu=cuda)");
    }
    return absl::OkStatus();
  }
  const GpuHomeLayout& layout() const override { return layout_; }
  absl::StatusOr<void*> Acquire(int group, Part part, int chunk, Access access) override {
    return client_->Acquire(tensors_[group][static_cast<int>(part)].at(chunk), access, Place::kGpu);
  }
  absl::Status Release(int group, Part part, int chunk, cudaStream_t stream) override {
    return client_->Release(tensors_[group][static_cast<int>(part)].at(chunk), stream);
  }
  bool HasHostTier() const override { return true; }
  absl::StatusOr<void*> AcquireHost(int group, Part part, int chunk, Access access) override {
    return client_->Acquire(tensors_[group][static_cast<int>(part)].at(chunk), access, Place::kHost);
  }
  absl::Status ReleaseHost(int group, Part part, int chunk) override {
    return client_->Release(tensors_[group][static_cast<int>(part)].at(chunk));
  }
  absl::StatusOr<std::string> RegisterGraph(const prefetcher::Graph& graph) override {
    auto reply = client_->RegisterGraph(ToGraphSpec(graph));
    if (!reply.ok()) return reply.status();
    return absl::StrFormat("planned %d ops: predicted %.3f s a step, %.3f s of it waiting for moves", graph.ops.size(),
                           reply->predicted_step_seconds(), reply->predicted_stall_seconds());
  }
  absl::Status OpBegin(uint32_t op) override { return client_->OpBegin(op); }
  absl::Status ReportStep(int64_t step, double loss, double seconds, double tokens) override {
    return client_->ReportStep(step, loss, seconds, tokens);
  }
  uint64_t OwnDeviceBytes() const override { return 0; }
  absl::StatusOr<Traffic> Moved() override {
    auto stats = client_->Stats();
    if (!stats.ok()) return stats.status();
    Traffic t;
    for (const auto& link : stats->links()) {
      if (link.link() == "dram->gpu") {
        t.host_to_gpu = link.bytes();
        t.host_to_gpu_busy = link.busy_seconds();
      }
      if (link.link() == "gpu->dram") {
        t.gpu_to_host = link.bytes();
        t.gpu_to_host_busy = link.busy_seconds();
      }
      if (link.link() == "nvme->dram") t.nvme_read = link.bytes();
      if (link.link() == "dram->nvme") t.nvme_write = link.bytes();
    }
    for (const auto& tier : stats->tiers()) {
      if (tier.tier() == v1::TIER_GPU) t.gpu_peak = tier.peak_used_bytes();
    }
    t.gpu_quota = quota_;
    t.demand_fetches = stats->stalls();
    return t;
  }
  absl::StatusOr<uint64_t> TakeGpuPeak() override {
    auto usage = client_->Usage(/*reset_peaks=*/true);
    if (!usage.ok()) return usage.status();
    for (const auto& tier : usage->tiers()) {
      if (tier.tier() == v1::TIER_GPU) return tier.peak_bytes();
    }
    return absl::InternalError("tierd's usage reply has no GPU tier");
  }
  std::string Describe() override {
    auto t = Moved();
    if (!t.ok()) return "tierd: " + std::string(t.status().message());
    return absl::StrFormat(
        "tierd: dram->gpu %s, gpu->dram %s, nvme->dram %s, dram->nvme %s; GPU tier peak %s of %s; "
        "%d demand fetches",
        FormatBytes(t->host_to_gpu), FormatBytes(t->gpu_to_host), FormatBytes(t->nvme_read), FormatBytes(t->nvme_write),
        FormatBytes(t->gpu_peak), FormatBytes(t->gpu_quota), t->demand_fetches);
  }

 private:
  std::unique_ptr<Client> client_;
  GpuHomeLayout layout_;
  std::vector<std::array<std::vector<Client::Tensor>, kParts>> tensors_;  // group -> part -> chunks
  uint64_t quota_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<GpuHome>> MakeTierdGpuHome(const GpuHomeLayout& layout, const ClientOptions& options) {
  auto home = std::make_unique<TierdGpuHome>();
  if (absl::Status s = home->Init(layout, options); !s.ok()) return s;
  return home;
}

}  // namespace tierd::trainer::gpu
