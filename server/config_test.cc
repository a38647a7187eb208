#include "server/config.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>

#include "base/units.h"

namespace tierd {
namespace {

TEST(ConfigTest, TheAnnotatedExampleParses) {
  auto options = LoadConfig("tools/tierd.example.yaml");
  ASSERT_TRUE(options.ok()) << options.status();
  EXPECT_EQ(options->store.gpu_bytes, 20 * kGiB);
  EXPECT_EQ(options->store.dram_bytes, 64 * kGiB);
  EXPECT_EQ(options->store.dram_headroom_bytes, 4 * kGiB);
  EXPECT_EQ(options->store.nvme_directory, "/mnt/nvme/tierd");
  EXPECT_EQ(options->store.nvme_bytes, 400 * kGiB);
  EXPECT_EQ(options->nvme_queue_depth, 32);
  ASSERT_EQ(options->pins.size(), 2u);
  EXPECT_EQ(options->pins[0].pattern, "embed\\..*");
  EXPECT_EQ(options->pins[0].tier, Tier::kGpu);
  ASSERT_EQ(options->priorities.size(), 1u);
  EXPECT_EQ(options->priorities[0].pattern, "layers\\.(30|31)\\..*");
  EXPECT_EQ(options->priorities[0].priority, 1);
  EXPECT_EQ(options->runtime_dir, "/run/tierd");
  EXPECT_EQ(options->allowed_uids.count(1000), 1u);
  EXPECT_EQ(options->default_quota.dram_bytes, 32 * kGiB);
  EXPECT_EQ(options->max_sessions, 64u);
  // What tierctl config shows parses back to the same options.
  auto again = ParseConfig(DescribeConfig(*options));
  ASSERT_TRUE(again.ok()) << again.status() << "\n" << DescribeConfig(*options);
  EXPECT_EQ(again->store.nvme_bytes, options->store.nvme_bytes);
  EXPECT_EQ(again->pins.size(), 2u);
  EXPECT_EQ(again->pins[1].pattern, options->pins[1].pattern);
  ASSERT_EQ(again->priorities.size(), 1u);
  EXPECT_EQ(again->priorities[0].pattern, options->priorities[0].pattern);
  EXPECT_EQ(again->priorities[0].priority, 1);
  // The thrash lock: on unless said off, its numbers said back, bounded.
  EXPECT_TRUE(options->thrash.lock);
  auto unsaid = ParseConfig("limits: {sessions: 8}\n");
  ASSERT_TRUE(unsaid.ok()) << unsaid.status();
  EXPECT_TRUE(unsaid->thrash.lock);
  auto unlocked = ParseConfig("thrash: {lock: false}\n");
  ASSERT_TRUE(unlocked.ok()) << unlocked.status();
  EXPECT_FALSE(unlocked->thrash.lock);
  EXPECT_EQ(options->thrash.refetches, 3u);
  auto thrash = ParseConfig("thrash: {lock: true, warmup_acquires: 50, refetches: 2, max_locked_fraction: 0.25}\n");
  ASSERT_TRUE(thrash.ok()) << thrash.status();
  auto thrash_again = ParseConfig(DescribeConfig(*thrash));
  ASSERT_TRUE(thrash_again.ok()) << thrash_again.status();
  EXPECT_TRUE(thrash_again->thrash.lock);
  EXPECT_EQ(thrash_again->thrash.warmup_acquires, 50u);
  EXPECT_EQ(thrash_again->thrash.refetches, 2u);
  EXPECT_EQ(thrash_again->thrash.max_locked_fraction, 0.25);
  for (const char* bad : {"thrash: {refetches: 0}\n", "thrash: {max_locked_fraction: 1.5}\n", "thrash: {lock: maybe}\n",
                          "thrash: {locks: true}\n"}) {
    EXPECT_FALSE(ParseConfig(bad).ok()) << bad;
  }
  // Priorities: whole numbers in range, patterns that are regular expressions.
  EXPECT_TRUE(ParseConfig("priorities: [{pattern: 'a.*', priority: -2}]\n").ok());
  for (const char* bad :
       {"priorities: [{pattern: 'a.*', priority: high}]\n", "priorities: [{pattern: 'a.*', priority: 5000}]\n",
        "priorities: [{pattern: 'a[', priority: 1}]\n", "priorities: [{pattern: 'a.*'}]\n",
        "priorities: {pattern: 'a.*', priority: 1}\n"}) {
    EXPECT_FALSE(ParseConfig(bad).ok()) << bad;
  }
  EXPECT_EQ(again->allowed_uids, options->allowed_uids);
  EXPECT_FALSE(options->planner_time_aware);
  // The planner's time-aware styles, switched on, survive the round trip; a word is refused.
  auto time_aware = ParseConfig("planner: {time_aware: true}\n");
  ASSERT_TRUE(time_aware.ok()) << time_aware.status();
  EXPECT_TRUE(time_aware->planner_time_aware);
  auto described = ParseConfig(DescribeConfig(*time_aware));
  ASSERT_TRUE(described.ok()) << described.status();
  EXPECT_TRUE(described->planner_time_aware);
  EXPECT_FALSE(ParseConfig("planner: {time_aware: sometimes}\n").ok());
  EXPECT_FALSE(options->planner_layout_wait);
  auto layout_wait = ParseConfig("planner: {layout_wait: true}\n");
  ASSERT_TRUE(layout_wait.ok()) << layout_wait.status();
  EXPECT_TRUE(layout_wait->planner_layout_wait);
  auto layout_described = ParseConfig(DescribeConfig(*layout_wait));
  ASSERT_TRUE(layout_described.ok()) << layout_described.status();
  EXPECT_TRUE(layout_described->planner_layout_wait);
  EXPECT_EQ(options->planner_load_lead_ops, -1);
  auto lead = ParseConfig("planner: {load_lead_ops: 2}\n");
  ASSERT_TRUE(lead.ok()) << lead.status();
  EXPECT_EQ(lead->planner_load_lead_ops, 2);
  auto lead_described = ParseConfig(DescribeConfig(*lead));
  ASSERT_TRUE(lead_described.ok()) << lead_described.status();
  EXPECT_EQ(lead_described->planner_load_lead_ops, 2);
  EXPECT_EQ(ParseConfig("planner: {load_lead_ops: -2}\n").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(options->planner_settle_layout);
  auto unsettled = ParseConfig("planner: {settle_layout: false}\n");
  ASSERT_TRUE(unsettled.ok()) << unsettled.status();
  EXPECT_FALSE(unsettled->planner_settle_layout);
  auto unsettled_described = ParseConfig(DescribeConfig(*unsettled));
  ASSERT_TRUE(unsettled_described.ok()) << unsettled_described.status();
  EXPECT_FALSE(unsettled_described->planner_settle_layout);
  EXPECT_FALSE(options->planner_settle_after_replan);
  auto after = ParseConfig("planner: {settle_after_replan: true}\n");
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_TRUE(after->planner_settle_after_replan);
  auto after_described = ParseConfig(DescribeConfig(*after));
  ASSERT_TRUE(after_described.ok()) << after_described.status();
  EXPECT_TRUE(after_described->planner_settle_after_replan);
  EXPECT_EQ(options->planner_replan_drift, 0.25);
  auto kept = ParseConfig("planner: {replan_drift: 1e9}\n");
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_EQ(kept->planner_replan_drift, 1e9);
  auto kept_described = ParseConfig(DescribeConfig(*kept));
  ASSERT_TRUE(kept_described.ok()) << kept_described.status();
  EXPECT_EQ(kept_described->planner_replan_drift, 1e9);
  EXPECT_EQ(options->planner_keep_plan_margin, 0.05);
  auto swap = ParseConfig("planner: {keep_plan_margin: -1}\n");
  ASSERT_TRUE(swap.ok()) << swap.status();
  EXPECT_EQ(ParseConfig(DescribeConfig(*swap))->planner_keep_plan_margin, -1);
  EXPECT_EQ(ParseConfig("planner: {keep_plan_margin: 2}\n").status().code(), absl::StatusCode::kInvalidArgument);
  const auto no_drift = ParseConfig("planner: {replan_drift: 0}\n").status();
  EXPECT_EQ(no_drift.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(no_drift.message().find("replan_drift must be above 0"), absl::string_view::npos) << no_drift;
  EXPECT_EQ(options->gpu_join_bounce_bytes, 0u);
  auto bounce = ParseConfig("tiers: {gpu: {join_bounce: 64MiB}}\n");
  ASSERT_TRUE(bounce.ok()) << bounce.status();
  EXPECT_EQ(bounce->gpu_join_bounce_bytes, 64 * kMiB);
  auto bounce_described = ParseConfig(DescribeConfig(*bounce));
  ASSERT_TRUE(bounce_described.ok()) << bounce_described.status();
  EXPECT_EQ(bounce_described->gpu_join_bounce_bytes, 64 * kMiB);
  const auto too_big = ParseConfig("tiers: {gpu: {join_bounce: 2GiB}}\n").status();
  EXPECT_EQ(too_big.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(too_big.message().find("at most 1.00 GiB"), absl::string_view::npos) << too_big;
  // TCP beyond loopback, allowed in the config, survives the round trip (off unless said).
  EXPECT_FALSE(options->grpc_tcp_public);
  auto wide = ParseConfig("listen: {grpc_tcp: '0.0.0.0:7070', grpc_tcp_public: true}\n");
  ASSERT_TRUE(wide.ok()) << wide.status();
  EXPECT_TRUE(wide->grpc_tcp_public);
  auto wide_again = ParseConfig(DescribeConfig(*wide));
  ASSERT_TRUE(wide_again.ok()) << wide_again.status();
  EXPECT_TRUE(wide_again->grpc_tcp_public);
  EXPECT_EQ(wide_again->grpc_tcp_address, "0.0.0.0:7070");
  // The planning headroom: one tensor (and the GPU 3.5%) unless said, said back by DescribeConfig, bounded.
  EXPECT_EQ(options->planner_headroom.dram_tensors, 1);
  EXPECT_EQ(options->planner_headroom.gpu_tensors, 1);
  EXPECT_EQ(options->planner_headroom.gpu_fraction, 0.035);
  auto headroom =
      ParseConfig("planner: {dram_headroom_tensors: 3, gpu_headroom_tensors: 2, gpu_headroom_fraction: 0.05}\n");
  ASSERT_TRUE(headroom.ok()) << headroom.status();
  EXPECT_EQ(headroom->planner_headroom.dram_tensors, 3);
  auto said_back = ParseConfig(DescribeConfig(*headroom));
  ASSERT_TRUE(said_back.ok()) << said_back.status();
  EXPECT_EQ(said_back->planner_headroom.dram_tensors, 3);
  EXPECT_EQ(said_back->planner_headroom.gpu_tensors, 2);
  EXPECT_EQ(said_back->planner_headroom.gpu_fraction, 0.05);
  EXPECT_EQ(said_back->planner_deadline_seconds, 60);
  EXPECT_FALSE(ParseConfig("planner: {gpu_headroom_fraction: 0.5}\n").ok());
  auto deadline = ParseConfig("planner: {deadline_s: 2.5}\n");
  ASSERT_TRUE(deadline.ok()) << deadline.status();
  EXPECT_EQ(deadline->planner_deadline_seconds, 2.5);
  auto no_time = ParseConfig("planner: {deadline_s: 0}\n");
  ASSERT_FALSE(no_time.ok());
  EXPECT_NE(no_time.status().message().find("planner.deadline_s must be above 0"), std::string::npos)
      << no_time.status();
  auto too_many = ParseConfig("planner: {dram_headroom_tensors: 17}\n");
  ASSERT_FALSE(too_many.ok());
  EXPECT_NE(too_many.status().message().find("planner.dram_headroom_tensors must be 0 to 16"), std::string::npos)
      << too_many.status();
}

TEST(ConfigTest, MistakesNameTheKeyAndLine) {
  auto typo = ParseConfig("tiers:\n  dram:\n    byts: 4GiB\n");
  ASSERT_EQ(typo.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(typo.status().message().find("line 3: unknown key 'byts' in tiers.dram"), absl::string_view::npos)
      << typo.status().message();
  auto size = ParseConfig("tiers:\n  gpu:\n    bytes: lots\n");
  EXPECT_NE(size.status().message().find("line 3: bytes: 'lots' is not a byte size"), absl::string_view::npos)
      << size.status().message();
  auto tier = ParseConfig("pins:\n  - {pattern: x, tier: moon}\n");
  EXPECT_NE(tier.status().message().find("gpu, dram or nvme"), absl::string_view::npos);
  // A value of the wrong type names the key, the type wanted and the line (yaml-cpp alone
  // said "bad conversion" at a line and column).
  auto depth = ParseConfig("tiers:\n  nvme:\n    queue_depth: deep\n");
  ASSERT_EQ(depth.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(depth.status().message(), "config line 3: tiers.nvme.queue_depth must be a whole number, not 'deep'");
  auto sessions = ParseConfig("limits:\n  sessions: -2\n");
  EXPECT_EQ(sessions.status().message(), "config line 2: limits.sessions must be a whole number >= 0, not '-2'");
  auto flag = ParseConfig("planner: {time_aware: sometimes}\n");
  EXPECT_EQ(flag.status().message(), "config line 1: planner.time_aware must be true or false, not 'sometimes'");
  auto uids = ParseConfig("security:\n  allowed_uids: [0, root]\n");
  EXPECT_EQ(uids.status().message(), "config line 2: security.allowed_uids[] must be a whole number >= 0, not 'root'");
  // What is checked after the types: with its line too.
  auto chunk = ParseConfig("tiers:\n  nvme:\n    chunk: 3MiB\n");
  EXPECT_EQ(chunk.status().message(),
            "config line 3: tiers.nvme.chunk must be a power of two from 64.0 KiB to 64.0 MiB, not 3.00 MiB");
  auto depth_big = ParseConfig("tiers:\n  nvme:\n    queue_depth: 100000\n");
  EXPECT_EQ(depth_big.status().message(), "config line 3: tiers.nvme.queue_depth must be 1 to 64, not 100000");
  auto regex = ParseConfig("pins:\n  - {pattern: 'layers.(3', tier: gpu}\n");
  EXPECT_EQ(regex.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(regex.status().message().rfind("config line 2: pins[].pattern 'layers.(3' is not a regular expression", 0),
            0u)
      << regex.status().message();
  auto broken = ParseConfig("tiers: [unclosed\n");
  EXPECT_EQ(broken.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LoadConfig("/nonexistent.yaml").status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(ParseConfig("").ok());
}

}  // namespace
}  // namespace tierd
