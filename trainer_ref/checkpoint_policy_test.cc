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
  in.layer_recompute_seconds = 0.0025;
  in.step_seconds = 0.36;
  in.pcie_bytes_per_s = 55e9;
  in.tierd = true;
  return in;
}

TEST(CheckpointPolicyTest, TheLastLayersKeepWhatFitsBesideTheState) {
  // 21 - 15 - 24 x 0.125 = 3 GiB of room, 1.125 GiB more a layer kept: 2 layers.
  const CheckpointChoice choice = ChooseCheckpointing(Step());
  EXPECT_EQ(choice.kept_layers, 2);
  EXPECT_NE(choice.why.find("layers 22-23 keep their activations (2.50 GiB), layers 0-21 recompute their activations"),
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

// A lean keep (all but the element-wise outputs: 0.925 of the layer's 1.25 GiB, 0.8 GiB more
// than its input) fits more layers than a full one; the room left turns the last into full keeps.
TEST(CheckpointPolicyTest, LayersKeepLeanWhereNotAllFitAndTheRoomLeftKeepsTheLastFully) {
  CheckpointInputs in = Step();
  in.lean_layer_bytes = 0.925 * kGiB;
  in.lean_layer_seconds = 0.0001;
  // 3 GiB of room: 3 lean (2.4 GiB), 0.6 GiB left, 0.325 GiB more to keep one of them fully: 1.
  CheckpointChoice choice = ChooseCheckpointing(in);
  EXPECT_EQ(choice.kept_layers, 1);
  EXPECT_EQ(choice.lean_layers, 2);
  EXPECT_NE(choice.why.find("layer 23 keeps its activations (1.25 GiB), layers 21-22 keep their activations but the "
                            "norms' and SwiGLU's outputs (1.85 GiB; 0.1 ms a layer to recompute those), layers 0-20 "
                            "recompute their activations from their input"),
            std::string::npos)
      << choice.why;
  // 0.36 + 21 x 2.5 ms + 2 x 0.1 ms, against 2 full keeps' 0.415 s.
  EXPECT_NE(choice.why.find("Predicted step: dynamic 0.413 s, full checkpointing 0.420 s"), std::string::npos)
      << choice.why;

  in.gpu_bytes = 38 * kGiB;  // 20 GiB of room: all 24 lean (19.2 GiB), 0.8 GiB left: 2 of them kept fully
  choice = ChooseCheckpointing(in);
  EXPECT_EQ(choice.kept_layers, 2);
  EXPECT_EQ(choice.lean_layers, 22);
  EXPECT_NE(choice.why.find("layers 0-21 keep their activations but"), std::string::npos) << choice.why;
  EXPECT_EQ(choice.why.find("recompute their activations from"), std::string::npos) << choice.why;

  in.gpu_bytes = 60 * kGiB;  // everything fits: nothing lean
  choice = ChooseCheckpointing(in);
  EXPECT_EQ(choice.kept_layers, 24);
  EXPECT_EQ(choice.lean_layers, 0);
}

TEST(CheckpointPolicyTest, OffloadingIsChosenOnlyWhereTheLinkBeatsTheRecomputeAndTierdCanMoveIt) {
  CheckpointInputs slow_gpu = Step();
  slow_gpu.layer_recompute_seconds = 0.1;  // 100 ms a layer: moving 1.125 GiB both ways (43.9 ms) is cheaper
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
