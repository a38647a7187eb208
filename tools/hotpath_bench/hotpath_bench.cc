// hotpath_bench: acquire+release round-trip latency of a resident tensor, through the
// shared-memory ring vs through gRPC, with N client processes on one real tierd; and
// gRPC lease+unlease throughput. Target: ring median <= 5 us, p99 <= 50 us
// with 4 concurrent clients. With --gpu=cuda also the release a GPU trainer makes after
// queueing its kernels (Release with a CUDA stream: the client records its interprocess event,
// the daemon makes a fence of it), on an idle stream, so what is timed is the calls alone.
// Then one session shared by two threads, one moving a 64 MiB tensor between the tiers each
// call (demand fetches, as a forward's weights, 2 ms apart) while the other times its pairs
// (200 us apart, as an optimizer's update exchanges), the session's calls on one ring and on
// two (ClientOptions::rings).
//   hotpath_bench --tierd=bazel-bin/server/tierd --clients=4 --pairs=20000
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_format.h"
#include "base/units.h"
#include "clients/client.h"
#ifdef TIERD_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

ABSL_FLAG(std::string, tierd, "bazel-bin/server/tierd", "the tierd binary to start");
ABSL_FLAG(std::string, gpu, "fake", "tierd's --gpu (fake, auto, cuda)");
ABSL_FLAG(int, clients, 4, "concurrent client processes");
ABSL_FLAG(int, pairs, 20000, "acquire+release pairs per client and path");
ABSL_FLAG(std::string, worker, "", "internal: run as a client; the runtime dir");
ABSL_FLAG(std::string, out, "", "internal: where a worker writes its samples");

