#include "trainer_ref/run_report.h"

#include <gtest/gtest.h>
#include <unistd.h>

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
