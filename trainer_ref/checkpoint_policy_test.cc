#include "trainer_ref/checkpoint_policy.h"

#include <gtest/gtest.h>

namespace tierd::trainer {
namespace {

constexpr double kGiB = 1024.0 * 1024 * 1024;

// A 1.3B-like step: 24 layers, 1.25 GiB of activations a layer kept, 0.125 GiB of input a
// layer recomputing, 15 GiB of other state, 21 GiB of room; a layer's forward 2.5 ms, the step
// 0.36 s; PCIe 55 GB/s.
CheckpointInputs Step() {
  CheckpointInputs in;
  in.layers = 24;
  in.kept_layer_bytes = 1.25 * kGiB;
  in.recompute_layer_bytes = 0.125 * kGiB;
  in.other_bytes = 15 * kGiB;
  in.gpu_bytes = 21 * kGiB;
  in.layer_forward_seconds = 0.0025;
  in.step_seconds = 0.36;
  in.pcie_bytes_per_s = 55e9;
  in.tierd = true;
  return in;
}

TEST(CheckpointPolicyTest, TheLastLayersKeepWhatFitsBesideTheState) {
  // 21 - 15 - 24 x 0.125 = 3 GiB of room, 1.125 GiB more a layer kept: 2 layers.
  const CheckpointChoice choice = ChooseCheckpointing(Step());
  EXPECT_EQ(choice.kept_layers, 2);
  EXPECT_NE(choice.why.find("layers 22-23 keep their activations (2.50 GiB), layers 0-21 recompute theirs"),
            std::string::npos)
      << choice.why;
  EXPECT_NE(choice.why.find("3.00 GiB of room beside the state and every layer's input, 1.12 GiB more a layer kept"),
            std::string::npos)
      << choice.why;
  // dynamic: 0.36 + 22 x 2.5 ms; full: 0.36 + 24 x 2.5 ms; none: 30 GiB offloaded... (over by 24 GiB).
  EXPECT_NE(choice.why.find("Predicted step: dynamic 0.415 s, full checkpointing 0.420 s, none "), std::string::npos)
      << choice.why;
  // Moving 1.125 GiB out and back at 55 GB/s: 43.9 ms against 2.5 ms of recompute.
  EXPECT_NE(choice.why.find("a layer recomputes in 2.5 ms a step; moving its activations (1.12 GiB) out and back over "
                            "PCIe would take 43.9 ms"),
            std::string::npos)
      << choice.why;
}

TEST(CheckpointPolicyTest, EveryLayerKeepsWhenAllFitsAndNoneWhenTheStateAloneDoesNot) {
  CheckpointInputs roomy = Step();
  roomy.gpu_bytes = 60 * kGiB;
  CheckpointChoice choice = ChooseCheckpointing(roomy);
  EXPECT_EQ(choice.kept_layers, 24);
  EXPECT_NE(choice.why.find("every layer keeps its activations (30.00 GiB)"), std::string::npos) << choice.why;
  EXPECT_NE(choice.why.find("none 0.360 s"), std::string::npos) << choice.why;

  CheckpointInputs streaming = Step();
  streaming.other_bytes = 40 * kGiB;  // the state streams through tierd already
  choice = ChooseCheckpointing(streaming);
  EXPECT_EQ(choice.kept_layers, 0);
  EXPECT_NE(choice.why.find("every layer recomputes its activations from its input: the state with every layer "
                            "recomputing (43.00 GiB) is more than the room (21.00 GiB)"),
            std::string::npos)
      << choice.why;
  EXPECT_NE(choice.why.find("dynamic 0.420 s, full checkpointing 0.420 s"), std::string::npos) << choice.why;

  CheckpointInputs one_short = Step();
  one_short.gpu_bytes = 20.25 * kGiB - 1;  // just under 2 layers' worth of room (2 x 1.125 GiB)
  EXPECT_EQ(ChooseCheckpointing(one_short).kept_layers, 1);
}

TEST(CheckpointPolicyTest, OffloadingIsChosenOnlyWhereTheLinkBeatsTheRecomputeAndTierdCanMoveIt) {
  CheckpointInputs slow_gpu = Step();
  slow_gpu.layer_forward_seconds = 0.1;  // 100 ms a layer: moving 1.125 GiB both ways (43.9 ms) is cheaper
  CheckpointChoice choice = ChooseCheckpointing(slow_gpu);
  EXPECT_EQ(choice.kept_layers, 24);
  EXPECT_NE(choice.why.find("offloading beats recomputing"), std::string::npos) << choice.why;

  CheckpointInputs plain = slow_gpu;
  plain.tierd = false;  // plain GPU buffers: nothing would move them
  choice = ChooseCheckpointing(plain);
  EXPECT_EQ(choice.kept_layers, 2);
  EXPECT_NE(choice.why.find("none does not fit (24.00 GiB over)"), std::string::npos) << choice.why;
}

}  // namespace
}  // namespace tierd::trainer
