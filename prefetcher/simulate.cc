#include "prefetcher/simulate.h"

#include <algorithm>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <queue>
#include <random>
#include <string>

#include "absl/strings/str_format.h"
#include "base/units.h"

namespace tierd::prefetcher {

const char* TrackName(Track track) {
  switch (track) {
    case Track::kCompute: return "compute";
    case Track::kH2D: return "DRAM->GPU";
    case Track::kD2H: return "GPU->DRAM";
    case Track::kNvme: return "NVMe";
  }
  return "?";
}

namespace {

// Queues that run one task at a time. NVMe reads and writes have their own queues but
// share the device.
enum Queue : int { kNoQueue = -1, kCompute = 0, kH2D, kD2H, kNvmeRead, kNvmeWrite, kQueues };

enum class Effect : uint8_t {
  kOp, kLoad, kAlloc, kFreeGpu, kWriteBack, kStage, kPushDown, kDropDram, kInvalidate, kDropNvme,
  kHostAlloc,  // DRAM room for a host op's overwrite (the NVMe copy, stale, goes)
};

struct Task {
  Effect effect = Effect::kOp;
  int queue = kNoQueue;
  TensorIndex tensor = 0;
  uint64_t bytes = 0;
  double duration = 0;
  int pending = 0;
  std::vector<int> dependents;
  bool ticketed = false;  // takes DRAM room in plan order
  bool started = false, done = false;
  double start = 0, end = 0;
  int iteration = 0;
  uint32_t op = 0;
};

class Engine {
 public:
  Engine(const Graph& graph, const Budgets& budgets) : graph_(graph), budgets_(budgets) {
    dram_has_.assign(graph.tensors.size(), false);
    nvme_has_.assign(graph.tensors.size(), false);
  }

  int Add(Effect effect, int queue, TensorIndex tensor, uint64_t bytes, double duration, int iteration,
          uint32_t op) {
    Task t;
    t.effect = effect;
    t.queue = queue;
    t.tensor = tensor;
    t.bytes = bytes;
    t.duration = duration;
    t.iteration = iteration;
    t.op = op;
    tasks_.push_back(std::move(t));
    const int id = static_cast<int>(tasks_.size() - 1);
    if (queue != kNoQueue) queues_[queue].push_back(id);
    return id;
  }
  void Depend(int task, int on) {
    if (on < 0) return;
    tasks_[on].dependents.push_back(task);
    ++tasks_[task].pending;
  }
  void Ticket(int task) {
    tasks_[task].ticketed = true;
    tickets_.push_back(task);
  }
  void SetStart(uint64_t gpu, const std::vector<bool>& dram, const std::vector<bool>& nvme) {
    gpu_ = gpu;
    dram_has_ = dram;
    nvme_has_ = nvme;
    for (size_t t = 0; t < dram.size(); ++t) {
      if (dram[t]) dram_ += graph_.tensors[t].bytes;
      if (nvme[t]) nvme_ += graph_.tensors[t].bytes;
    }
  }
  Task& task(int id) { return tasks_[id]; }
  const std::vector<Task>& tasks() const { return tasks_; }
  uint64_t peak_gpu() const { return peak_gpu_; }
  uint64_t peak_dram() const { return peak_dram_; }
  uint64_t peak_nvme() const { return peak_nvme_; }
  void MeasureFrom(int iteration) { measure_from_ = iteration; }
  void RecordWindows() { record_windows_ = true; }
  const std::vector<GpuWindow>& windows() const { return windows_; }

