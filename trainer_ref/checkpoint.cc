#include "trainer_ref/checkpoint.h"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "absl/strings/str_format.h"
#include "runtime/crc32c.h"

namespace tierd::trainer {
namespace {

constexpr uint64_t kMagic = 0x74726b6370743031ull;  // "trkcpt01"

absl::Status Errno(const std::string& what, const std::string& path) {
  return absl::InternalError(absl::StrFormat("%s '%s': %s", what, path, std::strerror(errno)));
}

absl::Status WriteAll(int fd, const char* p, size_t n, const std::string& path) {
  while (n > 0) {
    const ssize_t w = write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return errno == ENOSPC ? absl::ResourceExhaustedError(absl::StrFormat("writing '%s': the disk is full", path))
                             : Errno("writing", path);
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> WriteCheckpoint(const std::string& dir, int64_t step, const std::string& payload) {
  const std::string path = absl::StrFormat("%s/ckpt-%08d.bin", dir, step);
  const std::string tmp = path + ".tmp";
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Errno("creating", tmp);
  const uint64_t length = payload.size();
  const uint32_t crc = Crc32c(0, payload.data(), payload.size());
  std::string header;
  header.append(reinterpret_cast<const char*>(&kMagic), 8);
  header.append(reinterpret_cast<const char*>(&length), 8);
  header.append(reinterpret_cast<const char*>(&crc), 4);
  absl::Status s = WriteAll(fd, header.data(), header.size(), tmp);
  if (s.ok()) s = WriteAll(fd, payload.data(), payload.size(), tmp);
  if (s.ok() && fsync(fd) != 0) s = Errno("syncing", tmp);
  close(fd);
  if (s.ok() && rename(tmp.c_str(), path.c_str()) != 0) s = Errno("renaming into", path);
  if (!s.ok()) {
    unlink(tmp.c_str());  // nothing half-written stays behind
    return s;
  }
  const int dfd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    fsync(dfd);  // the rename itself survives a crash
    close(dfd);
  }
  return path;
}

absl::StatusOr<std::string> ReadCheckpoint(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return errno == ENOENT ? absl::NotFoundError(absl::StrFormat("no checkpoint '%s'", path)) : Errno("opening", path);
  }
  std::string bytes;
  char buf[1 << 16];
  for (;;) {
    const ssize_t r = read(fd, buf, sizeof(buf));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      close(fd);
      return Errno("reading", path);
    }
    if (r == 0) break;
    bytes.append(buf, static_cast<size_t>(r));
  }
  close(fd);
  uint64_t magic = 0, length = 0;
  uint32_t crc = 0;
  if (bytes.size() < 20) return absl::DataLossError(absl::StrFormat("'%s' is %d bytes: truncated", path, bytes.size()));
  std::memcpy(&magic, bytes.data(), 8);
  std::memcpy(&length, bytes.data() + 8, 8);
  std::memcpy(&crc, bytes.data() + 16, 4);
  if (magic != kMagic) return absl::DataLossError(absl::StrFormat("'%s' is not a tierd trainer checkpoint", path));
  if (bytes.size() != 20 + length) {
    return absl::DataLossError(absl::StrFormat("'%s' holds %d payload bytes; its header says %d", path,
                                               bytes.size() - 20, length));
  }
  if (Crc32c(0, bytes.data() + 20, length) != crc) {
    return absl::DataLossError(absl::StrFormat("'%s' fails its checksum: the file is damaged", path));
  }
  return bytes.substr(20);
}

absl::StatusOr<std::string> LatestCheckpoint(const std::string& dir, std::string* skipped) {
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return absl::NotFoundError(absl::StrFormat("no checkpoint directory '%s'", dir));
  std::vector<std::string> names;
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name.rfind("ckpt-", 0) == 0 && name.size() > 4 && name.substr(name.size() - 4) == ".bin") names.push_back(name);
  }
  closedir(d);
  std::sort(names.rbegin(), names.rend());  // zero-padded steps: newest first
  for (const std::string& name : names) {
    const std::string path = dir + "/" + name;
    auto payload = ReadCheckpoint(path);
    if (payload.ok()) return path;
    if (skipped != nullptr) *skipped += std::string(payload.status().message()) + "\n";
  }
  return absl::NotFoundError(absl::StrFormat("no checkpoint in '%s' verifies", dir));
}

}  // namespace tierd::trainer
