// A timeline as Chrome/Perfetto trace JSON (open in ui.perfetto.dev or chrome://tracing):
// ops on the compute track, moves on one track per link, so overlap shows at a glance.
#ifndef TIERD_PREFETCHER_CHROME_TRACE_H_
#define TIERD_PREFETCHER_CHROME_TRACE_H_

#include <string>
#include <vector>

#include "prefetcher/simulate.h"

namespace tierd::prefetcher {

std::string ChromeTraceJson(const std::vector<TimelineEvent>& timeline, const std::string& process_name);

}  // namespace tierd::prefetcher

#endif  // TIERD_PREFETCHER_CHROME_TRACE_H_
