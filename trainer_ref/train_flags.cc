#include "trainer_ref/train_flags.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <set>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "base/units.h"
#include "trainer_ref/hf/hf_checkpoint.h"
#include "trainer_ref/model_config_file.h"
#include "trainer_ref/schedule.h"

ABSL_FLAG(std::string, device, "auto",
          "auto: the GPU when a usable CUDA GPU is there (and the binary was built with CUDA), else the CPU "
          "reference; gpu; cpu");
ABSL_FLAG(bool, print_device, false, "print the device --device picks here (gpu or cpu) and exit");
ABSL_FLAG(std::string, model_size, "tiny", "a preset: tiny | 124m | 350m | 1.3b | 7b | 13b (--model_config wins)");
ABSL_FLAG(std::string, model_config, "",
          "a model config file (JSON, as Hugging Face writes them: hidden_size, num_hidden_layers, "
          "num_attention_heads, intermediate_size, vocab_size, max_position_embeddings; if given rms_norm_eps, "
          "rope_theta, num_key_value_heads, head_dim, tie_word_embeddings, rope_scaling of type linear or llama3; "
          "model_type llama, mistral or qwen2 (q/k/v biases)) instead of a preset");
ABSL_FLAG(int, hidden_size, 0, "override the model's width (d_model); 0: the preset's or file's");
ABSL_FLAG(int, num_hidden_layers, 0, "override the number of layers; 0: keep");
ABSL_FLAG(int, num_attention_heads, 0, "override the number of attention heads; 0: keep");
ABSL_FLAG(int, num_key_value_heads, 0,
          "override the number of key/value heads (grouped-query attention: it divides the heads; 1: multi-query); "
          "0: keep");
ABSL_FLAG(int, head_dim, 0, "override the head size (when not hidden_size / heads); 0: keep");
ABSL_FLAG(int, intermediate_size, 0, "override the MLP's hidden width; 0: keep");
ABSL_FLAG(int, vocab_size, 0, "override the vocabulary size; 0: keep");
ABSL_FLAG(int, max_position_embeddings, 0, "override the longest sequence; 0: keep");
ABSL_FLAG(std::string, init_from, "",
          "fine-tune a Hugging Face checkpoint: a directory with config.json and model.safetensors (or shards and "
          "model.safetensors.index.json) of a Llama, Mistral or Qwen2 model, bf16/fp16/fp32; the shape comes from "
          "its config.json, the weights are read tensor by tensor into the run's tiers, and the default schedule "
          "becomes a fine-tuning one (lr 2e-5, warmup 3%)");
ABSL_FLAG(std::string, export, "",
          "at the end of the run, write the trained weights as a Hugging Face checkpoint into this new (or empty) "
          "directory: sharded safetensors + index, config.json and the --init_from checkpoint's tokenizer files, "
          "loadable by transformers and vLLM as is");
ABSL_FLAG(std::string, export_dtype, "bf16", "the exported weights' dtype: bf16 (rounded from the fp32 master) or fp32");
ABSL_FLAG(std::string, export_shard_size, "5GiB", "the exported checkpoint's shards, at most this big each");
ABSL_FLAG(std::string, checkpoint, "",
          "tierd-train export: the checkpoint to export (a file, or a --checkpoint_dir: its newest that verifies)");
ABSL_FLAG(std::string, to, "", "tierd-train export: the new (or empty) directory the Hugging Face checkpoint goes to");
ABSL_FLAG(std::string, validation_out, "",
          "after the last validation, write its held-out windows and loss to this JSON file (checked against an "
          "export by tools/hf/check_export.py)");
ABSL_FLAG(std::string, data, "embedded",
          "embedded | a directory of .txt | FILE.u16 / FILE.u32 token shards | any file (bytes)");
ABSL_FLAG(int, batch_size, 0, "sequences per micro-batch (0: 4 on the CPU, 8 on a GPU)");
ABSL_FLAG(int, seq_len, 0, "tokens per sequence (0: on the CPU 64, on a GPU the model's longest up to 2048)");
ABSL_FLAG(int, grad_accum_steps, 1, "micro-batches per optimizer step");
ABSL_FLAG(int64_t, steps, 0, "optimizer steps (0: 200 on the CPU, 50 on a GPU)");
ABSL_FLAG(int64_t, warmup, -1,
          "linear warmup steps, then cosine decay to lr / 10 (-1: chosen and said at startup: 3% of the steps with "
          "--init_from; from scratch on a GPU 10 a billion parameters; 20 on the CPU)");
ABSL_FLAG(double, lr, 0,
          "peak learning rate (0: chosen and said at startup: 2e-5 with --init_from; from scratch on a GPU "
          "GPT-3's rate for the model's size, 6e-4 at 125M to 1e-4 at 13B; 3e-3 on the CPU; a third of that with "
          "--opt=lion)");
ABSL_FLAG(double, clip, 1.0, "global gradient-norm clip (0: off)");
ABSL_FLAG(double, loss_spike_sds, 4.0,
          "flag a step whose loss is more than this many noise deviations above the mean of the last 10 steps' "
          "(the noise: the standard deviation of the last 100 steps' step-to-step changes over sqrt 2, so a "
          "falling loss does not hide a spike; once 20 steps are there) on its progress line and in --metrics, "
          "and count them in the last line (0: off)");
ABSL_FLAG(double, weight_decay, 0.1, "AdamW's decoupled weight decay");
ABSL_FLAG(uint64_t, seed, 1, "seed of the initial weights and the data order");
ABSL_FLAG(uint64_t, data_seed, 0,
          "seed of the data order alone (0: --seed's): two runs that differ only in it measure how far noise "
          "alone moves a loss");
