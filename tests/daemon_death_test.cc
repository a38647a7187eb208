// A tierd that dies (SIGKILL: no goodbye, the rings' closed flags never set) ends its
// clients within seconds: a client waiting on its ring for an answer that will never come,
// and the reference trainer, which stops saying where its last checkpoint is. Then a new
// tierd starts in the same runtime directory and sweeps what the dead one left.
#include <dirent.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <random>
#include <string>
#include <thread>

#include "tests/process.h"

namespace tierd {
namespace {

using testing::CountShm;
using testing::Process;
using Clock = std::chrono::steady_clock;

class DaemonDeathTest : public ::testing::Test {
 protected:
  void SetUp() override {
    runtime_dir_ =
        "/tmp/tierd-death-" + std::to_string(getpid()) + "-" + std::to_string(std::random_device{}() % 100000);
    daemon_ = Start();
    ASSERT_NE(daemon_, nullptr);
  }
  std::unique_ptr<Process> Start() {
    const char* tmp = std::getenv("TEST_TMPDIR");
    auto daemon = std::make_unique<Process>(
        "server/tierd", std::vector<std::string>{"--gpu=fake", "--gpu_bytes=16MiB", "--dram_bytes=16MiB",
                                                 std::string("--nvme_dir=") + (tmp ? tmp : "/tmp"),
                                                 "--nvme_bytes=96MiB", "--runtime_dir=" + runtime_dir_});
    const std::string instance = daemon->WaitForLine("tierd: instance ", 20000);
    EXPECT_NE(instance, "") << daemon->output();
    if (instance.empty()) return nullptr;
    instance_ = instance.substr(16, instance.find(' ', 16) - 16) + "-";
    EXPECT_NE(daemon->WaitForLine("tierd: ready", 20000), "") << daemon->output();
    return daemon;
  }
  // After the kill: a new tierd in the same directory starts, sweeps the dead one's
  // shared memory (its clients are gone by now), and stops cleanly.
  void RestartAndSweep() {
    const std::string dead = instance_;
    auto fresh = Start();
    ASSERT_NE(fresh, nullptr);
    EXPECT_EQ(CountShm(dead), 0) << "the dead daemon's segments were not swept";
    fresh->Signal(SIGTERM);
    EXPECT_EQ(fresh->Wait(), 0) << fresh->output();
    rmdir(runtime_dir_.c_str());
  }
  std::string runtime_dir_, instance_;
  std::unique_ptr<Process> daemon_;
};

// The client is in the middle of acquire/release round trips when tierd stops answering
// (SIGSTOP) and then dies (SIGKILL): its wait on the ring ends within a second or two.
TEST_F(DaemonDeathTest, AClientWaitingOnItsRingNoticesWithinSeconds) {
  Process churner("tests/client_worker", {runtime_dir_, "churn"});
  ASSERT_NE(churner.WaitForLine("churning", 10000), "") << churner.output();
  daemon_->Signal(SIGSTOP);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the client is waiting for an answer now
  const auto killed = Clock::now();
  daemon_->Signal(SIGKILL);
  daemon_->Wait();
  const std::string line = churner.WaitForLine("client_worker: ", 5000);
  const double seconds = std::chrono::duration<double>(Clock::now() - killed).count();
  ASSERT_NE(line, "") << "no word from the client 5 s after tierd died:\n" << churner.output();
  EXPECT_NE(line.find("UNAVAILABLE: tierd closed session"), std::string::npos) << line;
  EXPECT_NE(line.find("tierd died, was stopped, or ended the session"), std::string::npos) << line;
  EXPECT_EQ(churner.Wait(), 1);
  std::printf("the client noticed %.2f s after the kill\n", seconds);
  RestartAndSweep();
}

// The reference trainer (CPU, every tensor leased from tierd) stops within seconds with the
// reason and where its last checkpoint is, and exits non-zero.
TEST_F(DaemonDeathTest, TheTrainerStopsWithWhereItsLastCheckpointIs) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string ckpt = std::string(tmp ? tmp : "/tmp") + "/death-ckpt-" + std::to_string(getpid());
  Process trainer("trainer_ref/tierd-train",
                  {"--device=cpu", "--offload_policy=tierd", "--tierd_dir=" + runtime_dir_, "--tierd_dram=2MiB",
                   "--tierd_nvme=32MiB", "--steps=100000", "--batch_size=2", "--seq_len=32", "--eval_every=0",
                   "--checkpoint_dir=" + ckpt, "--checkpoint_every=2"});
  ASSERT_NE(trainer.WaitForLine("checkpoint " + ckpt + "/ckpt-00000004.bin", 60000), "") << trainer.output();
  const auto killed = Clock::now();
  daemon_->Signal(SIGKILL);
  daemon_->Wait();
  const std::string line = trainer.WaitForLine("tierd-train: ", 5000);
  const double seconds = std::chrono::duration<double>(Clock::now() - killed).count();
  ASSERT_NE(line, "") << "no word from the trainer 5 s after tierd died:\n" << trainer.output();
  EXPECT_NE(line.find("tierd closed session"), std::string::npos) << line;
  const std::string advice = trainer.WaitForLine("  last checkpoint ", 1000);
  EXPECT_NE(advice.find(ckpt + "/ckpt-0000000"), std::string::npos) << trainer.output();
  EXPECT_NE(advice.find("--resume"), std::string::npos) << advice;
  EXPECT_EQ(trainer.Wait(), 1);
  std::printf("the trainer stopped %.2f s after the kill: %s\n%s\n", seconds, line.c_str(), advice.c_str());
  RestartAndSweep();
  std::system(("rm -rf " + ckpt).c_str());
}

}  // namespace
}  // namespace tierd
