// A training-shaped client of a tierd that owns a real GPU, with and without the planner:
// an 8-layer Llama-style step (forward, backward, AdamW; 2.5 GiB of tensors in a 1.5 GiB
// GPU quota) where each op "computes" for its planned time (a spin kernel), every tensor it
// reads is checked on the GPU against the pattern last written, and every tensor it writes
// gets a new pattern. Releases are asynchronous (CUDA IPC events order them).
//   gpu_planned_worker RUNTIME_DIR LAPS plan|lru
// plan: registers the graph and reports each op (tierd moves tensors ahead of use);
// lru: neither (tierd fetches on demand). Prints per-iteration time, the time the client
// waited inside Acquire, and the daemon's counters; exit 0 when every word came back right.
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "base/units.h"
#include "clients/client.h"
#include "clients/graph_spec.h"
#include "prefetcher/synthetic.h"
#include "tools/gpu_check/kernels.h"

namespace tierd {
namespace {

namespace tp = prefetcher;
using Seconds = std::chrono::duration<double>;

int Fail(const std::string& what) {
  std::fprintf(stderr, "gpu_planned_worker: %s\n", what.c_str());
  return 1;
}

uint32_t Seed(size_t t, uint32_t version) { return static_cast<uint32_t>(t * 7919 + version); }

int Run(const std::string& dir, int laps, bool plan) {
  tp::TraceOptions trace;
  trace.micro_batch_seqs = 8;
  trace.seq_len = 2048;
  trace.grad_accum = 2;
  trace.flops_per_s = 100e12;  // op times of a few ms: something to hide the moves behind
  const tp::Graph graph = tp::SyntheticTransformer({"gpu8", 8, 1024, 2752, 8192}, trace);
  uint64_t total = 0;
  double compute = 0;
  for (const auto& t : graph.tensors) total += t.bytes;
  for (const auto& op : graph.ops) compute += op.seconds;
  auto client = Client::Connect({dir, plan ? "planned" : "on-demand", {total * 6 / 10, total / 2, 2 * total}});
  if (!client.ok()) return Fail(client.status().ToString());
  cudaStream_t stream;
  if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) return Fail("stream");
  unsigned long long* mismatches = nullptr;
  if (cudaMalloc(&mismatches, sizeof(*mismatches)) != cudaSuccess) return Fail("cudaMalloc");
  cudaMemset(mismatches, 0, sizeof(*mismatches));
  std::vector<Client::Tensor> tensors;
  std::vector<uint32_t> version(graph.tensors.size(), 0);
  for (size_t t = 0; t < graph.tensors.size(); ++t) {
    const auto& g = graph.tensors[t];
    auto lease = (*client)->Lease({g.name, TensorClass::kParam, DType::kU8, {static_cast<int64_t>(g.bytes)}});
    if (!lease.ok()) return Fail(lease.status().ToString());
    tensors.push_back(*lease);
    auto p = (*client)->Acquire(*lease, Access::kOverwrite, Place::kGpu);
    if (!p.ok()) return Fail(p.status().ToString());
    if (gpu_check::LaunchFillPattern(stream, static_cast<uint32_t*>(*p), g.bytes / 4, Seed(t, 0)) != cudaSuccess) {
      return Fail("fill");
    }
    if (auto s = (*client)->Release(*lease, stream); !s.ok()) return Fail(s.ToString());
  }
  std::string predicted;
  if (plan) {
    auto reply = (*client)->RegisterGraph(ToGraphSpec(graph));
    if (!reply.ok()) return Fail("register graph: " + reply.status().ToString());
    predicted = reply->summary().substr(0, reply->summary().find('\n') + 1);  // the prediction
  }
  std::printf("%s: %zu tensors (%s), %zu ops, compute %.3f s per iteration, GPU quota %s\n",
              plan ? "planned" : "on-demand", graph.tensors.size(), FormatBytes(total).c_str(), graph.ops.size(),
              compute, FormatBytes(total * 6 / 10).c_str());
  double steady_lap = 0, steady_wait = 0;
  int steady = 0;
  for (int lap = 0; lap < laps; ++lap) {
    const auto lap_start = std::chrono::steady_clock::now();
    double waited = 0;
    for (uint32_t i = 0; i < graph.ops.size(); ++i) {
      if (plan) {
        if (auto s = (*client)->OpBegin(i); !s.ok()) return Fail(s.ToString());
      }
      const auto& op = graph.ops[i];
      const std::vector<tp::TensorIndex> touched = tp::Touched(op);
      for (auto t : touched) {
        const tp::Use use = tp::UseOf(op, t);
        const Access access = use == tp::Use::kRead ? Access::kRead
                              : use == tp::Use::kWrite ? Access::kWrite : Access::kOverwrite;
        const auto before = std::chrono::steady_clock::now();
        auto p = (*client)->Acquire(tensors[t], access, Place::kGpu);
        waited += Seconds(std::chrono::steady_clock::now() - before).count();
        if (!p.ok()) return Fail(graph.tensors[t].name + " at " + op.name + ": " + p.status().ToString());
        auto* words = static_cast<uint32_t*>(*p);
        const size_t count = graph.tensors[t].bytes / 4;
        if (use != tp::Use::kOverwrite &&
            gpu_check::LaunchCountMismatches(stream, words, count, Seed(t, version[t]), mismatches) != cudaSuccess) {
          return Fail("check");
        }
        if (use != tp::Use::kRead &&
            gpu_check::LaunchFillPattern(stream, words, count, Seed(t, ++version[t])) != cudaSuccess) {
          return Fail("fill");
        }
      }
      if (gpu_check::LaunchSpin(stream, static_cast<uint64_t>(op.seconds * 1e9)) != cudaSuccess) return Fail("spin");
      for (auto t : touched) {
        if (auto s = (*client)->Release(tensors[t], stream); !s.ok()) return Fail(s.ToString());
      }
    }
    unsigned long long wrong = 0;
    if (cudaMemcpyAsync(&wrong, mismatches, sizeof(wrong), cudaMemcpyDeviceToHost, stream) != cudaSuccess ||
        cudaStreamSynchronize(stream) != cudaSuccess) {
      return Fail("sync");
    }
    const double seconds = Seconds(std::chrono::steady_clock::now() - lap_start).count();
    std::printf("  iteration %d: %.3f s, waited in acquire %.3f s, wrong words so far %llu\n", lap, seconds, waited,
                wrong);
    if (wrong != 0) return Fail(std::to_string(wrong) + " wrong words");
    if (lap >= 2) {
      steady_lap += seconds;
      steady_wait += waited;
      ++steady;
    }
  }
  auto stats = (*client)->Stats();
  if (!stats.ok()) return Fail(stats.status().ToString());
  std::printf("%s: steady iteration %.3f s (compute %.3f s), waited in acquire %.3f s; daemon: stalls %lu, "
              "prefetches %lu, discards %lu, hits %lu\n",
              plan ? "planned" : "on-demand", steady_lap / std::max(steady, 1), compute,
              steady_wait / std::max(steady, 1), static_cast<unsigned long>(stats->stalls()),
              static_cast<unsigned long>(stats->prefetches()), static_cast<unsigned long>(stats->discards()),
              static_cast<unsigned long>(stats->acquire_hits()));
  if (plan) std::printf("%s", predicted.c_str());
  return 0;
}

}  // namespace
}  // namespace tierd

int main(int argc, char** argv) {
  if (argc != 4) return tierd::Fail("usage: gpu_planned_worker RUNTIME_DIR LAPS plan|lru");
  const std::string mode = argv[3];
  if (mode != "plan" && mode != "lru") return tierd::Fail("the mode is plan or lru");
  return tierd::Run(argv[1], std::stoi(argv[2]), mode == "plan");
}
