// Where a process's GPU time goes, kernel by kernel: a CUDA injection library (the driver loads
// it for every process started with CUDA_INJECTION64_PATH set to it) that records each kernel,
// copy and memset through CUPTI's activity API and, when the process exits, writes a table to
// $KPROF_OUT/kprof-<program>-<pid>.txt: per kernel name, calls, total and mean time, share of
// the kernel time; copies and memsets by kind with their bytes; and, for the stream that ran
// the most kernel time, its span, busy and idle time, and the idle time split by gap length
// (short gaps are launch overhead between queued kernels, long ones the stream waiting for the
// host or another stream); and the memsets by size and the kernel that next ran on their stream
// (what they were made for: a library's workspace zeroed before its kernel, say), and the
// busiest stream's gaps of 2-100 us by the kernels either side. KPROF_STEPS=N divides every time by N (a figure per training step).
// KPROF_HOST=1 also records the runtime and driver API calls (a microsecond or so more host time
// each) and splits the busiest stream's gaps by whether the call that launched the next kernel
// returned only after the stream had gone idle (the host late: the GPU waited for it) or before
// (the kernel was queued: the stream waited on something else, an event or the launch itself).
//   CUDA_INJECTION64_PATH=.carry/lib/libkernel_profile.so KPROF_OUT=/tmp/kprof KPROF_STEPS=16 tierd-train ...
// libcupti.so.13 is opened at start (LD_LIBRARY_PATH, or KPROF_CUPTI: its path), so the library
// builds with the toolkit's headers alone. Nothing is recorded without KPROF_OUT.
#include <cupti.h>
#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "tools/kernel_profile/gaps.h"
#include "tools/kernel_profile/kernel_name.h"

namespace {

struct Cupti {
  CUptiResult (*register_callbacks)(CUpti_BuffersCallbackRequestFunc, CUpti_BuffersCallbackCompleteFunc);
  CUptiResult (*enable)(CUpti_ActivityKind);
  CUptiResult (*next_record)(uint8_t*, size_t, CUpti_Activity**);
  CUptiResult (*flush_all)(uint32_t);
};
Cupti cupti;

struct Totals {
  uint64_t calls = 0, ns = 0, bytes = 0;
};
struct Interval {
  uint64_t start, end;
  const std::string* name;  // the kernel's (a key of `kernels`), or null
  uint64_t bytes;           // a memset's
  uint32_t correlation = 0;  // a kernel's: the API call that launched it
};

std::mutex mutex;
std::map<std::string, Totals> kernels, copies;  // copies: memcpy kinds and memsets
std::map<uint32_t, std::vector<Interval>> stream_kernels, stream_memsets;
std::map<uint32_t, uint64_t> api_end;  // KPROF_HOST: when each runtime or driver call returned, by correlation id

constexpr size_t kBufferBytes = 8 << 20;

const char* CopyKind(uint8_t kind) {
  switch (kind) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD: return "copy host->device";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH: return "copy device->host";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD: return "copy device->device";
    default: return "copy (other)";
  }
}

void CUPTIAPI BufferRequested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(8, kBufferBytes));
  *size = kBufferBytes;
  *max_records = 0;
}

void CUPTIAPI BufferCompleted(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  std::lock_guard<std::mutex> lock(mutex);
  CUpti_Activity* record = nullptr;
  while (cupti.next_record(buffer, valid, &record) == CUPTI_SUCCESS) {
    if (record->kind == CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL || record->kind == CUPTI_ACTIVITY_KIND_KERNEL) {
      const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
      const auto entry = kernels.try_emplace(tierd::tools::ReadableKernelName(k->name)).first;
      Totals& t = entry->second;
      ++t.calls;
      t.ns += k->end - k->start;
      stream_kernels[k->streamId].push_back({k->start, k->end, &entry->first, 0, k->correlationId});
    } else if (record->kind == CUPTI_ACTIVITY_KIND_RUNTIME || record->kind == CUPTI_ACTIVITY_KIND_DRIVER) {
      // A runtime launch and the driver call inside it may share an id: the driver's return (the
      // earlier) is when the kernel was queued.
      const auto* a = reinterpret_cast<const CUpti_ActivityAPI*>(record);
      const auto [it, added] = api_end.try_emplace(a->correlationId, a->end);
      if (!added) it->second = std::min(it->second, a->end);
    } else if (record->kind == CUPTI_ACTIVITY_KIND_MEMCPY) {
      const auto* c = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
      Totals& t = copies[CopyKind(c->copyKind)];
      ++t.calls;
      t.ns += c->end - c->start;
      t.bytes += c->bytes;
    } else if (record->kind == CUPTI_ACTIVITY_KIND_MEMSET) {
      const auto* s = reinterpret_cast<const CUpti_ActivityMemset4*>(record);
      Totals& t = copies["memset"];
      ++t.calls;
      t.ns += s->end - s->start;
      t.bytes += s->bytes;
      stream_memsets[s->streamId].push_back({s->start, s->end, nullptr, s->bytes});
    }
  }
  std::free(buffer);
}

