// The baselines the planner is measured against: an on-demand LRU pager and the lower
// bound (simulate.h).
#include <algorithm>
#include <random>
#include <string>
#include <tuple>
#include <vector>

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

namespace {

// Per op i: the bytes of values live as op i begins (needed by it or later, with their value:
// not overwritten first), all of them, those next used on the GPU, and those whose latest
// write in the lap (before i, cyclically) was on the GPU or anywhere; pinned tensors left
// out.
struct LiveBytes {
  std::vector<uint64_t> all, gpu_next, gpu_written, written;
};

LiveBytes LiveBytesAtEachOp(const Graph& graph) {
  const size_t ops = graph.ops.size();
  LiveBytes live{std::vector<uint64_t>(ops, 0), std::vector<uint64_t>(ops, 0), std::vector<uint64_t>(ops, 0),
                 std::vector<uint64_t>(ops, 0)};
  std::vector<Use> gpu_use(ops), host_use(ops);
  for (size_t t = 0; t < graph.tensors.size(); ++t) {
    if (graph.tensors[t].pinned_gpu) continue;
    const auto ti = static_cast<TensorIndex>(t);
    for (size_t i = 0; i < ops; ++i) {
      gpu_use[i] = UseOf(graph.ops[i], ti);
      host_use[i] = HostUseOf(graph.ops[i], ti);
    }
    // Walk two laps backwards for the next use, two forwards for the latest writer.
    std::vector<bool> is_live(ops, false), next_on_gpu(ops, false);
    bool needed = false, on_gpu = false;
    for (size_t k = 2 * ops; k-- > 0;) {
      const size_t i = k % ops;
      const Use use = gpu_use[i] != Use::kNone ? gpu_use[i] : host_use[i];
      if (use != Use::kNone) {
        needed = use != Use::kOverwrite;
        on_gpu = gpu_use[i] != Use::kNone;
      }
      if (k < ops) is_live[i] = needed, next_on_gpu[i] = on_gpu;
    }
    int writer = 0;  // 0: none yet, 1: the GPU, 2: the host
    for (size_t k = 0; k < 2 * ops; ++k) {
      const size_t i = k % ops;
      if (k >= ops && is_live[i]) {
        if (writer == 1) live.gpu_written[i] += graph.tensors[t].bytes;
        if (writer != 0) live.written[i] += graph.tensors[t].bytes;
        live.all[i] += graph.tensors[t].bytes;
        if (next_on_gpu[i]) live.gpu_next[i] += graph.tensors[t].bytes;
      }
      if (gpu_use[i] == Use::kWrite || gpu_use[i] == Use::kOverwrite) writer = 1;
      if (host_use[i] == Use::kWrite || host_use[i] == Use::kOverwrite) writer = 2;
    }
  }
  return live;
}

// Bytes beyond the room for them (0 when they fit).
uint64_t Beyond(uint64_t bytes, uint64_t room) { return bytes > room ? bytes - room : 0; }

// What an op writes whole is on the GPU (or, from the host, in DRAM) with its inputs while
// it runs: room the live values do not have then. {GPU room, GPU and DRAM room} left.
std::pair<uint64_t, uint64_t> RoomLeftWhileRunning(const Graph& graph, const GraphOp& op, uint64_t gpu_room,
                                                   uint64_t both) {
  uint64_t on_gpu = 0, on_host = 0;
  for (TensorIndex t : Touched(op)) {
    if (UseOf(op, t) == Use::kOverwrite && !graph.tensors[t].pinned_gpu) on_gpu += graph.tensors[t].bytes;
  }
  for (TensorIndex t : HostTouched(op)) {
    if (HostUseOf(op, t) == Use::kOverwrite) on_host += graph.tensors[t].bytes;
  }
  return {Beyond(gpu_room, on_gpu), Beyond(both, on_gpu + on_host)};
}

// One run of the phase bound: its compute, the time beyond it that its traffic forces,
// the link that sets that, and the NVMe bytes it must read and write.
struct PhaseRun {
  double excess = 0, compute = 0;
  const char* link = "";
  uint64_t nvme_read = 0, nvme_write = 0;
  double Seconds() const { return compute + excess; }
};

// A run of ops grown one op at a time (indices unrolled: op k is graph op k % ops), and what
// it must move: everything it uses with its value that cannot be above NVMe (or on the GPU)
// when it starts, with room taken by what its first op writes whole, comes in during it;
// what it writes that is live after it (or while its last op runs) and cannot stay above
// NVMe goes down during it.
class RunMeter {
 public:
  RunMeter(const Graph& graph, const std::vector<std::vector<bool>>& dead, const LinkModel& link, uint64_t gpu_room,
           uint64_t both)
      : graph_(graph), dead_(dead), link_(link), gpu_room_(gpu_room), both_(both),
        seen_(graph.tensors.size(), 0), wrote_(graph.tensors.size(), 0) {}

