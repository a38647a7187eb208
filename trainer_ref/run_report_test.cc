#include "trainer_ref/run_report.h"
#include "trainer_ref/run_plan.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace tierd::trainer {
namespace {

TEST(RunReportTest, TheLossWindowKeepsTheLastHundred) {
  LossWindow window;
  for (int i = 0; i < 150; ++i) window.Add(i < 50 ? 1000.0 : (i % 2 ? 3.0 : 1.0));
  EXPECT_EQ(window.size(), 100u);
  EXPECT_DOUBLE_EQ(window.mean(), 2.0);
  EXPECT_DOUBLE_EQ(window.sd(), 1.0);
  LossWindow restored;
  restored.Restore(window.values());
  EXPECT_EQ(restored.values(), window.values());
}

// The guard's units: 21 losses alternating 1.5 and 2.5 have a recent level of 2 and
// step-to-step differences of +-1, so a noise of 1 / sqrt 2; 5 of those above the level is a
// spike at 4, 3.9 is not, nor a fall, a non-finite loss, anything before 20 steps or with the
// guard at 0. A window falling steeply (its plain sd 1.4, mostly the fall) still flags a loss
// well above its recent level, where its plain mean and sd would put that loss below the mean;
// a flat window's noise is floored at 0.1% of its level.
TEST(RunReportTest, ALossFarAboveTheRecentLevelIsASpike) {
  LossWindow window;
  SpikeGuard guard(4.0);
  for (int i = 0; i < 19; ++i) window.Add(i % 2 ? 2.5 : 1.5);
  EXPECT_EQ(guard.Check(20, 100.0, window), 0) << "19 steps: too few to judge";
  window.Add(2.5);
  window.Add(1.5);
  const double noise = 1 / std::sqrt(2.0);
  EXPECT_EQ(guard.Check(22, 2 + 3.9 * noise, window), 0);
  EXPECT_NEAR(guard.Check(23, 2 + 5 * noise, window), 5.0, 1e-9);
  EXPECT_EQ(guard.Words(5.0),
            "  loss spike: 5.0 sd above the last 10 steps' mean 2.0000 (noise sd 0.7071 over the last 21 steps)");
  EXPECT_EQ(guard.Words(0), "");
  EXPECT_EQ(guard.Check(24, -50.0, window), 0) << "a fall is no spike";
  EXPECT_EQ(guard.Check(25, std::nan(""), window), 0) << "a non-finite loss is the skip's to report";
  EXPECT_EQ(guard.steps(), (std::vector<int64_t>{23}));
  EXPECT_EQ(guard.Summary(), "; 1 loss spike flagged (step 23)");

  LossWindow falling;
  for (int i = 0; i < 100; ++i) falling.Add(6 - 0.05 * i + (i % 2 ? 0.05 : -0.05));
  ASSERT_GT(falling.sd(), 1.4);
  ASSERT_GT(falling.mean(), 3.0);
  SpikeGuard trend(4.0);
  EXPECT_EQ(trend.Check(101, 1.0, falling), 0) << "the next step of the fall";
  EXPECT_GT(trend.Check(102, 2.0, falling), 9.0) << "0.7 above the recent level, 10 noise deviations";
  EXPECT_EQ(trend.Summary(), "; 1 loss spike flagged (step 102)");

  LossWindow flat;
  for (int i = 0; i < 30; ++i) flat.Add(2.0);
  SpikeGuard flat_guard(4.0);
  EXPECT_EQ(flat_guard.Check(31, 2.005, flat), 0) << "2.5 sd of the 0.1% floor";
  EXPECT_NEAR(flat_guard.Check(32, 2.01, flat), 5.0, 1e-9);
  SpikeGuard off(0);
  EXPECT_EQ(off.Check(33, 1e9, window), 0);
  EXPECT_EQ(off.Summary(), "");
  // Ten and more: the first ten steps named.
  for (int k = 0; k < 11; ++k) flat_guard.Check(40 + k, 3.0, flat);
  EXPECT_EQ(flat_guard.Summary(), "; 12 loss spikes flagged (steps 32, 40, 41, 42, 43, 44, 45, 46, 47, 48, ...)");
}

// Reports go on while they are taken; the first refusal is said and ends them (the run goes
// on), so an older tierd costs one line, not the run.
TEST(RunReportTest, StepReportsStopAtTheFirstRefusal) {
  StepReporter reporter;
  int calls = 0;
  reporter.Send([&] {
    ++calls;
    return absl::OkStatus();
  });
  EXPECT_TRUE(reporter.on());
  testing::internal::CaptureStdout();
  reporter.Send([&] {
    ++calls;
    return absl::UnimplementedError("unknown method ReportStep");
  });
  reporter.Send([&] {
    ++calls;
    return absl::OkStatus();
  });
  const std::string said = testing::internal::GetCapturedStdout();
  EXPECT_EQ(calls, 2);
  EXPECT_FALSE(reporter.on());
  EXPECT_EQ(said,
            "note: tierd did not take the step's report (unknown method ReportStep): its statistics will not show this "
            "run's steps\n");
}

std::string Read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The stopped run wrote steps 5 and 6 after its checkpoint at 4: a resume at 4 removes them.
TEST(RunReportTest, MetricsAreRewoundToTheResumedStep) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(tmp ? tmp : "/tmp") + "/metrics." + std::to_string(getpid()) + ".jsonl";
  std::ofstream(path) << "{\"step\": 3, \"loss\": 3.0}\n{\"step\": 4, \"loss\": 2.5}\n"
                         "{\"step\": 5, \"loss\": 2.4}\n{\"step\": 6, \"loss\": 2.3}\n";
  std::string note;
  {
    auto out = OpenMetrics(path, 4, &note);
    ASSERT_TRUE(out.ok()) << out.status();
    *out << "{\"step\": 5, \"loss\": 2.4}\n";
  }
  EXPECT_EQ(Read(path), "{\"step\": 3, \"loss\": 3.0}\n{\"step\": 4, \"loss\": 2.5}\n{\"step\": 5, \"loss\": 2.4}\n");
  EXPECT_NE(note.find("2 lines after step 4"), std::string::npos) << note;
  note.clear();
  { auto out = OpenMetrics(path, 0, &note); }  // a fresh run appends; nothing removed
  EXPECT_EQ(note, "");
  EXPECT_FALSE(OpenMetrics("/nonexistent/dir/m.jsonl", 0, &note).ok());
  unlink(path.c_str());
}

