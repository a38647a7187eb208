// The raw ceilings tierbench compares the Mover with, measured in the same run:
//   GPU: one cudaMemcpyAsync per transfer between cudaMallocHost memory and cudaMalloc
//        memory on a bare stream (no tierd code at all); with the fake GPU, memcpy.
//   NVMe: a plain sequential O_DIRECT pwrite/pread loop, one thread, no io_uring.
#ifndef TIERD_TOOLS_TIERBENCH_RAW_CEILING_H_
#define TIERD_TOOLS_TIERBENCH_RAW_CEILING_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace tierd::bench {

struct GpuRates {
  double host_to_device = 0;  // bytes per second
  double device_to_host = 0;
  double both_directions = 0;  // total of both, run at once on two streams
};

// `use_cuda` false: the fake GPU's ceiling, memcpy between two host buffers.
absl::StatusOr<GpuRates> MeasureRawGpuCopies(bool use_cuda, uint64_t bytes, uint64_t transfer_bytes,
                                             int repeats);

struct NvmeRates {
  double write = 0;  // bytes per second
  double read = 0;
};

// A fallocated, unlinked O_DIRECT file and an aligned buffer of `bytes` random data.
class RawNvme {
 public:
  static absl::StatusOr<std::unique_ptr<RawNvme>> Create(const std::string& directory,
                                                         uint64_t bytes);
  ~RawNvme();
  // One sequential pwrite pass (then fdatasync) and one pread pass, `block_bytes` a call.
  absl::StatusOr<NvmeRates> MeasureOnce(uint64_t block_bytes);

 private:
  RawNvme(int fd, uint8_t* buffer, uint64_t bytes) : fd_(fd), buffer_(buffer), bytes_(bytes) {}
  int fd_;
  uint8_t* buffer_;
  uint64_t bytes_;
};

}  // namespace tierd::bench

#endif  // TIERD_TOOLS_TIERBENCH_RAW_CEILING_H_
