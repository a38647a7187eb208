// The daemon's config file (YAML), parsed into DaemonOptions. Annotated example:
// tools/tierd.example.yaml. Unknown keys are an error (a typo must not silently mean
// "default"), and every error names the key and the line.
#ifndef TIERD_RUNTIME_CONFIG_H_
#define TIERD_RUNTIME_CONFIG_H_

#include <string>

#include "absl/status/statusor.h"
#include "server/daemon.h"

namespace tierd {

absl::StatusOr<DaemonOptions> ParseConfig(const std::string& yaml_text);
absl::StatusOr<DaemonOptions> LoadConfig(const std::string& path);
// The effective options, in the config file's format (tierctl config).
std::string DescribeConfig(const DaemonOptions& options);

}  // namespace tierd

#endif  // TIERD_RUNTIME_CONFIG_H_