// The plan goes first into a new file; a resume of the same run does not repeat it, a
// different plan (the same file, other settings) is written before its steps.
TEST(RunReportTest, ThePlanLineIsWrittenOncePerPlan) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(tmp ? tmp : "/tmp") + "/planned." + std::to_string(getpid()) + ".jsonl";
  unlink(path.c_str());
  const std::string plan = "{\"plan\": {\"device\": \"cpu\"}}\n", other = "{\"plan\": {\"device\": \"gpu\"}}\n";
  std::string note;
  {
    auto out = OpenMetrics(path, 0, &note, plan);
    ASSERT_TRUE(out.ok()) << out.status();
    *out << "{\"step\": 1, \"loss\": 2.5}\n{\"step\": 2, \"loss\": 2.4}\n";
  }
  {
    auto out = OpenMetrics(path, 1, &note, plan);  // resumed at step 1: step 2 goes, the plan stays once
    ASSERT_TRUE(out.ok()) << out.status();
    *out << "{\"step\": 2, \"loss\": 2.4}\n";
  }
  EXPECT_EQ(Read(path), plan + "{\"step\": 1, \"loss\": 2.5}\n{\"step\": 2, \"loss\": 2.4}\n");
  { auto out = OpenMetrics(path, 0, &note, other); }
  EXPECT_EQ(Read(path), plan + "{\"step\": 1, \"loss\": 2.5}\n{\"step\": 2, \"loss\": 2.4}\n" + other);
  auto curve = ReadLossCurve(path);  // another run's plan lines are not steps
  ASSERT_TRUE(curve.ok()) << curve.status();
  EXPECT_EQ(*curve, (std::vector<double>{2.5, 2.4}));
  unlink(path.c_str());
}

TEST(RunReportTest, ThePlanIsATableAndAJsonLine) {
  RunPlan plan;
  plan.Add("device", "gpu", "--device");
  plan.Add("precision", "fp8 \"delayed\"", "auto: compute capability 9.0");
  EXPECT_EQ(plan.Table(),
            "run plan:\n"
            "  device     gpu            --device\n"
            "  precision  fp8 \"delayed\"  auto: compute capability 9.0\n");
  EXPECT_EQ(plan.JsonLine(), "{\"plan\": {\"device\": \"gpu\", \"precision\": \"fp8 \\\"delayed\\\"\"}}\n");
}

TEST(RunReportTest, ALossCurveIsReadFromAnotherRunsMetrics) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(tmp ? tmp : "/tmp") + "/other." + std::to_string(getpid()) + ".jsonl";
  std::ofstream(path) << "{\"step\": 1, \"loss\": 5.5, \"lr\": 0.1}\n{\"step\": 1, \"validation_loss\": 9.0}\n"
                         "{\"step\": 2, \"loss\": 4.25}\n";
  auto curve = ReadLossCurve(path);
  ASSERT_TRUE(curve.ok()) << curve.status();
  EXPECT_EQ(*curve, (std::vector<double>{5.5, 4.25}));
  std::ofstream(path) << "{\"step\": 1, \"loss\": 5.5}\nnot json\n";
  EXPECT_EQ(ReadLossCurve(path).status().message(),
            "--compare_metrics: '" + path + "' line 2 has no \"loss\": not a tierd-train metrics file");
  EXPECT_EQ(ReadLossCurve("/nonexistent/m.jsonl").status().code(), absl::StatusCode::kNotFound);
  unlink(path.c_str());
}

TEST(RunReportTest, AdviceSaysWhereTheWorkIsSafe) {
  EXPECT_NE(CheckpointAdvice("", "", 0).find("no checkpoint was kept"), std::string::npos);
  EXPECT_NE(CheckpointAdvice("ck", "", 0).find("no checkpoint was written in ck"), std::string::npos);
  const std::string advice = CheckpointAdvice("ck", "ck/ckpt-00000100.bin", 100);
  EXPECT_NE(advice.find("last checkpoint ck/ckpt-00000100.bin (step 100)"), std::string::npos) << advice;
  EXPECT_NE(advice.find("--checkpoint_dir=ck --resume"), std::string::npos) << advice;
}

}  // namespace
}  // namespace tierd::trainer
