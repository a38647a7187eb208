#ifndef TIERD_BASE_GPU_UTILISATION_H_
#define TIERD_BASE_GPU_UTILISATION_H_

// A GPU's utilisation as the driver samples it (NVML's "GPU utilization": the share of each
// sample period, 1/6 s to 1 s, in which a kernel ran; what nvidia-smi shows). NVML is opened
// with dlopen (libnvidia-ml.so.1 comes with the driver, not the toolkit), so the build needs
// nothing and a machine without the driver gets a clear UNAVAILABLE. The figure is the
// device's, every process on it included: on a shared GPU it is not one job's.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace tierd {

struct UtilisationSample {
  uint64_t time_us = 0;  // the end of the sample's period (host clock, microseconds)
  double percent = 0;
};

// The mean of the samples after *since_us (their periods ended after it), and *since_us moved
// to the latest of them; nullopt (and *since_us unchanged) when none is newer.
std::optional<double> MeanUtilisationSince(const std::vector<UtilisationSample>& samples, uint64_t* since_us);
// The mean of the samples within `window_us` of the newest (its period included); nullopt when
// there are none.
std::optional<double> MeanUtilisationWithin(const std::vector<UtilisationSample>& samples, uint64_t window_us);

class GpuUtilisation {
 public:
  // The GPU at a PCI bus id as cudaDeviceGetPCIBusId writes it ("0000:3B:00.0"). UNAVAILABLE
  // with the reason when there is no NVML (no NVIDIA driver) or it does not know the device.
  static absl::StatusOr<std::unique_ptr<GpuUtilisation>> Open(const std::string& pci_bus_id);
  virtual ~GpuUtilisation() = default;
  // Where the driver's samples end now: a mark for Since.
  virtual uint64_t Mark() = 0;
  // The mean utilisation (percent) of the samples after *mark, and *mark moved past them;
  // nullopt when no new sample came (an interval shorter than the sample period). Several
  // marks may follow one GPU (each step's, a run's).
  virtual std::optional<double> Since(uint64_t* mark) = 0;
  // The mean over the driver's samples of about the last `seconds` (at least the newest
  // sample's period); no state: safe from several threads at once.
  virtual std::optional<double> Recent(double seconds) = 0;
  // The GPU memory each compute process on the device holds, as nvidia-smi lists it (its
  // allocations, its CUDA context included): pid -> bytes. UNAVAILABLE where the driver
  // does not say (some virtualised setups).
  virtual absl::StatusOr<std::vector<std::pair<uint32_t, uint64_t>>> ProcessMemory() = 0;
};

// Of `processes` (ProcessMemory's), the bytes of this process and those of the processes
// whose name (/proc/PID/comm) is `name` ("tierd"), summed.
uint64_t ProcessBytes(const std::vector<std::pair<uint32_t, uint64_t>>& processes, uint32_t pid);
uint64_t NamedProcessesBytes(const std::vector<std::pair<uint32_t, uint64_t>>& processes, const std::string& name);

}  // namespace tierd

#endif  // TIERD_BASE_GPU_UTILISATION_H_