std::string ProgramName() {
  char path[4096];
  const ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 1);
  if (n <= 0) return "unknown";
  path[n] = '\0';
  const char* slash = std::strrchr(path, '/');
  return slash != nullptr ? slash + 1 : path;
}

void Report() {
  cupti.flush_all(1);
  const char* dir = std::getenv("KPROF_OUT");
  const std::string file = std::string(dir) + "/kprof-" + ProgramName() + "-" + std::to_string(getpid()) + ".txt";
  FILE* out = std::fopen(file.c_str(), "w");
  if (out == nullptr) {
    std::fprintf(stderr, "kernel_profile: cannot write %s\n", file.c_str());
    return;
  }
  const char* steps_env = std::getenv("KPROF_STEPS");
  const double steps = steps_env != nullptr && std::atof(steps_env) > 0 ? std::atof(steps_env) : 1.0;
  const char* unit = steps > 1 ? "ms a step" : "ms";
  std::lock_guard<std::mutex> lock(mutex);
  std::vector<std::pair<std::string, Totals>> rows(kernels.begin(), kernels.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.ns > b.second.ns; });
  uint64_t total = 0;
  for (const auto& r : rows) total += r.second.ns;
  std::fprintf(out, "kernels of %s (pid %d): %.3f %s in %zu kernel names\n", ProgramName().c_str(), getpid(),
               total / 1e6 / steps, unit, rows.size());
  std::fprintf(out, "| kernel | calls | %s | mean us | share |\n|---|---|---|---|---|\n", unit);
  for (const auto& [name, t] : rows) {
    std::fprintf(out, "| %s | %.1f | %.3f | %.1f | %.1f%% |\n", name.c_str(), t.calls / steps, t.ns / 1e6 / steps,
                 t.ns / 1e3 / t.calls, 100.0 * t.ns / std::max<uint64_t>(total, 1));
  }
  std::fprintf(out, "\n| copies and memsets | calls | %s | GB | GB/s |\n|---|---|---|---|---|\n", unit);
  for (const auto& [kind, t] : copies) {
    std::fprintf(out, "| %s | %.1f | %.3f | %.3f | %.1f |\n", kind.c_str(), t.calls / steps, t.ns / 1e6 / steps,
                 t.bytes / 1e9 / steps, t.ns > 0 ? t.bytes / double(t.ns) : 0.0);
  }
  // Memsets by size and the kernel that next started on their stream, the most time first.
  std::map<std::pair<uint64_t, std::string>, Totals> memsets_before;
  for (auto& [stream, sets] : stream_memsets) {
    std::vector<Interval>& list = stream_kernels[stream];
    std::sort(list.begin(), list.end(), [](const Interval& a, const Interval& b) { return a.start < b.start; });
    for (const Interval& m : sets) {
      const auto next = std::lower_bound(list.begin(), list.end(), m.end,
                                         [](const Interval& k, uint64_t at) { return k.start < at; });
      Totals& t = memsets_before[{m.bytes, next != list.end() ? *next->name : std::string("(no kernel after)")}];
      ++t.calls;
      t.ns += m.end - m.start;
    }
  }
  std::vector<std::pair<std::pair<uint64_t, std::string>, Totals>> sets(memsets_before.begin(), memsets_before.end());
  std::sort(sets.begin(), sets.end(), [](const auto& a, const auto& b) { return a.second.ns > b.second.ns; });
  if (!sets.empty()) {
    std::fprintf(out, "\n| memset of | before | calls | %s |\n|---|---|---|---|\n", unit);
    for (size_t i = 0; i < sets.size() && i < 12; ++i) {
      std::fprintf(out, "| %llu bytes | %s | %.1f | %.3f |\n", static_cast<unsigned long long>(sets[i].first.first),
                   sets[i].first.second.c_str(), sets[i].second.calls / steps, sets[i].second.ns / 1e6 / steps);
    }
  }
  // The busiest stream: its gaps between one kernel's end and the next one's start.
  uint32_t busiest = 0;
  uint64_t most = 0;
  for (const auto& [stream, list] : stream_kernels) {
    uint64_t busy = 0;
    for (const Interval& i : list) busy += i.end - i.start;
    if (busy > most) most = busy, busiest = stream;
  }
  if (most > 0) {
    std::vector<Interval>& list = stream_kernels[busiest];
    std::sort(list.begin(), list.end(), [](const Interval& a, const Interval& b) { return a.start < b.start; });
    // Gaps of 2-100 us by the kernels on either side: where the stream waits on something
    // other than the launch of a queued kernel (an event from another stream, the host).
    std::map<std::pair<std::string, std::string>, Totals> gaps_between;
    std::vector<tierd::tools::KernelRun> runs;
    for (size_t i = 0; i < list.size(); ++i) {
      runs.push_back({list[i].start, list[i].end, list[i].correlation});
      if (i == 0 || list[i].start <= list[i - 1].end) continue;
      const int b = tierd::tools::GapBucket(list[i].start - list[i - 1].end);
      if (b == 1 || b == 2 || b == 3) {
        Totals& t = gaps_between[{*list[i - 1].name, *list[i].name}];
        ++t.calls;
        t.ns += list[i].start - list[i - 1].end;
      }
    }
    // KPROF_HOST: whether the call launching the kernel after each gap returned after the stream went idle.
    const tierd::tools::GapTable gaps = tierd::tools::SplitGaps(runs, api_end);
    const uint64_t span = list.back().end - list.front().start;
    std::fprintf(out, "\nstream %u (the most kernel time): span %.3f %s, kernels %.3f, idle %.3f\n", busiest,
                 span / 1e6 / steps, unit, most / 1e6 / steps, (span - most) / 1e6 / steps);
    const char* names[] = {"< 2 us", "2-5 us", "5-20 us", "20-100 us", ">= 100 us"};
    if (gaps.known == 0) {
      std::fprintf(out, "| idle gaps | count | %s |\n|---|---|---|\n", unit);
      for (int b = 0; b < tierd::tools::kGapBuckets; ++b) {
        std::fprintf(out, "| %s | %.1f | %.3f |\n", names[b], gaps.count[b] / steps, gaps.ns[b] / 1e6 / steps);
      }
    } else {
      std::fprintf(out,
                   "| idle gaps | count | %s | of them, the next kernel's launch returned after the stream went idle "
                   "(the host late): count | %s |\n|---|---|---|---|---|\n",
                   unit, unit);
      for (int b = 0; b < tierd::tools::kGapBuckets; ++b) {
        std::fprintf(out, "| %s | %.1f | %.3f | %.1f | %.3f |\n", names[b], gaps.count[b] / steps,
                     gaps.ns[b] / 1e6 / steps, gaps.late_count[b] / steps, gaps.late_ns[b] / 1e6 / steps);
      }
    }
    std::vector<std::pair<std::pair<std::string, std::string>, Totals>> between(gaps_between.begin(),
                                                                                gaps_between.end());
    std::sort(between.begin(), between.end(), [](const auto& a, const auto& b) { return a.second.ns > b.second.ns; });
    if (!between.empty()) {
      std::fprintf(out, "\n| gaps of 2-100 us after | before | count | %s |\n|---|---|---|---|\n", unit);
      for (size_t i = 0; i < between.size() && i < 16; ++i) {
        std::fprintf(out, "| %s | %s | %.1f | %.3f |\n", between[i].first.first.c_str(), between[i].first.second.c_str(),
                     between[i].second.calls / steps, between[i].second.ns / 1e6 / steps);
      }
    }
  }
  std::fclose(out);
}

