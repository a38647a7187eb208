#include "trainer_ref/checkpoint.h"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/str_format.h"
#include "base/crc32c.h"

namespace tierd::trainer {
namespace {

constexpr char kMagic[8] = {'t', 'r', 'k', 'c', 'p', 't', '0', '2'};
constexpr char kEnd[] = "end";
constexpr uint32_t kNameBytesMax = 4096;

absl::Status Errno(const std::string& what, const std::string& path) {
  return absl::InternalError(absl::StrFormat("%s '%s': %s", what, path, std::strerror(errno)));
}

bool IsCheckpointName(const std::string& name) {
  return name.rfind("ckpt-", 0) == 0 && name.size() > 9 && name.substr(name.size() - 4) == ".bin";
}

}  // namespace

CheckpointWriter::CheckpointWriter(std::string dir, std::string path, int fd)
    : dir_(std::move(dir)), path_(std::move(path)), tmp_(path_ + ".tmp"), fd_(fd) {}

CheckpointWriter::~CheckpointWriter() {
  if (fd_ >= 0) {
    close(fd_);
    unlink(tmp_.c_str());  // not committed: nothing half-written stays behind
  }
}

absl::StatusOr<std::unique_ptr<CheckpointWriter>> CheckpointWriter::Create(const std::string& dir, int64_t step) {
  const std::string path = absl::StrFormat("%s/ckpt-%08d.bin", dir, step);
  const std::string tmp = path + ".tmp";
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Errno("creating", tmp);
  std::unique_ptr<CheckpointWriter> writer(new CheckpointWriter(dir, path, fd));
  if (absl::Status s = writer->Raw(kMagic, sizeof(kMagic)); !s.ok()) return s;
  return writer;
}

absl::Status CheckpointWriter::Raw(const void* data, uint64_t bytes) {
  if (!failed_.ok()) return failed_;
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t w = write(fd_, p, std::min<uint64_t>(bytes, 1u << 30));
    if (w < 0) {
      if (errno == EINTR) continue;
      // Out of room (a full disk, a quota, a file-size limit): the run goes on from the
      // checkpoints already there, so say that they are untouched.
      failed_ = errno == ENOSPC || errno == EDQUOT || errno == EFBIG
                    ? absl::ResourceExhaustedError(absl::StrFormat(
                          "writing checkpoint '%s': no room after %d bytes (%s); the checkpoints already in %s are "
                          "untouched",
                          tmp_, offset_, std::strerror(errno), dir_))
                    : Errno("writing checkpoint", tmp_);
      return failed_;
    }
    p += w;
    bytes -= static_cast<uint64_t>(w);
    offset_ += static_cast<uint64_t>(w);
  }
  return absl::OkStatus();
}

absl::Status CheckpointWriter::BeginRecord(absl::string_view name, uint64_t bytes) {
  if (!failed_.ok()) return failed_;
  if (in_record_ || name.empty() || name.size() > kNameBytesMax) {
    return absl::FailedPreconditionError(absl::StrFormat("checkpoint record '%s' begun wrongly", name));
  }
  const uint32_t name_bytes = static_cast<uint32_t>(name.size());
  crc_ = Crc32c(0, &name_bytes, 4);
  crc_ = Crc32c(crc_, name.data(), name.size());
  crc_ = Crc32c(crc_, &bytes, 8);
  if (absl::Status s = Raw(&name_bytes, 4); !s.ok()) return s;
  if (absl::Status s = Raw(name.data(), name.size()); !s.ok()) return s;
  if (absl::Status s = Raw(&bytes, 8); !s.ok()) return s;
  in_record_ = true;
  record_left_ = bytes;
  return absl::OkStatus();
}

absl::Status CheckpointWriter::Write(const void* data, uint64_t bytes) {
  if (!in_record_ || bytes > record_left_) {
    return absl::FailedPreconditionError(absl::StrFormat("checkpoint: %d bytes written into a record with %d left",
                                                         bytes, in_record_ ? record_left_ : 0));
  }
  crc_ = Crc32c(crc_, data, bytes);
  record_left_ -= bytes;
  return Raw(data, bytes);
}

absl::Status CheckpointWriter::EndRecord() {
  if (!in_record_ || record_left_ != 0) {
    return absl::FailedPreconditionError(
        absl::StrFormat("checkpoint record ended with %d bytes unwritten", record_left_));
  }
  in_record_ = false;
  ++records_;
  return Raw(&crc_, 4);
}

absl::Status CheckpointWriter::Append(absl::string_view name, const void* data, uint64_t bytes) {
  if (absl::Status s = BeginRecord(name, bytes); !s.ok()) return s;
  if (absl::Status s = Write(data, bytes); !s.ok()) return s;
  return EndRecord();
}

