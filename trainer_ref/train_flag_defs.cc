// The trainer's flags, defined: what each means and its default (--help prints these texts).
// train_flags.cc reads them, once (ReadRunSettings); nothing else does.
#include <cstdint>
#include <string>

#include "absl/flags/flag.h"
#include "trainer_ref/train_flags.h"

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
ABSL_FLAG(bool, fp8_fast_accumulation, false,
          "with FP8 matmuls: the forward's with the tensor cores' fast accumulation (partial sums promoted to fp32 "
          "less often: torchao's and Transformer Engine's forward default); the backward's stay exact. Measured no "
          "faster at 1.3B on an H100 (the forward's GEMMs already run near 1,000 TFLOP/s), so off by default");
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
          "weights need not stay on the GPU between updates (codes take half their room); the fastest 1.3B runs in "
          "23.5 GiB use it (docs/BENCHMARKS.md). Off by default");
ABSL_FLAG(bool, fp8_transposed_weight_codes, true,
          "With --fp8_weight_codes and micro-batches one after the other (--step_order=micro, "
          "--grad_accum_steps > 1): the optimizer's step also writes each FP8 matrix's codes transposed (a byte a "
          "parameter more in the codes' part), which the backward's input-gradient product reads; without them "
          "each micro-batch's backward transposes every layer's codes again. Layer-major steps transpose once a "
          "layer already and do not write them");
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
ABSL_FLAG(bool, fused_norms, true,
          "GPU: each layer's forward adds the attention's output into the fp32 residual stream, keeps the copy its "
          "backward reads and takes the second norm in one kernel, and copies its input within the first norm's: "
          "the same bits as the separate kernels, with 3 of the 6 reads of the stream in a layer's forward "
          "gone; a micro-batch's forward also leaves each layer's last add to the next layer's first norm (and "
          "the last layer's to the final norm): no pass of its own (--nofused_norms: the separate kernels)");
ABSL_FLAG(bool, optimizer_one_launch, true,
          "GPU, --opt=adamw8bit: the optimizer's step takes a layer's tensors in one kernel launch instead of one "
          "a tensor: the same bits, one launch's ramp and tail a layer instead of nine (1.3B: 0.7% faster a "
          "step; --nooptimizer_one_launch: a launch a tensor)");
ABSL_FLAG(int, gemm_candidates, 1,
          "GPU: time this many of cuBLASLt's candidate algorithms at each GEMM shape's first call (3 runs each, into "
          "a scratch output the size of the GEMM's) and keep the fastest; 1: cuBLASLt's heuristic first choice, "
          "untimed. Choices are cached in --gemm_cache_dir, so a resumed run takes the same ones (the same bits)");
ABSL_FLAG(int, gemm_workspace_mib, 32,
          "GPU: cuBLASLt's workspace in MiB (32: what cuBLAS asks for on Hopper). 0 leaves it only algorithms that "
          "need none: the FP8 GEMMs then run the same tiles without the 4-byte memset cuBLASLt issues before each "
          "one (~1,600 launches and their gaps a 1.3B step: 1.5% faster there, H100; not yet measured at 7B and "
          "13B, whose figures were taken at 32)");
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
