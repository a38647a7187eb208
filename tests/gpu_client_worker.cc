// A client of a tierd that owns a real GPU: leases GPU-tier tensors, writes them with a
// CUDA kernel through the device pointers it gets (the session's imported pool), lets a
// small quota force tierd to evict them to DRAM (and NVMe) and fetch them back, and
// checks every word with a second kernel. Run two at once against one tierd.
//   gpu_client_worker RUNTIME_DIR SEED [async|unsafe]   exit 0 when all came back right
// With "async", each write is a slow kernel (a 20 ms spin, then the fill) released at once
// with Release(tensor, stream): no synchronisation; tierd must wait for the kernel (CUDA
// IPC event) before it evicts the tensor, or the bytes it copies out are stale.
#include <cuda_runtime.h>

#include <cstdio>
#include <string>
#include <vector>

#include "base/units.h"
#include "clients/client.h"
#include "tools/gpu_check/kernels.h"

namespace tierd {
namespace {

int Fail(const std::string& what) {
  std::fprintf(stderr, "gpu_client_worker: %s\n", what.c_str());
  return 1;
}

// "unsafe" (the control): like async, but released with neither an event nor a sync. It
// should come back wrong, which shows the async run's race is real.
int Run(const std::string& dir, uint32_t seed, bool async, bool unsafe) {
  constexpr int kTensors = 8;
  constexpr uint64_t kWords = 8 * 1024 * 1024;  // 32 MiB each
  // 96 MiB of GPU for 256 MiB of tensors: most live in DRAM at any time.
  auto client = Client::Connect({dir, "gpu-worker-" + std::to_string(seed), {96 * kMiB, 160 * kMiB, 256 * kMiB}});
  if (!client.ok()) return Fail(client.status().ToString());
  cudaStream_t stream;
  if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) return Fail("stream");
  unsigned long long* mismatches = nullptr;
  if (cudaMalloc(&mismatches, sizeof(*mismatches)) != cudaSuccess) return Fail("cudaMalloc");
  std::vector<Client::Tensor> tensors;
  for (int i = 0; i < kTensors; ++i) {
    auto t = (*client)->Lease({"w" + std::to_string(i), TensorClass::kParam, DType::kF32, {int64_t{kWords}}});
    if (!t.ok()) return Fail(t.status().ToString());
    tensors.push_back(*t);
  }
  for (int round = 0; round < 2; ++round) {
    for (int i = 0; i < kTensors; ++i) {
      auto p = (*client)->Acquire(tensors[i], Access::kWrite, Place::kGpu);
      if (!p.ok()) return Fail(p.status().ToString());
      if (((async || unsafe) && gpu_check::LaunchSpin(stream, 20'000'000) != cudaSuccess) ||
          gpu_check::LaunchFillPattern(stream, static_cast<uint32_t*>(*p), kWords, seed * 1000 + round * 100 + i) !=
              cudaSuccess) {
        return Fail("fill kernel");
      }
      if (unsafe) {
        if (auto s = (*client)->Release(tensors[i]); !s.ok()) return Fail(s.ToString());
        continue;
      }
      if (async) {
        if (auto s = (*client)->Release(tensors[i], stream); !s.ok()) return Fail(s.ToString());
        continue;
      }
      if (cudaStreamSynchronize(stream) != cudaSuccess) return Fail("fill kernel");
      if (auto s = (*client)->Release(tensors[i]); !s.ok()) return Fail(s.ToString());
    }
    for (int i = kTensors - 1; i >= 0; --i) {
      auto p = (*client)->Acquire(tensors[i], Access::kRead, Place::kGpu);
      if (!p.ok()) return Fail(p.status().ToString());
      unsigned long long wrong = ~0ull;
      if (cudaMemsetAsync(mismatches, 0, sizeof(*mismatches), stream) != cudaSuccess ||
          gpu_check::LaunchCountMismatches(stream, static_cast<const uint32_t*>(*p), kWords,
                                           seed * 1000 + round * 100 + i, mismatches) != cudaSuccess ||
          cudaMemcpyAsync(&wrong, mismatches, sizeof(wrong), cudaMemcpyDeviceToHost, stream) != cudaSuccess ||
          cudaStreamSynchronize(stream) != cudaSuccess) {
        return Fail("check kernel");
      }
      if (wrong != 0) return Fail("tensor " + std::to_string(i) + ": " + std::to_string(wrong) + " wrong words");
      if (auto s = (*client)->Release(tensors[i]); !s.ok()) return Fail(s.ToString());
    }
  }
  auto stats = (*client)->Stats();
  if (!stats.ok()) return Fail(stats.status().ToString());
  std::printf("gpu_client_worker %u%s: ok, %d tensors x 2 rounds verified; daemon: stalls %lu, writebacks %lu\n",
              seed, async ? " (async releases)" : "", kTensors, static_cast<unsigned long>(stats->stalls()),
              static_cast<unsigned long>(stats->writebacks()));
  return 0;
}

}  // namespace
}  // namespace tierd

int main(int argc, char** argv) {
  if (argc != 3 && argc != 4) return tierd::Fail("usage: gpu_client_worker RUNTIME_DIR SEED [async]");
  const std::string mode = argc == 4 ? argv[3] : "";
  return tierd::Run(argv[1], static_cast<uint32_t>(std::stoul(argv[2])), mode == "async", mode == "unsafe");
}
