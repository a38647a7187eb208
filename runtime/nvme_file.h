// NvmeFile: the NVMe tier's backing store, one file under a configured directory,
// opened with O_DIRECT (no page cache: the DRAM tier is the cache) and fully
// allocated up front with fallocate, so a full disk fails at start, not mid-run.
//
// The file is unlinked right after it is created and allocated: its space lives as
// long as the open descriptor, so a crashed daemon can never leak it.
#ifndef TIERD_RUNTIME_NVME_FILE_H_
#define TIERD_RUNTIME_NVME_FILE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace tierd {

class NvmeFile {
 public:
  // FAILED_PRECONDITION for a missing or unwritable directory or a filesystem without
  // O_DIRECT; RESOURCE_EXHAUSTED (with the free space) when `bytes` do not fit.
  static absl::StatusOr<std::unique_ptr<NvmeFile>> Create(const std::string& directory,
                                                          const std::string& name, uint64_t bytes);
  ~NvmeFile();
  NvmeFile(const NvmeFile&) = delete;
  NvmeFile& operator=(const NvmeFile&) = delete;

  int fd() const { return fd_; }
  uint64_t bytes() const { return bytes_; }
  // Where the file was created (it is unlinked; shown in logs).
  const std::string& path() const { return path_; }

 private:
  NvmeFile(int fd, uint64_t bytes, std::string path)
      : fd_(fd), bytes_(bytes), path_(std::move(path)) {}
  int fd_;
  uint64_t bytes_;
  std::string path_;
};

}  // namespace tierd

#endif  // TIERD_RUNTIME_NVME_FILE_H_
