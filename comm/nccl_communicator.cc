#include "comm/nccl_communicator.h"

#include <cuda_runtime.h>
#include <dlfcn.h>
#include <link.h>
#include <nccl.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/units.h"
#include "comm/rendezvous.h"

#ifndef TIERD_CUDA_LIB_DIR
#define TIERD_CUDA_LIB_DIR "/usr/local/cuda/lib64"
#endif

namespace tierd::comm {
namespace {

using Clock = std::chrono::steady_clock;

// The NCCL calls this backend makes, resolved from the library at run time.
struct NcclApi {
  std::string path;
  ncclResult_t (*GetVersion)(int*);
  const char* (*GetErrorString)(ncclResult_t);
  ncclResult_t (*GetUniqueId)(ncclUniqueId*);
  ncclResult_t (*CommInitRank)(ncclComm_t*, int, ncclUniqueId, int);
  ncclResult_t (*CommDestroy)(ncclComm_t);
  ncclResult_t (*CommAbort)(ncclComm_t);
  ncclResult_t (*CommGetAsyncError)(ncclComm_t, ncclResult_t*);
  ncclResult_t (*AllReduce)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t);
  ncclResult_t (*ReduceScatter)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t, cudaStream_t);
  ncclResult_t (*AllGather)(const void*, void*, size_t, ncclDataType_t, ncclComm_t, cudaStream_t);
  ncclResult_t (*Reduce)(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, int, ncclComm_t, cudaStream_t);
  ncclResult_t (*Broadcast)(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t, cudaStream_t);
  ncclResult_t (*GroupStart)();
  ncclResult_t (*GroupEnd)();
};

template <typename F>
bool Resolve(void* handle, const char* name, F* out) {
  *out = reinterpret_cast<F>(dlsym(handle, name));
  return *out != nullptr;
}

absl::StatusOr<NcclApi> Load() {
  void* handle = nullptr;
  std::string tried;
  for (const std::string& name : {std::string("libnccl.so.2"), std::string(TIERD_CUDA_LIB_DIR) + "/libnccl.so.2"}) {
    handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle != nullptr) break;
    const char* why = dlerror();
    absl::StrAppend(&tried, tried.empty() ? "" : "; ", why != nullptr ? why : name);
  }
  if (handle == nullptr) {
    return absl::NotFoundError(absl::StrFormat(
        "NCCL (libnccl.so.2) is not installed where this process looks (%s): install NCCL, or put its lib folder "
        "in LD_LIBRARY_PATH (pip's nvidia-nccl-cu13 has one under site-packages/nvidia/nccl/lib)",
        tried));
  }
  NcclApi api;
  link_map* map = nullptr;
  api.path = dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map != nullptr ? map->l_name : "libnccl.so.2";
  const bool ok =
      Resolve(handle, "ncclGetVersion", &api.GetVersion) &&
      Resolve(handle, "ncclGetErrorString", &api.GetErrorString) &&
      Resolve(handle, "ncclGetUniqueId", &api.GetUniqueId) && Resolve(handle, "ncclCommInitRank", &api.CommInitRank) &&
      Resolve(handle, "ncclCommDestroy", &api.CommDestroy) && Resolve(handle, "ncclCommAbort", &api.CommAbort) &&
      Resolve(handle, "ncclCommGetAsyncError", &api.CommGetAsyncError) &&
      Resolve(handle, "ncclAllReduce", &api.AllReduce) && Resolve(handle, "ncclReduceScatter", &api.ReduceScatter) &&
      Resolve(handle, "ncclAllGather", &api.AllGather) && Resolve(handle, "ncclReduce", &api.Reduce) &&
      Resolve(handle, "ncclBroadcast", &api.Broadcast) && Resolve(handle, "ncclGroupStart", &api.GroupStart) &&
      Resolve(handle, "ncclGroupEnd", &api.GroupEnd);
  if (!ok) {
    return absl::FailedPreconditionError(
        absl::StrFormat("%s lacks an NCCL 2 call this backend needs: %s", api.path, dlerror()));
  }
  return api;  // the handle stays open for the process
}