  absl::Status Run() {
    using Event = std::pair<double, int>;
    std::priority_queue<Event, std::vector<Event>, std::greater<Event>> running;
    std::vector<int> ready_instant;
    for (size_t i = 0; i < tasks_.size(); ++i) {
      if (tasks_[i].queue == kNoQueue && tasks_[i].pending == 0) ready_instant.push_back(static_cast<int>(i));
    }
    std::vector<int> waiting_instant;  // ready, but no DRAM room yet (a host op's overwrite)
    std::vector<size_t> head(kQueues, 0);
    std::vector<bool> busy(kQueues, false);
    size_t done = 0;
    double now = 0;
    auto finish = [&](int id) {
      Task& t = tasks_[id];
      t.done = true;
      t.end = now;
      ++done;
      ApplyEnd(t);
      if (t.queue != kNoQueue) busy[t.queue] = false;
      for (int d : t.dependents) {
        if (--tasks_[d].pending == 0 && tasks_[d].queue == kNoQueue) ready_instant.push_back(d);
      }
    };
    while (done < tasks_.size()) {
      bool progress = true;
      while (progress) {
        progress = false;
        for (size_t k = 0; k < waiting_instant.size();) {
          if (CanStart(tasks_[waiting_instant[k]])) {
            ready_instant.push_back(waiting_instant[k]);
            waiting_instant.erase(waiting_instant.begin() + static_cast<std::ptrdiff_t>(k));
          } else {
            ++k;
          }
        }
        while (!ready_instant.empty()) {
          const int id = ready_instant.back();
          ready_instant.pop_back();
          if (!CanStart(tasks_[id])) {
            waiting_instant.push_back(id);
            continue;
          }
          tasks_[id].started = true;
          tasks_[id].start = now;
          ApplyStart(tasks_[id]);
          finish(id);
          progress = true;
        }
        for (int q = 0; q < kQueues; ++q) {
          const bool nvme = q == kNvmeRead || q == kNvmeWrite;
          if (busy[q] || head[q] >= queues_[q].size()) continue;
          if (nvme && (busy[kNvmeRead] || busy[kNvmeWrite])) continue;
          const int id = queues_[q][head[q]];
          if (!CanStart(tasks_[id])) continue;
          if (nvme) {  // one device: the other queue's head goes first if it is older and ready
            const int other = q == kNvmeRead ? kNvmeWrite : kNvmeRead;
            if (head[other] < queues_[other].size()) {
              const int oid = queues_[other][head[other]];
              if (oid < id && CanStart(tasks_[oid])) continue;
            }
          }
          ++head[q];
          Task& t = tasks_[id];
          t.started = true;
          t.start = now;
          ApplyStart(t);
          busy[q] = true;
          running.push({now + t.duration, id});
          progress = true;
        }
      }
      if (done == tasks_.size()) break;
      if (running.empty()) return Stuck(head);
      now = running.top().first;
      const int id = running.top().second;
      running.pop();
      finish(id);
    }
    return absl::OkStatus();
  }

 private:
  bool CanStart(const Task& t) const {
    if (t.pending > 0) return false;
    if (t.ticketed && !TicketAllows(t)) return false;
    switch (t.effect) {
      case Effect::kLoad:
      case Effect::kAlloc:
        return gpu_ + t.bytes <= budgets_.gpu;
      case Effect::kWriteBack:
      case Effect::kStage:
      case Effect::kHostAlloc:
        return dram_has_[t.tensor] || dram_ + t.bytes <= budgets_.dram;
      case Effect::kPushDown:
        return nvme_has_[t.tensor] || nvme_ + t.bytes <= budgets_.nvme;
      default:
        return true;
    }
  }

  // DRAM room goes in plan order; a later move may go first (its queue is free while an
  // earlier one waits for another queue) when the room it takes leaves enough for every
  // earlier one still waiting, so none of them can be starved.
  bool TicketAllows(const Task& t) const {
    const int id = static_cast<int>(&t - tasks_.data());
    constexpr size_t kLookahead = 64;
    uint64_t reserved = 0;
    for (size_t k = next_ticket_; k < tickets_.size() && k < next_ticket_ + kLookahead; ++k) {
      const Task& earlier = tasks_[tickets_[k]];
      if (tickets_[k] == id) {
        return reserved == 0 || dram_ + reserved + (dram_has_[t.tensor] ? 0 : t.bytes) <= budgets_.dram;
      }
      if (!earlier.started) reserved += earlier.bytes;
    }
    return false;
  }

  // GPU residency windows (for the static layout): a copy's memory from the start of its
  // load or alloc to the end of its free or write-back.
  // A new copy may be made (room for an overwrite) before the old one's free: the frees
  // close a tensor's windows oldest first.
  void OpenWindow(const Task& t) {
    if (!record_windows_) return;
    if (open_.size() < graph_.tensors.size()) open_.resize(graph_.tensors.size());
    open_[t.tensor].push_back(windows_.size());
    windows_.push_back({t.tensor, t.start, -1, t.iteration, t.op});
  }
  void CloseWindow(const Task& t) {
    if (!record_windows_ || t.tensor >= open_.size() || open_[t.tensor].empty()) return;
    windows_[open_[t.tensor].front()].end = t.end;
    open_[t.tensor].pop_front();
  }