  void Start(size_t first) {
    ++epoch_;
    need_ = need_gpu_ = 0;
    compute_ = 0;
    written_.clear();
    std::tie(gpu_left_, both_left_) =
        RoomLeftWhileRunning(graph_, graph_.ops[first % graph_.ops.size()], gpu_room_, both_);
  }
  void Add(size_t op_index) {
    last_ = op_index;
    const GraphOp& op = graph_.ops[op_index % graph_.ops.size()];
    compute_ += op.seconds;
    written_before_last_ = written_.size();
    auto touch = [&](TensorIndex t, Use use, bool on_gpu) {
      if (graph_.tensors[t].pinned_gpu) return;
      if (seen_[t] != epoch_) {
        seen_[t] = epoch_;
        if (use != Use::kOverwrite) need_ += graph_.tensors[t].bytes;
        if (use != Use::kOverwrite && on_gpu) need_gpu_ += graph_.tensors[t].bytes;
      }
      if (use != Use::kRead && wrote_[t] != epoch_) {
        wrote_[t] = epoch_;
        written_.push_back(t);
      }
    };
    for (TensorIndex t : Touched(op)) touch(t, UseOf(op, t), true);
    for (TensorIndex t : HostTouched(op)) touch(t, HostUseOf(op, t), false);
  }
  PhaseRun Close() const {
    const size_t ops = graph_.ops.size();
    // Values written in the run and still live after it: what GPU and DRAM cannot hold at
    // its end was written to NVMe during it (they did not exist before). So were those
    // written before its last op and live while it runs beyond what that op's outputs leave.
    uint64_t live_written = 0, live_while_last = 0;
    for (size_t k = 0; k < written_.size(); ++k) {
      const TensorIndex t = written_[k];
      live_written += dead_[last_ % ops][t] ? 0 : graph_.tensors[t].bytes;
      if (k < written_before_last_ && !dead_[(last_ + ops - 1) % ops][t]) live_while_last += graph_.tensors[t].bytes;
    }
    const uint64_t last_left = RoomLeftWhileRunning(graph_, graph_.ops[last_ % ops], gpu_room_, both_).second;
    const uint64_t must_write = std::max(Beyond(live_written, both_), Beyond(live_while_last, last_left));
    const uint64_t must_read = Beyond(need_, both_left_);
    const double h2d_min = static_cast<double>(Beyond(need_gpu_, gpu_left_)) / link_.h2d_bytes_per_s;
    const double nvme_min = static_cast<double>(must_read) / link_.nvme_read_bytes_per_s +
                            static_cast<double>(must_write) / link_.nvme_write_bytes_per_s;
    const double window = std::max({compute_, h2d_min, nvme_min});
    return {window - compute_, compute_, nvme_min >= h2d_min ? "NVMe" : "DRAM->GPU", must_read, must_write};
  }

 private:
  const Graph& graph_;
  const std::vector<std::vector<bool>>& dead_;
  const LinkModel& link_;
  const uint64_t gpu_room_, both_;
  std::vector<uint64_t> seen_, wrote_;  // the epoch that last saw / wrote each tensor
  uint64_t epoch_ = 0;
  uint64_t need_ = 0, need_gpu_ = 0, gpu_left_ = 0, both_left_ = 0;
  double compute_ = 0;
  std::vector<TensorIndex> written_;
  size_t written_before_last_ = 0, last_ = 0;
};

}  // namespace

