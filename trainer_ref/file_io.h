// Whole small files in and out (configs, indexes, held-out windows), the trainer's way: a file
// is read whole or refused saying why; a file is written aside (PATH.partial), synced and
// renamed, so a crash or a full disk leaves the old file or the new one, never half of one.
#ifndef TIERD_TRAINER_REF_FILE_IO_H_
#define TIERD_TRAINER_REF_FILE_IO_H_

#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace tierd::trainer {

// NOT_FOUND (with errno's words) for a file that cannot be opened; DATA_LOSS for a short read.
absl::StatusOr<std::string> ReadWholeFile(const std::string& path);

// PERMISSION_DENIED when PATH.partial cannot be made; RESOURCE_EXHAUSTED (the disk full) when
// it cannot be written, synced or renamed: then nothing is left of it.
absl::Status WriteFileAside(const std::string& path, std::string_view bytes);

}  // namespace tierd::trainer

#endif  // TIERD_TRAINER_REF_FILE_IO_H_