ABSL_FLAG(std::string, precision, "auto",
          "auto: fp32 on the CPU; on a GPU three levels by tensor class: FP8 for the decoder layers' matmuls where "
          "the GPU has FP8 tensor cores (compute capability 8.9+) and the shapes are multiples of 16, bf16 for "
          "weights, activations and the other matmuls, fp32 for master weights, gradients, optimizer state, norms' "
          "statistics, softmax, loss and every accumulation; one line at start says which and why. bf16: the same "
          "without FP8. fp8: FP8 or refuse (E4M3 weights and activations, E5M2 gradients, each tensor of each "
          "layer at its own scale: see --fp8_scaling; layers kept out by --bf16_layers). fp32: the CPU's");
ABSL_FLAG(std::string, fp8_scaling, "delayed",
          "with FP8 matmuls (--precision=fp8, or auto on an FP8 GPU), how each tensor's scale is chosen. delayed "
          "(Transformer Engine's recipe): from "
          "the tensor's largest |x| over the last --fp8_window steps, so a conversion reads the tensor once; "
          "current: from its largest |x| now, read first (exact for this tensor, one more read of it); fixed (for "
          "debugging): every weight and input at --fp8_fixed_scale and every output gradient at "
          "--fp8_fixed_grad_scale for the whole run (code = value x scale), their saturation and underflow "
          "reported as under delayed scaling");
ABSL_FLAG(double, fp8_fixed_scale, 1.0,
          "with --fp8_scaling=fixed: the scale of the E4M3 tensors (weights and inputs; 448 / scale is the largest "
          "value kept)");
ABSL_FLAG(double, fp8_fixed_grad_scale, 1.0,
          "with --fp8_scaling=fixed: the scale of the E5M2 tensors (the linear maps' output gradients; 57344 / scale "
          "is the largest value kept)");
ABSL_FLAG(int32_t, fp8_window, 16, "with --fp8_scaling=delayed: the steps of amax history a scale is taken from");
ABSL_FLAG(int32_t, fp8_margin, 0,
          "with --fp8_scaling=delayed: scales are 2^-margin of what the history allows (headroom for growth)");
ABSL_FLAG(int32_t, fp8_fallback_after, 4,
          "with FP8 matmuls: a layer one of whose tensors overflows (a non-finite largest value) this many "
          "steps, or under delayed scaling saturates or underflows the format this many steps in a row, runs in "
          "bf16 from then on, and the progress line says so (0: never)");
ABSL_FLAG(std::string, bf16_layers, "",
          "with --precision=fp8 or auto: the decoder layers to keep in bf16, a regex fully matching their names "
          "(layers.0 ... layers.<L-1>), e.g. 'layers\\.(0|23)' for the first and last of 24");
ABSL_FLAG(std::string, opt, "adamw",
          "the optimizer: adamw (decoupled weight decay, fp32 moments) or adamw8bit (the same with 8-bit blockwise "
          "moments: ~6 bytes of optimizer state a parameter instead of 12, on the GPU or the host), or lion (one fp32 "
          "moment, 8 bytes of state a parameter with the master, on the CPU, the GPU or its host; every element moved "
          "by the sign of a mix of moment and gradient, so its --lr defaults to a third of AdamW's and it likes a "
          "larger --weight_decay; suits --sparse_grad_ratio, whose gradients arrive in bursts), or adafactor (both "
          "trainers, not with --zero=2: no first moment and each matrix's second moment factored into row and column "
          "means, ~4 bytes "
          "of state a parameter; external learning rate as AdamW's, update clipped to RMS 1). Names as written "
          "elsewhere (AdamW, Lion, Adafactor) are taken too");
ABSL_FLAG(int64_t, adamw8bit_min_size, 0,
          "GPU, --opt=adamw8bit: tensors of fewer values keep fp32 moments (bitsandbytes' min_8bit_size is 4096: "
          "the norms' weights); 0: every tensor 8-bit (with blocks of 256 the 1.3B fidelity run found no gain from "
          "4096: docs/runs/BENCHMARKS-history-2026-12-02-to-12-04.md). Checkpoints record it");
ABSL_FLAG(std::string, grad_checkpointing, "none",
          "none | full: keep only each layer's input from forward and recompute the rest in backward (about a "
          "third more compute; saved activations shrink ~10x) | dynamic (GPU): layer by layer and tensor by tensor, "
          "keep the activations where they fit beside the state under the GPU budget (or the device's free "
          "memory), then layers that keep all but their norms' and SwiGLU's outputs (recomputed by a few "
          "element-wise kernels, ~a quarter of a layer's bytes), recompute the rest, offload them through tierd "
          "where PCIe beats the recompute; one line says what it chose and the predicted step of each way. A bare "
          "--grad_checkpointing means full");
ABSL_FLAG(std::string, checkpoint_precision, "fp32",
          "GPU, with --grad_checkpointing: fp32 | bf16: a layer that recomputes keeps its input rounded to bf16, "
          "half the bytes (what tierd holds and moves for the step's checkpoints: at 13B, 4 x 2048 tokens, 40 "
          "layers, 3.1 GiB a micro-batch instead of 6.3); its backward recomputes the layer from the rounded input "
          "(the forward and its losses are unchanged; the gradients differ by that rounding)");
ABSL_FLAG(std::string, offload_policy, "none",
          "none: plain buffers (the baseline); tierd (or tiered): every parameter, gradient, optimizer moment and "
          "saved activation leased from the tierd at --tierd_dir by name, acquired only while an op uses it");
ABSL_FLAG(std::string, tierd_dir, "/tmp/tierd", "tierd's runtime directory (--offload_policy=tierd)");
ABSL_FLAG(std::string, tierd_dram, "",
          "the session's DRAM quota (\"\": 64MiB on the CPU; on a GPU what the state needs beyond the GPU quota, "
          "+25% and 1 GiB, at most 64GiB). tierd reserves and pins all of it when the session opens (~4 GB/s)");
