// planreplay: a step graph replayed through tierd's real tiers and planner, on the dev box.
// The graph (a trainer's, as `tierctl plan --session N --dump_graph` writes it on the GPU
// machine, or a synthetic one) runs for --laps iterations through LeaseTable over the fake
// GPU, real shared memory and a real O_DIRECT file, with the executor following the plan, on
// a fake clock (op times from the graph, link times from the lent machine's links, both with
// seeded jitter). Bytes and link speeds are divided by --scale, so a 21 GiB plan runs in a few
// hundred MiB with the same timing. Prints where the GPU copies went (the plan's layout
// offsets or elsewhere, and what held the range), the moves within the GPU to join free space,
// the client's misses after warm-up, and the planned session's summary: the questions the
// device's runs raise, answered in seconds here.
//
//   bazel run -c opt //tools/planreplay -- --graph=$PWD/step.yaml --gpu=21.3GiB --dram=32GiB --scale=64
//   bazel run -c opt //tools/planreplay -- --model=1.3b --accum=4 --gpu=12GiB --scale=64
#include <sys/statvfs.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_format.h"
#include "base/fake_clock.h"
#include "base/jitter_clock.h"
#include "base/units.h"
#include "prefetcher/graph_file.h"
#include "prefetcher/synthetic.h"
#include "runtime/lease_table.h"
#include "runtime/mover_test_util.h"
#include "server/planned_session.h"

ABSL_FLAG(std::string, graph, "", "the step graph (YAML, `tierctl plan --session N --dump_graph`)");
ABSL_FLAG(std::string, model, "", "instead of --graph: a synthetic Llama-style step: tiny, 1.3b, 7b, 13b");
ABSL_FLAG(int, accum, 1, "with --model: micro-batches a step");
ABSL_FLAG(std::string, gpu, "24GiB", "the session's GPU quota (before --scale)");
ABSL_FLAG(std::string, dram, "64GiB", "the session's DRAM quota (before --scale)");
ABSL_FLAG(std::string, nvme, "64GiB", "the session's NVMe quota (before --scale)");
ABSL_FLAG(double, scale, 64, "divide every tensor's bytes, the quotas and the link speeds by this");
ABSL_FLAG(int, laps, 8, "iterations replayed");
ABSL_FLAG(int, warmup, 2, "iterations before the counts start");
ABSL_FLAG(double, op_jitter, 0.2, "each op's time is the graph's times a factor in [1-j, 1+j]");
ABSL_FLAG(double, link_jitter, 0.2, "each copy's time is the link's times a factor in [1-j, 1+j]");
ABSL_FLAG(uint64_t, seed, 7, "the jitters' seed");
ABSL_FLAG(bool, start_on_gpu, false,
          "each tensor's first value is written on the GPU (room made online, least recently used out), as a "
          "trainer that initialises on the GPU before its graph is planned; default: in host memory");
ABSL_FLAG(double, plan_op_time_factor, 1,
          "the first plan assumes the graph's op times times this (a trainer's estimates before it measured), "
          "the ops then take the graph's times: off by more than 25%, the executor replans after the first lap");
ABSL_FLAG(bool, settle_layout, true,
          "when the plan starts, GPU copies go to the layout's offsets or leave the GPU (tierd "
          "--planner_settle_layout)");
ABSL_FLAG(bool, settle_after_replan, false,
          "and again after each replan, the plan's lanes paused until it is done (tierd "
          "--planner_settle_after_replan)");
ABSL_FLAG(double, replan_drift, 0.25,
          "replan when the measured op times differ from the plan's by more than this, mean relative difference "
          "over a lap (tierd --planner_replan_drift; 1e9: keep the first plan)");
ABSL_FLAG(double, keep_plan_margin, 0.05,
          "a drift replan swaps its plan in only when it predicts a step this share shorter than the plan in force "
          "(tierd --planner_keep_plan_margin; below 0: always)");
ABSL_FLAG(bool, layout_wait, false, "planned loads wait for their layout range (tierd --planner_layout_wait)");
ABSL_FLAG(int, load_lead_ops, -1,
          "a planned load issues at most this many ops before the op it serves (tierd --planner_load_lead_ops; "
          "-1: a lap)");