namespace tierd {
namespace {

using Clock = std::chrono::steady_clock;

// Times `pairs` acquire+release round trips of one resident tensor; nanoseconds each.
// `stream`: released after the work queued there (a CUDA stream), or plainly (null). `gap`:
// a sleep before each (a trainer's work between its calls).
std::vector<uint32_t> TimePairs(Client& client, const Client::Tensor& tensor, Place place, int pairs,
                                void* stream = nullptr, std::chrono::microseconds gap = {}, int warmup = 1000) {
  std::vector<uint32_t> samples;
  samples.reserve(pairs);
  for (int i = 0; i < pairs + warmup; ++i) {
    if (gap.count() > 0) std::this_thread::sleep_for(gap);
    const auto start = Clock::now();
    auto p = client.Acquire(tensor, Access::kRead, place);
    auto r = stream != nullptr ? client.Release(tensor, stream) : client.Release(tensor);
    const auto nanos = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count();
    if (!p.ok() || !r.ok()) {
      std::fprintf(stderr, "worker: %s\n", (!p.ok() ? p.status() : r).ToString().c_str());
      std::exit(1);
    }
    if (i >= warmup) samples.push_back(static_cast<uint32_t>(std::min<int64_t>(nanos, UINT32_MAX)));
  }
  return samples;
}

int Worker(const std::string& dir, const std::string& out, int pairs) {
  const Place place = absl::GetFlag(FLAGS_gpu) == "fake" ? Place::kHost : Place::kGpu;
  std::ofstream file(out, std::ios::binary);
  void* stream = nullptr;
#ifdef TIERD_HAVE_CUDA
  if (place == Place::kGpu) {
    cudaStream_t s = nullptr;
    if (cudaStreamCreate(&s) != cudaSuccess) return 1;
    stream = s;
  }
#endif
  {  // the ring, releases with a stream (none without CUDA: an empty sample)
    std::vector<uint32_t> samples;
    if (stream != nullptr) {
      auto client = Client::Connect({dir, "fenced", {4 * kMiB, 4 * kMiB, 0}, true});
      if (!client.ok()) return 1;
      auto tensor = (*client)->Lease({"hot", TensorClass::kParam, DType::kF32, {1024}});
      if (!tensor.ok()) return 1;
      samples = TimePairs(**client, *tensor, place, pairs / 4, stream);
    }
    const uint32_t count = samples.size();
    file.write(reinterpret_cast<const char*>(&count), 4);
    file.write(reinterpret_cast<const char*>(samples.data()), 4 * count);
  }
  for (bool ring : {true, false}) {
    auto client = Client::Connect({dir, ring ? "ring" : "grpc", {4 * kMiB, 4 * kMiB, 0}, ring});
    if (!client.ok()) {
      std::fprintf(stderr, "worker: %s\n", client.status().ToString().c_str());
      return 1;
    }
    auto tensor = (*client)->Lease({"hot", TensorClass::kParam, DType::kF32, {1024}});
    if (!tensor.ok()) return 1;
    std::vector<uint32_t> samples = TimePairs(**client, *tensor, place, ring ? pairs : pairs / 4);
    const uint32_t count = samples.size();
    file.write(reinterpret_cast<const char*>(&count), 4);
    file.write(reinterpret_cast<const char*>(samples.data()), 4 * count);
    if (!ring) {  // gRPC control-plane throughput: lease + unlease pairs
      const auto start = Clock::now();
      const int leases = 2000;
      for (int i = 0; i < leases; ++i) {
        auto t = (*client)->Lease({"t" + std::to_string(i), TensorClass::kScratch, DType::kU8, {4096}});
        if (!t.ok() || !(*client)->Unlease(*t).ok()) return 1;
      }
      const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
      file.write(reinterpret_cast<const char*>(&seconds), sizeof(seconds));
    }
  }
  return 0;
}

// One session, two threads: one writes a 64 MiB tensor on the GPU tier and on the host in
// turn (each acquire moves it: a demand fetch; 2 ms of sleep after each), the other times acquire+release pairs of a
// resident tensor meanwhile, 200 us of sleep (its work) before each. With one ring the pairs wait behind the moves; with a ring each,
// they should not. Samples of the pairs (ns); `moves`: how many moves ran meanwhile.
std::vector<uint32_t> PairsBesideMoves(const std::string& dir, int rings, int pairs, int* moves) {
  auto client = Client::Connect({.runtime_dir = dir, .label = "shared", .quota = {96 * kMiB, 96 * kMiB, 0},
                                 .rings = rings});
  if (!client.ok()) {
    std::fprintf(stderr, "hotpath_bench: %s\n", client.status().ToString().c_str());
    std::exit(1);
  }
  auto big = (*client)->Lease({"big", TensorClass::kParam, DType::kU8, {64 * kMiB}});
  auto hot = (*client)->Lease({"hot", TensorClass::kOptState, DType::kF32, {1024}});
  if (!big.ok() || !hot.ok()) std::exit(1);
  std::atomic<bool> stop{false};
  std::atomic<int> moved{0};
  std::thread mover([&] {
    for (int k = 0; !stop.load(); ++k) {
      const Place place = k % 2 == 0 ? Place::kGpu : Place::kHost;
      auto p = (*client)->Acquire(*big, Access::kWrite, place);  // the other tier's copy comes here
      if (!p.ok() || !(*client)->Release(*big).ok()) std::exit(1);
      moved.fetch_add(1);
      std::this_thread::sleep_for(std::chrono::milliseconds(2));  // a layer's compute between fetches
    }
  });
  while (moved.load() < 2) std::this_thread::yield();
  // Work between pairs (an optimizer's kernels): the other thread gets the ring in between.
  std::vector<uint32_t> samples =
      TimePairs(**client, *hot, Place::kHost, pairs, nullptr, std::chrono::microseconds(200), /*warmup=*/0);
  stop = true;
  mover.join();
  *moves = moved.load();
  return samples;
}

double Percentile(std::vector<uint32_t>& v, double q) {
  const size_t index = std::min(v.size() - 1, static_cast<size_t>(q * v.size()));
  std::nth_element(v.begin(), v.begin() + index, v.end());
  return v[index] / 1000.0;
}

int Driver() {
  const int clients = absl::GetFlag(FLAGS_clients), pairs = absl::GetFlag(FLAGS_pairs);
  const std::string dir = "/tmp/hotpath-" + std::to_string(getpid());
  const pid_t tierd = fork();
  if (tierd == 0) {
    const std::string gpu = "--gpu=" + absl::GetFlag(FLAGS_gpu);
    const std::string run = "--runtime_dir=" + dir;
    execl(absl::GetFlag(FLAGS_tierd).c_str(), "tierd", gpu.c_str(), "--gpu_bytes=256MiB",
          "--dram_bytes=256MiB", run.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  for (int i = 0; i < 200 && access((dir + "/tierd.grpc.sock").c_str(), F_OK) != 0; ++i) usleep(20000);
  std::vector<pid_t> workers;
  for (int c = 0; c < clients; ++c) {
    const pid_t pid = fork();
    if (pid == 0) {
      const std::string out = dir + "/samples." + std::to_string(c);
      execl("/proc/self/exe", "hotpath_bench", ("--worker=" + dir).c_str(), ("--out=" + out).c_str(),
            ("--pairs=" + std::to_string(pairs)).c_str(), ("--gpu=" + absl::GetFlag(FLAGS_gpu)).c_str(),
            static_cast<char*>(nullptr));
      _exit(127);
    }
    workers.push_back(pid);
  }
  int failed = 0;
  for (pid_t pid : workers) {
    int status = 0;
    waitpid(pid, &status, 0);
    failed += !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  std::vector<uint32_t> fenced, ring, grpc;
  double lease_seconds = 0;
  for (int c = 0; c < clients && failed == 0; ++c) {
    std::ifstream file(dir + "/samples." + std::to_string(c), std::ios::binary);
    for (auto* v : {&fenced, &ring, &grpc}) {
      uint32_t count = 0;
      file.read(reinterpret_cast<char*>(&count), 4);
      const size_t old = v->size();
      v->resize(old + count);
      file.read(reinterpret_cast<char*>(v->data() + old), 4 * count);
    }
    double seconds = 0;
    file.read(reinterpret_cast<char*>(&seconds), sizeof(seconds));
    lease_seconds = std::max(lease_seconds, seconds);
    std::remove((dir + "/samples." + std::to_string(c)).c_str());
  }
  std::vector<std::vector<uint32_t>> beside(2);
  int moves[2] = {};
  for (int rings = 1; rings <= 2 && failed == 0; ++rings) {
    beside[rings - 1] = PairsBesideMoves(dir, rings, std::max(pairs / 5, 100), &moves[rings - 1]);
  }
  kill(tierd, SIGTERM);
  waitpid(tierd, nullptr, 0);
  if (failed > 0) {
    std::fprintf(stderr, "hotpath_bench: %d worker(s) failed\n", failed);
    return 1;
  }
  char host[256] = {};
  gethostname(host, sizeof(host));
  std::printf("hotpath_bench: acquire+release of a resident tensor, ring vs gRPC, same run\n");
  std::printf("machine: %s, %ld cores; tierd --gpu=%s; %d client processes at once\n\n", host,
              sysconf(_SC_NPROCESSORS_ONLN), absl::GetFlag(FLAGS_gpu).c_str(), clients);
  std::printf("%-30s %9s %9s %9s %9s %9s\n", "path", "pairs", "p50 us", "p99 us", "p99.9 us", "max us");
  for (auto [name, v] : {std::pair{"ring", &ring}, {"gRPC", &grpc}, {"ring, release after GPU work", &fenced}}) {
    const size_t n = v->size();
    if (n == 0) continue;  // (the fenced path: CUDA only)
    const double p50 = Percentile(*v, 0.5), p99 = Percentile(*v, 0.99), p999 = Percentile(*v, 0.999);
    std::printf("%-30s %9zu %9.1f %9.1f %9.1f %9.1f\n", name, n, p50, p99, p999,
                *std::max_element(v->begin(), v->end()) / 1000.0);
  }
  std::printf("\nring p50 / gRPC p50 = %.3f\n", Percentile(ring, 0.5) / Percentile(grpc, 0.5));
  std::printf("\none session, another thread moving 64 MiB between the tiers each call meanwhile:\n");
  std::printf("%-30s %9s %9s %9s %9s %9s\n", "rings", "pairs", "p50 us", "p99 us", "mean us", "moves");
  double mean[2] = {};
  for (int r = 0; r < 2; ++r) {
    std::vector<uint32_t>& v = beside[r];
    double sum = 0;
    for (uint32_t x : v) sum += x / 1000.0;
    mean[r] = sum / static_cast<double>(v.size());
    std::printf("%-30s %9zu %9.1f %9.1f %9.1f %9d\n", r == 0 ? "one ring for both threads" : "a ring each", v.size(),
                Percentile(v, 0.5), Percentile(v, 0.99), mean[r], moves[r]);
  }
  std::printf("the pairs' mean, one ring / a ring each = %.1fx\n", mean[0] / mean[1]);
  std::printf("gRPC lease+unlease: %.0f pairs/s (%d clients x 2000 pairs, slowest client %.2f s)\n",
              clients * 2000 / lease_seconds, clients, lease_seconds);
  std::printf("target: ring p50 <= 5 us, p99 <= 50 us: %s\n",
              Percentile(ring, 0.5) <= 5 && Percentile(ring, 0.99) <= 50 ? "met" : "NOT met");
  rmdir(dir.c_str());
  return 0;
}

}  // namespace
}  // namespace tierd

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("acquire/release round-trip latency, shm ring vs gRPC, N clients on one tierd");
  absl::ParseCommandLine(argc, argv);
  if (!absl::GetFlag(FLAGS_worker).empty()) {
    return tierd::Worker(absl::GetFlag(FLAGS_worker), absl::GetFlag(FLAGS_out), absl::GetFlag(FLAGS_pairs));
  }
  return tierd::Driver();
}
