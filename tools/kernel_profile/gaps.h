// A stream's idle gaps between kernels, by length, and which of them the host caused.
#ifndef TIERD_TOOLS_KERNEL_PROFILE_GAPS_H_
#define TIERD_TOOLS_KERNEL_PROFILE_GAPS_H_

#include <cstdint>
#include <map>
#include <vector>

namespace tierd::tools {

// A kernel on the stream: when it ran (ns) and the API call that launched it.
struct KernelRun {
  uint64_t start, end;
  uint32_t correlation;
};

// The buckets' upper bounds: < 2 us, 2-5 us, 5-20 us, 20-100 us, >= 100 us.
inline constexpr int kGapBuckets = 5;
inline constexpr uint64_t kGapBounds[kGapBuckets] = {2000, 5000, 20000, 100000, UINT64_MAX};
int GapBucket(uint64_t gap_ns);

struct GapTable {
  uint64_t ns[kGapBuckets] = {}, count[kGapBuckets] = {};
  // Of them, the gaps before a kernel whose launch call returned at or after the previous
  // kernel's end (the stream idle, waiting for the host).
  uint64_t late_ns[kGapBuckets] = {}, late_count[kGapBuckets] = {};
  uint64_t known = 0;  // gaps whose next kernel's launch call is in `call_end`
};

// `runs` in start order; `call_end`: when each launch call returned, by correlation id (empty:
// no host split). Overlapping kernels (another's start before one's end) leave no gap.
GapTable SplitGaps(const std::vector<KernelRun>& runs, const std::map<uint32_t, uint64_t>& call_end);

}  // namespace tierd::tools

#endif  // TIERD_TOOLS_KERNEL_PROFILE_GAPS_H_
