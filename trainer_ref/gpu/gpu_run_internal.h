// What the GPU run's files share (gpu_run.cc: the steps; gpu_run_setup.cc: setting up;
// gpu_run_report.cc: validation, the summary, the export): the run's class and its clocks.
// Not part of the trainer's interface (gpu_run.h).
#ifndef TIERD_TRAINER_REF_GPU_GPU_RUN_INTERNAL_H_
#define TIERD_TRAINER_REF_GPU_GPU_RUN_INTERNAL_H_

#include <cuda_runtime_api.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "base/units.h"
#include "comm/launch_env.h"
#include "comm/nccl_communicator.h"
#include "base/gpu_utilisation.h"
#include "trainer_ref/checkpoint.h"
#include "trainer_ref/data.h"
#include "trainer_ref/gpu/gpu_model.h"
#include "trainer_ref/gpu/gpu_run_checkpoint.h"
#include "trainer_ref/gpu/gpu_run_state.h"
#include "trainer_ref/hf/hf_checkpoint.h"
#include "trainer_ref/optimizer.h"
#include "trainer_ref/plot.h"
#include "trainer_ref/run_report.h"

namespace tierd::trainer::gpu {

using Clock = std::chrono::steady_clock;

inline double Since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// Launch-to-first-step time by phase, said in one line before the first step.
struct Startup {
  Clock::time_point start = Clock::now(), phase = start;
  std::vector<std::string> phases;
  void Done(const char* what) {
    phases.push_back(absl::StrFormat("%s %.1f s", what, Since(phase)));
    phase = Clock::now();
  }
  std::string Line() const {
    return absl::StrFormat("startup: %.1f s (%s)", Since(start), absl::StrJoin(phases, ", "));
  }
};

// The share of `seconds` each PCIe direction had a copy in flight between two readings of
// tierd's links (at most 1: the readings and the step's clock are a few microseconds apart).
std::pair<double, double> PcieBusy(const HomeTraffic& from, const HomeTraffic& to, double seconds);

// One run: set up, the steps, the summary. Members hold what the phases share.
class GpuRun {
 public:
  explicit GpuRun(const RunSettings& s) : s_(s), ck_{s.checkpoint_dir, "", 0}, spikes_(s.loss_spike_sds) {}
  int Run();

 private:
  int Setup();
  int Step(int64_t step);  // 0, or the exit status of a failure
  // The mean loss of `batches` held-out batches, forward only, the same windows every time.
  absl::StatusOr<double> ValidationLoss(int batches);
  int Validate(int64_t step);  // prints, plots and records it; 0, or the exit status
  void Summary();
  int Export();  // --export: the master weights as a Hugging Face checkpoint
  std::string Progress(int64_t step, double loss, double lr, double grad_norm, double seconds,
                       const HomeTraffic& after, std::optional<double> util);
  std::pair<uint64_t, std::string> GpuMemory(const HomeTraffic& t) const;
  HomeTraffic Traffic() {
    auto t = model_->home().Moved();
    return t.ok() ? *t : HomeTraffic{};
  }

  // Data-parallel GPU ranks (one a GPU, from the launcher's environment): NCCL, the
  // gradients summed each step; rank 0 prints, writes the metrics and the checkpoints (every
  // rank holds the same state) and every rank resumes from them.
  int SetupRanks();
  int ConnectRanks();

  const RunSettings& s_;
  comm::LaunchInfo launch_;
  std::unique_ptr<comm::Communicator> comm_;
  int ranks_ = 1, device_ = 0;
  bool lead_ = true;
  double comm_seconds_before_ = 0, comm_bytes_before_ = 0;
  CheckpointTrail ck_;
  Startup startup_;
  std::unique_ptr<GpuModel> model_;
  std::unique_ptr<Dataset> data_;
  std::unique_ptr<Batcher> batcher_;
  GpuPlan plan_;  // every choice, made once (ResolveGpuPlan)
  bool optimizer_on_cpu_ = false;
  bool host_optimizer_ = false;  // the host steps some groups, or all (optimizer_on_cpu_)
  bool fp8_ = false;     // the layers' matmuls in FP8 (--precision=fp8, or auto's choice)
  int layer_major_ = 0;  // K micro-batches a step in layer-major order; 0: one after the other
  RunState run_;
  LossWindow window_;
  SpikeGuard spikes_;
  StepReporter reporter_;
  std::ofstream metrics_;
  RunCurves curves_;
  std::vector<int32_t> inputs_, targets_;
  std::vector<GpuModel::ProfileEntry> profile_;  // ms and FLOPs summed over the timed steps
  // NVML's GPU-Util (null: no NVML), with marks where each step's and the timed steps' samples begin.
  std::unique_ptr<GpuUtilisation> util_;
  uint64_t step_mark_ = 0, timed_mark_ = 0;
  double timed_seconds_ = 0, last_loss_ = 0, timed_waits_ = 0, timed_releases_ = 0, last_validation_ = 0;
  int64_t timed_steps_ = 0;
  uint64_t device_bytes_ = 0;  // NVML's figure for this process and tierd at the end of the run
  HomeTraffic before_, timed_from_, timed_to_;  // tierd's counters around the timed steps
};

}  // namespace tierd::trainer::gpu

#endif  // TIERD_TRAINER_REF_GPU_GPU_RUN_INTERNAL_H_
