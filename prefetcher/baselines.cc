// The baselines the planner is measured against: an on-demand LRU pager and the lower
// bound (simulate.h).
#include <algorithm>
#include <random>
#include <string>

#include "absl/strings/str_format.h"
#include "prefetcher/simulate.h"

namespace tierd::prefetcher {

absl::StatusOr<SimResult> SimulateOnDemandLru(const Graph& graph, const Budgets& budgets, const LinkModel& link,
                                              const SimOptions& options) {
  if (absl::Status s = ValidateSimInputs(link, options); !s.ok()) return s;
  if (absl::Status s = ValidateGraph(graph); !s.ok()) return s;
  const size_t n = graph.tensors.size(), ops = graph.ops.size();
  std::mt19937_64 rng(options.seed);
  std::uniform_real_distribution<double> jitter(1 - options.jitter, 1 + options.jitter);
  auto scale = [&] { return options.jitter > 0 ? jitter(rng) : 1.0; };
  auto move_time = [&](uint64_t b, double bw) { return link.move_latency_s + b / (bw * scale()); };
  // Per tensor and tier: has a copy; dirty = the GPU copy is the only one; last use tick.
  std::vector<bool> gpu(n, false), dram(n, false), nvme(n, true), gpu_dirty(n, false);
  std::vector<uint64_t> gpu_used_at(n, 0), dram_used_at(n, 0);
  uint64_t gpu_bytes = 0, dram_bytes = 0, nvme_bytes = 0, tick = 0;
  for (size_t t = 0; t < n; ++t) {
    if (graph.tensors[t].pinned_gpu) {
      gpu[t] = true;
      nvme[t] = false;
      gpu_bytes += graph.tensors[t].bytes;
    } else {
      nvme_bytes += graph.tensors[t].bytes;
    }
  }
  if (gpu_bytes > budgets.gpu) return absl::ResourceExhaustedError("the pinned tensors do not fit the GPU budget");
  SimResult r;
  r.op_stall_seconds.assign(ops, 0);
  const int measured = options.iterations - 1;
  double now = 0, iteration_start = 0;
  auto b = [&](size_t t) { return graph.tensors[t].bytes; };
  for (int it = 0; it < options.iterations; ++it) {
    const bool measure = it >= 1;
    auto count = [&](uint64_t& field, uint64_t bytes) {
      if (measure) field += bytes;
    };
    for (size_t i = 0; i < ops; ++i) {
      const std::vector<TensorIndex> needed = Touched(graph.ops[i]);
      const double op_start = now;
      auto dram_room = [&](uint64_t want, size_t keep) -> absl::Status {
        while (dram_bytes + want > budgets.dram) {
          int victim = -1;
          for (size_t v = 0; v < n; ++v) {
            if (dram[v] && v != keep && (victim < 0 || dram_used_at[v] < dram_used_at[victim])) victim = static_cast<int>(v);
          }
          if (victim < 0) return absl::ResourceExhaustedError("a tensor does not fit the DRAM budget");
          if (!nvme[victim] && !gpu[victim]) {  // only copy: push down
            now += move_time(b(victim), link.nvme_write_bytes_per_s);
            count(r.nvme_write_bytes, b(victim));
            nvme[victim] = true;
            nvme_bytes += b(victim);
          } else if (!nvme[victim] && gpu[victim] && !gpu_dirty[victim]) {
            now += move_time(b(victim), link.nvme_write_bytes_per_s);  // the GPU copy needs a backing
            count(r.nvme_write_bytes, b(victim));
            nvme[victim] = true;
            nvme_bytes += b(victim);
          }
          dram[victim] = false;
          dram_bytes -= b(victim);
        }
        return absl::OkStatus();
      };
      // An op on the host: its tensors' GPU copies come down (written back when newer)
      // and their DRAM copies are fetched from NVMe on demand.
      for (TensorIndex t : HostTouched(graph.ops[i])) {
        ++tick;
        const Use use = HostUseOf(graph.ops[i], t);
        if (gpu[t]) {
          if (gpu_dirty[t] && use != Use::kOverwrite) {
            if (absl::Status s = dram_room(b(t), t); !s.ok()) return s;
            now += move_time(b(t), link.d2h_bytes_per_s);
            count(r.d2h_bytes, b(t));
            if (!dram[t]) dram_bytes += b(t);
            dram[t] = true;
            if (nvme[t]) nvme_bytes -= b(t);
            nvme[t] = false;
          }
          gpu[t] = gpu_dirty[t] = false;
          gpu_bytes -= b(t);
        }
        if (!dram[t]) {
          if (absl::Status s = dram_room(b(t), t); !s.ok()) return s;
          if (use != Use::kOverwrite) {
            now += move_time(b(t), link.nvme_read_bytes_per_s);
            count(r.nvme_read_bytes, b(t));
          }
          dram[t] = true;
          dram_bytes += b(t);
        }
        dram_used_at[t] = tick;
        if (use != Use::kRead && nvme[t]) {  // the NVMe copy is stale
          nvme_bytes -= b(t);
          nvme[t] = false;
        }
      }
      for (TensorIndex t : needed) {
        ++tick;
        if (!gpu[t]) {
          while (gpu_bytes + b(t) > budgets.gpu) {
            int victim = -1;
            for (size_t v = 0; v < n; ++v) {
              if (!gpu[v] || graph.tensors[v].pinned_gpu || std::binary_search(needed.begin(), needed.end(), v)) continue;
              if (victim < 0 || gpu_used_at[v] < gpu_used_at[victim]) victim = static_cast<int>(v);
            }
            if (victim < 0) {
              return absl::ResourceExhaustedError(absl::StrFormat("op %d does not fit the GPU budget", i));
            }
            if (gpu_dirty[victim]) {
              if (absl::Status s = dram_room(b(victim), victim); !s.ok()) return s;
              now += move_time(b(victim), link.d2h_bytes_per_s);
              count(r.d2h_bytes, b(victim));
              if (!dram[victim]) dram_bytes += b(victim);
              dram[victim] = true;
              dram_used_at[victim] = tick;
              if (nvme[victim]) nvme_bytes -= b(victim);
              nvme[victim] = false;
            }
            gpu[victim] = gpu_dirty[victim] = false;
            gpu_bytes -= b(victim);
          }
          if (UseOf(graph.ops[i], t) != Use::kOverwrite) {
            if (!dram[t]) {
              if (absl::Status s = dram_room(b(t), t); !s.ok()) return s;
              now += move_time(b(t), link.nvme_read_bytes_per_s);
              count(r.nvme_read_bytes, b(t));
              dram[t] = true;
              dram_bytes += b(t);
            }
            dram_used_at[t] = tick;
            now += move_time(b(t), link.h2d_bytes_per_s);
            count(r.h2d_bytes, b(t));
          }
          gpu[t] = true;
          gpu_bytes += b(t);
        }
        gpu_used_at[t] = tick;
        if (UseOf(graph.ops[i], t) != Use::kRead) {  // the copies below are stale
          gpu_dirty[t] = true;
          if (dram[t]) dram_bytes -= b(t);
          if (nvme[t]) nvme_bytes -= b(t);
          dram[t] = nvme[t] = false;
        }
      }
      const double op_time = graph.ops[i].seconds * scale();
      if (options.record_timeline) r.timeline.push_back({Track::kCompute, graph.ops[i].name, now, now + op_time, 0, it, static_cast<uint32_t>(i)});
      if (measure) {
        r.stall_seconds += (now - op_start) / measured;
        r.op_stall_seconds[i] += (now - op_start) / measured;
        r.compute_seconds += op_time / measured;
        r.peak_gpu_bytes = std::max(r.peak_gpu_bytes, gpu_bytes);
        r.peak_dram_bytes = std::max(r.peak_dram_bytes, dram_bytes);
        r.peak_nvme_bytes = std::max(r.peak_nvme_bytes, nvme_bytes);
      }
      now += op_time;
    }
    if (measure) {
      r.step_seconds += (now - iteration_start) / measured;
      r.max_step_seconds = std::max(r.max_step_seconds, now - iteration_start);
    }
    iteration_start = now;
  }
  for (uint64_t* total : {&r.h2d_bytes, &r.d2h_bytes, &r.nvme_read_bytes, &r.nvme_write_bytes}) *total /= measured;
  return r;
}

LowerBound ComputeLowerBound(const Graph& graph, const Plan& plan, const LinkModel& link, const Budgets& budgets) {
  LowerBound lb;
  for (const GraphOp& op : graph.ops) lb.compute_seconds += op.seconds;
  const double h2d = plan.gpu.bytes_loaded / link.h2d_bytes_per_s;
  const double d2h = plan.gpu.bytes_written_back / link.d2h_bytes_per_s;
  const double nvme = plan.lower.nvme_read_bytes / link.nvme_read_bytes_per_s +
                      plan.lower.nvme_write_bytes / link.nvme_write_bytes_per_s;
  lb.step_seconds = lb.compute_seconds;
  for (auto [seconds, name] : {std::pair{h2d, "DRAM->GPU"}, std::pair{d2h, "GPU->DRAM"}, std::pair{nvme, "NVMe"}}) {
    if (seconds > lb.step_seconds) {
      lb.step_seconds = seconds;
      lb.bound_by = name;
    }
  }
  // The phase bound, over runs of ops [a, b) of the lap (all of them for small graphs; on a
  // grid of about 300 starts and ends for big ones — any set of runs gives a valid bound).
  const size_t ops = graph.ops.size(), n = graph.tensors.size();
  const size_t stride = std::max<size_t>(1, ops / 300);
  const auto dead = DeadAfter(graph);
  uint64_t pinned = 0;
  for (const GraphTensor& t : graph.tensors) pinned += t.pinned_gpu ? t.bytes : 0;
  const uint64_t gpu_room = budgets.gpu > pinned ? budgets.gpu - pinned : 0;
  const uint64_t both = gpu_room + budgets.dram;
  std::vector<size_t> seen(n, SIZE_MAX), wrote(n, SIZE_MAX);
  std::vector<TensorIndex> written;
  for (size_t a = 0; a < ops; a += stride) {
    uint64_t need = 0;  // distinct bytes the run uses with their value (not overwritten first)
    double compute = 0;
    written.clear();
    for (size_t b = a; b < ops; ++b) {
      const GraphOp& op = graph.ops[b];
      compute += op.seconds;
      for (TensorIndex t : Touched(op)) {
        const Use use = UseOf(op, t);
        if (seen[t] != a) {
          seen[t] = a;
          if (!graph.tensors[t].pinned_gpu && use != Use::kOverwrite) need += graph.tensors[t].bytes;
        }
        if (use != Use::kRead && wrote[t] != a && !graph.tensors[t].pinned_gpu) {
          wrote[t] = a;
          written.push_back(t);
        }
      }
      if ((b + 1 - a) % stride != 0 && b + 1 != ops) continue;
      // Values written in the run and still live after it: what GPU and DRAM cannot hold
      // at its end was written to NVMe during it (they did not exist before).
      uint64_t live_written = 0;
      for (TensorIndex t : written) live_written += dead[b][t] ? 0 : graph.tensors[t].bytes;
      const double h2d_min = need > gpu_room ? (need - gpu_room) / link.h2d_bytes_per_s : 0;
      const double nvme_min = (need > both ? (need - both) / link.nvme_read_bytes_per_s : 0) +
                              (live_written > both ? (live_written - both) / link.nvme_write_bytes_per_s : 0);
      const double window = std::max({compute, h2d_min, nvme_min});
      const double bound = window + (lb.compute_seconds - compute);
      if (bound > lb.step_seconds * (1 + 1e-12)) {
        lb.step_seconds = bound;
        lb.bound_by = absl::StrFormat("%s in ops %d-%d", nvme_min >= h2d_min ? "NVMe" : "DRAM->GPU", a, b);
      }
    }
  }
  lb.stall_seconds = lb.step_seconds - lb.compute_seconds;
  return lb;
}

}  // namespace tierd::prefetcher
