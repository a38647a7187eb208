// The NVMe ceiling: sequential O_DIRECT pwrite/pread of one file, block by block.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <random>

#include "absl/strings/str_format.h"
#include "tools/tierbench/raw_ceiling.h"

namespace tierd::bench {
namespace {

double Seconds(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

absl::StatusOr<std::unique_ptr<RawNvme>> RawNvme::Create(const std::string& directory,
                                                         uint64_t bytes) {
  const std::string path = directory + "/tierbench-raw-" + std::to_string(getpid());
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_DIRECT | O_CLOEXEC, 0600);
  if (fd < 0) return absl::InternalError(absl::StrFormat("open %s: %s", path, std::strerror(errno)));
  unlink(path.c_str());
  if (const int error = posix_fallocate(fd, 0, static_cast<off_t>(bytes)); error != 0) {
    close(fd);
    return absl::ResourceExhaustedError(absl::StrFormat("fallocate: %s", std::strerror(error)));
  }
  auto* buffer = static_cast<uint8_t*>(std::aligned_alloc(4096, bytes));
  std::mt19937_64 rng(1);
  for (uint64_t i = 0; i + 8 <= bytes; i += 8) {
    const uint64_t word = rng();
    std::memcpy(buffer + i, &word, 8);
  }
  return std::unique_ptr<RawNvme>(new RawNvme(fd, buffer, bytes));
}

RawNvme::~RawNvme() {
  std::free(buffer_);
  close(fd_);
}

absl::StatusOr<NvmeRates> RawNvme::MeasureOnce(uint64_t block_bytes) {
  NvmeRates rates;
  auto start = std::chrono::steady_clock::now();
  for (uint64_t offset = 0; offset < bytes_; offset += block_bytes) {
    const size_t length = std::min(block_bytes, bytes_ - offset);
    if (pwrite(fd_, buffer_ + offset, length, static_cast<off_t>(offset)) != static_cast<ssize_t>(length)) {
      return absl::InternalError(absl::StrFormat("pwrite: %s", std::strerror(errno)));
    }
  }
  if (fdatasync(fd_) != 0) return absl::InternalError("fdatasync failed");
  rates.write = bytes_ / Seconds(start);
  start = std::chrono::steady_clock::now();
  for (uint64_t offset = 0; offset < bytes_; offset += block_bytes) {
    const size_t length = std::min(block_bytes, bytes_ - offset);
    if (pread(fd_, buffer_ + offset, length, static_cast<off_t>(offset)) != static_cast<ssize_t>(length)) {
      return absl::InternalError(absl::StrFormat("pread: %s", std::strerror(errno)));
    }
  }
  rates.read = bytes_ / Seconds(start);
  return rates;
}

}  // namespace tierd::bench
