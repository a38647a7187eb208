#include "base/gpu_utilisation.h"

#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <fstream>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"

namespace tierd {
namespace {

// NVML's C ABI, declared here so that the build needs no NVML header (the toolkit may lack it;
// a CPU-only machine has neither): the names, values and layouts of nvml.h.
using NvmlReturn = int;                    // nvmlReturn_t; NVML_SUCCESS = 0
using NvmlDevice = struct NvmlDevice_*;    // nvmlDevice_t
constexpr int kGpuUtilisationSamples = 1;  // NVML_GPU_UTILIZATION_SAMPLES
enum NvmlValueType {
  kDouble = 0,
  kUnsignedInt = 1,
  kUnsignedLong = 2,
  kUnsignedLongLong = 3,
  kSignedLongLong = 4,
  kSignedInt = 5
};
union NvmlValue {  // nvmlValue_t
  double d;
  unsigned int ui;
  unsigned long ul;
  unsigned long long ull;
  long long sll;
  int si;
};
struct NvmlSample {  // nvmlSample_t
  unsigned long long time_stamp;
  NvmlValue value;
};
struct NvmlUtilisation {  // nvmlUtilization_t
  unsigned int gpu;
  unsigned int memory;
};
constexpr NvmlReturn kNotFound = 6;  // NVML_ERROR_NOT_FOUND
constexpr NvmlReturn kInsufficientSize = 7;  // NVML_ERROR_INSUFFICIENT_SIZE
struct NvmlProcessInfo {  // nvmlProcessInfo_t (the _v2 and _v3 calls' layout)
  unsigned int pid;
  unsigned long long used_gpu_memory;
  unsigned int gpu_instance_id;
  unsigned int compute_instance_id;
};

double AsPercent(NvmlValueType type, const NvmlValue& v) {
  switch (type) {
    case kDouble:
      return v.d;
    case kUnsignedInt:
      return v.ui;
    case kUnsignedLong:
      return static_cast<double>(v.ul);
    case kUnsignedLongLong:
      return static_cast<double>(v.ull);
    case kSignedLongLong:
      return static_cast<double>(v.sll);
    case kSignedInt:
      return v.si;
  }
  return v.ui;
}

class Nvml final : public GpuUtilisation {
 public:
  ~Nvml() override {
    if (shutdown_ != nullptr) shutdown_();
    if (library_ != nullptr) dlclose(library_);
  }

  static absl::StatusOr<std::unique_ptr<GpuUtilisation>> Open(const std::string& pci_bus_id) {
    auto n = std::unique_ptr<Nvml>(new Nvml);
    n->library_ = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (n->library_ == nullptr) {
      return absl::UnavailableError(
          absl::StrFormat("no NVML (libnvidia-ml.so.1, part of the NVIDIA driver): %s", dlerror()));
    }
    auto init = n->Symbol<NvmlReturn (*)()>("nvmlInit_v2");
    n->shutdown_ = n->Symbol<NvmlReturn (*)()>("nvmlShutdown");
    n->error_string_ = n->Symbol<const char* (*)(NvmlReturn)>("nvmlErrorString");
    auto by_bus = n->Symbol<NvmlReturn (*)(const char*, NvmlDevice*)>("nvmlDeviceGetHandleByPciBusId_v2");
    n->samples_ =
        n->Symbol<NvmlReturn (*)(NvmlDevice, int, unsigned long long, NvmlValueType*, unsigned int*, NvmlSample*)>(
            "nvmlDeviceGetSamples");
    if (init == nullptr || n->shutdown_ == nullptr || n->error_string_ == nullptr || by_bus == nullptr ||
        n->samples_ == nullptr) {
      n->shutdown_ = nullptr;
      return absl::UnavailableError("NVML lacks nvmlInit_v2, nvmlDeviceGetHandleByPciBusId_v2 or nvmlDeviceGetSamples");
    }
    if (NvmlReturn r = init(); r != 0) {
      const std::string why = n->error_string_(r);
      n->shutdown_ = nullptr;  // not initialised: nothing to shut down
      return absl::UnavailableError("NVML did not start: " + why);
    }
    if (NvmlReturn r = by_bus(pci_bus_id.c_str(), &n->device_); r != 0) {
      return absl::UnavailableError(
          absl::StrFormat("NVML knows no GPU at PCI bus id %s: %s", pci_bus_id, n->error_string_(r)));
    }
    n->rates_ = n->Symbol<NvmlReturn (*)(NvmlDevice, NvmlUtilisation*)>("nvmlDeviceGetUtilizationRates");
    n->processes_ = n->Symbol<NvmlReturn (*)(NvmlDevice, unsigned int*, NvmlProcessInfo*)>(
        "nvmlDeviceGetComputeRunningProcesses_v3");
    if (n->processes_ == nullptr) {
      n->processes_ = n->Symbol<NvmlReturn (*)(NvmlDevice, unsigned int*, NvmlProcessInfo*)>(
          "nvmlDeviceGetComputeRunningProcesses_v2");
    }
    return std::unique_ptr<GpuUtilisation>(std::move(n));
  }

  uint64_t Mark() override {
    uint64_t latest = 0;
    for (const UtilisationSample& s : Read(0)) latest = std::max(latest, s.time_us);
    return latest;
  }

  std::optional<double> Since(uint64_t* mark) override {
    if (!samples_unsupported_) return MeanUtilisationSince(Read(*mark), mark);
    return LastPeriod();
  }

