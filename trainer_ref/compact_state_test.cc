#include "trainer_ref/compact_state.h"

#include <gtest/gtest.h>

namespace tierd::trainer {
namespace {

constexpr double kGiB = 1024.0 * 1024 * 1024;

// 13B in 24 GiB, layer-major 4 x 2 with 8-bit moments (H200 box): 158 GiB of full state
// against 19 GiB of GPU quota and 100 of DRAM; compact, 110 GiB.
CompactStateInputs ThirteenB() {
  CompactStateInputs in;
  in.tierd = true;
  in.one_backward_per_group = true;
  in.full_bytes = 158 * kGiB;
  in.compact_bytes = 110 * kGiB;
  in.gpu_bytes = 19 * kGiB;
  in.dram_bytes = 100 * kGiB;
  return in;
}

TEST(CompactStateTest, AutoKeepsItCompactWhenTheFullStateWouldSpillToNvme) {
  auto choice = ChooseCompactState(ThirteenB());
  ASSERT_TRUE(choice.ok()) << choice.status();
  EXPECT_TRUE(choice->compact);
  EXPECT_NE(choice->why.find("110.0 GiB instead of 158.0 GiB"), std::string::npos) << choice->why;
  EXPECT_NE(choice->why.find("more than the GPU and DRAM quotas (119.0 GiB), so 39.0 GiB of it goes through NVMe"),
            std::string::npos)
      << choice->why;
}

TEST(CompactStateTest, AutoKeepsTheFullStateWhenItFitsOrWithoutTierd) {
  CompactStateInputs fits = ThirteenB();
  fits.dram_bytes = 140 * kGiB;
  auto choice = ChooseCompactState(fits);
  ASSERT_TRUE(choice.ok());
  EXPECT_FALSE(choice->compact);
  EXPECT_EQ(choice->why, "");
  CompactStateInputs plain = ThirteenB();
  plain.tierd = false;
  EXPECT_FALSE(ChooseCompactState(plain)->compact);
  CompactStateInputs off = ThirteenB();
  off.flag = "off";
  EXPECT_FALSE(ChooseCompactState(off)->compact);
}

TEST(CompactStateTest, AutoSaysWhatTheCompactStateWouldNeedWhereTheStepCannotKeepIt) {
  CompactStateInputs micro = ThirteenB();
  micro.one_backward_per_group = false;
  auto choice = ChooseCompactState(micro);
  ASSERT_TRUE(choice.ok());
  EXPECT_FALSE(choice->compact);
  EXPECT_NE(choice->why.find("--step_order=layer"), std::string::npos) << choice->why;
  CompactStateInputs host = ThirteenB();
  host.optimizer_on_cpu = true;
  choice = ChooseCompactState(host);
  ASSERT_TRUE(choice.ok());
  EXPECT_FALSE(choice->compact);
  EXPECT_NE(choice->why.find("--optimizer_place=gpu"), std::string::npos) << choice->why;
}

TEST(CompactStateTest, OnIsRefusedWhereTheStepCannotKeepItAndUnknownValuesAreRefused) {
  CompactStateInputs on = ThirteenB();
  on.flag = "on";
  on.tierd = false;
  on.full_bytes = 1 * kGiB;  // on: whatever the sizes
  auto choice = ChooseCompactState(on);
  ASSERT_TRUE(choice.ok());
  EXPECT_TRUE(choice->compact);
  on.one_backward_per_group = false;
  EXPECT_EQ(ChooseCompactState(on).status().code(), absl::StatusCode::kInvalidArgument);
  on.one_backward_per_group = true;
  on.optimizer_on_cpu = true;
  const absl::Status refused = ChooseCompactState(on).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.message().find("the host's step writes the bf16 weight copy"), std::string::npos) << refused;
  CompactStateInputs odd = ThirteenB();
  odd.flag = "yes";
  EXPECT_EQ(ChooseCompactState(odd).status().message(), "--compact_state is auto, on or off, not 'yes'");
}

}  // namespace
}  // namespace tierd::trainer
