// The reference trainer with every parameter, gradient, Adam moment and saved activation leased from the real
// tierd binary, in a DRAM quota far below the model's state so every step moves tensors
// between DRAM and NVMe: the losses are the same, step for step, as with plain buffers.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "base/units.h"
#include "clients/client.h"
#include "tests/process.h"
#include "trainer_ref/home/tierd_home.h"
#include "trainer_ref/trainer.h"

namespace tierd {
namespace {

// The real tierd with a fake GPU, 16 MiB of DRAM and 96 MiB of NVMe, ready.
std::unique_ptr<testing::Process> StartTierd(const std::string& runtime_dir) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  auto daemon = std::make_unique<testing::Process>(
      "server/tierd", std::vector<std::string>{"--gpu=fake", "--gpu_bytes=16MiB", "--dram_bytes=16MiB",
                                               std::string("--nvme_dir=") + (tmp ? tmp : "/tmp"), "--nvme_bytes=96MiB",
                                               "--runtime_dir=" + runtime_dir});
  EXPECT_NE(daemon->WaitForLine("tierd: ready", 20000), "") << daemon->output();
  return daemon;
}

// A session of its own on that tierd, leasing nothing: to look at the others.
std::unique_ptr<Client> Watcher(const std::string& runtime_dir) {
  ClientOptions options;
  options.runtime_dir = runtime_dir;
  options.label = "watcher";
  options.quota = {0, 1 * kMiB, 1 * kMiB};
  auto watcher = Client::Connect(options);
  EXPECT_TRUE(watcher.ok()) << watcher.status();
  return watcher.ok() ? std::move(*watcher) : nullptr;
}

// Five short steps of the tiny model: 2 x 32 tokens a micro-batch.
trainer::TrainOptions FiveSteps() {
  trainer::TrainOptions options;
  options.batch = 2;
  options.seq = 32;
  options.steps = 5;
  options.warmup = 2;
  return options;
}

TEST(TrainerOnTierdTest, SameLossesAsPlainBuffersWhileTensorsMoveThroughNvme) {
  const std::string runtime_dir =
      "/tmp/tierd-train-" + std::to_string(getpid()) + "-" + std::to_string(std::random_device{}() % 100000);
  auto daemon = StartTierd(runtime_dir);

  const trainer::ModelConfig config = *trainer::ModelPreset("tiny");
  auto data = trainer::LoadDataset("embedded", config.vocab, 32, 0.1);
  ASSERT_TRUE(data.ok());
  trainer::TrainOptions options = FiveSteps();
  options.grad_accum = 2;
  // The tiny model's state is 4 x 0.7 MiB, and its saved activations 0.7 MiB (2 layers of
  // 292 KiB, the head's 84 KiB); a 2 MiB DRAM quota holds a fraction of it. (At 1 MiB the
  // backward of a layer, 18 tensors and its activations held at once, does not find a
  // 292 KiB block in the holes between them: tierd says so with the numbers.)
  ClientOptions client;
  client.runtime_dir = runtime_dir;
  client.label = "trainer";
  client.quota = {0, 2 * kMiB, 32 * kMiB};
  auto tierd_home = trainer::MakeTierdHome(trainer::HomeShapeFor(config, options).Table(), client);
  ASSERT_TRUE(tierd_home.ok()) << tierd_home.status();
  auto plain_home = trainer::MakePlainHome(trainer::HomeShapeFor(config, options).Table()).value();
  auto on_tierd = trainer::Trainer::Create(config, options, *data, **tierd_home);
  auto plain = trainer::Trainer::Create(config, options, *data, *plain_home);
  ASSERT_TRUE(on_tierd.ok()) << on_tierd.status();
  ASSERT_TRUE(plain.ok());
  // The trainer registered its step: tierd plans DRAM over NVMe for it.
  EXPECT_EQ((*on_tierd)->plan_note().rfind("planned ", 0), 0u) << (*on_tierd)->plan_note();
  EXPECT_EQ((*plain)->plan_note(), "");
  std::printf("%s\n", (*on_tierd)->plan_note().c_str());
  for (int step = 0; step < 5; ++step) {
    auto a = (*on_tierd)->Step();
    auto b = (*plain)->Step();
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_TRUE(b.ok());
    EXPECT_EQ(a->loss, b->loss) << "step " << step + 1;
    EXPECT_EQ(a->grad_norm, b->grad_norm) << "step " << step + 1;
  }
  EXPECT_EQ(*(*on_tierd)->SaveState(), *(*plain)->SaveState()) << "weights and moments, bit for bit";
  const std::string traffic = (*tierd_home)->Describe();
  EXPECT_NE(traffic.find("dram->nvme"), std::string::npos) << traffic;
  EXPECT_NE(traffic.find("nvme->dram"), std::string::npos) << traffic;
  std::printf("%s\n", traffic.c_str());
  // The saved activations are tierd's tensors too.
  auto watcher = Watcher(runtime_dir);
  ASSERT_NE(watcher, nullptr);
  auto leases = watcher->ListLeases(/*every_session=*/true);
  ASSERT_TRUE(leases.ok()) << leases.status();
  std::set<std::string> activations;
  for (const auto& lease : leases->leases()) {
    if (lease.spec().tensor_class() == v1::TENSOR_CLASS_ACTIVATION) activations.insert(lease.spec().name());
  }
  EXPECT_EQ(activations, (std::set<std::string>{"act.layers.0", "act.layers.1", "act.head"}));

  // The same run without the plan: every tensor fetched when acquired. The planned run
  // fetched on demand far less (the executor moved them ahead of the ops).
  auto planned_stats = watcher->Stats();
  ASSERT_TRUE(planned_stats.ok());
  const uint64_t planned_fetches = planned_stats->stalls();
  // A trainer on its own tierd session (label), with `options` changed by `adjust`.
  struct OnTierd {
    std::unique_ptr<trainer::Home> home;
    std::unique_ptr<trainer::Trainer> trainer;  // destroyed first: it uses the home
  };
  auto start = [&](const std::string& label, void (*adjust)(trainer::TrainOptions&), OnTierd* out) {
    client.label = label;
    auto home = trainer::MakeTierdHome(trainer::HomeShapeFor(config, options).Table(), client);
    ASSERT_TRUE(home.ok()) << home.status();
    out->home = std::move(*home);
    trainer::TrainOptions adjusted = options;
    adjust(adjusted);
    auto made = trainer::Trainer::Create(config, adjusted, *data, *out->home);
    ASSERT_TRUE(made.ok()) << made.status();
    out->trainer = std::move(*made);
  };
  OnTierd unplanned;
  start("unplanned", [](trainer::TrainOptions& o) { o.plan = false; }, &unplanned);
  ASSERT_NE(unplanned.trainer, nullptr);
  for (int step = 0; step < 5; ++step) {
    auto st = unplanned.trainer->Step();
    ASSERT_TRUE(st.ok()) << "step " << step << ": " << st.status();
  }
  EXPECT_EQ(*unplanned.trainer->SaveState(), *(*plain)->SaveState());
  auto unplanned_stats = watcher->Stats();
  ASSERT_TRUE(unplanned_stats.ok());
  const uint64_t unplanned_fetches = unplanned_stats->stalls() - planned_fetches;
  std::printf("demand fetches: %d with the plan, %d without\n", static_cast<int>(planned_fetches),
              static_cast<int>(unplanned_fetches));
  EXPECT_LT(planned_fetches, unplanned_fetches);

  // And recorded instead of registered: the trainer marks each step's start, tierd records
  // the first step's acquires and releases, plans at the second mark and follows the ops
  // as they are acquired. Same values; fewer demand fetches than without a plan.
  unplanned.trainer.reset();  // the trainer before its home:
  unplanned.home.reset();     // the session ends, its quota goes back to the daemon
  OnTierd recorded_run;
  start("recorded", [](trainer::TrainOptions& o) { o.record_plan = true; }, &recorded_run);
  ASSERT_NE(recorded_run.trainer, nullptr);
  trainer::Trainer* recorded = recorded_run.trainer.get();
  EXPECT_EQ(recorded->plan_note(), "") << "nothing registered";
  ASSERT_TRUE(recorded->Step().ok());
  EXPECT_EQ(recorded->plan_note().rfind("recording", 0), 0u) << recorded->plan_note();
  ASSERT_TRUE(recorded->Step().ok());
  EXPECT_EQ(recorded->plan_note().rfind("recorded one iteration: ", 0), 0u) << recorded->plan_note();
  std::printf("%s\n", recorded->plan_note().c_str());
  for (int step = 2; step < 5; ++step) ASSERT_TRUE(recorded->Step().ok());
  EXPECT_EQ(*recorded->SaveState(), *(*plain)->SaveState());
  auto recorded_stats = watcher->Stats();
  ASSERT_TRUE(recorded_stats.ok());
  const uint64_t recorded_fetches = recorded_stats->stalls() - unplanned_stats->stalls();
  std::printf("demand fetches: %d with the recorded plan (its first step recording, unplanned)\n",
              static_cast<int>(recorded_fetches));
  EXPECT_LT(recorded_fetches, unplanned_fetches);
}

// 8-bit moments through tierd (each moment a byte lease: codes and scales) give the plain
// buffers' losses and state bit for bit, in a DRAM quota that sends tensors through NVMe.
TEST(TrainerOnTierdTest, EightBitMomentsThroughTierdMatchPlainBuffers) {
  const std::string runtime_dir =
      "/tmp/tierd-train8-" + std::to_string(getpid()) + "-" + std::to_string(std::random_device{}() % 100000);
  auto daemon = StartTierd(runtime_dir);
  const trainer::ModelConfig config = *trainer::ModelPreset("tiny");
  auto data = trainer::LoadDataset("embedded", config.vocab, 32, 0.1);
  ASSERT_TRUE(data.ok());
  trainer::TrainOptions options = FiveSteps();
  options.moments_8bit = true;
  ClientOptions client;
  client.runtime_dir = runtime_dir;
  client.label = "eight-bit";
  client.quota = {0, 2 * kMiB, 32 * kMiB};
  auto tierd_home = trainer::MakeTierdHome(trainer::HomeShapeFor(config, options).Table(), client);
  ASSERT_TRUE(tierd_home.ok()) << tierd_home.status();
  auto plain_home = trainer::MakePlainHome(trainer::HomeShapeFor(config, options).Table()).value();
  auto on_tierd = trainer::Trainer::Create(config, options, *data, **tierd_home);
  auto plain = trainer::Trainer::Create(config, options, *data, *plain_home);
  ASSERT_TRUE(on_tierd.ok()) << on_tierd.status();
  ASSERT_TRUE(plain.ok());
  for (int step = 0; step < 5; ++step) {
    auto a = (*on_tierd)->Step();
    auto b = (*plain)->Step();
    ASSERT_TRUE(a.ok()) << a.status();
    ASSERT_TRUE(b.ok());
    EXPECT_EQ(a->loss, b->loss) << "step " << step + 1;
  }
  EXPECT_EQ(*(*on_tierd)->SaveState(), *(*plain)->SaveState());
  const std::string traffic = (*tierd_home)->Describe();
  EXPECT_NE(traffic.find("dram->nvme"), std::string::npos) << traffic;
  on_tierd->reset();
  tierd_home->reset();
  daemon->Signal(SIGTERM);
  EXPECT_EQ(daemon->Wait(), 0) << daemon->output();
  rmdir(runtime_dir.c_str());
}

// tierd-train through tierd reports each step (ReportStep): a watcher sees the trainer's session
// in tierd's Stats while it runs — its step, loss, the mean and deviation of its losses, the
// step's seconds and tokens/s — the users' "step time, loss variance" beside the tiers'.
TEST(TrainerOnTierdTest, TheTrainersStepsAreInTierdsStats) {
  const std::string runtime_dir =
      "/tmp/tierd-steps-" + std::to_string(getpid()) + "-" + std::to_string(std::random_device{}() % 100000);
  auto daemon = StartTierd(runtime_dir);
  testing::Process run(
      "trainer_ref/tierd-train",
      {"--device=cpu", "--steps=100000", "--batch_size=2", "--seq_len=32", "--eval_every=0", "--offload_policy=tierd",
       "--tierd_dir=" + runtime_dir, "--tierd_dram=4MiB", "--tierd_nvme=32MiB"});
  auto watcher = Watcher(runtime_dir);
  ASSERT_NE(watcher, nullptr);
  v1::SessionSteps seen;
  for (int tries = 0; tries < 600 && seen.step() < 5; ++tries) {  // up to a minute
    auto stats = watcher->Stats();
    ASSERT_TRUE(stats.ok()) << stats.status();
    if (stats->session_steps_size() == 1) seen = stats->session_steps(0);
    if (seen.step() < 5) usleep(100 * 1000);
  }
  run.Signal(SIGKILL);
  run.Wait();
  ASSERT_GE(seen.step(), 5) << run.output();
  EXPECT_NE(seen.session_id(), watcher->session_id());
  EXPECT_EQ(seen.window(), std::min<int64_t>(seen.step(), 100)) << "every step's loss, none skipped";
  EXPECT_EQ(seen.skipped_steps(), 0u);
  EXPECT_GT(seen.loss(), 0.5);
  EXPECT_LT(seen.loss(), 10);
  EXPECT_GT(seen.loss_sd(), 0) << "the tiny model's loss moves from step to step";
  EXPECT_GT(seen.step_seconds(), 0);
  EXPECT_NEAR(seen.tokens_per_second() * seen.step_seconds(), 64, 1e-6) << "2 x 32 tokens a step";
  daemon->Signal(SIGTERM);
  EXPECT_EQ(daemon->Wait(), 0) << daemon->output();
  rmdir(runtime_dir.c_str());
}

// The metrics lines without what differs between runs that compute the same (time, bytes moved).
std::vector<std::string> Losses(const std::string& path) {
  std::vector<std::string> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("{\"plan\": ", 0) == 0) continue;  // the run plan says how, and the two runs differ there
    out.push_back(line.substr(0, line.find(", \"seconds\"")));
  }
  return out;
}

