// Every collective of the NCCL backend on GPU buffers holding data that depends on the rank,
// against the values it must give: sizes that do not divide evenly (NCCL's reduce-scatter and
// all-gather want equal parts: the backend groups reduces and broadcasts then), even ones
// (NCCL's own), empty slices, and the traffic counted. One process a GPU, started by torchrun
// or anything that sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT:
//   torchrun --nproc_per_node=N --no-python nccl_collectives_check      (or run it alone: one rank)
// Prints the NCCL it loaded, then "rank R of N: P passed, F failed"; exit 0 when nothing failed.
#include <cuda_runtime.h>

#include <cstdio>
#include <string>
#include <vector>

#include "comm/launch_env.h"
#include "comm/nccl_communicator.h"

namespace tc = tierd::comm;

namespace {

int passed = 0, failed = 0;

void Expect(bool ok, int rank, const std::string& what) {
  if (ok) {
    ++passed;
  } else {
    ++failed;
    std::printf("rank %d: FAIL %s\n", rank, what.c_str());
  }
}

float Value(int rank, int64_t i) { return static_cast<float>((rank + 1) * 1000 + i % 977) * 0.25f; }

// Host data through a device buffer and back, around `call`.
template <typename T, typename Call>
bool OnDevice(std::vector<T>& host, Call call) {
  T* device = nullptr;
  const size_t bytes = std::max<size_t>(1, host.size() * sizeof(T));
  if (cudaMalloc(&device, bytes) != cudaSuccess) return false;
  cudaMemcpy(device, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
  const bool ok = call(device);
  cudaMemcpy(host.data(), device, host.size() * sizeof(T), cudaMemcpyDeviceToHost);
  cudaFree(device);
  return ok;
}

}  // namespace

int main() {
  auto version = tc::NcclVersion();
  if (!version.ok()) {
    std::printf("FAIL: %s\n", std::string(version.status().message()).c_str());
    return 1;
  }
  auto launch = tc::LaunchFromEnv();
  if (!launch.ok()) {
    std::printf("FAIL: %s\n", std::string(launch.status().message()).c_str());
    return 1;
  }
  std::printf("%s; %s\n", version->c_str(), launch->Describe().c_str());
  auto made = tc::MakeNcclCommunicator(*launch, {.timeout_seconds = 60});
  if (!made.ok()) {
    std::printf("FAIL: %s\n", std::string(made.status().message()).c_str());
    return 1;
  }
  tc::Communicator& c = **made;
  const int r = c.rank(), n = c.size();
  Expect(c.name() == "nccl", r, "name");
  // All-reduce: sums of small integers times 0.25 are exact in float, whatever the order.
  for (int64_t count : {1, 1000, 100003}) {
    std::vector<float> x(count);
    for (int64_t i = 0; i < count; ++i) x[i] = Value(r, i);
    Expect(OnDevice(x, [&](float* d) { return c.AllReduce(d, count).ok(); }), r, "all-reduce returned an error");
    bool ok = true;
    for (int64_t i = 0; i < count; ++i) {
      float want = 0;
      for (int k = 0; k < n; ++k) want += Value(k, i);
      ok = ok && x[i] == want;
    }
    Expect(ok, r, "all-reduce sums of " + std::to_string(count));
  }
  std::vector<double> d = {static_cast<double>(r), -static_cast<double>(r)};
  Expect(
      OnDevice(d, [&](double* p) { return c.AllReduce(p, 2, tc::ReduceOp::kMax).ok(); }) && d[0] == n - 1 && d[1] == 0,
      r, "all-reduce max");
  std::vector<double> m = {10.0 + r};
  Expect(OnDevice(m, [&](double* p) { return c.AllReduce(p, 1, tc::ReduceOp::kMin).ok(); }) && m[0] == 10.0, r,
         "all-reduce min");
  // Reduce-scatter then all-gather (ZeRO's pair): uneven (blocks of 64) and even slices.
  for (const auto& [total, align] : std::vector<std::pair<int64_t, int64_t>>{{10007, 64}, {5, 64}, {4096 * n, 1}}) {
    const tc::Slices s = tc::Slices::Even(total, n, align);
    const std::string what = " of " + std::to_string(total) + " in blocks of " + std::to_string(align);
    std::vector<float> x(total);
    for (int64_t i = 0; i < total; ++i) x[i] = Value(r, i);
    Expect(OnDevice(x, [&](float* p) { return c.ReduceScatterSum(p, s).ok(); }), r, "reduce-scatter error" + what);
    bool ok = true;
    for (int64_t i = s.offset[r]; i < s.offset[r] + s.count[r]; ++i) {
      float want = 0;
      for (int k = 0; k < n; ++k) want += Value(k, i);
      ok = ok && x[i] == want;
    }
    Expect(ok, r, "reduce-scatter: this rank's slice holds the sums" + what);
    for (int64_t i = s.offset[r]; i < s.offset[r] + s.count[r]; ++i) x[i] = static_cast<float>(r * 100000 + i);
    Expect(OnDevice(x, [&](float* p) { return c.AllGather(p, s).ok(); }), r, "all-gather error" + what);
    ok = true;
    for (int k = 0; k < n; ++k) {
      for (int64_t i = s.offset[k]; i < s.offset[k] + s.count[k]; ++i) ok = ok && x[i] == k * 100000 + i;
    }
    Expect(ok, r, "all-gather: every slice from its rank" + what);
  }
  std::vector<int32_t> both(3 + 3 * n);
  both[0] = r;
  both[1] = r * 7;
  both[2] = -r;
  Expect(OnDevice(both, [&](int32_t* p) { return c.AllGatherBytes(p, p + 3, sizeof(int32_t) * 3).ok(); }), r,
         "byte gather returned an error");
  bool ok = true;
  for (int k = 0; k < n; ++k) ok = ok && both[3 + 3 * k] == k && both[4 + 3 * k] == 7 * k && both[5 + 3 * k] == -k;
  Expect(ok, r, "byte gather: every rank's block in rank order");
  double host = r + 1.0;  // host memory: staged through the GPU
  Expect(c.AllReduce(&host, 1).ok() && host == n * (n + 1) / 2.0, r, "all-reduce of a host value");
  Expect(c.Barrier().ok(), r, "barrier");
  Expect(c.stats().calls == 14 && (c.stats().bytes_sent > 0) == (n > 1), r, "traffic counted for every call");
  std::printf("rank %d of %d: %d passed, %d failed\n", r, n, passed, failed);
  return failed == 0 ? 0 : 1;
}