absl::StatusOr<std::string> CheckpointWriter::Commit() {
  if (!failed_.ok()) return failed_;
  const uint64_t records = records_;
  if (absl::Status s = Append(kEnd, &records, 8); !s.ok()) return s;
  if (fsync(fd_) != 0) return Errno("syncing checkpoint", tmp_);
  close(fd_);
  fd_ = -1;
  if (rename(tmp_.c_str(), path_.c_str()) != 0) {
    const absl::Status s = Errno("renaming checkpoint into", path_);
    unlink(tmp_.c_str());
    return s;
  }
  const int dfd = open(dir_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    fsync(dfd);  // the rename itself survives a crash
    close(dfd);
  }
  return path_;
}

CheckpointReader::~CheckpointReader() {
  if (fd_ >= 0) close(fd_);
}

absl::StatusOr<std::unique_ptr<CheckpointReader>> CheckpointReader::Open(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return errno == ENOENT ? absl::NotFoundError(absl::StrFormat("no checkpoint '%s'", path))
                           : Errno("opening checkpoint", path);
  }
  std::unique_ptr<CheckpointReader> reader(new CheckpointReader(path, fd));
  char magic[8] = {};
  if (!reader->Raw(magic, 8).ok() || std::memcmp(magic, kMagic, 8) != 0) {
    return absl::DataLossError(absl::StrFormat("'%s' is not a tierd trainer checkpoint (or was cut short)", path));
  }
  return reader;
}

absl::Status CheckpointReader::Raw(void* data, uint64_t bytes) {
  char* p = static_cast<char*>(data);
  while (bytes > 0) {
    const ssize_t r = read(fd_, p, std::min<uint64_t>(bytes, 1u << 30));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return Errno("reading checkpoint", path_);
    if (r == 0) return absl::DataLossError(absl::StrFormat("'%s' ends early: the file was cut short", path_));
    p += r;
    bytes -= static_cast<uint64_t>(r);
  }
  return absl::OkStatus();
}

absl::Status CheckpointReader::ReadHeader() {
  if (have_header_) return absl::OkStatus();
  uint32_t name_bytes = 0;
  if (absl::Status s = Raw(&name_bytes, 4); !s.ok()) return s;
  if (name_bytes == 0 || name_bytes > kNameBytesMax) {
    return absl::DataLossError(
        absl::StrFormat("'%s' has a record name of %d bytes: the file is damaged", path_, name_bytes));
  }
  name_.assign(name_bytes, '\0');
  if (absl::Status s = Raw(name_.data(), name_bytes); !s.ok()) return s;
  if (absl::Status s = Raw(&length_, 8); !s.ok()) return s;
  crc_ = Crc32c(0, &name_bytes, 4);
  crc_ = Crc32c(crc_, name_.data(), name_.size());
  crc_ = Crc32c(crc_, &length_, 8);
  have_header_ = true;
  return absl::OkStatus();
}

absl::StatusOr<std::pair<std::string, uint64_t>> CheckpointReader::Peek() {
  if (in_record_) return absl::FailedPreconditionError("checkpoint: Peek inside a record");
  if (absl::Status s = ReadHeader(); !s.ok()) return s;
  return std::make_pair(name_, length_);
}

absl::Status CheckpointReader::BeginRecord(absl::string_view name, uint64_t bytes) {
  if (in_record_) return absl::FailedPreconditionError("checkpoint: a record begun inside another");
  if (absl::Status s = ReadHeader(); !s.ok()) return s;
  if (name_ != name || length_ != bytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "'%s' holds record '%s' of %d bytes where '%s' of %d bytes was expected (a checkpoint of another model "
        "or layout?)",
        path_, name_, length_, name, bytes));
  }
  in_record_ = true;
  left_ = length_;
  return absl::OkStatus();
}

absl::Status CheckpointReader::ReadPiece(void* data, uint64_t bytes) {
  if (!in_record_ || bytes > left_) return absl::FailedPreconditionError("checkpoint: read past the record");
  if (absl::Status s = Raw(data, bytes); !s.ok()) return s;
  crc_ = Crc32c(crc_, data, bytes);
  left_ -= bytes;
  return absl::OkStatus();
}

absl::Status CheckpointReader::EndRecord() {
  if (!in_record_ || left_ != 0) return absl::FailedPreconditionError("checkpoint: record ended before its end");
  uint32_t stored = 0;
  if (absl::Status s = Raw(&stored, 4); !s.ok()) return s;
  in_record_ = have_header_ = false;
  if (stored != crc_) {
    return absl::DataLossError(
        absl::StrFormat("'%s' fails its checksum in record '%s': the file is damaged", path_, name_));
  }
  return absl::OkStatus();
}