ABSL_FLAG(std::string, tierd_nvme, "", "the session's NVMe quota (\"\": 1GiB on the CPU, 64GiB on a GPU)");
ABSL_FLAG(bool, tierd_plan, true,
          "register the step's ops with tierd so its planner moves tensors ahead of them (--offload_policy=tierd); "
          "off: they move when acquired");
ABSL_FLAG(bool, tierd_record, false,
          "CPU: instead of registering the step's ops, mark each step's start: tierd records the first step's "
          "acquires and releases and plans from the second on");
ABSL_FLAG(std::string, checkpoint_dir, "",
          "where checkpoints go (crash-safe: written aside, synced, renamed); empty: none");
ABSL_FLAG(int64_t, checkpoint_every, 50, "steps between checkpoints (and one at the end)");
ABSL_FLAG(int, checkpoint_keep, 2, "checkpoints kept in --checkpoint_dir (older ones are removed)");
ABSL_FLAG(bool, resume, false,
          "continue from the newest checkpoint in --checkpoint_dir that verifies, bit for bit as if never stopped");
ABSL_FLAG(std::string, metrics, "", "a JSONL file: one line per step (loss, lr, grad norm, time, tokens)");
ABSL_FLAG(std::string, plot, "",
          "a PNG at the end: loss per step (and validation loss, and tier traffic per step on the CPU)");
ABSL_FLAG(std::string, compare_metrics, "",
          "CPU: another run's --metrics file (e.g. the dense run a --sparse_grad_ratio run is held against): its "
          "loss is drawn in grey on --plot and the final losses compared at the end");
ABSL_FLAG(int64_t, eval_every, 50,
          "steps between validation losses, the mean of 8 held-out batches (0: only at the end; -1: none)");
ABSL_FLAG(int, zero, 0,
          "data-parallel runs (started by mpirun or srun): 0, every rank keeps the whole optimizer state and "
          "gradients are all-reduced; 2 (ZeRO-2), gradients are reduce-scattered, each rank keeps and steps the "
          "moments of its 1/N slice of every tensor, and the parameters are all-gathered after; 3 (ZeRO-3), the "
          "same, but a rank keeps only its slice of the parameters too and all-gathers each tensor when the "
          "forward or backward reaches it (1.5x ZeRO-2's bytes on the wire a step, 1/N of the parameters' memory)");
ABSL_FLAG(double, sparse_grad_ratio, 0,
          "data-parallel: the fraction of each gradient tensor's elements sent a step (TopK by magnitude, as "
          "index + bf16 value); the rest accumulates in a residual per tensor (a tierd tensor with "
          "--offload_policy=tierd) and goes out when it has grown. 0 or 1: dense. How far from dense it trains, "
          "and why: docs/BENCHMARKS.md (data-parallel on the CPU)");
ABSL_FLAG(std::string, sparse_grad_ratio_by, "",
          "per-tensor fractions, 'REGEX=R,REGEX=R': the first regex that matches a tensor's whole name wins, e.g. "
          "'tok_emb=1,.*norm.*=1' keeps the embedding and norms dense");
ABSL_FLAG(std::string, sparse_sync, "gradient",
          "data-parallel, --sparse_grad_ratio: what the TopK and the residual are over. gradient: the gradient; "
          "every rank then steps the same optimizer on the sparse mean. update: each rank steps its own moments on "
          "its own gradient and the ranks exchange the TopK of the change (with AdamW a sparse gradient's bursts "
          "inflate the second moment, so an element sent every k-th step moves ~1/sqrt(k) as far; the update "
          "avoids that). momentum (AdamW, with --sparse_warmup=N): dense AdamW for N steps, then the second moment "
          "is frozen and each rank adds its own momentum to the residual and sends its TopK, applied over the "
          "frozen second moment (1-bit Adam's scheme, with TopK; Deep Gradient Compression's momentum correction)");
ABSL_FLAG(int, sparse_warmup, 0,
          "data-parallel, --sparse_grad_ratio: steps over which the fraction sent falls geometrically from 1 "
          "(dense) to the ratio (Deep Gradient Compression's warm-up); with --sparse_sync=momentum, the dense "
          "steps before the second moment is frozen");
ABSL_FLAG(int, sync_every, 1,
          "data-parallel, dense: K > 1 lets each rank step on its own gradients and averages the ranks' parameters "
          "every K steps (local steps, 1/K of the traffic)");
ABSL_FLAG(double, comm_timeout, 120,
          "data-parallel: seconds a collective may wait for the other ranks before the run fails saying so "
          "(a rank that died or hangs)");
ABSL_FLAG(std::string, gpu_budget, "24GiB",
          "GPU, --offload_policy=tierd: the GPU memory this run may use, all of it: the trainer's workspace (one "
          "layer's scratch, the logits) and tierd's GPU quota for the session (the rest)");
ABSL_FLAG(std::string, optimizer_place, "auto",
          "GPU: where AdamW runs: gpu (the state streams to the GPU and back), cpu (with tierd: on the host's "
          "threads, in tierd's DRAM tier where the master weights and moments stay, overlapping the next forward), "
          "split (with tierd: the last layers whose state the GPU quota cannot hold on the host, as cpu, and the "
          "rest on the GPU, each layer just before its next forward), or auto (with tierd, a cost model from the "
          "sizes, quotas, --pcie_gbps, --nvme_gbps, --gpu_tflops and "
          "the host's AdamW rate measured at start picks one and says why; without tierd, gpu)");
