// Synthetic training traces of Llama-style decoders, for the planner's tests, benchmark and
// `tierctl plan --simulate`: the ops of one optimizer step (forward and backward per
// micro-batch, activation checkpointing, then AdamW per tensor group) with the tensors
// each touches and op times from FLOPs at a stated throughput.
//
// Tensors (mixed precision, 16 bytes per parameter): bf16 weights and gradients, fp32
// master weights and Adam moments; per layer a bf16 checkpoint of its input; a ping-pong
// pair of activation-gradient buffers; one workspace for the layer being computed.
#ifndef TIERD_PREFETCHER_SYNTHETIC_H_
#define TIERD_PREFETCHER_SYNTHETIC_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "prefetcher/graph.h"

namespace tierd::prefetcher {

struct TransformerShape {
  std::string name;
  int layers = 0, d_model = 0, d_ff = 0, vocab = 0;
  double Params() const;  // embeddings + layers + head
};
// "tiny", "1.3b", "7b", "13b"; INVALID_ARGUMENT listing them otherwise.
absl::StatusOr<TransformerShape> ShapePreset(const std::string& name);

struct TraceOptions {
  int micro_batch_seqs = 8;
  int seq_len = 2048;
  int grad_accum = 1;             // micro-batches per optimizer step
  double flops_per_s = 400e12;    // sustained bf16 GEMM throughput (H200, measured ~409)
  double hbm_bytes_per_s = 3e12;  // for the optimizer's memory-bound update
  // AdamW on the host's CPU next to the state in DRAM (host ops: the gradients read there,
  // master and moments updated there, the bf16 weights written whole there), at this rate
  // (the lent machine's 16 cores: 2.3 G params/s measured).
  bool optimizer_on_host = false;
  double host_adamw_params_per_s = 2.3e9;
  // Each group's optimizer state (master, m, v) as this many tensors (sub-groups, like
  // DeepSpeed's sub_group_size): the tiers below can then hold part of a layer's state.
  int optimizer_state_chunks = 1;
};

Graph SyntheticTransformer(const TransformerShape& shape, const TraceOptions& options);

}  // namespace tierd::prefetcher

#endif  // TIERD_PREFETCHER_SYNTHETIC_H_
