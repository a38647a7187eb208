// Where a trainer's tensors live between uses: one abstraction for both trainers.
//
// A home holds a table of named tensors (a name, a class, a size in bytes), fixed when it
// is made. A trainer acquires a tensor, by its index in the table, at a place — the host
// or the GPU — for as long as an op uses it, and releases it after (with the CUDA stream
// whose queued work uses it, if any). A home smaller than the whole (tierd's tiers) moves
// the rest away meanwhile, ahead of need when the trainer registers its step as a graph.
//   plain: every tensor allocated once in one place (host or device memory), always there
//          (--offload_policy=none, the baseline);
//   tierd: every tensor leased from tierd by name (tierd_home.h).
// Each trainer reaches its tensors through its own coordinates over the table: the CPU
// trainer's (entry, kind), tensor_home.h; the GPU model's (group, part, chunk),
// gpu/gpu_home.h.
#ifndef TIERD_TRAINER_REF_HOME_HOME_H_
#define TIERD_TRAINER_REF_HOME_HOME_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "base/access.h"
#include "prefetcher/graph.h"
#include "runtime/tensor.h"

namespace tierd::trainer {

struct HomeTensor {
  std::string name;
  TensorClass cls = TensorClass::kScratch;
  uint64_t bytes = 0;
  bool operator==(const HomeTensor& o) const { return name == o.name && cls == o.cls && bytes == o.bytes; }
};
using HomeTable = std::vector<HomeTensor>;

// Bytes moved per link so far, the tiers' peak use and demand fetches (all 0 for a plain home).
struct HomeTraffic {
  uint64_t host_to_gpu = 0, gpu_to_host = 0, nvme_read = 0, nvme_write = 0;
  uint64_t all_links = 0;  // every link's bytes, moves within a tier included
  uint64_t gpu_peak = 0, gpu_quota = 0, dram_peak = 0, nvme_peak = 0, demand_fetches = 0;
  // Seconds each PCIe direction had a copy in flight (tierd's links, every session's).
  double host_to_gpu_busy = 0, gpu_to_host_busy = 0;
};

class Home {
 public:
  virtual ~Home() = default;
  // The tensors, in the order they are indexed.
  virtual const HomeTable& table() const = 0;
  // Whether Acquire serves a pointer at `place` (a plain home: its one place; tierd: the
  // host always, the GPU when the daemon owns a real one).
  virtual bool Holds(Place place) const = 0;
  // A pointer to the tensor's bytes at `place`, valid until Release. kOverwrite: the old
  // values may be gone (nothing is fetched).
  virtual absl::StatusOr<void*> Acquire(size_t index, Access access, Place place) = 0;
  // `stream`: the cudaStream_t whose queued work uses the tensor (tierd waits for it before
  // it moves the bytes); null: nothing is queued.
  virtual absl::Status Release(size_t index, void* stream = nullptr) = 0;

  // The planner: the step as ops over the table's names, registered once; then the op
  // about to run. Returns the prediction in words ("" for a home without a planner).
  virtual absl::StatusOr<std::string> RegisterGraph(const prefetcher::Graph&) { return std::string(); }
  virtual absl::Status OpBegin(uint32_t) { return absl::OkStatus(); }
  // Or, without a graph: the start of each step; the home records the first step and plans
  // from it (tierd's MarkIteration). Returns what it did in words ("" without a planner).
  virtual absl::StatusOr<std::string> MarkIteration() { return std::string(); }
  // After a step: its loss (not finite: skipped), seconds and tokens, for tierd's statistics
  // (tierctl stats, Prometheus). Nothing without tierd.
  virtual absl::Status ReportStep(int64_t, double, double, double) { return absl::OkStatus(); }

  virtual absl::StatusOr<HomeTraffic> Moved() { return HomeTraffic{}; }
  // Device bytes this home allocated itself (a plain device home: everything; tierd: none,
  // its GPU tier is the daemon's and reported by Moved).
  virtual uint64_t OwnDeviceBytes() const { return 0; }
  // The most GPU memory this home held since the last call (tierd: this session's GPU
  // arena, peaks reset at each call), for a peak per step.
  virtual absl::StatusOr<uint64_t> TakeGpuPeak() { return OwnDeviceBytes(); }
  // One line on where the bytes went, for the run's summary.
  virtual std::string Describe() = 0;
  // tierd: this process's time in the hot path's ring calls over the run, by kind; "" else.
  virtual std::string HotPathNote() { return ""; }
};

uint64_t TableBytes(const HomeTable& table);

// INVALID_ARGUMENT naming the first difference when a home's table is not `wanted` (a home
// made for another model, shape or layout); `what` names the wanted one in the message.
absl::Status CheckTable(const HomeTable& held, const HomeTable& wanted, const std::string& what);

// Where a plain home allocates: one place, and how. `allocate` gets the tensor, the bytes
// allocated so far and the table's total (for an error that explains itself); its memory
// is zeroed on the host, as it comes on the device.
struct PlainMemory {
  Place place = Place::kHost;
  std::string describe = "plain buffers (no offload)";
  std::function<absl::StatusOr<void*>(const HomeTensor&, uint64_t held, uint64_t total)> allocate;
  std::function<void(void*)> free;
};

// Zeroed host memory, 64-byte aligned.
PlainMemory HostMemory();

// Allocates every tensor of the table; the first allocation that fails comes back as it is.
absl::StatusOr<std::unique_ptr<Home>> MakePlainHome(HomeTable table, PlainMemory memory = HostMemory());

}  // namespace tierd::trainer

#endif  // TIERD_TRAINER_REF_HOME_HOME_H_
