#include "trainer_ref/home/tierd_home.h"

#include "absl/strings/str_format.h"
#include "base/units.h"
#include "clients/graph_spec.h"

namespace tierd::trainer {
namespace {

class TierdHome final : public Home {
 public:
  TierdHome(HomeTable table, uint64_t gpu_quota) : table_(std::move(table)), gpu_quota_(gpu_quota) {}
  absl::Status Init(const ClientOptions& options) {
    auto client = Client::Connect(options);
    if (!client.ok()) return client.status();
    client_ = std::move(*client);
    for (const HomeTensor& t : table_) {
      auto lease = client_->Lease({t.name, t.cls, DType::kU8, {static_cast<int64_t>(t.bytes)}});
      if (!lease.ok()) return lease.status();
      tensors_.push_back(*lease);
    }
    return absl::OkStatus();
  }
  const HomeTable& table() const override { return table_; }
  bool Holds(Place place) const override { return place == Place::kHost || !client_->fake_gpu(); }
  absl::StatusOr<void*> Acquire(size_t index, Access access, Place place) override {
    return client_->Acquire(tensors_.at(index), access, place);
  }
  absl::Status Release(size_t index, void* stream) override {
    return stream == nullptr ? client_->Release(tensors_.at(index)) : client_->Release(tensors_.at(index), stream);
  }
  absl::StatusOr<std::string> RegisterGraph(const prefetcher::Graph& graph) override {
    auto reply = client_->RegisterGraph(ToGraphSpec(graph));
    if (!reply.ok()) return reply.status();
    return absl::StrFormat(
        "planned %d ops: predicted %.3f s a step, %.3f s of it waiting for moves; %s brought in, %s sent out a step",
        graph.ops.size(), reply->predicted_step_seconds(), reply->predicted_stall_seconds(),
        FormatBytes(reply->predicted_h2d_bytes()), FormatBytes(reply->predicted_d2h_bytes()));
  }
  absl::Status OpBegin(uint32_t op) override { return client_->OpBegin(op); }
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
  absl::Status ReportStep(int64_t step, double loss, double seconds, double tokens) override {
    return client_->ReportStep(step, loss, seconds, tokens);
  }
  absl::StatusOr<HomeTraffic> Moved() override {
    auto stats = client_->Stats();
    if (!stats.ok()) return stats.status();
    HomeTraffic t;
    for (const auto& link : stats->links()) {
      t.all_links += link.bytes();
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
      const uint64_t peak = tier.peak_used_bytes();
      (tier.tier() == v1::TIER_GPU ? t.gpu_peak : tier.tier() == v1::TIER_DRAM ? t.dram_peak : t.nvme_peak) = peak;
    }
    t.gpu_quota = gpu_quota_;
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
        "tierd: dram->gpu %s, gpu->dram %s, nvme->dram %s, dram->nvme %s; peak GPU tier %s of %s, DRAM %s, NVMe %s; "
        "%d demand fetches",
        FormatBytes(t->host_to_gpu), FormatBytes(t->gpu_to_host), FormatBytes(t->nvme_read), FormatBytes(t->nvme_write),
        FormatBytes(t->gpu_peak), FormatBytes(t->gpu_quota), FormatBytes(t->dram_peak), FormatBytes(t->nvme_peak),
        t->demand_fetches);
  }
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

 private:
  HomeTable table_;
  uint64_t gpu_quota_ = 0;
  std::unique_ptr<Client> client_;
  std::vector<Client::Tensor> tensors_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Home>> MakeTierdHome(HomeTable table, const ClientOptions& options) {
  auto home = std::make_unique<TierdHome>(std::move(table), options.quota.gpu_bytes);
  if (absl::Status s = home->Init(options); !s.ok()) return s;
  return std::unique_ptr<Home>(std::move(home));
}

}  // namespace tierd::trainer
