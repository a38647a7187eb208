// "Why is this tensor where it is": for one tensor, what the plan does with it at every op
// where something happens, and the reason in the planner's own terms.
#ifndef TIERD_PREFETCHER_EXPLAIN_H_
#define TIERD_PREFETCHER_EXPLAIN_H_

#include <string>

#include "absl/status/statusor.h"
#include "prefetcher/graph.h"
#include "prefetcher/simulate.h"

namespace tierd::prefetcher {

// NOT_FOUND naming near matches when the graph has no tensor of that name.
absl::StatusOr<std::string> ExplainTensor(const Graph& graph, const Plan& plan, const std::string& name);

}  // namespace tierd::prefetcher

#endif  // TIERD_PREFETCHER_EXPLAIN_H_
