// The CPU trainer's state record (Trainer::SaveState): its header, read by the trainer to
// resume and by tierd-train export to take the parameters out. Little-endian:
//   u32 magic ("trs4"; "trs3": one process, no data-parallel block), i64 step, i64 batches
//   drawn, u64 parameter count, u32 moments' format, [u32 ranks, u32 rank, u32 sync flags],
// then the parameters (fp32, ParamLayout order; with ZeRO-3 this rank's slices), the moments
// and the residuals.
#ifndef TIERD_TRAINER_REF_TRAINER_STATE_FORMAT_H_
#define TIERD_TRAINER_REF_TRAINER_STATE_FORMAT_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace tierd::trainer {

inline constexpr uint32_t kStateMagic = 0x74727334;    // "trs4": + the data-parallel layout
inline constexpr uint32_t kStateMagicV3 = 0x74727333;  // "trs3": one process, no residuals
// The sync flags' ZeRO-3 bit (Trainer::DpFlags).
inline constexpr uint32_t kStateZero3 = 4;

struct TrainerStateHeader {
  uint32_t magic = 0;
  int64_t step = 0, drawn = 0;
  uint64_t count = 0;
  uint32_t format = 0;
  uint32_t dp[3] = {1, 0, 0};  // ranks, rank, sync flags (a "trs3" state: one process)
  size_t bytes = 0;            // where the parameters start
};

// INVALID_ARGUMENT for a record that is not a trainer state or is cut in its header.
absl::StatusOr<TrainerStateHeader> ReadTrainerStateHeader(const std::string& state);

}  // namespace tierd::trainer

#endif  // TIERD_TRAINER_REF_TRAINER_STATE_FORMAT_H_
