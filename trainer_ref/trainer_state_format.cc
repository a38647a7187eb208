#include "trainer_ref/trainer_state_format.h"

#include <cstring>

namespace tierd::trainer {

absl::StatusOr<TrainerStateHeader> ReadTrainerStateHeader(const std::string& state) {
  TrainerStateHeader h;
  auto take = [&](void* p, size_t n) {
    if (h.bytes + n > state.size()) return false;
    std::memcpy(p, state.data() + h.bytes, n);
    h.bytes += n;
    return true;
  };
  if (!take(&h.magic, 4) || (h.magic != kStateMagic && h.magic != kStateMagicV3)) {
    return absl::InvalidArgumentError("not a trainer state (bad magic)");
  }
  if (!take(&h.step, 8) || !take(&h.drawn, 8) || !take(&h.count, 8) || !take(&h.format, 4) ||
      (h.magic == kStateMagic && !take(h.dp, sizeof(h.dp)))) {
    return absl::InvalidArgumentError("trainer state truncated in its header");
  }
  return h;
}

}  // namespace tierd::trainer
