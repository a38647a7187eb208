// Crash-safe checkpoints: the trainer's state in DIR/ckpt-<step>.bin, written to a temporary
// file, fsync'ed, renamed into place and the directory fsync'ed, so a crash leaves either the
// old checkpoint or the new one, never half of one. Each file carries its length and a
// CRC32C of its payload; a damaged file is refused (DATA_LOSS) and resume takes the newest
// one that verifies.
#ifndef TIERD_TRAINER_REF_CHECKPOINT_H_
#define TIERD_TRAINER_REF_CHECKPOINT_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"

namespace tierd::trainer {

// Returns the path written. Errors carry the path and errno's text (a full disk says so).
absl::StatusOr<std::string> WriteCheckpoint(const std::string& dir, int64_t step, const std::string& payload);
// DATA_LOSS for a bad magic, length or checksum; NOT_FOUND for a missing file.
absl::StatusOr<std::string> ReadCheckpoint(const std::string& path);
// The newest checkpoint in `dir` that verifies (older ones are tried when the newest is
// damaged; what was skipped is said in `*skipped`). NOT_FOUND when there is none.
absl::StatusOr<std::string> LatestCheckpoint(const std::string& dir, std::string* skipped = nullptr);

}  // namespace tierd::trainer

#endif  // TIERD_TRAINER_REF_CHECKPOINT_H_
