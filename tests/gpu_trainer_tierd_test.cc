// The GPU trainer (trainer_ref/gpu/gpu_model) with its weights, master weights,
// gradients, Adam moments and saved activations leased from the real tierd binary on the
// real GPU, in a GPU quota about a third of the model's state: every step moves parts
// GPU <-> DRAM (<-> NVMe) while the kernels run, and the run tracks the same model on plain
// GPU buffers. Not bit for bit: two of the kernels (embedding and norm-weight gradients)
// sum with float atomics, whose order differs from run to run, so the bound is that noise
// (1e-5 relative on losses, 1e-4 relative L2 on the final weights), far below any lost or
// stale byte (a stale layer shows at percent level).
// Needs a CUDA device and the tierd binary (TIERD_BIN, default server/tierd as in Bazel's
// runfiles); skipped without a device. Run on the lent GPU machine by
// tools/device/kernels_check.sh.

#include <set>
#include <string>

#include "tests/gpu_tierd_fixture.h"

namespace tierd {
namespace {

namespace tg = trainer::gpu;
using gpu_tierd_testing::Closeness;
using gpu_tierd_testing::GpuTierdTest;
using gpu_tierd_testing::TestConfig;
using gpu_tierd_testing::TrainSideBySide;

TEST_F(GpuTierdTest, TrainsInAThirdOfItsStateLikePlainBuffers) {
  const trainer::ModelConfig config = TestConfig();
  const int batch = 4, seq = 128;
  const tg::GpuHomeLayout layout = tg::GpuModel::HomeLayout(config, batch, seq);
  const uint64_t state = layout.Total();
  const uint64_t quota = state / 3;
  auto home = tg::MakeTierdGpuHome(layout, Options(quota, 2 * state, 2 * state));
  ASSERT_TRUE(home.ok()) << home.status();
  auto on_tierd = tg::GpuModel::Create(config, batch, seq, std::move(*home));
  auto plain = tg::GpuModel::Create(config, batch, seq);
  ASSERT_TRUE(on_tierd.ok()) << on_tierd.status();
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ((*plain)->WorkspaceBytes(), tg::GpuModel::WorkspaceBytesFor(config, batch, seq));
  EXPECT_EQ((*on_tierd)->DeviceBytes(), (*on_tierd)->WorkspaceBytes()) << "the state is tierd's, not the model's";

  trainer::Model<float> init(config, 1, 1);
  init.InitParams(5);
  ASSERT_TRUE((*on_tierd)->SetParams(init.params()).ok());
  ASSERT_TRUE((*plain)->SetParams(init.params()).ok());
  auto note = (*on_tierd)->RegisterStep(2);
  ASSERT_TRUE(note.ok()) << note.status();
  EXPECT_EQ(note->rfind("planned ", 0), 0u) << *note;
  std::printf("state %s in a GPU quota of %s; %s\n", FormatBytes(state).c_str(), FormatBytes(quota).c_str(),
              note->c_str());
  TrainSideBySide(**on_tierd, **plain, config, batch, seq, /*steps=*/4, "tierd, plain");
  // And the parts really moved: in and out of the GPU tier, never above the quota.
  auto moved = (*on_tierd)->home().Moved();
  ASSERT_TRUE(moved.ok()) << moved.status();
  std::printf("%s\n", (*on_tierd)->home().Describe().c_str());
  EXPECT_GT(moved->host_to_gpu, state) << "more than the whole state came in over the run";
  EXPECT_GT(moved->gpu_to_host, 0u);
  EXPECT_LE(moved->gpu_peak, quota);
  // The session's own GPU peak since it opened (then reset): within the quota, not empty.
  auto peak = (*on_tierd)->home().TakeGpuPeak();
  ASSERT_TRUE(peak.ok()) << peak.status();
  EXPECT_GT(*peak, 0u);
  EXPECT_LE(*peak, quota);
}

// The optimizer's state in sub-groups (--optimizer_chunks): five leases a part through tierd,
// four plain buffers a part on the other side, and the training the same bit for bit; the
// graph the planner gets names exactly the leases the home holds.
TEST_F(GpuTierdTest, OptimizerStateInSubGroupsTrainsLikeOneLease) {
  const trainer::ModelConfig config = TestConfig();
  const int batch = 4, seq = 128;
  tg::GpuHomeLayout layout = tg::GpuModel::HomeLayout(config, batch, seq);
  const uint64_t state = layout.Total();
  layout.state_chunks = 5;
  auto home = tg::MakeTierdGpuHome(layout, Options(state / 3, 2 * state, 2 * state));
  ASSERT_TRUE(home.ok()) << home.status();
  tg::GpuHomeLayout plain_layout = tg::GpuModel::HomeLayout(config, batch, seq);
  plain_layout.state_chunks = 4;
  auto plain_home = tg::MakePlainGpuHome(plain_layout);
  ASSERT_TRUE(plain_home.ok()) << plain_home.status();
  auto chunked = tg::GpuModel::Create(config, batch, seq, std::move(*home));
  auto plain = tg::GpuModel::Create(config, batch, seq, std::move(*plain_home));
  ASSERT_TRUE(chunked.ok()) << chunked.status();
  ASSERT_TRUE(plain.ok()) << plain.status();
  ASSERT_TRUE((*chunked)->InitParams(4).ok());
  ASSERT_TRUE((*plain)->InitParams(4).ok());
  auto note = (*chunked)->RegisterStep(2);
  ASSERT_TRUE(note.ok()) << note.status();
  // The graph's tensors are the session's leases, name for name and byte for byte.
  std::map<std::string, uint64_t> graph_tensors, leased;
  for (const auto& t : (*chunked)->StepGraph(2).tensors) graph_tensors[t.name] = t.bytes;
  auto leases = EveryLease();
  ASSERT_TRUE(leases.ok()) << leases.status();
  for (const auto& lease : leases->leases()) leased[lease.spec().name()] = lease.spec().shape(0);
  EXPECT_EQ(graph_tensors, leased);
  EXPECT_EQ(graph_tensors.count("opt.v.layers.2.4"), 1u);
  EXPECT_EQ(graph_tensors.count("opt.v.layers.2"), 0u);
  std::printf("%zu leases, the state in 5 sub-groups a part; %s\n", leased.size(), note->c_str());
  TrainSideBySide(**chunked, **plain, config, batch, seq, /*steps=*/3, "tierd in 5 sub-groups, plain in 4");
  std::printf("%s\n", (*chunked)->home().Describe().c_str());
}

// AdamW on the host, in tierd's DRAM tier (SetOptimizerOnCpu), in the background while the
// next forward runs, the state in 3 sub-groups a part: the same training as AdamW on the GPU (the two give the same bits),
// while the master weights and moments never go to the GPU.
TEST_F(GpuTierdTest, TheOptimizerOnTheHostTracksTheGpu) {
  const trainer::ModelConfig config = TestConfig();
  const int batch = 4, seq = 128;
  tg::GpuHomeLayout layout = tg::GpuModel::HomeLayout(config, batch, seq);
  layout.state_chunks = 3;  // the host steps the state chunk by chunk too
  const uint64_t state = layout.Total();
  auto home = tg::MakeTierdGpuHome(layout, Options(state / 3, 2 * state, 2 * state));
  ASSERT_TRUE(home.ok()) << home.status();
  auto on_host = tg::GpuModel::Create(config, batch, seq, std::move(*home));
  auto plain = tg::GpuModel::Create(config, batch, seq);
  ASSERT_TRUE(on_host.ok()) << on_host.status();
  ASSERT_TRUE(plain.ok()) << plain.status();
  (*on_host)->SetOptimizerOnCpu(true);
  ASSERT_TRUE((*on_host)->InitParams(9).ok());
  ASSERT_TRUE((*plain)->InitParams(9).ok());
  ASSERT_TRUE((*on_host)->RegisterStep(2).ok());
  // After the run no master weights or moments are on the GPU: each host step dropped the
  // copies the initial upload left there, and nothing brought them back.
  auto optimizer_state_on_gpu = [&] {
    ASSERT_TRUE((*on_host)->FinishOptimizerStep().ok());
    auto leases = EveryLease();
    ASSERT_TRUE(leases.ok()) << leases.status();
    int optimizer_state = 0, on_gpu = 0;
    for (const auto& lease : leases->leases()) {
      const std::string& name = lease.spec().name();
      if (name.rfind("master.", 0) != 0 && name.rfind("opt.", 0) != 0) continue;
      ++optimizer_state;
      for (int tier : lease.copies()) on_gpu += tier == v1::TIER_GPU;
    }
    int chunks = 0;
    for (int g = 0; g < static_cast<int>(layout.groups.size()); ++g) chunks += 3 * layout.Chunks(g, tg::Part::kMaster);
    EXPECT_EQ(optimizer_state, chunks);
    EXPECT_EQ(chunks, 9 * static_cast<int>(layout.groups.size()));
    EXPECT_EQ(on_gpu, 0) << "master weights or moments on the GPU";
  };
  // The host's AdamW gives the kernel's bits, so the runs stay as close as two GPU runs.
  TrainSideBySide(**on_host, **plain, config, batch, seq, /*steps=*/4, "host AdamW overlapping the next forward, GPU AdamW",
                  optimizer_state_on_gpu);
  EXPECT_GT((*on_host)->HostOptimizerSeconds(), 0.0) << "the host did the steps";
  std::printf("%s\n", (*on_host)->home().Describe().c_str());
  // A plain home has no host tier: the CPU optimizer says so.
  auto no_host = tg::GpuModel::Create(config, batch, seq);
  ASSERT_TRUE(no_host.ok());
  (*no_host)->SetOptimizerOnCpu(true);
  ASSERT_TRUE((*no_host)->InitParams(9).ok());
  const absl::Status refused = (*no_host)->AdamWStep(1e-3, 1, trainer::AdamWOptions{}, 1.0);
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnimplemented) << refused;
}

// 8-bit blockwise moments (--opt=adamw8bit): the host steps them in tierd's DRAM tier, a
// plain model steps them with the GPU kernel; the two give the same bits, so the training
// is the same bit for bit, and the moments take a quarter of fp32's bytes.
TEST_F(GpuTierdTest, EightBitMomentsOnTheHostTrainLikeOnTheGpu) {
  const trainer::ModelConfig config = TestConfig();
  const int batch = 4, seq = 128;
  const tg::GpuHomeLayout fp32 = tg::GpuModel::HomeLayout(config, batch, seq);
  const tg::GpuHomeLayout layout = tg::GpuModel::HomeLayout(config, batch, seq, {.moments_8bit = true});
  EXPECT_LT(layout.TotalOf(tg::Part::kAdamM), fp32.TotalOf(tg::Part::kAdamM) / 3);
  auto on_host = OnTierd(config, batch, seq, {.moments_8bit = true});
  auto on_gpu = tg::GpuModel::Create(config, batch, seq, nullptr, {.moments_8bit = true});
  ASSERT_NE(on_host, nullptr);
  ASSERT_TRUE(on_gpu.ok()) << on_gpu.status();
  on_host->SetOptimizerOnCpu(true);
  ASSERT_TRUE(on_host->InitParams(9).ok());
  ASSERT_TRUE((*on_gpu)->InitParams(9).ok());
  ASSERT_TRUE(on_host->RegisterStep(2).ok());
  TrainSideBySide(*on_host, **on_gpu, config, batch, seq, /*steps=*/4, "host AdamW 8-bit, GPU AdamW 8-bit");
  EXPECT_GT(on_host->HostOptimizerSeconds(), 0.0) << "the host did the steps";
  // A home of fp32 moments is not one for a model of 8-bit ones.
  auto fp32_home = tg::MakePlainGpuHome(fp32);
  ASSERT_TRUE(fp32_home.ok());
  EXPECT_EQ(tg::GpuModel::Create(config, batch, seq, std::move(*fp32_home), {.moments_8bit = true}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Lion (--opt=lion): the host steps it in tierd's DRAM tier, a plain model with the GPU kernel;
// the two give the same bits, so the training is the same bit for bit. Its state has no
// second moment: no "opt.v." lease at all.
TEST_F(GpuTierdTest, LionOnTheHostTrainsLikeOnTheGpu) {
  const trainer::ModelConfig config = TestConfig();
  const int batch = 4, seq = 128;
  auto on_host = OnTierd(config, batch, seq, {.lion = true});
  auto on_gpu = tg::GpuModel::Create(config, batch, seq, nullptr, {.lion = true});
  ASSERT_NE(on_host, nullptr);
  ASSERT_TRUE(on_gpu.ok()) << on_gpu.status();
  on_host->SetOptimizerOnCpu(true);
  ASSERT_TRUE(on_host->InitParams(9).ok());
  ASSERT_TRUE((*on_gpu)->InitParams(9).ok());
  ASSERT_TRUE(on_host->RegisterStep(2).ok());
  TrainSideBySide(*on_host, **on_gpu, config, batch, seq, /*steps=*/4, "host Lion, GPU Lion");
  EXPECT_GT(on_host->HostOptimizerSeconds(), 0.0) << "the host did the steps";
  auto leases = EveryLease();
  ASSERT_TRUE(leases.ok()) << leases.status();
  int moments = 0;
  for (const auto& lease : leases->leases()) {
    const std::string& name = lease.spec().name();
    EXPECT_NE(name.rfind("opt.v.", 0), 0u) << name;
    moments += name.rfind("opt.m.", 0) == 0;
  }
  EXPECT_EQ(moments, config.layers + 2);
}

// Adafactor (--opt=adafactor): the host steps it in tierd's DRAM tier (HostAdafactor, its sums
// in the GPU kernels' order), a plain model with the GPU kernels. Unlike AdamW and Lion the two
// are not the same bits yet (a matrix's factored update differs in the last bits on the H200),
// and bf16 weight rounding amplifies that over steps (gradient norms 7e-4 apart by step 4), so
// the bound is: each step's loss within 1e-5 relative, its gradient norm within 3e-3, the final
// master weights within 5e-4 relative (L2) of each other (H200: 1.3e-4).
TEST_F(GpuTierdTest, AdafactorOnTheHostTrainsLikeOnTheGpu) {
  const trainer::ModelConfig config = TestConfig();
  const int batch = 4, seq = 128;
  auto on_host = OnTierd(config, batch, seq, {.adafactor = true});
  auto on_gpu = tg::GpuModel::Create(config, batch, seq, nullptr, {.adafactor = true});
  ASSERT_NE(on_host, nullptr);
  ASSERT_TRUE(on_gpu.ok()) << on_gpu.status();
  on_host->SetOptimizerOnCpu(true);
  ASSERT_TRUE(on_host->InitParams(9).ok());
  ASSERT_TRUE((*on_gpu)->InitParams(9).ok());
  ASSERT_TRUE(on_host->RegisterStep(2).ok());
  TrainSideBySide(
      *on_host, **on_gpu, config, batch, seq, /*steps=*/4, "host Adafactor, GPU Adafactor", [] {},
      Closeness{1e-5, 3e-3, 5e-4});
  EXPECT_GT(on_host->HostOptimizerSeconds(), 0.0) << "the host did the steps";
}

// A split (--optimizer_place=split, SetHostOptimizerGroups): the last two groups (the head and
// the last layer) stepped on the host in tierd's DRAM, the others on the GPU just before their
// next forward, 8-bit moments (each part leased whole). Host and GPU give the same
// bits, so the training tracks a plain model's; the host's groups' master weights and moments
// never reach the GPU, and the graph the planner gets says which group steps where.
TEST_F(GpuTierdTest, ASplitStepsTheLastGroupsOnTheHostAndTheRestOnTheGpu) {
  const trainer::ModelConfig config = TestConfig();
  const int batch = 4, seq = 128;
  tg::GpuHomeLayout layout = tg::GpuModel::HomeLayout(config, batch, seq, {.moments_8bit = true});
  layout.state_chunks = 2;
  const uint64_t state = layout.Total();
  auto home = tg::MakeTierdGpuHome(layout, Options(state / 3, 2 * state, 2 * state));
  ASSERT_TRUE(home.ok()) << home.status();
  auto split = tg::GpuModel::Create(config, batch, seq, std::move(*home), {.moments_8bit = true});
  auto plain = tg::GpuModel::Create(config, batch, seq, nullptr, {.moments_8bit = true});
  ASSERT_TRUE(split.ok()) << split.status();
  ASSERT_TRUE(plain.ok()) << plain.status();
  const int groups = static_cast<int>(layout.groups.size());
  (*split)->SetHostOptimizerGroups(2);
  EXPECT_EQ((*split)->HostOptimizerGroups(), 2);
  ASSERT_TRUE((*split)->InitParams(9).ok());
  ASSERT_TRUE((*plain)->InitParams(9).ok());
  // The graph: the host's op for the last two groups, the GPU's for the others, each just
  // before its group's first forward.
  std::set<std::string> host_ops, gpu_ops;
  for (const auto& op : (*split)->StepGraph(2).ops) {
    if (op.name.rfind("adamw.cpu.", 0) == 0) host_ops.insert(op.name.substr(10));
    else if (op.name.rfind("adamw.", 0) == 0) gpu_ops.insert(op.name.substr(6));
  }
  EXPECT_EQ(host_ops, (std::set<std::string>{layout.groups[groups - 2], layout.groups[groups - 1]}));
  EXPECT_EQ(static_cast<int>(gpu_ops.size()), groups - 2);
  EXPECT_EQ(gpu_ops.count(layout.groups[0]), 1u);
  auto note = (*split)->RegisterStep(2);
  ASSERT_TRUE(note.ok()) << note.status();
  std::printf("%s\n", note->c_str());
  auto host_state_on_gpu = [&] {
    ASSERT_TRUE((*split)->FinishOptimizerStep().ok());
    auto leases = EveryLease();
    ASSERT_TRUE(leases.ok()) << leases.status();
    int host_state = 0;
    for (const auto& lease : leases->leases()) {
      const std::string& name = lease.spec().name();
      if (name.rfind("master.", 0) != 0 && name.rfind("opt.", 0) != 0) continue;
      bool of_host_group = false;  // "opt.m.layers.3" or its sub-group "opt.m.layers.3.1"
      for (int g = groups - 2; g < groups; ++g) {
        for (const char* part : {"master.", "opt.m.", "opt.v."}) {
          const std::string base = part + layout.groups[g];
          of_host_group |= name == base || name.rfind(base + ".", 0) == 0;
        }
      }
      if (!of_host_group) continue;
      ++host_state;
      for (int tier : lease.copies()) EXPECT_NE(tier, v1::TIER_GPU) << name << " is on the GPU";
    }
    int leased = 0;  // 8-bit moments keep each part whole (GpuHomeLayout::Chunks)
    for (int g = groups - 2; g < groups; ++g) {
      for (tg::Part part : {tg::Part::kMaster, tg::Part::kAdamM, tg::Part::kAdamV}) {
        if (layout.bytes[g][static_cast<int>(part)] > 0) leased += layout.Chunks(g, part);
      }
    }
    EXPECT_EQ(host_state, leased) << "two groups, three parts, in the layout's sub-groups";
    EXPECT_GE(host_state, 6);
  };
  TrainSideBySide(**split, **plain, config, batch, seq, /*steps=*/4,
                  "split: host AdamW 8-bit for the last two groups, GPU for the rest; GPU AdamW 8-bit",
                  host_state_on_gpu);
  EXPECT_GT((*split)->HostOptimizerSeconds(), 0.0) << "the host did its groups' steps";
  std::printf("%s\n", (*split)->home().Describe().c_str());
}

}  // namespace
}  // namespace tierd
