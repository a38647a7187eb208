#include "tools/kernel_profile/gaps.h"

#include <cstddef>

namespace tierd::tools {

int GapBucket(uint64_t gap_ns) {
  int b = 0;
  while (gap_ns >= kGapBounds[b]) ++b;
  return b;
}

GapTable SplitGaps(const std::vector<KernelRun>& runs, const std::map<uint32_t, uint64_t>& call_end) {
  GapTable t;
  for (std::size_t i = 1; i < runs.size(); ++i) {
    if (runs[i].start <= runs[i - 1].end) continue;
    const uint64_t gap = runs[i].start - runs[i - 1].end;
    const int b = GapBucket(gap);
    t.ns[b] += gap;
    ++t.count[b];
    const auto call = call_end.find(runs[i].correlation);
    if (call == call_end.end()) continue;
    ++t.known;
    if (call->second < runs[i - 1].end) continue;  // queued before the stream went idle
    t.late_ns[b] += gap;
    ++t.late_count[b];
  }
  return t;
}

}  // namespace tierd::tools
