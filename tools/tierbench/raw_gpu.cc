// The GPU ceiling: plain cudaMemcpyAsync between cudaMallocHost and cudaMalloc memory.
// Without CUDA (or with use_cuda false): memcpy, the fake GPU's own ceiling.
#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "tools/tierbench/raw_ceiling.h"
#include "tools/tierbench/stats.h"

#ifdef TIERD_HAVE_CUDA
#include <cuda_runtime.h>
#endif

namespace tierd::bench {
namespace {

template <typename Fn>
double TimeSeconds(Fn&& fn) {
  const auto start = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

GpuRates MeasureMemcpy(uint64_t bytes, uint64_t transfer_bytes, int repeats) {
  std::vector<uint8_t> a(bytes, 1), b(bytes, 2), c(bytes, 3), d(bytes, 4);
  auto copy_all = [&](uint8_t* dst, const uint8_t* src) {
    for (uint64_t o = 0; o < bytes; o += transfer_bytes) {
      std::memcpy(dst + o, src + o, std::min(transfer_bytes, bytes - o));
    }
  };
  std::vector<double> up, down, both;
  for (int r = 0; r < repeats; ++r) {
    up.push_back(bytes / TimeSeconds([&] { copy_all(b.data(), a.data()); }));
    down.push_back(bytes / TimeSeconds([&] { copy_all(a.data(), b.data()); }));
    both.push_back(2.0 * bytes / TimeSeconds([&] {
      std::thread other([&] { copy_all(d.data(), c.data()); });
      copy_all(b.data(), a.data());
      other.join();
    }));
  }
  return GpuRates{Median(up), Median(down), Median(both)};
}

#ifdef TIERD_HAVE_CUDA
#define RAW_CUDA(call)                                                                 \
  do {                                                                                 \
    const cudaError_t e = (call);                                                      \
    if (e != cudaSuccess) return absl::InternalError(absl::StrFormat("%s: %s", #call, cudaGetErrorString(e))); \
  } while (0)

absl::StatusOr<GpuRates> MeasureCuda(uint64_t bytes, uint64_t transfer_bytes, int repeats) {
  void *host_a = nullptr, *host_b = nullptr, *device_a = nullptr, *device_b = nullptr;
  RAW_CUDA(cudaMallocHost(&host_a, bytes));
  RAW_CUDA(cudaMallocHost(&host_b, bytes));
  RAW_CUDA(cudaMalloc(&device_a, bytes));
  RAW_CUDA(cudaMalloc(&device_b, bytes));
  std::memset(host_a, 0x5A, bytes);
  std::memset(host_b, 0xA5, bytes);
  cudaStream_t up_stream, down_stream;
  RAW_CUDA(cudaStreamCreateWithFlags(&up_stream, cudaStreamNonBlocking));
  RAW_CUDA(cudaStreamCreateWithFlags(&down_stream, cudaStreamNonBlocking));
  auto issue = [&](void* dst, const void* src, cudaMemcpyKind kind, cudaStream_t stream) {
    for (uint64_t o = 0; o < bytes; o += transfer_bytes) {
      cudaMemcpyAsync(static_cast<uint8_t*>(dst) + o, static_cast<const uint8_t*>(src) + o,
                      std::min(transfer_bytes, bytes - o), kind, stream);
    }
  };
  std::vector<double> up, down, both;
  for (int r = 0; r < repeats + 1; ++r) {  // the first round warms up and is dropped
    const double t_up = TimeSeconds([&] {
      issue(device_a, host_a, cudaMemcpyHostToDevice, up_stream);
      cudaStreamSynchronize(up_stream);
    });
    const double t_down = TimeSeconds([&] {
      issue(host_b, device_b, cudaMemcpyDeviceToHost, down_stream);
      cudaStreamSynchronize(down_stream);
    });
    const double t_both = TimeSeconds([&] {
      issue(device_a, host_a, cudaMemcpyHostToDevice, up_stream);
      issue(host_b, device_b, cudaMemcpyDeviceToHost, down_stream);
      cudaStreamSynchronize(up_stream);
      cudaStreamSynchronize(down_stream);
    });
    if (r == 0) continue;
    up.push_back(bytes / t_up);
    down.push_back(bytes / t_down);
    both.push_back(2.0 * bytes / t_both);
  }
  RAW_CUDA(cudaGetLastError());
  cudaStreamDestroy(up_stream);
  cudaStreamDestroy(down_stream);
  cudaFreeHost(host_a);
  cudaFreeHost(host_b);
  cudaFree(device_a);
  cudaFree(device_b);
  return GpuRates{Median(up), Median(down), Median(both)};
}
#endif

}  // namespace

absl::StatusOr<GpuRates> MeasureRawGpuCopies(bool use_cuda, uint64_t bytes, uint64_t transfer_bytes,
                                             int repeats) {
#ifdef TIERD_HAVE_CUDA
  if (use_cuda) return MeasureCuda(bytes, transfer_bytes, repeats);
#else
  if (use_cuda) return absl::FailedPreconditionError("built without CUDA");
#endif
  return MeasureMemcpy(bytes, transfer_bytes, repeats);
}

}  // namespace tierd::bench