ABSL_FLAG(bool, fp8_weight_codes, false,
          "GPU, with tierd and FP8 layers: the optimizer's step also writes each FP8 layer's weights as E4M3 codes "
          "(each matrix at current scaling from its exact largest |x|), which the layer's matmuls read instead of "
          "the bf16 weights (still written: a layer that falls back to bf16 reads them). Stepped on the host "
          "(--optimizer_place=cpu or split), the GPU fetches 1 byte a parameter instead of 2, for a link that "
          "bounds the step; it costs the host ~0.2 s per billion parameters a step (H200 box, 16 cores). Stepped "
          "on the GPU, the micro-batches of a step share one conversion instead of making their own, and the bf16 "
          "weights need not stay on the GPU between updates (codes take half their room); at 1.3B in 24 GiB it has "
          "not yet beaten running without it (less GEMM time, more waiting in tierd's acquire). Off by default");
ABSL_FLAG(double, pcie_gbps, 55, "GPU: the host<->GPU link each way in GB/s, for --optimizer_place=auto");
ABSL_FLAG(double, nvme_gbps, 2, "GPU: NVMe GB/s, reads and writes sharing it, for --optimizer_place=auto");
ABSL_FLAG(double, gpu_tflops, 300, "GPU: sustained bf16 TFLOP/s, for --optimizer_place=auto");
ABSL_FLAG(bool, optimizer_deferred, true,
          "GPU, --offload_policy=tierd, AdamW on the GPU: each layer's update runs just before the layer's next "
          "forward (its master weights and moments stream in while the layers before it compute) instead of all "
          "layers at the end of the step; the same arithmetic and bits");
ABSL_FLAG(std::string, attention, "auto",
          "GPU: attention's kernels. cudnn: cuDNN 9's fused attention (libcudnn.so.9 on the library path, opened at "
          "run time; its Hopper kernels, 2-3x ours on an H200), its deterministic backward; ours: our "
          "FlashAttention-2-style kernels; auto: cuDNN's when it opens and takes the shape, else ours (the log says "
          "which and why); cudnn-fast: cuDNN's with its non-deterministic backward (atomic adds into dQ: faster, "
          "but two runs, or a run and its --resume, no longer give the same bits)");
ABSL_FLAG(bool, fused_norms, false,
          "GPU: each layer's forward adds the attention's output into the fp32 residual stream, keeps the copy its "
          "backward reads and takes the second norm in one kernel, and copies its input within the first norm's: "
          "the same bits as the separate kernels, with 3 of the 6 reads of the stream in a layer's forward "
          "makes gone (off until measured on the GPU)");
ABSL_FLAG(int, gemm_candidates, 1,
          "GPU: time this many of cuBLASLt's candidate algorithms at each GEMM shape's first call (3 runs each, into "
          "a scratch output the size of the GEMM's) and keep the fastest; 1: cuBLASLt's heuristic first choice, "
          "untimed. Choices are cached in --gemm_cache_dir, so a resumed run takes the same ones (the same bits)");
ABSL_FLAG(std::string, gemm_cache_dir, "",
          "GPU: where --gemm_candidates' choices are kept, a file per GPU model and cuBLASLt version (default: "
          "$XDG_CACHE_HOME/tierd, else ~/.cache/tierd; the file is made when first searched)");
ABSL_FLAG(int, optimizer_chunks, 1,
          "GPU, --offload_policy=tierd: lease each layer's master weights and moments as this many sub-groups "
          "(DeepSpeed's sub-groups); 1: one lease per layer and part");
ABSL_FLAG(std::string, compact_state, "auto",
          "GPU: keep 4 bytes a parameter less. on: each layer's gradients accumulate in fp32 on the GPU and are kept "
          "as bf16 (rounded once) when its backward is done, and no bf16 weight copy is kept (the GPU rounds the "
          "fp32 master copy when a layer is used; 2 bytes a parameter more over PCIe in the backward). Needs the "
          "optimizer on the GPU and one backward per layer a step (--step_order=layer, or one micro-batch). off: "
          "fp32 gradients and a bf16 weight copy. auto: on under tierd when the full state does not fit the GPU "
          "and DRAM quotas (so it would spill to NVMe) and the step allows it; says why");
ABSL_FLAG(std::string, step_order, "auto",
          "GPU: the order of a step's micro-batches. micro: one micro-batch's whole forward and backward after the "
          "other; auto: layer under tierd when the larger state of layer-major (an input per micro-batch per layer) "
          "fits the GPU quota and DRAM (in the compact state if only that fits: --compact_state), else micro, and says "
          "why; layer: layer-major, each layer's forward (then "
          "backward) for every micro-batch before the next layer's, so its weights come to the GPU twice a step "
          "and its gradients leave once, whatever --grad_accum_steps is (each layer keeps an input per "
          "micro-batch). The same losses either way, bit for "
          "bit. On the H200 at 7B in 24 GiB with --opt=adamw8bit, layer ran 0.89-0.90x of PyTorch with the whole GPU; "
          "with fp32 moments its state and kept inputs overflow DRAM onto NVMe and micro is faster "
          "(docs/BENCHMARKS.md)");
ABSL_FLAG(bool, profile, false, "GPU: time every kernel and GEMM with CUDA events and say where each step's time goes");
ABSL_FLAG(int64_t, timing_skip, 2, "GPU: steps left out of the tokens/s summary (warm-up)");

