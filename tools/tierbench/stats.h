// Small statistics shared by tierbench's measurements.
#ifndef TIERD_TOOLS_TIERBENCH_STATS_H_
#define TIERD_TOOLS_TIERBENCH_STATS_H_

#include <algorithm>
#include <vector>

namespace tierd::bench {

// The median (the upper one for an even count). `values` must not be empty.
inline double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

}  // namespace tierd::bench

#endif  // TIERD_TOOLS_TIERBENCH_STATS_H_
