// Crash-safe checkpoints: the trainer's state in DIR/ckpt-<step>.bin, written to a temporary
// file, fsync'ed, renamed into place and the directory fsync'ed, so a crash leaves either the
// old checkpoint or the new one, never half of one.
//
// A checkpoint is a sequence of named records written as the state is read, so a state far
// larger than memory (a 7B model's is ~100 GB, spread over GPU, DRAM and NVMe tiers) streams
// to disk piece by piece. File layout (little-endian):
//   "trkcpt02"                                   8-byte magic
//   per record: u32 name length, name, u64 data length, data, u32 CRC32C of all four
//   "end" record: data = u64 count of the records before it
// A file without its end record was cut short; a record whose checksum fails is damaged:
// both are refused (DATA_LOSS), and resume takes the newest checkpoint that verifies.
#ifndef TIERD_TRAINER_REF_CHECKPOINT_H_
#define TIERD_TRAINER_REF_CHECKPOINT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tierd::trainer {

// Writes one checkpoint. Records are written whole (Append) or in pieces (BeginRecord, Write
// until the announced length, EndRecord). Errors carry the path and errno's text (a full
// disk is RESOURCE_EXHAUSTED and says so). Dropped without Commit, the temporary file goes
// and the checkpoints already in the directory are untouched. Not thread-safe.
class CheckpointWriter {
 public:
  static absl::StatusOr<std::unique_ptr<CheckpointWriter>> Create(const std::string& dir, int64_t step);
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  absl::Status Append(absl::string_view name, const void* data, uint64_t bytes);
  absl::Status BeginRecord(absl::string_view name, uint64_t bytes);
  absl::Status Write(const void* data, uint64_t bytes);
  absl::Status EndRecord();
  // Ends the file, syncs it and renames it into place; returns its path.
  absl::StatusOr<std::string> Commit();
  uint64_t bytes_written() const { return offset_; }

 private:
  CheckpointWriter(std::string dir, std::string path, int fd);
  absl::Status Raw(const void* data, uint64_t bytes);

  std::string dir_, path_, tmp_;
  int fd_ = -1;
  uint64_t offset_ = 0, records_ = 0;
  bool in_record_ = false;
  uint64_t record_left_ = 0;
  uint32_t crc_ = 0;
  absl::Status failed_;  // the first error: later calls return it
};

// Reads one checkpoint record by record, in the order written; each record's checksum is
// verified at its end. Not thread-safe.
class CheckpointReader {
 public:
  // NOT_FOUND for a missing file; DATA_LOSS for one that is not a checkpoint.
  static absl::StatusOr<std::unique_ptr<CheckpointReader>> Open(const std::string& path);
  ~CheckpointReader();
  CheckpointReader(const CheckpointReader&) = delete;
  CheckpointReader& operator=(const CheckpointReader&) = delete;

  // The next record's name and length, without reading its data.
  absl::StatusOr<std::pair<std::string, uint64_t>> Peek();
  // The next record must be `name` of `bytes` (INVALID_ARGUMENT otherwise, saying what is
  // there instead): read whole, or begun and read in pieces.
  absl::Status Read(absl::string_view name, void* data, uint64_t bytes);
  absl::StatusOr<std::string> ReadString(absl::string_view name);
  absl::Status BeginRecord(absl::string_view name, uint64_t bytes);
  absl::Status ReadPiece(void* data, uint64_t bytes);
  absl::Status EndRecord();  // DATA_LOSS when the checksum fails
  const std::string& path() const { return path_; }

 private:
  CheckpointReader(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  absl::Status Raw(void* data, uint64_t bytes);
  absl::Status ReadHeader();

  std::string path_;
  int fd_ = -1;
  bool have_header_ = false, in_record_ = false;
  std::string name_;
  uint64_t length_ = 0, left_ = 0;
  uint32_t crc_ = 0;
};

// Streams the whole file through its checksums in constant memory: OK, or DATA_LOSS / NOT_FOUND
// saying what is wrong.
absl::Status VerifyCheckpoint(const std::string& path);

// The simple form for a state that fits in memory: one record, "state".
absl::StatusOr<std::string> WriteCheckpoint(const std::string& dir, int64_t step, const std::string& payload);
absl::StatusOr<std::string> ReadCheckpoint(const std::string& path);

// The newest checkpoint in `dir` that verifies (older ones are tried when the newest is
// damaged; what was skipped is said in `*skipped`). NOT_FOUND when there is none.
absl::StatusOr<std::string> LatestCheckpoint(const std::string& dir, std::string* skipped = nullptr);
// The checkpoint files in `dir`, newest first.
std::vector<std::string> ListCheckpoints(const std::string& dir);
// Removes all but the newest `keep` checkpoints (and temporary files of crashed writes).
void PruneCheckpoints(const std::string& dir, int keep);

}  // namespace tierd::trainer

#endif  // TIERD_TRAINER_REF_CHECKPOINT_H_
