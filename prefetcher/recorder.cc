#include "prefetcher/recorder.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_format.h"

namespace tierd::prefetcher {

bool IterationRecorder::BeginsOp() {
  const bool begins = after_release_;
  after_release_ = false;
  return begins;
}

void IterationRecorder::Mark(int64_t nanos) {
  after_release_ = true;
  switch (phase_) {
    case Phase::kWaiting:
      phase_ = Phase::kRecording;
      break;
    case Phase::kRecording:
      end_nanos_ = nanos;
      phase_ = Phase::kFollowing;
      next_op_ = 0;
      break;
    case Phase::kFollowing:
      next_op_ = 0;
      break;
  }
}

std::optional<uint32_t> IterationRecorder::Acquired(uint64_t tensor, Access touch, bool host, int64_t nanos) {
  const bool begins = BeginsOp();
  if (phase_ == Phase::kFollowing) {
    if (!begins || ops_.empty()) return std::nullopt;
    const uint32_t op = next_op_;
    next_op_ = (next_op_ + 1) % static_cast<uint32_t>(ops_.size());
    return op;
  }
  if (phase_ != Phase::kRecording) return std::nullopt;
  (host ? host_seen_ : gpu_seen_) = true;
  if (begins || ops_.empty()) ops_.push_back({nanos, {}});
  auto& touched = ops_.back().touched;
  for (auto& seen : touched) {
    if (seen.tensor != tensor) continue;
    // Acquired again within the op: the old value is needed if either acquire read it,
    // unless the op's first acquire already overwrote it.
    if (seen.touch != Access::kOverwrite && touch != Access::kRead) seen.touch = Access::kWrite;
    return std::nullopt;
  }
  touched.push_back({tensor, touch, host});
  return std::nullopt;
}

void IterationRecorder::Released(uint64_t) { after_release_ = true; }

absl::StatusOr<Graph> IterationRecorder::MakeGraph(
    const std::function<std::optional<TensorInfo>(uint64_t)>& describe) const {
  if (phase_ != Phase::kFollowing) {
    return absl::FailedPreconditionError("the iteration is not recorded yet: mark its start and its end");
  }
  if (ops_.empty()) {
    return absl::FailedPreconditionError(
        "the recorded iteration acquired nothing between its two marks: there is nothing to plan");
  }
  Graph graph;
  graph.host = host_seen_ && !gpu_seen_;
  std::map<uint64_t, TensorIndex> index;
  for (size_t i = 0; i < ops_.size(); ++i) {
    const RecordedOp& recorded = ops_[i];
    const int64_t end = i + 1 < ops_.size() ? ops_[i + 1].start_nanos : end_nanos_;
    GraphOp op;
    op.seconds = std::max<int64_t>(end - recorded.start_nanos, 0) / 1e9;
    std::string names;
    for (const auto& [id, touch, host] : recorded.touched) {
      auto it = index.find(id);
      if (it == index.end()) {
        const std::optional<TensorInfo> info = describe(id);
        if (!info.has_value() || info->bytes == 0) continue;
        it = index.emplace(id, static_cast<TensorIndex>(graph.tensors.size())).first;
        graph.tensors.push_back({info->name, info->bytes, false});
      }
      if (host && !graph.host) {
        // On the host in a GPU session: a host use, on the DRAM copy.
        (touch == Access::kRead    ? op.host_reads
         : touch == Access::kWrite ? op.host_writes
                                   : op.host_overwrites)
            .push_back(it->second);
      } else {
        (touch == Access::kRead ? op.reads : touch == Access::kWrite ? op.writes : op.overwrites).push_back(it->second);
      }
      if (names.size() < 48) names += (names.empty() ? "" : ",") + graph.tensors[it->second].name;
    }
    op.name = absl::StrFormat("recorded.%d(%s)", i, names);
    graph.ops.push_back(std::move(op));
  }
  if (graph.tensors.empty()) {
    return absl::FailedPreconditionError("none of the recorded tensors is leased any more: there is nothing to plan");
  }
  if (absl::Status valid = ValidateGraph(graph); !valid.ok()) return valid;
  return graph;
}

}  // namespace tierd::prefetcher