const absl::StatusOr<NcclApi>& Api() {
  static const absl::StatusOr<NcclApi> api = Load();
  return api;
}

ncclRedOp_t ToNccl(ReduceOp op) {
  switch (op) {
    case ReduceOp::kMax:
      return ncclMax;
    case ReduceOp::kMin:
      return ncclMin;
    case ReduceOp::kSum:
      break;
  }
  return ncclSum;
}

bool Even(const Slices& s) {
  for (size_t r = 0; r < s.count.size(); ++r) {
    if (s.count[r] != s.count[0] || s.offset[r] != static_cast<int64_t>(r) * s.count[0]) return false;
  }
  return true;
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(const NcclApi& api, const NcclOptions& options, int rank, int size, int device)
      : api_(api), options_(options), rank_(rank), size_(size), device_(device) {}
  ~NcclCommunicator() override {
    cudaSetDevice(device_);
    if (staging_ != nullptr) cudaFree(staging_);
    if (pinned_ != nullptr) cudaFreeHost(pinned_);
    if (comm_ != nullptr) broken_ ? api_.CommAbort(comm_) : api_.CommDestroy(comm_);
    if (done_ != nullptr) cudaEventDestroy(done_);
    if (scratch_ != nullptr) cudaFree(scratch_);
    if (own_stream_ && stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  absl::Status Init(const LaunchInfo& launch) {
    if (cudaSetDevice(device_) != cudaSuccess) return Error("cudaSetDevice", cudaGetLastError());
    stream_ = static_cast<cudaStream_t>(options_.stream);
    if (stream_ == nullptr) {
      own_stream_ = true;
      if (cudaError_t e = cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking); e != cudaSuccess) {
        return Error("cudaStreamCreate", e);
      }
    }
    if (cudaError_t e = cudaEventCreateWithFlags(&done_, cudaEventDisableTiming); e != cudaSuccess) {
      return Error("cudaEventCreate", e);
    }
    if (cudaError_t e = cudaMalloc(&scratch_, sizeof(float)); e != cudaSuccess) return Error("cudaMalloc", e);
    ncclUniqueId id{};
    if (rank_ == 0) {
      if (ncclResult_t r = api_.GetUniqueId(&id); r != ncclSuccess) return Nccl("ncclGetUniqueId", r);
    }
    auto shared = ShareFromRankZero(launch, std::string(id.internal, sizeof(id.internal)),
                                    {.timeout_seconds = options_.timeout_seconds});
    if (!shared.ok()) return shared.status();
    if (shared->size() != sizeof(id.internal)) return absl::DataLossError("NCCL id of the wrong size from rank 0");
    std::copy(shared->begin(), shared->end(), id.internal);
    if (ncclResult_t r = api_.CommInitRank(&comm_, size_, id, rank_); r != ncclSuccess) {
      comm_ = nullptr;
      return Nccl("ncclCommInitRank", r);
    }
    return absl::OkStatus();
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "nccl"; }

  absl::Status AllReduce(float* data, int64_t count, ReduceOp op) override {
    return AllReduceAny(data, count, op, ncclFloat);
  }
  absl::Status AllReduce(double* data, int64_t count, ReduceOp op) override {
    return AllReduceAny(data, count, op, ncclDouble);
  }
  absl::Status ReduceScatterSum(float* data, const Slices& slices) override {
    int64_t total = 0;
    for (int64_t c : slices.count) total += c;
    if (Even(slices)) {  // NCCL's own: in place where rank r's part starts at r x count
      return Run("reduce-scatter", total * 4.0, (size_ - 1.0) / size_, [&] {
        return api_.ReduceScatter(data, data + slices.offset[rank_], slices.count[0], ncclFloat, ncclSum, comm_,
                                  stream_);
      });
    }
    // Uneven slices (aligned boundaries, a shorter last one): one reduce to each slice's rank.
    return Run("reduce-scatter", total * 4.0, (size_ - 1.0) / size_, [&] {
      return Grouped(
          [&](int r) {
            return api_.Reduce(data + slices.offset[r], data + slices.offset[r], slices.count[r], ncclFloat, ncclSum, r,
                               comm_, stream_);
          },
          slices);
    });
  }
  absl::Status AllGather(float* data, const Slices& slices) override {
    int64_t total = 0;
    for (int64_t c : slices.count) total += c;
    if (Even(slices)) {
      return Run("all-gather", total * 4.0, (size_ - 1.0) / size_, [&] {
        return api_.AllGather(data + slices.offset[rank_], data, slices.count[0], ncclFloat, comm_, stream_);
      });
    }
    return Run("all-gather", total * 4.0, (size_ - 1.0) / size_, [&] {
      return Grouped(
          [&](int r) {
            return api_.Broadcast(data + slices.offset[r], data + slices.offset[r], slices.count[r], ncclFloat, r,
                                  comm_, stream_);
          },
          slices);
    });
  }
  absl::Status AllGatherBytes(const void* in, void* out, int64_t bytes) override {
    return Run("all-gather", bytes * static_cast<double>(size_), (size_ - 1.0) / size_,
               [&] { return api_.AllGather(in, out, bytes, ncclUint8, comm_, stream_); });
  }
  absl::Status Barrier() override {
    return Run("barrier", 0, 0,
               [&] { return api_.AllReduce(scratch_, scratch_, 1, ncclFloat, ncclSum, comm_, stream_); });
  }

 private:
  static bool OnDevice(const void* p) {
    cudaPointerAttributes a{};
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
  }

  // Device memory as it is; host memory (a trainer's scalars: a loss, a step) through a
  // device buffer and pinned memory, so that waiting stays this class's, with its deadline.
  template <typename T>
  absl::Status AllReduceAny(T* data, int64_t count, ReduceOp op, ncclDataType_t type) {
    const double bytes = static_cast<double>(count) * sizeof(T);
    if (OnDevice(data)) {
      return Run("all-reduce", bytes, 2.0 * (size_ - 1) / size_,
                 [&] { return api_.AllReduce(data, data, count, type, ToNccl(op), comm_, stream_); });
    }
    const size_t size = static_cast<size_t>(bytes);
    if (size > staged_) {
      if (staging_ != nullptr) cudaFree(staging_);
      if (pinned_ != nullptr) cudaFreeHost(pinned_);
      staging_ = pinned_ = nullptr;
      staged_ = 0;
      if (cudaError_t e = cudaMalloc(&staging_, size); e != cudaSuccess) return Error("cudaMalloc", e);
      if (cudaError_t e = cudaMallocHost(&pinned_, size); e != cudaSuccess) return Error("cudaMallocHost", e);
      staged_ = size;
    }
    std::memcpy(pinned_, data, size);
    absl::Status s = Run("all-reduce", bytes, 2.0 * (size_ - 1) / size_, [&] {
      if (cudaMemcpyAsync(staging_, pinned_, size, cudaMemcpyHostToDevice, stream_) != cudaSuccess) {
        return ncclUnhandledCudaError;
      }
      const ncclResult_t r = api_.AllReduce(staging_, staging_, count, type, ToNccl(op), comm_, stream_);
      if (r == ncclSuccess &&
          cudaMemcpyAsync(pinned_, staging_, size, cudaMemcpyDeviceToHost, stream_) != cudaSuccess) {
        return ncclUnhandledCudaError;
      }
      return r;
    });
    if (s.ok()) std::memcpy(data, pinned_, size);
    return s;
  }

  absl::Status Error(const char* what, cudaError_t e) const {
    return absl::InternalError(absl::StrFormat("rank %d: %s: %s", rank_, what, cudaGetErrorString(e)));
  }
  absl::Status Nccl(const char* what, ncclResult_t r) const {
    return absl::UnavailableError(absl::StrFormat("rank %d of %d: %s: %s", rank_, size_, what, api_.GetErrorString(r)));
  }

  // One call a rank with a non-empty slice, as one NCCL group.
  template <typename Call>
  ncclResult_t Grouped(Call call, const Slices& slices) {
    if (ncclResult_t r = api_.GroupStart(); r != ncclSuccess) return r;
    ncclResult_t first = ncclSuccess;
    for (int r = 0; r < size_; ++r) {
      if (slices.count[r] == 0) continue;
      if (ncclResult_t e = call(r); e != ncclSuccess && first == ncclSuccess) first = e;
    }
    const ncclResult_t end = api_.GroupEnd();
    return first != ncclSuccess ? first : end;
  }

  // Queues the call, then waits for it with a deadline, watching NCCL's own error state.
  template <typename Start>
  absl::Status Run(const char* what, double buffer_bytes, double wire_share, Start start) {
    if (broken_) return absl::FailedPreconditionError("NCCL communicator unusable after an earlier failure");
    const auto t0 = Clock::now();
    const std::string size = FormatBytes(static_cast<uint64_t>(buffer_bytes));
    if (ncclResult_t r = start(); r != ncclSuccess) {
      broken_ = true;
      return absl::UnavailableError(
          absl::StrFormat("rank %d: NCCL %s of %s: %s", rank_, what, size, api_.GetErrorString(r)));
    }
    if (cudaError_t e = cudaEventRecord(done_, stream_); e != cudaSuccess) return Error("cudaEventRecord", e);
    for (int spins = 0;; ++spins) {
      const cudaError_t q = cudaEventQuery(done_);
      if (q == cudaSuccess) break;
      if (q != cudaErrorNotReady) {
        broken_ = true;
        return absl::InternalError(
            absl::StrFormat("rank %d: NCCL %s of %s: %s", rank_, what, size, cudaGetErrorString(q)));
      }
      ncclResult_t async = ncclSuccess;
      api_.CommGetAsyncError(comm_, &async);
      if (async != ncclSuccess && async != ncclInProgress) {
        broken_ = true;
        return absl::UnavailableError(absl::StrFormat("rank %d of %d: NCCL %s of %s: %s (a peer failed?)", rank_, size_,
                                                      what, size, api_.GetErrorString(async)));
      }
      const double waited = std::chrono::duration<double>(Clock::now() - t0).count();
      if (waited > options_.timeout_seconds) {
        broken_ = true;
        return absl::DeadlineExceededError(absl::StrFormat(
            "rank %d of %d: NCCL %s of %s not done after %.0f s: another rank died or hangs (--comm_timeout)", rank_,
            size_, what, size, waited));
      }
      if (spins > 1000) std::this_thread::sleep_for(std::chrono::microseconds(spins > 100000 ? 1000 : 20));
    }
    Account(buffer_bytes * wire_share, std::chrono::duration<double>(Clock::now() - t0).count());
    return absl::OkStatus();
  }

  const NcclApi& api_;
  NcclOptions options_;
  int rank_, size_, device_;
  cudaStream_t stream_ = nullptr;
  bool own_stream_ = false;
  cudaEvent_t done_ = nullptr;
  float* scratch_ = nullptr;
  void *staging_ = nullptr, *pinned_ = nullptr;  // host data's way through the GPU
  size_t staged_ = 0;
  ncclComm_t comm_ = nullptr;
  bool broken_ = false;
};

}  // namespace

absl::StatusOr<std::string> NcclVersion() {
  const auto& api = Api();
  if (!api.ok()) return api.status();
  int v = 0;
  api->GetVersion(&v);
  return absl::StrFormat("NCCL %d.%d.%d (%s)", v / 10000, v / 100 % 100, v % 100, api->path);
}

absl::StatusOr<std::unique_ptr<Communicator>> MakeNcclCommunicator(const LaunchInfo& launch,
                                                                   const NcclOptions& options) {
  const auto& api = Api();
  if (!api.ok()) return api.status();
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    return absl::FailedPreconditionError(absl::StrFormat("rank %d: no CUDA device for an NCCL rank", launch.rank));
  }
  const int device = options.device >= 0 ? options.device : launch.local_rank % devices;
  if (device >= devices) {
    return absl::InvalidArgumentError(
        absl::StrFormat("rank %d: CUDA device %d asked for, %d here", launch.rank, device, devices));
  }
  auto comm = std::make_unique<NcclCommunicator>(*api, options, launch.rank, launch.size, device);
  if (absl::Status s = comm->Init(launch); !s.ok()) return s;
  return std::unique_ptr<Communicator>(std::move(comm));
}

}  // namespace tierd::comm
