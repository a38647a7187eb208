// PlannedSession's reports: the prediction next to what was observed, the graph as planned,
// why a tensor is where it is, and the recorded timeline (tierctl plan|trace --session).
#include <algorithm>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "base/units.h"
#include "prefetcher/chrome_trace.h"
#include "prefetcher/explain.h"
#include "prefetcher/graph_file.h"
#include "server/planned_session.h"

namespace tierd {

namespace tp = prefetcher;

std::string PlannedSession::Summary() const {
  const tp::ExecutorStats seen = executor_->Stats();
  tp::SimResult p;
  tp::LinkModel links;
  tp::LowerBound bound;
  tp::Budgets planned_under;
  std::string style;
  uint64_t reserve = 0;
  int replans = 0;
  {
    std::lock_guard<std::mutex> lock(prediction_->mutex);
    p = prediction_->sim;
    links = prediction_->links;
    bound = prediction_->bound;
    planned_under = prediction_->planned_under;
    style = prediction_->style;
    reserve = prediction_->reserve_bytes;
    replans = prediction_->replans;
  }
  std::string out = absl::StrFormat(
      "predicted per iteration: %.3f s (compute %.3f s, stall %.3f s); moves DRAM->GPU %s, GPU->DRAM %s, NVMe read %s, "
      "NVMe write %s; GPU reserve for prefetches %s; %s\n",
      p.step_seconds, p.compute_seconds, p.stall_seconds, FormatBytes(p.h2d_bytes), FormatBytes(p.d2h_bytes),
      FormatBytes(p.nvme_read_bytes), FormatBytes(p.nvme_write_bytes), FormatBytes(reserve), style);
  out += absl::StrFormat("links assumed: DRAM->GPU %.1f GB/s, GPU->DRAM %.1f, NVMe read %.2f, NVMe write %.2f; %s\n",
                         links.h2d_bytes_per_s / 1e9, links.d2h_bytes_per_s / 1e9, links.nvme_read_bytes_per_s / 1e9,
                         links.nvme_write_bytes_per_s / 1e9,
                         (replans == 0 ? std::string("the first plan")
                                       : absl::StrFormat("replanned %d time(s) at measured op times and links", replans)) +
                             (seen.replans_kept == 0
                                  ? std::string()
                                  : absl::StrFormat("; kept the plan in force at %d drift(s) (the latest: %s)",
                                                    seen.replans_kept, seen.last_kept)));
  // No plan of this graph on these links and tiers stalls less (prefetcher/simulate.h).
  out += absl::StrFormat("lower bound at the same op times and links, in the whole quotas: %.3f s a step (stall %.3f "
                         "s, bound by %s)%s\n",
                         bound.step_seconds, bound.stall_seconds, bound.bound_by,
                         bound.stall_seconds > 0
                             ? absl::StrFormat("; the plan's stall is %.3fx of it", p.stall_seconds / bound.stall_seconds)
                             : "");
  out += absl::StrFormat("planned under GPU %s and DRAM %s of the quotas (room kept for fragmentation)\n",
                         FormatBytes(planned_under.gpu), FormatBytes(planned_under.dram));
  out += absl::StrFormat("static layout: %s for at most %s live at once; the arena is %s: %s\n",
                         FormatBytes(layout_.size_bytes), FormatBytes(layout_.peak_live_bytes), FormatBytes(quota_),
                         layout_fits_ ? "planned tensors go to fixed offsets" : "too big, placement is online");
  if (settled_) {
    out += absl::StrFormat("settled into the layout at the start: %d copies moved to their offsets, %d (%s) out of the "
                           "GPU, their ranges laid out for others\n",
                           settled_->moved, settled_->demoted, FormatBytes(settled_->demoted_bytes));
  }
  if (settle_after_replan_ && replans > 0) {
    std::lock_guard<std::mutex> lock(laps_mutex_);
    out += absl::StrFormat("settled into the layout after %d replan(s): %d copies moved to their offsets, %d (%s) out "
                           "of the GPU\n",
                           replans, settled_after_replans_.moved, settled_after_replans_.demoted,
                           FormatBytes(settled_after_replans_.demoted_bytes));
  }
  out += absl::StrFormat(
      "observed: %d iteration(s), last %.3f s, mean %.3f s; %d loads (%d just in time: the client waited), %d late "
      "(fetched on demand), %d evictions, %d stages, %d push-downs, %d waits for room, %d refused, %d replan(s)\n",
      seen.laps, seen.last_lap_seconds, seen.mean_lap_seconds, seen.loads, seen.just_in_time, seen.late,
      seen.evictions, seen.stages, seen.push_downs, seen.waits, seen.errors, seen.replans);
  if (leases_ != nullptr) {
    // The top tier is the plan's GPU budget (DRAM for a host graph, one tier lower).
    const bool host = executor_->graph().host;
    if (auto usage = leases_->Usage(session_, /*reset_peaks=*/false); usage.ok()) {
      const auto& u = *usage;
      const std::string predicted =
          host ? absl::StrFormat("DRAM %s, NVMe %s", FormatBytes(p.peak_gpu_bytes), FormatBytes(p.peak_dram_bytes))
               : absl::StrFormat("GPU %s, DRAM %s, NVMe %s", FormatBytes(p.peak_gpu_bytes),
                                 FormatBytes(p.peak_dram_bytes), FormatBytes(p.peak_nvme_bytes));
      out += absl::StrFormat(
          "peaks: predicted %s; held at most (since the session opened or its client last reset them): GPU %s, DRAM "
          "%s, NVMe %s\n",
          predicted, FormatBytes(u[static_cast<int>(Tier::kGpu)].peak), FormatBytes(u[static_cast<int>(Tier::kDram)].peak),
          FormatBytes(u[static_cast<int>(Tier::kNvme)].peak));
    }
  }
  if (const LinkBytes lap = LastLapMoved(); lap != LinkBytes{}) {
    out += absl::StrFormat(
        "moved in the last lap (the daemon's links, every session): DRAM->GPU %s, GPU->DRAM %s, NVMe read %s, NVMe "
        "write %s\n",
        FormatBytes(lap[0]), FormatBytes(lap[1]), FormatBytes(lap[2]), FormatBytes(lap[3]));
  }
  out += absl::StrFormat("acquires that waited for their planned move instead of fetching on demand: %d (%d gave up)\n",
                         seen.awaited, seen.await_gave_up);
  if (!seen.last_gave_up.empty()) out += "the latest wait given up: " + seen.last_gave_up + "\n";
  const auto room_words = [](const RoomCounts& room) {
    return absl::StrFormat(
        "%d GPU->DRAM write-backs (%s), %d DRAM->NVMe (%s), %d copies dropped, %d NVMe copies of tensors held above "
        "dropped",
        room.to_dram, FormatBytes(room.to_dram_bytes), room.to_nvme, FormatBytes(room.to_nvme_bytes), room.dropped,
        room.nvme_dropped);
  };
  out += "the tiers' own moves for room (not planned; on the trace as \"for room\"): " + room_words(room_counts());
  if (const auto lap = LastLapRoom()) out += "; in the last whole lap: " + room_words(*lap);
  out += "\n";
  // Where the client waited most, against where the plan expected it to.
  std::vector<std::pair<double, uint32_t>> waits;
  for (const auto& [op, sum] : seen.waited_by_op) {
    if (sum.second > 0 && sum.first > 0) waits.push_back({sum.first / sum.second, op});
  }
  std::sort(waits.rbegin(), waits.rend());
  if (!waits.empty()) {
    double total = 0;
    for (const auto& w : waits) total += w.first;
    out += absl::StrFormat(
        "client waits in acquires, per lap after the first: %.3f s in %d op(s) (predicted stall %.3f s); most:", total,
        waits.size(), p.stall_seconds);
    const tp::Graph& graph = executor_->graph();
    for (size_t k = 0; k < waits.size() && k < 5; ++k) {
      const uint32_t op = waits[k].second;
      const double predicted = op < p.op_stall_seconds.size() ? p.op_stall_seconds[op] : 0;
      const auto jit = seen.just_in_time_by_op.find(op);
      out += absl::StrFormat(" %s %.3f s (predicted %.3f; %d loads for it issued just in time so far)",
                             graph.ops[op].name, waits[k].first, predicted,
                             jit == seen.just_in_time_by_op.end() ? 0 : jit->second);
      out += k + 1 < waits.size() && k < 4 ? ";" : "\n";
    }
  }
  if (!seen.last_error.empty()) out += "last refused move: " + seen.last_error + "\n";
  return out;
}

std::string PlannedSession::GraphYaml() const {
  std::lock_guard<std::mutex> lock(prediction_->mutex);
  const tp::LinkModel& l = prediction_->links;
  return absl::StrFormat(
             "# the graph of the plan in force (%s), on links DRAM->GPU %.2f GB/s, GPU->DRAM %.2f, NVMe read %.2f, "
             "write %.2f\n# offline: tierctl plan --graph FILE --h2d_gbps=%.2f --d2h_gbps=%.2f --nvme_gbps=%.2f "
             "--nvme_write_gbps=%.2f --simulate (the daemon plans under its quotas less some headroom)\n",
             prediction_->replans == 0 ? "as registered" : "at measured op times", l.h2d_bytes_per_s / 1e9,
             l.d2h_bytes_per_s / 1e9, l.nvme_read_bytes_per_s / 1e9, l.nvme_write_bytes_per_s / 1e9,
             l.h2d_bytes_per_s / 1e9, l.d2h_bytes_per_s / 1e9, l.nvme_read_bytes_per_s / 1e9,
             l.nvme_write_bytes_per_s / 1e9) +
         tp::GraphToYaml(prediction_->graph);
}

absl::StatusOr<std::string> PlannedSession::Explain(const std::string& name) const {
  return tp::ExplainTensor(executor_->graph(), executor_->CurrentPlan(), name);
}

std::string PlannedSession::TraceJson() const {
  std::vector<tp::TimelineEvent> timeline = executor_->Timeline();
  // The tiers' own moves for room within the recorded laps, on their links' tracks, each
  // numbered as the op that was running when it started.
  std::vector<const tp::TimelineEvent*> ops;
  for (const tp::TimelineEvent& e : timeline) {
    if (e.track == tp::Track::kCompute) ops.push_back(&e);
  }
  std::sort(ops.begin(), ops.end(), [](const auto* a, const auto* b) { return a->start < b->start; });
  std::vector<RoomMove> moves;
  {
    std::lock_guard<std::mutex> lock(room_->mutex);
    moves = room_->latest;
  }
  std::vector<tp::TimelineEvent> for_room;  // apart: `ops` points into `timeline`
  for (const RoomMove& m : moves) {
    const double start = m.start_nanos * 1e-9, end = m.end_nanos * 1e-9;
    if (ops.empty() || end < ops.front()->start) continue;  // before the recorded laps
    auto after = std::upper_bound(ops.begin(), ops.end(), start,
                                  [](double t, const tp::TimelineEvent* e) { return t < e->start; });
    const tp::TimelineEvent* running = after == ops.begin() ? ops.front() : *(after - 1);
    for_room.push_back({m.from == Tier::kGpu ? tp::Track::kD2H : tp::Track::kNvme, "write-back for room " + m.name,
                        start, std::max(end, start), m.bytes, running->iteration, running->op});
  }
  timeline.insert(timeline.end(), for_room.begin(), for_room.end());
  return tp::ChromeTraceJson(timeline, "tierd session (recorded)");
}

}  // namespace tierd