absl::Status CheckpointReader::Read(absl::string_view name, void* data, uint64_t bytes) {
  if (absl::Status s = BeginRecord(name, bytes); !s.ok()) return s;
  if (absl::Status s = ReadPiece(data, bytes); !s.ok()) return s;
  return EndRecord();
}

absl::StatusOr<std::string> CheckpointReader::ReadString(absl::string_view name) {
  if (absl::Status s = ReadHeader(); !s.ok()) return s;
  if (name_ != name) {
    return absl::InvalidArgumentError(
        absl::StrFormat("'%s' holds record '%s' where '%s' was expected", path_, name_, name));
  }
  if (length_ > (uint64_t{1} << 32)) {
    return absl::DataLossError(absl::StrFormat("'%s': record '%s' claims %d bytes", path_, name_, length_));
  }
  std::string out(length_, '\0');
  if (absl::Status s = Read(name, out.data(), out.size()); !s.ok()) return s;
  return out;
}

absl::Status VerifyCheckpoint(const std::string& path) {
  auto reader = CheckpointReader::Open(path);
  if (!reader.ok()) return reader.status();
  std::vector<char> buffer(8 << 20);
  for (uint64_t records = 0;; ++records) {
    auto next = (*reader)->Peek();
    if (!next.ok()) return next.status();
    const auto [name, bytes] = *next;
    if (name == kEnd) {
      uint64_t count = 0;
      if (bytes != 8) return absl::DataLossError(absl::StrFormat("'%s': its end record is damaged", path));
      if (absl::Status s = (*reader)->Read(kEnd, &count, 8); !s.ok()) return s;
      if (count != records) {
        return absl::DataLossError(absl::StrFormat("'%s' ends after %d records; it says %d", path, records, count));
      }
      return absl::OkStatus();
    }
    if (absl::Status s = (*reader)->BeginRecord(name, bytes); !s.ok()) return s;
    for (uint64_t left = bytes; left > 0;) {
      const uint64_t piece = std::min<uint64_t>(left, buffer.size());
      if (absl::Status s = (*reader)->ReadPiece(buffer.data(), piece); !s.ok()) return s;
      left -= piece;
    }
    if (absl::Status s = (*reader)->EndRecord(); !s.ok()) return s;
  }
}

absl::StatusOr<std::string> WriteCheckpoint(const std::string& dir, int64_t step, const std::string& payload) {
  auto writer = CheckpointWriter::Create(dir, step);
  if (!writer.ok()) return writer.status();
  if (absl::Status s = (*writer)->Append("state", payload.data(), payload.size()); !s.ok()) return s;
  return (*writer)->Commit();
}

absl::StatusOr<std::string> ReadCheckpoint(const std::string& path) {
  if (absl::Status s = VerifyCheckpoint(path); !s.ok()) return s;
  auto reader = CheckpointReader::Open(path);
  if (!reader.ok()) return reader.status();
  return (*reader)->ReadString("state");
}

std::vector<std::string> ListCheckpoints(const std::string& dir) {
  std::vector<std::string> names;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      if (IsCheckpointName(e->d_name)) names.push_back(e->d_name);
    }
    closedir(d);
  }
  std::sort(names.rbegin(), names.rend());  // zero-padded steps: newest first
  for (std::string& name : names) name = dir + "/" + name;
  return names;
}

absl::StatusOr<std::string> LatestCheckpoint(const std::string& dir, std::string* skipped) {
  if (DIR* d = opendir(dir.c_str())) {
    closedir(d);
  } else {
    return absl::NotFoundError(absl::StrFormat("no checkpoint directory '%s'", dir));
  }
  for (const std::string& path : ListCheckpoints(dir)) {
    const absl::Status verified = VerifyCheckpoint(path);
    if (verified.ok()) return path;
    if (skipped != nullptr) *skipped += std::string(verified.message()) + "\n";
  }
  return absl::NotFoundError(absl::StrFormat("no checkpoint in '%s' verifies", dir));
}

void PruneCheckpoints(const std::string& dir, int keep) {
  const std::vector<std::string> all = ListCheckpoints(dir);
  for (size_t i = static_cast<size_t>(std::max(keep, 1)); i < all.size(); ++i) unlink(all[i].c_str());
  if (DIR* d = opendir(dir.c_str())) {  // temporary files of writes a crash cut short
    std::vector<std::string> stale;
    while (dirent* e = readdir(d)) {
      const std::string name = e->d_name;
      if (name.rfind("ckpt-", 0) == 0 && name.size() > 8 && name.substr(name.size() - 8) == ".bin.tmp") {
        stale.push_back(dir + "/" + name);
      }
    }
    closedir(d);
    for (const std::string& path : stale) unlink(path.c_str());
  }
}

}  // namespace tierd::trainer