namespace tierd::trainer {
namespace {

// The flags named on the command line (this absl keeps IsSpecifiedOnCommandLine private).
std::set<std::string>& GivenFlags() {
  static std::set<std::string> given;
  return given;
}

bool Given(const char* name) { return GivenFlags().count(name) > 0; }

absl::Status Bad(const std::string& what) { return absl::InvalidArgumentError(what); }

absl::Status ReadPrecisionAndOptimizer(bool gpu) {
  const std::string precision = absl::AsciiStrToLower(absl::GetFlag(FLAGS_precision));
  if (precision == "fp8" && !gpu) {
    return Bad("--precision=fp8 is the GPU trainer's (FP8 tensor cores); the CPU reference is fp32");
  }
  if (precision != "auto" && precision != "fp32" && precision != "bf16" && precision != "fp8") {
    return Bad("--precision is auto, fp32 (CPU), bf16 or fp8 (GPU), not '" + precision + "'");
  }
  if (precision == "fp32" && gpu) {
    return Bad(
        "--precision=fp32: the GPU trainer computes bf16 with fp32 master weights, gradients and "
        "accumulation (--precision=auto); fp32 throughout is the CPU's (--device=cpu)");
  }
  if (precision == "bf16" && !gpu) return Bad("--precision=bf16 is the GPU trainer's; the CPU reference is fp32");
  const std::string opt = absl::AsciiStrToLower(absl::GetFlag(FLAGS_opt));
  if (opt != "adamw" && opt != "adamw8bit" && opt != "adamw_8bit" && opt != "lion" && opt != "adafactor") {
    return Bad("--opt is adamw, adamw8bit, lion or adafactor, not '" + absl::GetFlag(FLAGS_opt) + "'");
  }
  return absl::OkStatus();
}

absl::Status ReadCheckpointing(RunSettings& s) {
  const std::string value = absl::AsciiStrToLower(absl::GetFlag(FLAGS_grad_checkpointing));
  if (value == "none" || value == "false" || value == "0" || value == "no") return absl::OkStatus();
  s.checkpointing = true;
  if (value == "full" || value == "true" || value == "1" || value == "yes") return absl::OkStatus();
  if (value == "dynamic") {
    if (!s.gpu) {
      return Bad(
          "--grad_checkpointing=dynamic chooses under a GPU's memory (--device=gpu); the CPU trainer takes "
          "none or full");
    }
    s.dynamic_checkpointing = true;
    return absl::OkStatus();
  }
  return Bad("--grad_checkpointing is none, full or dynamic, not '" + value + "'");
}

absl::Status ReadCheckpointPrecision(RunSettings& s) {
  const std::string value = absl::AsciiStrToLower(absl::GetFlag(FLAGS_checkpoint_precision));
  if (value != "fp32" && value != "bf16") return Bad("--checkpoint_precision is fp32 or bf16, not '" + value + "'");
  s.bf16_checkpoints = value == "bf16";
  if (s.bf16_checkpoints && !s.checkpointing) {
    return Bad("--checkpoint_precision=bf16 rounds the inputs that --grad_checkpointing keeps: it needs it");
  }
  if (s.bf16_checkpoints && !s.gpu) return Bad("--checkpoint_precision=bf16 is for the GPU trainer (--device=gpu)");
  return absl::OkStatus();
}

absl::Status ReadDataParallel(RunSettings& s) {
  s.zero = absl::GetFlag(FLAGS_zero);
  if (s.zero != 0 && s.zero != 2 && s.zero != 3) {
    return Bad(
        absl::StrFormat("--zero is 0 (each rank keeps the whole state), 2 (optimizer state and gradients "
                        "sharded) or 3 (the parameters too), not %d",
                        s.zero));
  }
  s.sparse_ratio = absl::GetFlag(FLAGS_sparse_grad_ratio);
  s.sync_every = absl::GetFlag(FLAGS_sync_every);
  s.sparse_warmup = absl::GetFlag(FLAGS_sparse_warmup);
  const std::string sparse_sync = absl::GetFlag(FLAGS_sparse_sync);
  if (sparse_sync != "gradient" && sparse_sync != "update" && sparse_sync != "momentum") {
    return Bad("--sparse_sync is gradient, update or momentum, not '" + sparse_sync + "'");
  }
  s.sparse_update = sparse_sync == "update";
  s.sparse_momentum = sparse_sync == "momentum";
  if (s.sparse_warmup < 0) return Bad("--sparse_warmup: steps, 0 or more");
  s.comm_timeout = absl::GetFlag(FLAGS_comm_timeout);
  if (!(s.comm_timeout > 0)) return Bad("--comm_timeout: seconds, more than 0");
  const std::string by = absl::GetFlag(FLAGS_sparse_grad_ratio_by);
  for (absl::string_view part : absl::StrSplit(by, ',', absl::SkipEmpty())) {
    const size_t eq = part.rfind('=');
    double ratio = 0;
    if (eq == absl::string_view::npos || eq == 0 || !absl::SimpleAtod(part.substr(eq + 1), &ratio)) {
      return Bad(absl::StrFormat("--sparse_grad_ratio_by: '%s' is not REGEX=FRACTION", part));
    }
    s.sparse_ratio_by.emplace_back(std::string(part.substr(0, eq)), ratio);
  }
  return absl::OkStatus();
}

absl::Status ReadTierd(bool gpu, RunSettings& s) {
  const std::string policy = absl::GetFlag(FLAGS_offload_policy);
  if (policy != "none" && policy != "tierd" && policy != "tiered") {
    return Bad("--offload_policy is none or tierd, not '" + policy + "'");
  }
  s.tierd = policy != "none";
  s.tierd_dir = absl::GetFlag(FLAGS_tierd_dir);
  // On a GPU an empty --tierd_dram is sized from the model's state when the home is made (0 here).
  const std::string dram =
      absl::GetFlag(FLAGS_tierd_dram).empty() ? (gpu ? "0" : "64MiB") : absl::GetFlag(FLAGS_tierd_dram);
  const std::string nvme =
      absl::GetFlag(FLAGS_tierd_nvme).empty() ? (gpu ? "64GiB" : "1GiB") : absl::GetFlag(FLAGS_tierd_nvme);
  auto dram_bytes = ParseBytes(dram);
  auto nvme_bytes = ParseBytes(nvme);
  if (!dram_bytes.ok() || !nvme_bytes.ok()) return Bad("--tierd_dram / --tierd_nvme: sizes like 64MiB or 24GiB");
  s.tierd_dram = *dram_bytes;
  s.tierd_nvme = *nvme_bytes;
  return absl::OkStatus();
}

}  // namespace

void ParseTrainerFlags(int argc, char** argv, const char* usage) {
  absl::FlagsUsageConfig config;  // --help lists the trainer's flags, all defined in this file
  config.contains_help_flags = [](absl::string_view file) { return absl::EndsWith(file, "/train_flags.cc"); };
  absl::SetFlagsUsageConfig(config);
  absl::SetProgramUsageMessage(usage);
  std::vector<std::string> args(argv, argv + argc);
  for (size_t i = 1; i < args.size(); ++i) {
    std::string& a = args[i];
    if (a == "--") break;
    if (a.size() < 3 || a[0] != '-' || a[1] != '-') continue;
    for (size_t k = 2; k < a.size() && a[k] != '='; ++k) {
      if (a[k] == '-') a[k] = '_';
    }
    if (a == "--grad_checkpointing") a += "=full";  // was a switch: keep it one
    if (a == "--nograd_checkpointing") a = "--grad_checkpointing=none";
    const std::string name = a.substr(2, a.find('=') - 2);
    GivenFlags().insert(name);
    if (name.rfind("no", 0) == 0) GivenFlags().insert(name.substr(2));
  }
  std::vector<char*> pointers;
  for (std::string& a : args) pointers.push_back(a.data());
  pointers.push_back(nullptr);
  absl::ParseCommandLine(argc, pointers.data());
}

absl::StatusOr<ModelConfig> ReadModelFlags(std::string* init_from) {
  ShapeOverrides shape;
  shape.layers = absl::GetFlag(FLAGS_num_hidden_layers);
  shape.d_model = absl::GetFlag(FLAGS_hidden_size);
  shape.heads = absl::GetFlag(FLAGS_num_attention_heads);
  shape.kv_heads = absl::GetFlag(FLAGS_num_key_value_heads);
  shape.head_dim = absl::GetFlag(FLAGS_head_dim);
  shape.d_ff = absl::GetFlag(FLAGS_intermediate_size);
  shape.vocab = absl::GetFlag(FLAGS_vocab_size);
  shape.max_seq = absl::GetFlag(FLAGS_max_position_embeddings);
  if (Given("model_size") && !absl::GetFlag(FLAGS_model_config).empty()) {
    return Bad("give --model_size (a preset) or --model_config (a file), not both");
  }
  std::string from = absl::GetFlag(FLAGS_init_from);
  while (from.size() > 1 && from.back() == '/') from.pop_back();
  if (!from.empty()) {
    for (const char* flag : {"model_size", "model_config", "hidden_size", "num_hidden_layers", "num_attention_heads",
                             "num_key_value_heads", "head_dim", "intermediate_size", "vocab_size",
                             "max_position_embeddings"}) {
      if (Given(flag)) {
        return Bad(absl::StrFormat("--init_from takes the model's shape from %s/config.json: give no --%s",
                                   from, flag));
      }
    }
  }
  auto config = from.empty()
                    ? ResolveModelConfig(absl::GetFlag(FLAGS_model_size), absl::GetFlag(FLAGS_model_config), shape)
                    : ModelConfigFromFile(from + "/config.json");
  if (!config.ok()) return config.status();
  ModelConfig out = *config;
  if (!from.empty()) out.name = from.substr(from.find_last_of('/') + 1);
  *init_from = from;
  return out;
}

absl::StatusOr<RunSettings> ReadRunSettings(bool gpu, std::vector<std::string>* notes) {
  RunSettings s;
  s.gpu = gpu;
  s.given = GivenFlags();
  if (absl::Status st = ReadPrecisionAndOptimizer(gpu); !st.ok()) return st;
  const std::string opt = absl::AsciiStrToLower(absl::GetFlag(FLAGS_opt));
  s.lion = opt == "lion";
  s.adafactor = opt == "adafactor";
  s.moments_8bit = opt == "adamw8bit" || opt == "adamw_8bit";
  s.moments_8bit_min = absl::GetFlag(FLAGS_adamw8bit_min_size);
  if (s.moments_8bit_min < 0) return Bad("--adamw8bit_min_size: 0 (every tensor 8-bit) or a count of values");
  if (Given("adamw8bit_min_size") && s.moments_8bit_min > 0 && !s.moments_8bit)
    return Bad("--adamw8bit_min_size goes with --opt=adamw8bit");
  if (!s.moments_8bit) s.moments_8bit_min = 0;
  const std::string precision = absl::AsciiStrToLower(absl::GetFlag(FLAGS_precision));
  s.fp8 = precision == "fp8";
  s.precision_auto = gpu && precision == "auto";
  s.bf16_layers = absl::GetFlag(FLAGS_bf16_layers);
  if (!s.bf16_layers.empty() && !s.fp8 && !s.precision_auto)
    return Bad("--bf16_layers chooses layers to keep out of FP8: give it with --precision=fp8 or auto (GPU)");
  const std::string scaling = absl::AsciiStrToLower(absl::GetFlag(FLAGS_fp8_scaling));
  if (scaling != "delayed" && scaling != "current" && scaling != "fixed") {
    return Bad("--fp8_scaling is delayed, current or fixed, not '" + scaling + "'");
  }
  s.fp8_delayed = scaling == "delayed";
  if ((Given("fp8_fixed_scale") || Given("fp8_fixed_grad_scale")) && scaling != "fixed") {
    return Bad("--fp8_fixed_scale and --fp8_fixed_grad_scale go with --fp8_scaling=fixed");
  }
  if (scaling == "fixed") {
    const double scale = absl::GetFlag(FLAGS_fp8_fixed_scale), grad = absl::GetFlag(FLAGS_fp8_fixed_grad_scale);
    const auto good = [](double x) { return x >= 0x1p-100 && x <= 0x1p100; };  // finite in fp32 both ways
    if (!good(scale) || !good(grad)) {
      return Bad(absl::StrFormat(
          "--fp8_fixed_scale and --fp8_fixed_grad_scale are positive scales between 2^-100 and 2^100 (got %g and %g)",
          scale, grad));
    }
    s.fp8_fixed_scale = static_cast<float>(scale);
    s.fp8_fixed_grad_scale = static_cast<float>(grad);
  }
  s.fp8_window = absl::GetFlag(FLAGS_fp8_window);
  s.fp8_margin = absl::GetFlag(FLAGS_fp8_margin);
  s.fp8_fallback_after = absl::GetFlag(FLAGS_fp8_fallback_after);
  if (s.fp8_window < 1 || s.fp8_window > 1024) return Bad("--fp8_window is 1..1024 steps");
  if (s.fp8_margin < 0 || s.fp8_margin > 32) return Bad("--fp8_margin is 0..32 (a power of two of headroom)");
  if (s.fp8_fallback_after < 0) return Bad("--fp8_fallback_after is a count of steps (0: never fall back)");
  auto config = ReadModelFlags(&s.init_from);
  if (!config.ok()) return config.status();
  s.config = *config;
  s.export_dir = absl::GetFlag(FLAGS_export);
  s.validation_out = absl::GetFlag(FLAGS_validation_out);
  const std::string export_dtype = absl::AsciiStrToLower(absl::GetFlag(FLAGS_export_dtype));
  if (export_dtype != "bf16" && export_dtype != "fp32") return Bad("--export_dtype is bf16 or fp32");
  s.export_fp32 = export_dtype == "fp32";
  auto shard = ParseBytes(absl::GetFlag(FLAGS_export_shard_size));
  if (!shard.ok() || *shard < (uint64_t{1} << 20)) return Bad("--export_shard_size is a size of at least 1MiB (5GiB)");
  s.export_shard_bytes = *shard;
  if (!s.export_dir.empty()) {
    if (absl::Status st = hf::CheckExportDir(s.export_dir); !st.ok()) return st;
  }
  s.data = absl::GetFlag(FLAGS_data);
  s.batch = absl::GetFlag(FLAGS_batch_size) != 0 ? absl::GetFlag(FLAGS_batch_size) : (gpu ? 8 : 4);
  const int seq_flag = absl::GetFlag(FLAGS_seq_len);
  s.seq = seq_flag != 0 ? seq_flag : std::min(s.config.max_seq, gpu ? 2048 : 64);
  s.accum = absl::GetFlag(FLAGS_grad_accum_steps);
  s.steps = absl::GetFlag(FLAGS_steps) != 0 ? absl::GetFlag(FLAGS_steps) : (gpu ? 50 : 200);
  // Lion's updates are the sign's, a size for every element: a third of AdamW's rate by default.
  const Schedule schedule = ChooseSchedule(s.config, s.steps, !s.init_from.empty(), gpu, opt == "lion",
                                           absl::GetFlag(FLAGS_lr), absl::GetFlag(FLAGS_warmup));
  s.lr = schedule.lr;
  s.warmup = schedule.warmup;
  s.schedule_note = schedule.why;
  s.clip = absl::GetFlag(FLAGS_clip);
  s.loss_spike_sds = absl::GetFlag(FLAGS_loss_spike_sds);
  if (!(s.loss_spike_sds >= 0) || !std::isfinite(s.loss_spike_sds)) {
    return Bad("--loss_spike_sds is a number of standard deviations, 0 or more (0: no spike guard)");
  }
  s.weight_decay = absl::GetFlag(FLAGS_weight_decay);
  s.seed = absl::GetFlag(FLAGS_seed);
  s.data_seed = absl::GetFlag(FLAGS_data_seed) != 0 ? absl::GetFlag(FLAGS_data_seed) : s.seed;
  if (s.batch < 1 || s.seq < 1 || s.accum < 1 || s.steps < 1 ||
      (Given("batch_size") && s.batch != absl::GetFlag(FLAGS_batch_size)) ||
      (Given("steps") && s.steps != absl::GetFlag(FLAGS_steps))) {
    return Bad("--batch_size, --seq_len, --grad_accum_steps and --steps must be at least 1");
  }
  if (s.seq > s.config.max_seq) {
    return Bad(absl::StrFormat("--seq_len %d is longer than model %s's %d (max_position_embeddings)", s.seq,
                               s.config.name, s.config.max_seq));
  }
  if (s.config.sliding_window > 0 && s.seq > s.config.sliding_window) {
    return Bad(absl::StrFormat("--seq_len %d is longer than model %s's sliding window of %d positions; attention here "
                               "is full causal attention, which equals the window's only for sequences within it",
                               s.seq, s.config.name, s.config.sliding_window));
  }
  if (!(s.lr > 0) || (Given("lr") && !(absl::GetFlag(FLAGS_lr) > 0)) || s.clip < 0 || s.weight_decay < 0 ||
      s.warmup < 0 || (Given("warmup") && absl::GetFlag(FLAGS_warmup) < 0)) {
    return Bad("--lr must be positive; --clip, --weight_decay and --warmup not negative");
  }
  if (absl::Status st = ReadCheckpointing(s); !st.ok()) return st;
  if (absl::Status st = ReadCheckpointPrecision(s); !st.ok()) return st;
  if (absl::Status st = ReadTierd(gpu, s); !st.ok()) return st;
  if (absl::Status st = ReadDataParallel(s); !st.ok()) return st;
  s.checkpoint_dir = absl::GetFlag(FLAGS_checkpoint_dir);
  s.checkpoint_every = absl::GetFlag(FLAGS_checkpoint_every);
  s.checkpoint_keep = absl::GetFlag(FLAGS_checkpoint_keep);
  s.resume = absl::GetFlag(FLAGS_resume);
  if (s.resume && s.checkpoint_dir.empty()) return Bad("--resume needs --checkpoint_dir");
  if (s.checkpoint_every < 1 || s.checkpoint_keep < 1)
    return Bad("--checkpoint_every and --checkpoint_keep: at least 1");
  s.metrics = absl::GetFlag(FLAGS_metrics);
  s.plot = absl::GetFlag(FLAGS_plot);
  s.compare_metrics = absl::GetFlag(FLAGS_compare_metrics);
  s.eval_every = absl::GetFlag(FLAGS_eval_every);
  if (!s.validation_out.empty() && s.eval_every < 0) return Bad("--validation_out needs a validation (--eval_every >= 0)");
  s.tierd_plan = absl::GetFlag(FLAGS_tierd_plan);
  s.tierd_record = absl::GetFlag(FLAGS_tierd_record);
  s.gpu_budget_text = absl::GetFlag(FLAGS_gpu_budget);
  if (auto budget = ParseBytes(s.gpu_budget_text); budget.ok()) {
    s.gpu_budget = *budget;
  } else if (gpu && s.tierd) {
    return Bad("--gpu_budget: a size like 24GiB");
  }
  s.optimizer_place = absl::GetFlag(FLAGS_optimizer_place);
  s.optimizer_deferred = absl::GetFlag(FLAGS_optimizer_deferred);
  s.fp8_weight_codes = absl::GetFlag(FLAGS_fp8_weight_codes);
  s.compact_state = absl::GetFlag(FLAGS_compact_state);
  s.step_order = absl::GetFlag(FLAGS_step_order);
  s.optimizer_chunks = absl::GetFlag(FLAGS_optimizer_chunks);
  s.attention = absl::GetFlag(FLAGS_attention);
  s.fused_norms = absl::GetFlag(FLAGS_fused_norms);
  if (s.attention != "auto" && s.attention != "cudnn" && s.attention != "cudnn-fast" && s.attention != "ours") {
    return Bad("--attention is auto, cudnn, cudnn-fast or ours, not '" + s.attention + "'");
  }
  s.gemm_candidates = absl::GetFlag(FLAGS_gemm_candidates);
  if (s.gemm_candidates < 1 || s.gemm_candidates > 64) {
    return Bad(absl::StrFormat("--gemm_candidates=%d: 1 (cuBLASLt's heuristic first choice) up to 64",
                               s.gemm_candidates));
  }
  s.gemm_cache_dir = absl::GetFlag(FLAGS_gemm_cache_dir);
  if (s.gemm_cache_dir.empty()) {
    const char* xdg = std::getenv("XDG_CACHE_HOME");
    const char* home = std::getenv("HOME");
    s.gemm_cache_dir = xdg != nullptr && *xdg != 0 ? std::string(xdg) + "/tierd"
                       : home != nullptr           ? std::string(home) + "/.cache/tierd"
                                                   : "/tmp/tierd-cache";
  }
  s.pcie_gbps = absl::GetFlag(FLAGS_pcie_gbps);
  s.nvme_gbps = absl::GetFlag(FLAGS_nvme_gbps);
  s.gpu_tflops = absl::GetFlag(FLAGS_gpu_tflops);
  s.profile = absl::GetFlag(FLAGS_profile);
  s.timing_skip = absl::GetFlag(FLAGS_timing_skip);
  const std::vector<const char*> gpu_only = {
      "gpu_budget",         "optimizer_place", "pcie_gbps",   "nvme_gbps",  "gpu_tflops",    "optimizer_chunks",
      "optimizer_deferred", "profile",         "timing_skip", "step_order", "compact_state", "adamw8bit_min_size",
      "gemm_candidates",    "gemm_cache_dir",  "attention"};
  // (The GPU trainer's ranks sync dense: with more than one it refuses the sparse and ZeRO flags.)
  const std::vector<const char*> cpu_only = {"tierd_record",         "zero",           "sparse_grad_ratio",
                                             "sparse_grad_ratio_by", "sync_every",     "sparse_warmup",
                                             "sparse_sync",          "compare_metrics"};
  for (const char* name : gpu ? cpu_only : gpu_only) {
    if (Given(name) && notes != nullptr) {
      notes->push_back(absl::StrFormat("--%s is for the %s trainer: ignored on the %s", name, gpu ? "CPU" : "GPU",
                                       gpu ? "GPU" : "CPU"));
    }
  }
  return s;
}

DeviceFlags ReadDeviceFlags() { return {absl::GetFlag(FLAGS_device), absl::GetFlag(FLAGS_print_device)}; }

absl::StatusOr<ExportFlags> ReadExportFlags() {
  ExportFlags f;
  f.checkpoint = absl::GetFlag(FLAGS_checkpoint);
  f.to = absl::GetFlag(FLAGS_to);
  if (f.checkpoint.empty() || f.to.empty()) {
    return absl::InvalidArgumentError(
        "give --checkpoint=FILE_OR_DIR --to=NEW_DIR and the run's model flags (--init_from=DIR, or --model_size / "
        "--model_config)");
  }
  const std::string dtype = absl::GetFlag(FLAGS_export_dtype);
  if (dtype != "bf16" && dtype != "fp32") return absl::InvalidArgumentError("--export_dtype is bf16 or fp32");
  f.fp32 = dtype == "fp32";
  auto shard = ParseBytes(absl::GetFlag(FLAGS_export_shard_size));
  if (!shard.ok()) return absl::InvalidArgumentError("--export_shard_size: " + std::string(shard.status().message()));
  f.shard_bytes = *shard;
  return f;
}

}  // namespace tierd::trainer
