// How the GPU model keeps its state (StateOptions): checkpointing and what each layer keeps,
// the optimizer's state, FP8 weight codes, the attention's and GEMMs' kernels. The home's
// layout (GpuModel::HomeLayout) follows from it.
#ifndef TIERD_TRAINER_REF_GPU_GPU_STATE_OPTIONS_H_
#define TIERD_TRAINER_REF_GPU_GPU_STATE_OPTIONS_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace tierd::trainer::gpu {

// How the model keeps its state; the home's layout follows from it.
struct StateOptions {
  // Activation checkpointing: a layer saves only its input (fp32) and its backward
  // recomputes the rest into the workspace first.
  bool checkpointing = false;
  // With checkpointing (--checkpoint_precision=bf16): a recomputing layer saves its input
  // rounded to bf16, half the bytes tierd holds and moves for it; its backward recomputes the
  // layer from the rounded input (the forward itself is unchanged: the same losses).
  bool bf16_checkpoints = false;
  // With checkpointing (--grad_checkpointing=dynamic): the last kept_layers layers keep every
  // activation their backward reads all the same (no recompute); the lean_layers before them
  // keep all but their element-wise outputs (the two norms' and SwiGLU's, ~a quarter of a
  // layer's bytes), which their backward recomputes from what they keep (a few element-wise
  // kernels, the same bits); the others keep their input and recompute the whole layer.
  int kept_layers = 0;
  int lean_layers = 0;
  // The decoder layers that start with FP8 matmuls (Fp8Layers: what UseFp8 will be given).
  // Each of them that keeps its activations (not lean, not recomputing) saves h1, h2 and s as
  // their E4M3 codes transposed (GpuModel::Acts::inputs_transposed) in rooms of a byte an
  // element instead of bf16's two (1.3B: 0.94 GB less). Such a layer that runs in bf16 (not
  // given to UseFp8, or fallen back) keeps lean instead: its backward recomputes h1, h2 and s
  // into the workspace, which then holds room for them. Empty: rooms for bf16 values.
  std::vector<bool> fp8_layers;
  // K > 0: the step runs layer-major over K micro-batches (ForwardBackwardLayerMajor); each
  // layer saves what it keeps for each of them (K slots of its activations part) and the
  // workspace holds each micro-batch's residual stream and its gradient.
  int layer_major_micro_batches = 0;
  // The Adam moments as 8-bit blockwise codes (--opt=adamw8bit; adamw8bit.h), each tensor's
  // own at MomentOffset within its group's moment parts.
  bool moments_8bit = false;
  // With moments_8bit: tensors of fewer values keep fp32 moments (bitsandbytes' min_8bit_size,
  // 4096 there; the norms' weights), at their MomentOffset all the same. 0: every tensor 8-bit.
  int64_t moments_8bit_min = 0;
  // 4 bytes a parameter less to keep (--state=compact), for a state that does not fit the
  // GPU and DRAM otherwise. A group's gradients accumulate in fp32 in a workspace of one group
  // and are kept as bf16 (rounded once) when its backward is done; no bf16 weight copy is
  // kept: when a group is used its fp32 master copy is rounded into a workspace of one group
  // (the same bits a kept copy would hold). Costs 2 bytes a parameter more over PCIe in the
  // backward (master instead of bf16 weights). Needs one backward per group a step
  // (layer-major, or one micro-batch) and the optimizer on the GPU.
  bool compact = false;
  // Lion instead of AdamW (optimizer.h's LionStep; --opt=lion): one fp32 moment, so the
  // second moment's part is empty (8 bytes of optimizer state a parameter with the master).
  // AdamWStep then steps Lion, reading beta1, beta2 and weight_decay of its options as Lion's.
  bool lion = false;
  // Adafactor instead (optimizer.h's AdafactorStep with its default decay rate, eps1 and clip
  // threshold; --opt=adafactor): no first moment and a matrix's second moment factored into
  // its row and column means, so the state is a few floats a row and column (the moments' part
  // holds it, the second part is empty; ~4 bytes a parameter of master alone). AdamWStep steps
  // it, reading weight_decay of its options.
  bool adafactor = false;
  // The FP8 layers' weights also as E4M3 codes (--fp8_weight_codes): a part per layer,
  // "layers.3.w8", each matrix at current scaling from its exact largest |x| (fp8_codes.h),
  // that the layer's FP8 matmuls read instead of the bf16 part. The optimizer's step writes
  // it beside the bf16 weights: on the host (the host's groups), so a step's weights cost 1
  // byte a parameter over PCIe instead of 2; on the GPU (its groups), right after the update,
  // so the micro-batches of a step share one conversion instead of making their own, and the
  // bf16 part, which nothing reads until the next update, need not stay on the GPU
  // (WeightsAreScratch). The weights' codes are then current-scaled (the inputs and gradients
  // keep their scaling). A layer that falls back to bf16 reads its bf16 part again (the run
  // registers the step's graph anew). Where the bf16 weights change otherwise (new
  // parameters, a checkpoint loaded) the codes are made again at the layer's next use: on the
  // GPU from the bf16 part, or, where that part is the codes' scratch, on the host from the
  // master copy: the same bits.
  bool fp8_weight_codes = false;
  // With fp8_weight_codes (--fp8_transposed_weight_codes): the codes part also holds each
  // matrix's codes transposed, written with them (a byte a parameter more), which the layer's
  // backward reads for its input gradient instead of transposing the codes itself. Pays where
  // a layer's backward runs more than once between updates (micro-batches one after the
  // other: each made its own transposes).
  bool transposed_weight_codes = false;
  // Not the state's but the model's GEMMs (Gemm's GemmOptions): how many of cuBLASLt's
  // candidates a new shape's first call times, and where the choices are cached.
  int gemm_candidates = 1;
  size_t gemm_workspace_bytes = size_t{32} << 20;  // cuBLASLt's workspace (--gemm_workspace_mib)
  std::string gemm_cache_dir;
  // Attention's kernels: "cudnn" (cuDNN's fused attention, libcudnn.so.9 opened at run time;
  // Create fails without it), "cudnn-fast" (the same with its non-deterministic backward),
  // "ours" (attention_tc.h), "auto" (cuDNN when it opens and takes the shape in the workspace
  // ours would use, else ours; attention_note() says which, why).
  std::string attention = "ours";
  // The head's logits this many rows at a time (0: HeadRows's choice; tests set it smaller to
  // see the chunks at small shapes).
  int head_rows = 0;
  // A layer's forward adds the attention's output into the residual stream, keeps the copy
  // its backward reads and takes the second norm in one kernel (ResidualRmsNormForward), and
  // keeps its input's copy within the first norm's (--fused_norms): the same bits in fewer
  // passes over the fp32 stream (3 of the 6 reads of it in a layer's forward).
  bool fused_norms = true;
  // The GPU optimizer's step takes a group's tensors in one call (GpuOptimizer::StepGpuAll: 8-bit
  // AdamW's one launch) rather than one call a tensor (--optimizer_one_launch): the same bits.
  bool optimizer_one_launch = true;
};

}  // namespace tierd::trainer::gpu

#endif  // TIERD_TRAINER_REF_GPU_GPU_STATE_OPTIONS_H_