template <typename F>
bool Bind(void* lib, const char* name, F* fn) {
  *fn = reinterpret_cast<F>(dlsym(lib, name));
  return *fn != nullptr;
}

}  // namespace

// Called by the CUDA driver at initialisation (CUDA_INJECTION64_PATH); 1 on success.
extern "C" int InitializeInjection() {
  if (std::getenv("KPROF_OUT") == nullptr) return 1;
  const char* path = std::getenv("KPROF_CUPTI");
  void* lib = dlopen(path != nullptr ? path : "libcupti.so.13", RTLD_NOW | RTLD_GLOBAL);
  if (lib == nullptr || !Bind(lib, "cuptiActivityRegisterCallbacks", &cupti.register_callbacks) ||
      !Bind(lib, "cuptiActivityEnable", &cupti.enable) || !Bind(lib, "cuptiActivityGetNextRecord", &cupti.next_record) ||
      !Bind(lib, "cuptiActivityFlushAll", &cupti.flush_all)) {
    std::fprintf(stderr, "kernel_profile: CUPTI not opened (%s): no profile\n", dlerror());
    return 0;
  }
  if (cupti.register_callbacks(BufferRequested, BufferCompleted) != CUPTI_SUCCESS ||
      cupti.enable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) != CUPTI_SUCCESS ||
      cupti.enable(CUPTI_ACTIVITY_KIND_MEMCPY) != CUPTI_SUCCESS || cupti.enable(CUPTI_ACTIVITY_KIND_MEMSET) != CUPTI_SUCCESS) {
    std::fprintf(stderr, "kernel_profile: CUPTI refused the activity kinds: no profile\n");
    return 0;
  }
  const char* host = std::getenv("KPROF_HOST");
  if (host != nullptr && std::strcmp(host, "1") == 0 &&
      (cupti.enable(CUPTI_ACTIVITY_KIND_RUNTIME) != CUPTI_SUCCESS ||
       cupti.enable(CUPTI_ACTIVITY_KIND_DRIVER) != CUPTI_SUCCESS)) {
    std::fprintf(stderr, "kernel_profile: CUPTI refused the API activity kinds: no host split of the gaps\n");
  }
  std::atexit(Report);
  return 1;
}