  void Peaks(const Task& t) {
    if (t.iteration < measure_from_) return;
    peak_gpu_ = std::max(peak_gpu_, gpu_);
    peak_dram_ = std::max(peak_dram_, dram_);
    peak_nvme_ = std::max(peak_nvme_, nvme_);
  }

  void ApplyStart(Task& t) {
    if (t.ticketed) {
      while (next_ticket_ < tickets_.size() && (tasks_[tickets_[next_ticket_]].started ||
                                                tickets_[next_ticket_] == &t - tasks_.data())) {
        ++next_ticket_;
      }
    }
    switch (t.effect) {
      case Effect::kLoad:
      case Effect::kAlloc:
        gpu_ += t.bytes;
        OpenWindow(t);
        break;
      case Effect::kWriteBack:
      case Effect::kStage:
        if (!dram_has_[t.tensor]) dram_ += t.bytes;
        dram_has_[t.tensor] = true;
        if (t.effect == Effect::kWriteBack && nvme_has_[t.tensor]) {
          nvme_ -= t.bytes;  // the NVMe copy is stale now
          nvme_has_[t.tensor] = false;
        }
        break;
      case Effect::kPushDown:
        if (!nvme_has_[t.tensor]) nvme_ += t.bytes;
        nvme_has_[t.tensor] = true;
        break;
      case Effect::kHostAlloc:
        if (!dram_has_[t.tensor]) dram_ += t.bytes;
        dram_has_[t.tensor] = true;
        if (nvme_has_[t.tensor]) nvme_ -= t.bytes;
        nvme_has_[t.tensor] = false;
        break;
      default:
        break;
    }
    Peaks(t);
  }

  void ApplyEnd(Task& t) {
    switch (t.effect) {
      case Effect::kFreeGpu:
      case Effect::kWriteBack:
        gpu_ -= t.bytes;
        CloseWindow(t);
        break;
      case Effect::kPushDown:
      case Effect::kDropDram:
        if (dram_has_[t.tensor]) dram_ -= t.bytes;
        dram_has_[t.tensor] = false;
        break;
      case Effect::kDropNvme:
        if (nvme_has_[t.tensor]) nvme_ -= t.bytes;
        nvme_has_[t.tensor] = false;
        break;
      case Effect::kInvalidate:
        if (dram_has_[t.tensor]) dram_ -= t.bytes;
        if (nvme_has_[t.tensor]) nvme_ -= t.bytes;
        dram_has_[t.tensor] = nvme_has_[t.tensor] = false;
        break;
      default:
        break;
    }
  }

  absl::Status Stuck(const std::vector<size_t>& head) const {
    std::string why;
    for (int q = 0; q < kQueues; ++q) {
      if (head[q] >= queues_[q].size()) continue;
      const Task& t = tasks_[queues_[q][head[q]]];
      why += absl::StrFormat(" queue %d waits (op %d it %d effect %d pending %d)", q, t.op, t.iteration,
                             static_cast<int>(t.effect), t.pending);
    }
    if (next_ticket_ < tickets_.size()) {
      const Task& t = tasks_[tickets_[next_ticket_]];
      why += absl::StrFormat("; DRAM room is next granted to op %d it %d effect %d ('%s', %s, pending %d)", t.op,
                             t.iteration, static_cast<int>(t.effect), graph_.tensors[t.tensor].name,
                             FormatBytes(t.bytes), t.pending);
    }
    std::string held;
    for (size_t t = 0, listed = 0; t < dram_has_.size(); ++t) {
      if (!dram_has_[t]) continue;
      if (++listed > 12) {
        held += ", ...";
        break;
      }
      held += (held.empty() ? "" : ", ") + graph_.tensors[t].name;
    }
    return absl::InternalError(absl::StrFormat(
        "the schedule deadlocked (a planner bug): GPU %s of %s, DRAM %s of %s (holding %s);%s", FormatBytes(gpu_),
        FormatBytes(budgets_.gpu), FormatBytes(dram_), FormatBytes(budgets_.dram), held, why));
  }

