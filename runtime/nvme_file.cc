#include "runtime/nvme_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_format.h"
#include "base/limits.h"
#include "base/units.h"

namespace tierd {

absl::StatusOr<std::unique_ptr<NvmeFile>> NvmeFile::Create(const std::string& directory,
                                                           const std::string& name,
                                                           uint64_t bytes) {
  if (bytes == 0 || bytes % limits::kDirectIoAlignmentBytes != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "nvme tier: budget %d bytes must be a positive multiple of %s", bytes,
        FormatBytes(limits::kDirectIoAlignmentBytes)));
  }
  struct stat st;
  if (stat(directory.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrFormat("nvme tier: %s does not exist or is not a directory", directory));
  }
  if (access(directory.c_str(), W_OK) != 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "nvme tier: directory %s is not writable by this user: %s", directory, std::strerror(errno)));
  }
  struct statvfs fs;
  if (statvfs(directory.c_str(), &fs) == 0) {
    const uint64_t free_bytes = static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize;
    if (bytes > free_bytes) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "nvme tier: budget %s exceeds the free space of %s (%s free)", FormatBytes(bytes),
          directory, FormatBytes(free_bytes)));
    }
  }
  const std::string path = directory + "/" + name;
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_DIRECT | O_CLOEXEC, 0600);
  if (fd < 0) {
    const int error = errno;
    if (error == EINVAL) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "nvme tier: the filesystem of %s does not support O_DIRECT (tmpfs?); put the NVMe "
          "tier on a real disk", directory));
    }
    return absl::FailedPreconditionError(
        absl::StrFormat("nvme tier: cannot create %s: %s", path, std::strerror(error)));
  }
  // Reserve the space now (and unlink: the space lives exactly as long as the fd).
  const int error = posix_fallocate(fd, 0, static_cast<off_t>(bytes));
  unlink(path.c_str());
  if (error != 0) {
    close(fd);
    return absl::ResourceExhaustedError(absl::StrFormat(
        "nvme tier: cannot reserve %s in %s: %s", FormatBytes(bytes), directory, std::strerror(error)));
  }
  return std::unique_ptr<NvmeFile>(new NvmeFile(fd, bytes, path));
}

NvmeFile::~NvmeFile() { close(fd_); }

}  // namespace tierd
