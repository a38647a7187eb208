// tierctl plan / tierctl trace: plan a training iteration offline (no daemon needed) from a
// graph file or a synthetic model preset, and show what it will cost, why a tensor is
// where it is, or the timeline as a Chrome/Perfetto trace.
#ifndef TIERD_TOOLS_TIERCTL_PLAN_CMD_H_
#define TIERD_TOOLS_TIERCTL_PLAN_CMD_H_

#include <string>
#include <vector>

namespace tierd {

// args: the words after "tierctl" ("plan" or "trace"); flags are already parsed.
int RunPlanCommand(const std::vector<std::string>& args);

}  // namespace tierd

#endif  // TIERD_TOOLS_TIERCTL_PLAN_CMD_H_