namespace tierd {
namespace {

namespace tp = prefetcher;

int Fail(const std::string& what) {
  std::fprintf(stderr, "planreplay: %s\n", what.c_str());
  return 1;
}

absl::StatusOr<tp::Graph> LoadGraph() {
  if (absl::GetFlag(FLAGS_graph).empty() == absl::GetFlag(FLAGS_model).empty()) {
    return absl::InvalidArgumentError("give the step as --graph FILE or as --model tiny|1.3b|7b|13b (one of them)");
  }
  if (!absl::GetFlag(FLAGS_graph).empty()) return tp::LoadGraphFile(absl::GetFlag(FLAGS_graph));
  auto shape = tp::ShapePreset(absl::GetFlag(FLAGS_model));
  if (!shape.ok()) return shape.status();
  tp::TraceOptions options;
  options.grad_accum = absl::GetFlag(FLAGS_accum);
  if (options.grad_accum < 1) return absl::InvalidArgumentError("--accum must be >= 1");
  return tp::SyntheticTransformer(*shape, options);
}

int Replay() {
  auto loaded = LoadGraph();
  if (!loaded.ok()) return Fail(std::string(loaded.status().message()));
  tp::Graph graph = *std::move(loaded);
  const double scale = absl::GetFlag(FLAGS_scale);
  if (!(scale >= 1)) return Fail("--scale must be >= 1");
  for (tp::GraphTensor& t : graph.tensors) t.bytes = std::max<uint64_t>(256, static_cast<uint64_t>(t.bytes / scale));
  tp::Budgets budgets;
  for (auto [flag, out] : {std::pair{absl::GetFlag(FLAGS_gpu), &budgets.gpu},
                           std::pair{absl::GetFlag(FLAGS_dram), &budgets.dram},
                           std::pair{absl::GetFlag(FLAGS_nvme), &budgets.nvme}}) {
    auto b = ParseBytes(flag);
    if (!b.ok()) return Fail(std::string(b.status().message()));
    *out = static_cast<uint64_t>(*b / scale);
  }
  tp::LinkModel links;  // the lent machine's, slowed by the scale: the same times for fewer bytes
  links.h2d_bytes_per_s /= scale;
  links.d2h_bytes_per_s /= scale;
  links.nvme_read_bytes_per_s /= scale;
  links.nvme_write_bytes_per_s /= scale;
  // The NVMe tier is a real file: refuse plainly where the disk cannot hold it (the tests'
  // engine would abort).
  const char* dir = std::getenv("TEST_TMPDIR") ? std::getenv("TEST_TMPDIR") : "/tmp";
  struct statvfs disk;
  if (statvfs(dir, &disk) == 0 && budgets.nvme + kMiB > static_cast<uint64_t>(disk.f_bavail) * disk.f_frsize) {
    return Fail(absl::StrFormat("the NVMe quota (%s after --scale) does not fit %s's %s free: give a smaller --nvme",
                                FormatBytes(budgets.nvme), dir,
                                FormatBytes(static_cast<uint64_t>(disk.f_bavail) * disk.f_frsize)));
  }
  FakeClock op_time, link_time;
  JitterClock link_clock(link_time, absl::GetFlag(FLAGS_seed), absl::GetFlag(FLAGS_link_jitter));
  FakeGpuOptions gpu;
  gpu.link_bytes_per_second = links.h2d_bytes_per_s;
  gpu.clock = &link_clock;
  testing::Engine engine =
      testing::MakeDaemonEngine("planreplay", budgets.gpu * 2, budgets.dram * 2, budgets.nvme + kMiB, gpu);
  auto table = LeaseTable::Create(*engine.store, *engine.mover, op_time, {});
  if (!table.ok()) return Fail(std::string(table.status().message()));
  LeaseTable& leases = **table;
  leases.SetLayoutWait(absl::GetFlag(FLAGS_layout_wait));
  auto session = leases.OpenSession("replay", {budgets.gpu, budgets.dram, budgets.nvme});
  if (!session.ok()) return Fail(std::string(session.status().message()));
  std::vector<TensorId> ids;
  for (const tp::GraphTensor& t : graph.tensors) {
    auto id = leases.Lease(*session, {t.name, TensorClass::kParam, DType::kU8, {static_cast<int64_t>(t.bytes)}});
    if (!id.ok()) return Fail(absl::StrFormat("leasing %s: %s", t.name, id.status().message()));
    auto p = leases.Acquire(*session, *id, Access::kOverwrite,  // a first value, as a trainer's
                            absl::GetFlag(FLAGS_start_on_gpu) ? Place::kGpu : Place::kHost);
    if (!p.ok()) return Fail(absl::StrFormat("writing %s: %s", t.name, p.status().message()));
    if (absl::Status st = leases.Release(*session, *id); !st.ok()) return Fail(std::string(st.message()));
    ids.push_back(*id);
  }
  tp::Graph first = graph;
  for (tp::GraphOp& op : first.ops) op.seconds *= absl::GetFlag(FLAGS_plan_op_time_factor);
  auto planned = PlannedSession::Create(leases, *session, first, budgets, op_time,
                                        {.links = links, .deterministic = true,
                                         .load_lead_ops = absl::GetFlag(FLAGS_load_lead_ops),
                                         .settle_layout = absl::GetFlag(FLAGS_settle_layout),
                                         .settle_after_replan = absl::GetFlag(FLAGS_settle_after_replan),
                                         .replan_drift = absl::GetFlag(FLAGS_replan_drift),
                                         .keep_plan_margin = absl::GetFlag(FLAGS_keep_plan_margin)});
  if (!planned.ok()) return Fail(absl::StrFormat("planning: %s", planned.status().message()));
  Mover* mover = engine.mover.get();
  (*planned)->SetLinkBytes([mover] { return PlannedSession::MovedBy(*mover); });
  std::mt19937_64 rng(absl::GetFlag(FLAGS_seed));
  const double j = absl::GetFlag(FLAGS_op_jitter);
  std::uniform_real_distribution<double> op_jitter(1 - j, 1 + j);
  const int laps = absl::GetFlag(FLAGS_laps), warmup = absl::GetFlag(FLAGS_warmup);
  uint64_t misses = 0, acquires = 0;
  LeaseStats before;
  for (int lap = 0; lap < laps; ++lap) {
    if (lap == warmup) before = leases.Stats();
    for (uint32_t i = 0; i < graph.ops.size(); ++i) {
      if (absl::Status st = (*planned)->OpBegin(i); !st.ok()) return Fail(std::string(st.message()));
      (*planned)->WaitIdle();
      const tp::GraphOp& op = graph.ops[i];
      // The op's uses in the top tier (the GPU; DRAM for a host graph), then its host uses.
      for (const bool host : {false, true}) {
        for (tp::TensorIndex t : host ? tp::HostTouched(op) : tp::Touched(op)) {
          const tp::Use use = host ? tp::HostUseOf(op, t) : tp::UseOf(op, t);
          const Access access = use == tp::Use::kRead    ? Access::kRead
                                : use == tp::Use::kWrite ? Access::kWrite
                                                         : Access::kOverwrite;
          auto p = leases.Acquire(*session, ids[t], access, host || graph.host ? Place::kHost : Place::kGpu);
          if (!p.ok()) {
            return Fail(absl::StrFormat("%s at %s: %s", graph.tensors[t].name, op.name, p.status().message()));
          }
          if (lap >= warmup && !host) {
            ++acquires;
            misses += p->fetched;
          }
          if (absl::Status st = leases.Release(*session, ids[t]); !st.ok()) return Fail(std::string(st.message()));
        }
      }
      op_time.AdvanceNanos(static_cast<int64_t>(op.seconds * 1e9 * op_jitter(rng)));
    }
  }
  (*planned)->WaitIdle();
  const LeaseStats after = leases.Stats();
  std::printf("%s", (*planned)->Summary().c_str());
  std::printf(
      "after %d laps of warm-up, %d laps: GPU copies placed at the layout's offsets %lu, elsewhere %lu (held by a "
      "copy off the layout %lu, by one there ahead of its time %lu, by the tensor planned there for a placement "
      "that does not wait %lu, by a move in flight %lu); planned loads that waited for their range %lu; moves within "
      "the GPU %lu (to the layout's offset %lu); misses %lu of %lu acquires\n",
      warmup, laps - warmup, after.planned_placements - before.planned_placements,
      after.off_plan_placements - before.off_plan_placements, after.off_plan_by[0] - before.off_plan_by[0],
      after.off_plan_by[1] - before.off_plan_by[1], after.off_plan_by[2] - before.off_plan_by[2],
      after.off_plan_by[3] - before.off_plan_by[3], after.layout_waits - before.layout_waits,
      after.gpu_relocations - before.gpu_relocations, after.rehomed - before.rehomed, misses, acquires);
  return 0;
}

}  // namespace
}  // namespace tierd

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "replays a step graph through tierd's real tiers and planner on a fake GPU and clock; see the file's "
      "header.\n  planreplay --graph=step.yaml --gpu=21.3GiB --dram=32GiB --scale=64");
  absl::ParseCommandLine(argc, argv);
  return tierd::Replay();
}