  const Graph& graph_;
  Budgets budgets_;
  std::vector<Task> tasks_;
  std::vector<int> queues_[kQueues];
  std::vector<int> tickets_;
  size_t next_ticket_ = 0;
  uint64_t gpu_ = 0, dram_ = 0, nvme_ = 0;
  uint64_t peak_gpu_ = 0, peak_dram_ = 0, peak_nvme_ = 0;
  std::vector<bool> dram_has_, nvme_has_;
  bool record_windows_ = false;
  std::vector<GpuWindow> windows_;
  std::vector<std::deque<size_t>> open_;  // per tensor: its open windows, oldest first
  int measure_from_ = 1;
};

}  // namespace

absl::Status ValidateSimInputs(const LinkModel& link, const SimOptions& options) {
  if (link.h2d_bytes_per_s <= 0 || link.d2h_bytes_per_s <= 0 || link.nvme_read_bytes_per_s <= 0 ||
      link.nvme_write_bytes_per_s <= 0 || link.move_latency_s < 0) {
    return absl::InvalidArgumentError("link bandwidths must be > 0 and the latency >= 0");
  }
  if (options.iterations < 2) return absl::InvalidArgumentError("simulate at least 2 iterations (1 warm-up)");
  if (options.jitter < 0 || options.jitter >= 1) return absl::InvalidArgumentError("jitter must be in [0, 1)");
  return absl::OkStatus();
}

namespace {

// For op i and tensor t used by the ops: the op of t's previous use, and whether it was in
// the previous iteration.
struct PrevUse {
  std::vector<std::vector<int>> op;  // [i][t], -1 if never used
  std::vector<std::vector<bool>> wrapped;
};
PrevUse PreviousUses(const Graph& graph) {
  const size_t ops = graph.ops.size(), n = graph.tensors.size();
  PrevUse p{std::vector<std::vector<int>>(ops, std::vector<int>(n, -1)),
            std::vector<std::vector<bool>>(ops, std::vector<bool>(n, false))};
  std::vector<int> last(n, -1);
  for (size_t step = 0; step < 2 * ops; ++step) {
    const size_t i = step % ops;
    if (step >= ops) {
      for (size_t t = 0; t < n; ++t) {
        p.op[i][t] = last[t] < 0 ? -1 : last[t] % static_cast<int>(ops);
        p.wrapped[i][t] = last[t] >= 0 && last[t] < static_cast<int>(ops);
      }
    }
    for (TensorIndex t : Touched(graph.ops[i])) last[t] = static_cast<int>(step);
  }
  return p;
}

std::string MoveName(Effect e, const std::string& tensor) {
  switch (e) {
    case Effect::kLoad: return "load " + tensor;
    case Effect::kWriteBack: return "write-back " + tensor;
    case Effect::kStage: return "stage " + tensor;
    case Effect::kPushDown: return "push-down " + tensor;
    default: return tensor;
  }
}

SimResult Summarize(const Graph& graph, const Engine& engine, const std::vector<std::vector<int>>& op_task,
                    const SimOptions& options) {
  SimResult r;
  const int measured = options.iterations - 1;
  const size_t ops = graph.ops.size();
  r.op_stall_seconds.assign(ops, 0);
  double prev_end = engine.tasks()[op_task[0][ops - 1]].end;
  for (int it = 1; it < options.iterations; ++it) {
    const double step = engine.tasks()[op_task[it][ops - 1]].end - prev_end;
    r.step_seconds += step / measured;
    r.max_step_seconds = std::max(r.max_step_seconds, step);
    double last = prev_end;
    for (size_t i = 0; i < ops; ++i) {
      const Task& t = engine.tasks()[op_task[it][i]];
      r.compute_seconds += t.duration / measured;
      r.op_stall_seconds[i] += (t.start - last) / measured;
      r.stall_seconds += (t.start - last) / measured;
      last = t.end;
    }
    prev_end = last;
  }
  for (const Task& t : engine.tasks()) {
    if (t.iteration >= 1) {
      if (t.effect == Effect::kLoad) r.h2d_bytes += t.bytes;
      if (t.effect == Effect::kWriteBack) r.d2h_bytes += t.bytes;
      if (t.effect == Effect::kStage) r.nvme_read_bytes += t.bytes;
      if (t.effect == Effect::kPushDown) r.nvme_write_bytes += t.bytes;
    }
    if (!options.record_timeline || t.queue == kNoQueue || t.effect == Effect::kAlloc) continue;
    static constexpr Track kTrack[] = {Track::kCompute, Track::kH2D, Track::kD2H, Track::kNvme, Track::kNvme};
    const std::string& name = t.effect == Effect::kOp ? graph.ops[t.op].name : graph.tensors[t.tensor].name;
    r.timeline.push_back({kTrack[t.queue], t.effect == Effect::kOp ? name : MoveName(t.effect, name), t.start,
                          t.end, t.bytes, t.iteration, t.op});
  }
  for (uint64_t* total : {&r.h2d_bytes, &r.d2h_bytes, &r.nvme_read_bytes, &r.nvme_write_bytes}) *total /= measured;
  r.peak_gpu_bytes = engine.peak_gpu();
  r.peak_dram_bytes = engine.peak_dram();
  r.peak_nvme_bytes = engine.peak_nvme();
  return r;
}

}  // namespace

absl::StatusOr<SimResult> SimulatePlan(const Graph& graph, const Plan& plan, const Budgets& budgets,
                                       const LinkModel& link, const SimOptions& options) {
  if (absl::Status s = ValidateSimInputs(link, options); !s.ok()) return s;
  const size_t ops = graph.ops.size();
  std::mt19937_64 rng(options.seed);
  std::uniform_real_distribution<double> jitter(1 - options.jitter, 1 + options.jitter);
  auto scale = [&] { return options.jitter > 0 ? jitter(rng) : 1.0; };
  auto move_time = [&](uint64_t bytes, double bw) { return link.move_latency_s + bytes / (bw * scale()); };
  auto bytes = [&](TensorIndex t) { return graph.tensors[t].bytes; };

  Engine engine(graph, budgets);
  uint64_t gpu_start = 0;
  for (TensorIndex t : plan.gpu.resident_at_start) gpu_start += bytes(t);
  engine.SetStart(gpu_start, plan.lower.dram_at_start, plan.lower.nvme_at_start);
  if (options.record_timeline) engine.RecordWindows();
  const PrevUse prev = PreviousUses(graph);
  std::vector<std::vector<int>> op_task(options.iterations, std::vector<int>(ops, -1));
  // Per tensor: the last task that put bytes in DRAM (write-back or stage), the last that
  // used its DRAM copy (those, loads reading it, push-downs), and the last push-down.
  const size_t n = graph.tensors.size();
  std::vector<int> dram_producer(n, -1), dram_user(n, -1), pushed(n, -1);
  size_t lower_pos = 0;
  for (int it = 0; it < options.iterations; ++it) {
    lower_pos = 0;
    for (uint32_t i = 0; i < ops; ++i) {
      if (options.cancel != nullptr && options.cancel->load(std::memory_order_relaxed)) {
        return absl::CancelledError("the simulation was cancelled");
      }
      // GPU evictions: possible once the tensor's last use has finished.
      std::map<TensorIndex, int> write_back_task, dead_drop_task;
      for (const Eviction& e : plan.gpu.evictions[i]) {
        const int j = prev.op[i][e.tensor];
        const int jt = prev.wrapped[i][e.tensor] ? it - 1 : it;
        const int last_use = j < 0 || jt < 0 ? -1 : op_task[jt][j];
        const int id = e.write_back
                           ? engine.Add(Effect::kWriteBack, kD2H, e.tensor, bytes(e.tensor),
                                        move_time(bytes(e.tensor), link.d2h_bytes_per_s), it, i)
                           : engine.Add(Effect::kFreeGpu, kNoQueue, e.tensor, bytes(e.tensor), 0, it, i);
        engine.Depend(id, last_use);
        if (e.write_back) write_back_task[e.tensor] = id;
        if (e.dead) dead_drop_task[e.tensor] = id;
      }
      std::map<TensorIndex, int> load_task;
      std::vector<int> arrivals;
      for (TensorIndex t : plan.gpu.allocs[i]) {
        const int id = engine.Add(Effect::kAlloc, kH2D, t, bytes(t), 0, it, i);
        arrivals.push_back(id);
      }
      for (TensorIndex t : plan.gpu.loads[i]) {
        const int id = engine.Add(Effect::kLoad, kH2D, t, bytes(t), move_time(bytes(t), link.h2d_bytes_per_s), it, i);
        load_task[t] = id;
        arrivals.push_back(id);
      }
      const int op = engine.Add(Effect::kOp, kCompute, 0, 0, graph.ops[i].seconds * scale(), it, i);
      op_task[it][i] = op;
      const int previous_op = i > 0 ? op_task[it][i - 1] : (it > 0 ? op_task[it - 1][ops - 1] : -1);
      engine.Depend(op, previous_op);
      for (int a : arrivals) engine.Depend(op, a);
      // The moves below the GPU for this op, in plan order.
      for (; lower_pos < plan.lower.events.size() && plan.lower.events[lower_pos].op == i; ++lower_pos) {
        const LowerEvent& ev = plan.lower.events[lower_pos];
        const TensorIndex t = ev.tensor;
        switch (ev.kind) {
          case LowerKind::kWriteBack: {
            const int id = write_back_task.at(t);
            engine.Ticket(id);
            dram_producer[t] = dram_user[t] = id;
            break;
          }
          case LowerKind::kStage: {
            const int id = engine.Add(Effect::kStage, kNvmeRead, t, bytes(t),
                                      move_time(bytes(t), link.nvme_read_bytes_per_s), it, i);
            engine.Ticket(id);
            engine.Depend(id, pushed[t]);
            engine.Depend(id, dram_user[t]);
            dram_producer[t] = dram_user[t] = id;
            break;
          }
          case LowerKind::kRead: {
            const int id = load_task.at(t);
            engine.Depend(id, dram_producer[t]);
            dram_user[t] = id;
            break;
          }
          case LowerKind::kPushDown: {
            const int id = engine.Add(Effect::kPushDown, kNvmeWrite, t, bytes(t),
                                      move_time(bytes(t), link.nvme_write_bytes_per_s), it, i);
            engine.Depend(id, dram_user[t]);
            pushed[t] = dram_user[t] = id;
            break;
          }
          case LowerKind::kDrop: {
            const int id = engine.Add(Effect::kDropDram, kNoQueue, t, bytes(t), 0, it, i);
            engine.Depend(id, dram_user[t]);
            dram_user[t] = id;
            break;
          }
          case LowerKind::kDropNvme: {
            const int id = engine.Add(Effect::kDropNvme, kNoQueue, t, bytes(t), 0, it, i);
            engine.Depend(id, pushed[t]);
            engine.Depend(id, dram_user[t]);
            dram_user[t] = id;
            break;
          }
          case LowerKind::kHostRead:
          case LowerKind::kHostWrite: {
            // The host op runs on the DRAM copy: after it landed, before it may leave; a
            // host write is the copy later loads read, and leaves the NVMe copy stale.
            engine.Depend(op, dram_producer[t]);
            dram_user[t] = op;
            if (ev.kind == LowerKind::kHostWrite) {
              dram_producer[t] = op;
              const int id = engine.Add(Effect::kDropNvme, kNoQueue, t, bytes(t), 0, it, i);
              engine.Depend(id, op);
              engine.Depend(id, pushed[t]);
            }
            break;
          }
          case LowerKind::kHostOverwrite: {
            // Room taken as the op is about to run (after the op before it), not earlier.
            const int id = engine.Add(Effect::kHostAlloc, kNoQueue, t, bytes(t), 0, it, i);
            engine.Ticket(id);
            engine.Depend(id, previous_op);
            engine.Depend(id, dram_user[t]);
            engine.Depend(id, pushed[t]);
            engine.Depend(op, id);
            dram_producer[t] = dram_user[t] = op;
            break;
          }
          case LowerKind::kDiscard: {  // dead after its host use: freed once that op is over
            const int id = engine.Add(Effect::kInvalidate, kNoQueue, t, bytes(t), 0, it, i);
            engine.Depend(id, dram_user[t]);
            engine.Depend(id, pushed[t]);
            dram_user[t] = id;
            break;
          }
          case LowerKind::kInvalidate: {
            // Stale once the GPU copy is dropped dead, or once op i may run and write it.
            const int id = engine.Add(Effect::kInvalidate, kNoQueue, t, bytes(t), 0, it, i);
            auto dead = dead_drop_task.find(t);
            engine.Depend(id, dead != dead_drop_task.end() ? dead->second : previous_op);
            engine.Depend(id, dram_user[t]);
            engine.Depend(id, pushed[t]);
            dram_user[t] = id;
            break;
          }
        }
      }
    }
  }
  if (absl::Status s = engine.Run(); !s.ok()) return s;
  SimResult result = Summarize(graph, engine, op_task, options);
  result.gpu_windows = engine.windows();
  return result;
}

}  // namespace tierd::prefetcher