LowerBound ComputeLowerBound(const Graph& graph, const LinkModel& link, const Budgets& budgets) {
  LowerBound lb;
  for (const GraphOp& op : graph.ops) lb.compute_seconds += op.seconds;
  lb.step_seconds = lb.compute_seconds;
  const size_t ops = graph.ops.size();
  uint64_t pinned = 0;
  for (const GraphTensor& t : graph.tensors) pinned += t.pinned_gpu ? t.bytes : 0;
  const uint64_t gpu_room = budgets.gpu > pinned ? budgets.gpu - pinned : 0;
  const uint64_t both = gpu_room + budgets.dram;
  // The whole step, from capacity alone (no plan): while op i runs, the live values beyond
  // what the GPU can hold besides the op's outputs are below it; each next used on the GPU
  // is loaded before that use, within a lap (one next used by the host need not be), and
  // those the GPU wrote last were written back since. Beyond GPU
  // and DRAM they are on NVMe only: each read from it within a lap, and each written (after
  // its latest write) within the lap before. Every link carries at least that every lap.
  const LiveBytes live = LiveBytesAtEachOp(graph);
  auto beyond = [](uint64_t bytes, uint64_t room) { return static_cast<double>(Beyond(bytes, room)); };
  for (size_t i = 0; i < ops; ++i) {
    const auto [gpu_left, both_left] = RoomLeftWhileRunning(graph, graph.ops[i], gpu_room, both);
    const double h2d = beyond(live.gpu_next[i], gpu_left) / link.h2d_bytes_per_s;
    const double d2h = beyond(live.gpu_written[i], gpu_left) / link.d2h_bytes_per_s;
    const double nvme = beyond(live.all[i], both_left) / link.nvme_read_bytes_per_s +
                        beyond(live.written[i], both_left) / link.nvme_write_bytes_per_s;
    for (auto [seconds, name] : {std::pair{h2d, "DRAM->GPU"}, std::pair{d2h, "GPU->DRAM"}, std::pair{nvme, "NVMe"}}) {
      if (seconds > lb.step_seconds * (1 + 1e-12)) {
        lb.step_seconds = seconds;
        lb.bound_by = name;
      }
    }
  }
  // The phase bound. A run of ops W takes at least as long as its compute, and as the bytes
  // that must arrive during it: everything W uses with its value that cannot already be on
  // the GPU when W starts (beyond the GPU budget) comes in on DRAM->GPU, and beyond GPU and
  // DRAM off NVMe; what W writes that is still live after it and cannot stay above NVMe is
  // written to it. Runs that do not overlap take their times one after the other, so a lap
  // takes at least the sum over any cut of it into runs. The lap repeats, so a run may cross
  // its end (the optimizer step and the next step's first micro-batch, say, where updated
  // state must go down to NVMe to make room for the gradients). The best cut, by dynamic
  // programming from each starting cut, over cut points (every op boundary for small
  // graphs; a grid of about 300 for big ones — any set of cuts gives a valid bound).
  const size_t stride = std::max<size_t>(1, ops / 300);
  const size_t points = (ops + stride - 1) / stride;  // cut k before op k * stride
  auto cut_op = [&](size_t k) { return (k % points) * stride + (k / points) * ops; };  // unrolled
  const auto dead = DeadAfter(graph);
  RunMeter meter(graph, dead, link, gpu_room, both);
  // run[i][len - 1]: the run from cut i over `len` cuts (up to a whole lap).
  std::vector<std::vector<PhaseRun>> run(points, std::vector<PhaseRun>(points));
  for (size_t a = 0; a < points; ++a) {
    meter.Start(cut_op(a));
    for (size_t b = cut_op(a), len = 1; len <= points; ++b) {
      meter.Add(b);
      if (b + 1 == cut_op(a + len)) run[a][len++ - 1] = meter.Close();
    }
  }
  // From each starting cut, the best chain of runs over one lap (a sum of times).
  double best_lap = -1;
  std::vector<std::pair<size_t, size_t>> best_runs;  // (first cut, length) of the best chain
  std::vector<double> best(points + 1);
  std::vector<size_t> from(points + 1);
  for (size_t s0 = 0; s0 < points; ++s0) {
    best[0] = 0;
    for (size_t j = 1; j <= points; ++j) {
      best[j] = -1;
      for (size_t i = 0; i < j; ++i) {
        const double t = best[i] + run[(s0 + i) % points][j - i - 1].Seconds();
        if (t > best[j]) best[j] = t, from[j] = i;
      }
    }
    if (best[points] > best_lap * (1 + 1e-12)) {
      best_lap = best[points];
      best_runs.clear();
      for (size_t j = points; j > 0; j = from[j]) best_runs.push_back({(s0 + from[j]) % points, j - from[j]});
    }
  }
  // The chain as runs between op boundaries, then each boundary next to a run that adds
  // something moved by less than a grid step where that adds more (the grid misses the best
  // cut by up to a step: at 7B with 64 micro-batches, one op in 14).
  std::vector<size_t> starts;  // op boundaries, ascending mod ops; run k is [starts[k], starts[k + 1])
  for (const auto& [first, length] : best_runs) starts.push_back(cut_op(first) % ops);
  std::sort(starts.begin(), starts.end());
  const size_t m = starts.size();
  auto end_of = [&](size_t k) { return k + 1 < m ? starts[k + 1] : starts[0] + ops; };
  auto measure = [&](size_t first, size_t end) {  // ops [first, end), end > first (unrolled)
    meter.Start(first);
    for (size_t op = first; op < end; ++op) meter.Add(op);
    return meter.Close();
  };
  std::vector<PhaseRun> chain(m);
  for (size_t k = 0; k < m; ++k) chain[k] = measure(starts[k], end_of(k));
  for (int pass = 0; pass < 3 && m > 1 && stride > 1; ++pass) {
    bool moved = false;
    for (size_t k = 0; k < m; ++k) {
      const size_t before = (k + m - 1) % m;  // the run ending at boundary k
      if (chain[before].excess <= 1e-12 && chain[k].excess <= 1e-12) continue;
      // In one unrolled frame: the run before starts at `lo`, this one ends at `hi`.
      const size_t lo = starts[before], at = k == 0 ? starts[0] + ops : starts[k];
      const size_t hi = k == 0 ? end_of(0) + ops : end_of(k);
      const double now = chain[before].Seconds() + chain[k].Seconds();
      size_t best_at = at;
      double best_sum = now;
      PhaseRun best_before = chain[before], best_after = chain[k];
      for (size_t candidate = at > lo + stride ? at - stride + 1 : lo + 1; candidate < at + stride && candidate < hi;
           ++candidate) {
        if (candidate == at) continue;
        const PhaseRun r1 = measure(lo, candidate), r2 = measure(candidate, hi);
        if (r1.Seconds() + r2.Seconds() > best_sum * (1 + 1e-12)) {
          best_sum = r1.Seconds() + r2.Seconds();
          best_at = candidate;
          best_before = r1;
          best_after = r2;
        }
      }
      if (best_at == at) continue;
      starts[k] = best_at % ops;
      chain[before] = best_before;
      chain[k] = best_after;
      moved = true;
      if (k == 0 || starts[k] < starts[k - 1]) {  // the boundary crossed op 0: keep them sorted
        std::vector<size_t> order(m);
        for (size_t i = 0; i < m; ++i) order[i] = i;
        std::sort(order.begin(), order.end(), [&](size_t x, size_t y) { return starts[x] < starts[y]; });
        std::vector<size_t> sorted_starts(m);
        std::vector<PhaseRun> sorted_chain(m);
        for (size_t i = 0; i < m; ++i) sorted_starts[i] = starts[order[i]], sorted_chain[i] = chain[order[i]];
        starts = std::move(sorted_starts);
        chain = std::move(sorted_chain);
      }
    }
    if (!moved) break;
  }
  double chain_lap = 0;
  for (const PhaseRun& r : chain) chain_lap += r.Seconds();
  if (std::max(chain_lap, best_lap) > lb.step_seconds * (1 + 1e-12)) {
    lb.step_seconds = std::max(chain_lap, best_lap);
    // Name the run that adds the most, and how many others add anything.
    size_t worst = 0;
    int adding = 0;
    for (size_t k = 0; k < m; ++k) {
      if (chain[k].excess > 1e-12) ++adding;
      if (chain[k].excess > chain[worst].excess) worst = k;
    }
    const PhaseRun& r = chain[worst];
    const size_t first_op = starts[worst], last_op = (end_of(worst) - 1) % ops;
    lb.bound_by = absl::StrFormat("%s in ops %d-%d%s", r.link, first_op, last_op,
                                  last_op < first_op ? " (across the lap's end)" : "");
    if (r.excess > 1e-12) {
      lb.run_first_op = static_cast<uint32_t>(first_op);
      lb.run_last_op = static_cast<uint32_t>(last_op);
      lb.run_nvme_read_bytes = r.nvme_read;
      lb.run_nvme_write_bytes = r.nvme_write;
      lb.run_seconds = r.Seconds();
    }
    if (adding > 1) lb.bound_by += absl::StrFormat(" +%d", adding - 1);
  }
  lb.stall_seconds = lb.step_seconds - lb.compute_seconds;
  return lb;
}

}  // namespace tierd::prefetcher
