// The client side of the GPU check, run as a second process: imports the daemon's GPU
// region, writes it with a kernel that a daemon copy must wait for, and checks data the
// daemon moved in, ordered only by CUDA IPC events.
#include "tools/gpu_check/ipc_child.h"

#include <cstring>
#include <vector>

#include "ipc/gpu_import.h"
#include "tools/gpu_check/check_util.h"
#include "tools/gpu_check/kernels.h"

namespace tierd::gpu_check {

int RunChild(const ChildArgs& args) {
  GpuRegionExport exported;
  exported.pool_fd = args.pool_fd;
  if (!FromHex(args.pointer_hex, exported.pointer_data.data(), exported.pointer_data.size())) {
    std::fprintf(stderr, "child: bad --pointer\n");
    return 1;
  }
  auto base = ImportGpuRegion(0, exported);
  if (!base.ok()) {
    std::fprintf(stderr, "child: import failed: %s\n", base.status().ToString().c_str());
    return 1;
  }
  auto* region = static_cast<uint8_t*>(*base);
  cudaStream_t stream;
  CHECK_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  cudaEvent_t written;
  CHECK_CUDA(cudaEventCreateWithFlags(&written, cudaEventDisableTiming | cudaEventInterprocess));
  cudaIpcEventHandle_t handle;
  CHECK_CUDA(cudaIpcGetEventHandle(&handle, written));
  SendLine(args.to_parent_fd, ToHex(&handle, sizeof(handle)));

  // 1. Write A after a long spin; tell the daemon at once (no synchronisation here).
  auto* a = reinterpret_cast<uint32_t*>(region + args.a_offset);
  CHECK_CUDA(LaunchSpin(stream, 300'000'000));
  CHECK_CUDA(LaunchFillPattern(stream, a, args.words, 1));
  CHECK_CUDA(cudaEventRecord(written, stream));
  SendLine(args.to_parent_fd, "written");

  // 2. The daemon moved data into B and C; its event orders our reads after its copy.
  cudaIpcEventHandle_t parent_handle;
  if (!FromHex(ReadLine(args.from_parent_fd), &parent_handle, sizeof(parent_handle))) return 1;
  cudaEvent_t parent_event;
  CHECK_CUDA(cudaIpcOpenEventHandle(&parent_event, parent_handle));
  if (ReadLine(args.from_parent_fd) != "moved") return 1;
  CHECK_CUDA(cudaStreamWaitEvent(stream, parent_event, 0));
  unsigned long long* counts = nullptr;
  CHECK_CUDA(cudaMallocAsync(reinterpret_cast<void**>(&counts), 2 * sizeof(*counts), stream));
  CHECK_CUDA(cudaMemsetAsync(counts, 0, 2 * sizeof(*counts), stream));
  CHECK_CUDA(LaunchCountMismatches(stream, reinterpret_cast<uint32_t*>(region + args.b_offset),
                                   args.words, 1, counts));
  CHECK_CUDA(LaunchCountMismatches(stream, reinterpret_cast<uint32_t*>(region + args.c_offset),
                                   args.words, 2, counts + 1));
  unsigned long long host_counts[2] = {~0ull, ~0ull};
  CHECK_CUDA(cudaMemcpyAsync(host_counts, counts, sizeof(host_counts), cudaMemcpyDeviceToHost, stream));
  CHECK_CUDA(cudaStreamSynchronize(stream));
  SendLine(args.to_parent_fd, "mismatches " + std::to_string(host_counts[0]) + " " +
                                  std::to_string(host_counts[1]));
  CHECK_CUDA(cudaFreeAsync(counts, stream));
  CHECK_CUDA(cudaStreamSynchronize(stream));
  CHECK_CUDA(cudaEventDestroy(parent_event));
  if (!ReleaseImportedGpuRegion(region).ok()) return 1;
  return 0;
}

}  // namespace tierd::gpu_check
