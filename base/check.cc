#include "base/check.h"

#include <cstdio>
#include <cstdlib>

namespace tierd::internal {

void CheckFailed(const char* file, int line, const char* condition, const char* detail) {
  std::fprintf(stderr, "tierd: invariant broken at %s:%d: %s%s%s\n", file, line, condition,
               detail ? ": " : "", detail ? detail : "");
  std::fflush(stderr);
  std::abort();
}

}  // namespace tierd::internal