// Checkpoints of a state spread over tierd's DRAM and NVMe tiers (what DeepSpeed cannot do for
// NVMe-offloaded state): tierd-train through tierd in a 2 MiB DRAM quota (the tiny model's
// state is 2.8 MiB), killed with SIGKILL after step 5, resumed from step 4's checkpoint, gives
// the plain run's losses bit for bit.
TEST(TrainerOnTierdTest, AKilledRunWhoseStateIsOnNvmeResumesBitForBit) {
  const std::string tag = std::to_string(getpid()) + "-" + std::to_string(std::random_device{}() % 100000);
  const std::string runtime_dir = "/tmp/tierd-resume-" + tag;
  const char* tmp_env = std::getenv("TEST_TMPDIR");
  const std::string tmp = tmp_env ? tmp_env : "/tmp";
  auto daemon = StartTierd(runtime_dir);
  const std::vector<std::string> common = {"--device=cpu", "--steps=8", "--warmup=2", "--batch_size=2",
                                           "--seq_len=32", "--eval_every=0"};
  auto with = [&](std::vector<std::string> extra) {
    std::vector<std::string> all = common;
    all.insert(all.end(), extra.begin(), extra.end());
    return all;
  };
  const std::string plain_metrics = tmp + "/plain-" + tag + ".jsonl", tierd_metrics = tmp + "/tierd-" + tag + ".jsonl";
  const std::string ckpt = tmp + "/ckpt-" + tag;
  testing::Process plain("trainer_ref/tierd-train", with({"--metrics=" + plain_metrics}));
  ASSERT_EQ(plain.Wait(), 0) << plain.output();
  const std::vector<std::string> on_tierd = {"--offload_policy=tierd", "--tierd_dir=" + runtime_dir,
                                             "--tierd_dram=2MiB", "--tierd_nvme=32MiB", "--metrics=" + tierd_metrics,
                                             "--checkpoint_dir=" + ckpt, "--checkpoint_every=2"};
  setenv("TIERD_TRAIN_SIGKILL_AT_STEP", "5", 1);
  testing::Process killed("trainer_ref/tierd-train", with(on_tierd));
  EXPECT_EQ(killed.Wait(), 128 + SIGKILL);
  unsetenv("TIERD_TRAIN_SIGKILL_AT_STEP");
  std::vector<std::string> resume_flags = on_tierd;
  resume_flags.push_back("--resume");
  testing::Process resumed("trainer_ref/tierd-train", with(resume_flags));
  EXPECT_NE(resumed.WaitForLine("resumed from " + ckpt + "/ckpt-00000004.bin at step 4", 20000), "")
      << resumed.output();
  const std::string done = resumed.WaitForLine("done: 8 steps", 60000);
  EXPECT_NE(done.find("dram->nvme"), std::string::npos) << "the state went through NVMe: " << done;
  EXPECT_EQ(resumed.Wait(), 0) << resumed.output();
  const std::vector<std::string> want = Losses(plain_metrics), got = Losses(tierd_metrics);
  ASSERT_EQ(want.size(), 8u);
  EXPECT_EQ(got, want);
  daemon->Signal(SIGTERM);
  EXPECT_EQ(daemon->Wait(), 0) << daemon->output();
  std::system(("rm -rf " + ckpt + " " + plain_metrics + " " + tierd_metrics).c_str());
  rmdir(runtime_dir.c_str());
}

}  // namespace
}  // namespace tierd
