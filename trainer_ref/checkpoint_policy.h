// --grad_checkpointing=dynamic: which decoder layers keep every activation their backward
// reads and which keep only their input and recompute the rest (activation checkpointing),
// under the GPU's room, saved tensor by saved tensor where that is cheaper. Each layer is one of:
//   keep on the GPU  costs its activations' bytes of GPU memory, no time;
//   keep lean        keeps all but its element-wise outputs (the two norms' and SwiGLU's, the
//                    cheapest tensors to recompute per byte: a few memory-bound kernels for ~a
//                    quarter of the layer's bytes), which the backward recomputes;
//   offload (tierd)  costs them twice over PCIe (out after the forward, back for the backward);
//   recompute        costs its input's bytes and one more forward of the layer (its GEMMs and
//                    attention: the dearest per byte, so they go last).
// The layers kept are the last ones: the backward reaches them first, so their activations
// are the shortest-lived. Where not every layer can keep everything, as many layers as fit keep
// lean (one lean layer's recompute costs a few percent of a full one's), and what room is left
// turns the last of them into full keeps. Keeping displaces nothing: a layer keeps only where the
// rest of the state and every other layer's saved tensors still fit; where the state alone does
// not fit (it streams through tierd), every layer recomputes. Offloading is chosen (every layer keeps,
// tierd moves what does not fit) only where PCIe moves a layer's activations both ways faster
// than the GPU recomputes them; on a box whose GPU outruns its link many times it never is
// (an H200 on PCIe Gen5, 1.3B, 4 micro-batches of 2 x 2048 tokens: 39 ms to move a layer's
// activations out and back against 6 ms to recompute them, at the trainer's estimates).
#ifndef TIERD_TRAINER_REF_CHECKPOINT_POLICY_H_
#define TIERD_TRAINER_REF_CHECKPOINT_POLICY_H_

#include <string>

namespace tierd::trainer {

struct CheckpointInputs {
  int layers = 0;
  double kept_layer_bytes = 0;       // a layer's saved activations when it keeps them all (every micro-batch's)
  double lean_layer_bytes = 0;       // when it keeps lean (0: no lean keep)
  double lean_layer_seconds = 0;     // a lean layer's element-wise recompute over a step's micro-batches
  double recompute_layer_bytes = 0;  // its input alone
  double other_bytes = 0;            // the rest of the state the GPU is to hold (weights, master, gradients...)
  double gpu_bytes = 0;              // the room for all of it (tierd's GPU quota, or the device's free memory)
  // One layer's recompute over a step's micro-batches: its forward up to the down projection.
  double layer_recompute_seconds = 0;
  double step_seconds = 0;           // the step's compute without any recompute
  double pcie_bytes_per_s = 0;       // each way, for the offload alternative
  bool tierd = false;                // without it nothing can be offloaded: what does not fit fails
};

struct CheckpointChoice {
  int kept_layers = 0;  // the last kept_layers layers keep their activations
  int lean_layers = 0;  // the lean_layers before them keep lean; the others recompute
  std::string why;      // one line: the choice, its bytes and the predicted step of each alternative
};

CheckpointChoice ChooseCheckpointing(const CheckpointInputs& in);

}  // namespace tierd::trainer

#endif  // TIERD_TRAINER_REF_CHECKPOINT_POLICY_H_