  absl::StatusOr<std::vector<std::pair<uint32_t, uint64_t>>> ProcessMemory() override {
    if (processes_ == nullptr) return absl::UnavailableError("NVML lacks nvmlDeviceGetComputeRunningProcesses");
    std::vector<NvmlProcessInfo> info(64);
    for (int attempt = 0; attempt < 3; ++attempt) {
      unsigned int count = static_cast<unsigned int>(info.size());
      const NvmlReturn r = processes_(device_, &count, info.data());
      if (r == kInsufficientSize) {
        info.resize(count + 16);
        continue;
      }
      if (r != 0) return absl::UnavailableError(std::string("NVML's process list: ") + error_string_(r));
      std::vector<std::pair<uint32_t, uint64_t>> out;
      for (unsigned int i = 0; i < count; ++i) {
        // A driver that cannot say a process's memory (NVML_VALUE_NOT_AVAILABLE) gives all ones.
        if (info[i].used_gpu_memory == ~0ull) return absl::UnavailableError("NVML does not say processes' memory here");
        out.emplace_back(info[i].pid, info[i].used_gpu_memory);
      }
      return out;
    }
    return absl::UnavailableError("NVML's process list kept growing");
  }

  std::optional<double> Recent(double seconds) override {
    if (!samples_unsupported_) {
      return MeanUtilisationWithin(Read(0), static_cast<uint64_t>(std::max(0.0, seconds) * 1e6));
    }
    return LastPeriod();
  }

 private:
  Nvml() = default;
  template <typename F>
  F Symbol(const char* name) {
    return reinterpret_cast<F>(dlsym(library_, name));
  }
  // A driver that keeps no samples: the figure of its last sample period.
  std::optional<double> LastPeriod() {
    NvmlUtilisation u{};
    if (rates_ == nullptr || rates_(device_, &u) != 0) return std::nullopt;
    return u.gpu;
  }
  // The samples after since_us (the driver keeps a few seconds of them). NOT_FOUND: none is
  // newer; any other error: this driver keeps none, and the callers read the last period's.
  std::vector<UtilisationSample> Read(uint64_t since_us) {
    NvmlValueType type = kUnsignedInt;
    unsigned int count = 0;
    NvmlReturn r = samples_(device_, kGpuUtilisationSamples, since_us, &type, &count, nullptr);
    if (r != 0 && r != kNotFound) samples_unsupported_ = true;
    if (r != 0 || count == 0) return {};
    std::vector<NvmlSample> raw(count);
    if (samples_(device_, kGpuUtilisationSamples, since_us, &type, &count, raw.data()) != 0) return {};
    std::vector<UtilisationSample> out;
    out.reserve(count);
    for (unsigned int i = 0; i < count && i < raw.size(); ++i) {
      out.push_back({raw[i].time_stamp, AsPercent(type, raw[i].value)});
    }
    return out;
  }

  void* library_ = nullptr;
  NvmlReturn (*shutdown_)() = nullptr;
  const char* (*error_string_)(NvmlReturn) = nullptr;
  NvmlReturn (*samples_)(NvmlDevice, int, unsigned long long, NvmlValueType*, unsigned int*, NvmlSample*) = nullptr;
  NvmlReturn (*rates_)(NvmlDevice, NvmlUtilisation*) = nullptr;
  NvmlReturn (*processes_)(NvmlDevice, unsigned int*, NvmlProcessInfo*) = nullptr;
  NvmlDevice device_ = nullptr;
  std::atomic<bool> samples_unsupported_{false};
};

}  // namespace

std::optional<double> MeanUtilisationSince(const std::vector<UtilisationSample>& samples, uint64_t* since_us) {
  double sum = 0;
  int n = 0;
  uint64_t latest = *since_us;
  for (const UtilisationSample& s : samples) {
    if (s.time_us <= *since_us) continue;
    sum += s.percent;
    ++n;
    latest = std::max(latest, s.time_us);
  }
  if (n == 0) return std::nullopt;
  *since_us = latest;
  return sum / n;
}

std::optional<double> MeanUtilisationWithin(const std::vector<UtilisationSample>& samples, uint64_t window_us) {
  uint64_t newest = 0;
  for (const UtilisationSample& s : samples) newest = std::max(newest, s.time_us);
  double sum = 0;
  int n = 0;
  for (const UtilisationSample& s : samples) {
    if (s.time_us + window_us < newest) continue;
    sum += s.percent;
    ++n;
  }
  if (n == 0) return std::nullopt;
  return sum / n;
}

absl::StatusOr<std::unique_ptr<GpuUtilisation>> GpuUtilisation::Open(const std::string& pci_bus_id) {
  return Nvml::Open(pci_bus_id);
}

uint64_t ProcessBytes(const std::vector<std::pair<uint32_t, uint64_t>>& processes, uint32_t pid) {
  uint64_t bytes = 0;
  for (const auto& [p, b] : processes) bytes += p == pid ? b : 0;
  return bytes;
}

uint64_t NamedProcessesBytes(const std::vector<std::pair<uint32_t, uint64_t>>& processes, const std::string& name) {
  uint64_t bytes = 0;
  for (const auto& [pid, b] : processes) {
    std::ifstream comm(absl::StrFormat("/proc/%d/comm", pid));
    std::string line;
    if (std::getline(comm, line) && line == name) bytes += b;
  }
  return bytes;
}

}  // namespace tierd
