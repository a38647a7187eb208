"""A plain PyTorch training loop with and without tierd.torch.OffloadOptimizer, side by side
in one process (issue 44's first target): the same model (tools/bench/torch_baseline.py's
Llama-style decoder, fp32 weights, bf16 autocast), the same data, clipping at 1.0; PyTorch's
fused AdamW with everything on the GPU, then OffloadOptimizer (master weights and moments in
tierd's DRAM tier, stepped on the host). Prints each run's tokens/s, peak GPU memory and
losses, then the ratio. Needs a running tierd (TIERD_DIR) and the tierd package on PYTHONPATH.

  python3 tools/bench/offload_optimizer_bench.py --model_size=1.3b --batch_size=8 \
      --variants="adamw:clip adamw:noclip adamw8bit:clip adamw8bit:noclip" [--hf]

--hf trains transformers' LlamaForCausalLM of the same shape (random weights, SDPA attention)
instead of our benchmark decoder. Each variant is opt:clip (clipping by global norm at 1.0: the
update waits for every gradient) or opt:noclip (no clipping on either side: each update starts in
the backward); opt:mode:offload also puts the parameters in tierd (tierd.torch.offload, a GPU quota
of --gpu_quota), opt:mode:offload:plan with tierd's planner following the first step's order;
threads=N anywhere after the mode gives the host's optimizer N threads (default: all, at most 16);
a last part gpu=F steps that fraction of the parameters on the GPU (gpu_share=F; with offload its
state shares the --gpu_quota session, so raise it), e.g. adamw:noclip:gpu=0.3; gpu=F@QUOTA gives
the optimizer's session that GPU quota (smaller than the share's state: tierd moves it in and out).
"""
import argparse
import json
import os
import re
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_baseline import PRESETS, Decoder, hf_llama, nvml_mib, random_batch  # noqa: E402

import tierd.torch as tt  # noqa: E402
import gpu_timeline  # noqa: E402


def make_model(a, baseline=False):
    torch.manual_seed(0)
    dtype = torch.bfloat16 if a.bf16 and not (baseline and a.baseline_fp32) else torch.float32
    if a.hf:
        model = hf_llama(a.model_size, a.seq_len, a.checkpointing, dtype,
                         attention="eager" if a.deterministic else "sdpa")
    else:
        layers, c, h, f, v, kv = PRESETS[a.model_size]
        model = Decoder(layers, c, h, f, v, a.checkpointing, a.seq_len, kv).cuda().to(dtype)
    if a.compile_layers:  # every run alike, the baseline too
        for layer in decoder_layers(model, a):
            layer.compile()
    return model


def decoder_layers(model, a):
    return model.model.layers if a.hf else model.layers


def forward(model, batch, a):
    if not a.hf:
        return model(batch[:, :-1], batch[:, 1:])
    return model(input_ids=batch[:, :-1], labels=batch[:, :-1]).loss


def run(name, make_opt, clip, a, data, offload=None, baseline=False):
    model = make_model(a, baseline)
    weights = None
    if offload:  # the parameters into tierd: the GPU keeps what the session's GPU quota holds
        weights = tt.offload(model, gpu=a.gpu_quota, dram=a.dram, nvme="8GiB", plan=offload == "plan",
                             units=decoder_layers(model, a))  # each layer's weights acquired together
        torch.cuda.empty_cache()
    opt = make_opt(model) if weights is None else make_opt(model, weights.client)
    # A linear warm-up (both sides alike): without one a random model's loss spikes in the first
    # steps at lr 3e-4, and the runs' losses then say little about each other.
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / a.warmup)) if a.warmup else None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    g = torch.Generator().manual_seed(1)
    timed, losses, seconds = 0.0, [], []

    def one_step():
        micro = []
        for _ in range(a.grad_accum):
            micro.append(random_batch(data, a.batch_size, a.seq_len, generator=g))
        torch.cuda.synchronize()
        t0 = time.time()
        total = 0.0
        for batch in micro:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = forward(model, batch, a) / a.grad_accum
            loss.backward()
            total += loss.detach()
        loss = total
        if clip and not isinstance(opt, tt.OffloadOptimizer):
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if sched is not None:
            sched.step()
        value = loss.item()
        torch.cuda.synchronize()
        return value, time.time() - t0

    for step in range(a.steps):
        loss, took = one_step()
        losses.append(loss)
        seconds.append(took)
        if step >= a.skip:
            timed += seconds[-1]
        if step == a.steps - 1:
            mine, every = nvml_mib()
    times = None
    if isinstance(opt, tt.OffloadOptimizer):
        opt.synchronize()
        times = opt.timings()  # the timed steps' (before a profiled one)
    if a.profile:  # one step more under torch.profiler, outside the timing and the losses printed
        prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                  torch.profiler.ProfilerActivity.CUDA])
        with prof:
            with torch.profiler.record_function(gpu_timeline.STEP):
                one_step()
        path = os.path.join(a.profile, re.sub(r"[^A-Za-z0-9._-]", "-", name) + ".trace.json")
        os.makedirs(a.profile, exist_ok=True)
        prof.export_chrome_trace(path)
        print(f"  timeline ({path}): " + json.dumps(gpu_timeline.summarize_trace_file(path)), flush=True)
    if isinstance(opt, tt.OffloadOptimizer):
        opt.synchronize()
        if opt.gpu_values:
            print(f"  stepped on the GPU: {opt.gpu_values / sum(p.numel() for p in model.parameters()):.1%} of the "
                  "values", flush=True)
        print("  where the host's time went, s a step: " + ", ".join(
            f"{k} {v / a.steps:.3f}" for k, v in times.items()), flush=True)
        opt.close()
    if weights is not None:
        weights.client.close()
    tps = a.batch_size * a.grad_accum * a.seq_len * (a.steps - a.skip) / timed
    peak = torch.cuda.max_memory_allocated() / 2**30
    print(f"{name}: {tps:,.0f} tokens/s, peak allocated {peak:.1f} GiB, nvidia-smi {mine / 1024:.1f} GiB this "
          f"process, {every / 1024:.1f} GiB every process (tierd's too), losses "
          + " ".join(f"{x:.4f}" for x in losses) + "; step s " + " ".join(f"{x:.2f}" for x in seconds), flush=True)
    del model, opt
    torch.cuda.empty_cache()
    return tps, losses


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model_size", default="1.3b", choices=sorted(PRESETS))
    p.add_argument("--batch_size", type=int, default=8)
    p.add_argument("--seq_len", type=int, default=2048)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--grad_accum", type=int, default=1, help="micro-batches of --batch_size a step")
    p.add_argument("--skip", type=int, default=3, help="untimed first steps")
    p.add_argument("--warmup", type=int, default=0, help="steps of linear learning-rate warm-up (0: none)")
    p.add_argument("--profile", default="", metavar="DIR",
                   help="each run: one step more under torch.profiler, its trace written to DIR and a "
                        "'timeline' line printed (gpu_timeline.py: the GPU busy and idle in the step, kernels on "
                        "the compute stream and the others, copies each way, the longest idle gaps and what "
                        "borders them)")
    p.add_argument("--variants", default="adamw:clip", help="opt:clip|noclip[:offload[:plan]], opt adamw, adamw8bit or lion; several apart by spaces or commas")
    p.add_argument("--hf", action="store_true", help="transformers' LlamaForCausalLM of the same shape")
    p.add_argument("--bf16", action="store_true", help="bf16 weights (pure bf16 training) instead of fp32 + autocast")
    p.add_argument("--baseline_fp32", action="store_true",
                   help="with --bf16: the loop without offload trains fp32 weights under bf16 autocast (PyTorch's "
                        "mixed precision, fp32 master weights on the GPU) while ours keeps bf16 weights on the GPU and "
                        "fp32 master weights on the host: the same arithmetic, so their losses should agree")
    p.add_argument("--baseline_twin", action="store_true",
                   help="the loop without offload keeps the whole model on the GPU and steps it with the variant's own "
                        "optimizer wholly on the GPU (OffloadOptimizer, gpu_share=1: the host step's bits, its state "
                        "in tierd's GPU tier, so tierd's GPU budget must hold it) instead of PyTorch's AdamW: the same "
                        "arithmetic as ours, so where the forward and backward repeat their bits the losses are ours "
                        "exactly, and any difference is what offloading changed")
    p.add_argument("--baseline_host", action="store_true",
                   help="the loop without offload keeps the whole model on the GPU and steps it with the variant's own "
                        "optimizer on the host (OffloadOptimizer, gpu_share=0: fp32 master on the host, so it fits "
                        "where the twin's GPU state does not, e.g. 7B on an 80 GB card): then an offload variant "
                        "differs from it only by tierd.torch.offload")
    p.add_argument("--no_baseline", action="store_true", help="ours only (a model the GPU cannot hold otherwise)")
    p.add_argument("--deterministic", action="store_true",
                   help="runs that repeat their bits: torch.use_deterministic_algorithms, cuBLAS's fixed workspace, "
                        "and with --hf transformers' eager attention (SDPA's backward is not deterministic): "
                        "then a run's losses differ from the loop without offload's only where offloading changed "
                        "the arithmetic, and the first step that differs says where")
    p.add_argument("--gpu_quota", default="4GiB", help="offload variants: the session's GPU quota for the weights")
    p.add_argument("--checkpointing", action="store_true")
    p.add_argument("--compile_layers", action="store_true", help="torch.compile each decoder layer (in place), in every run")
    p.add_argument("--dram", default="64GiB", help="the optimizer's tierd DRAM quota")
    p.add_argument("--switch_intervals", default="",
                   help="each of our variants once per value of sys.setswitchinterval (seconds, apart by commas; "
                        "Python's default 0.005): how long the optimizer's threads wait for the GIL")
    a = p.parse_args()
    if a.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before cuBLAS starts
        torch.use_deterministic_algorithms(True, warn_only=True)  # an op without a deterministic form says so
    if (a.baseline_twin or a.baseline_host) and a.baseline_fp32:
        p.error("--baseline_twin and --baseline_host keep the baseline's weights as ours (bf16 with --bf16): "
                "not with --baseline_fp32")
    if a.baseline_twin and a.baseline_host:
        p.error("one baseline: --baseline_twin (the optimizer stepped on the GPU) or --baseline_host (on the host)")
    py_lib = os.path.dirname(os.__file__)
    text = b"".join(open(os.path.join(py_lib, n), "rb").read() for n in sorted(os.listdir(py_lib)) if n.endswith(".py"))
    data = torch.frombuffer(bytearray(text), dtype=torch.uint8).long()
    print(f"machine: {torch.cuda.get_device_name()}; {'transformers LlamaForCausalLM' if a.hf else 'our decoder'} "
          f"{a.model_size}, batch {a.batch_size} x {a.seq_len} x {a.grad_accum} micro-batches, bf16 autocast, "
          f"{'bf16 weights' if a.bf16 else 'fp32 weights'}{' (fp32 without offload)' if a.baseline_fp32 else ''}; host threads "
          f"{tt._tierd.cpu_threads()}", flush=True)
    baselines = {}
    for variant in a.variants.replace(",", " ").split():  # commas: one word for a shell variable
        opt_name, mode, *where = variant.split(":")
        threads = [int(w[8:]) for w in where if w.startswith("threads=")]
        where = [w for w in where if not w.startswith("threads=")]
        share, share_quota = 0.0, 0
        if where and where[-1].startswith("gpu="):
            share, _, share_quota = where.pop()[4:].partition("@")
            share, share_quota = float(share), share_quota or 0
        clip = mode == "clip"
        offload = None if not where else "plan" if where == ["offload", "plan"] else "online"
        if clip not in baselines and not a.no_baseline and (a.baseline_twin or a.baseline_host):
            on_gpu = 1.0 if a.baseline_twin else 0.0
            baselines[clip] = run(f"the same loop without offload, {opt_name} "
                                  f"{'wholly on the GPU (gpu_share=1)' if on_gpu else 'on the host (gpu_share=0)'}"
                                  f"{', clipping at 1.0' if clip else ''}",
                                  lambda m: tt.OffloadOptimizer(
                                      m.parameters(), opt=opt_name, lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1,
                                      max_grad_norm=1.0 if clip else None, accumulation_steps=a.grad_accum,
                                      dram=a.dram, nvme="4GiB", name="twin", gpu_share=on_gpu), clip, a, data,
                                  baseline=True)
        if clip not in baselines and not a.no_baseline:
            baselines[clip] = run(f"PyTorch fused AdamW on the GPU{' (fp32 weights)' if a.baseline_fp32 else ''}"
                                  f"{', clipping at 1.0' if clip else ''}",
                                  lambda m: torch.optim.AdamW(m.parameters(), lr=3e-4, betas=(0.9, 0.95),
                                                              weight_decay=0.1, fused=True), clip, a, data, baseline=True)

        def make(m, client=None):
            return tt.OffloadOptimizer(m.parameters(), opt=opt_name, lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1,
                                       max_grad_norm=1.0 if clip else None, accumulation_steps=a.grad_accum,
                                       dram=a.dram, nvme="4GiB", client=client, name=re.sub(r"[^A-Za-z0-9._-]", "-", variant),
                                       gpu_share=share, gpu=share_quota, threads=threads[-1] if threads else 0)
        default_interval = sys.getswitchinterval()
        for interval in [float(x) for x in a.switch_intervals.split(",") if x] or [default_interval]:
            sys.setswitchinterval(interval)
            label = variant + (f", switch interval {interval * 1e3:g} ms" if a.switch_intervals else "")
            torch.cuda.reset_peak_memory_stats()
            ours, our_losses = run(f"tierd OffloadOptimizer {label}", make, clip, a, data, offload=offload)
            sys.setswitchinterval(default_interval)
            if a.no_baseline:
                continue
            base, base_losses = baselines[clip]
            worst = max(abs(x - y) / abs(y) for x, y in zip(our_losses, base_losses))
            peer = ("the twin's (gpu_share=1, no offload)" if a.baseline_twin else
                    "the host-stepped loop's without offload" if a.baseline_host else "PyTorch fused AdamW's")
            same = sum(x == y for x, y in zip(our_losses, base_losses))
            first = next((i + 1 for i, (x, y) in enumerate(zip(our_losses, base_losses)) if x != y), None)
            print(f"ratio: OffloadOptimizer {label} {ours / base:.2f}x of {peer} tokens/s; losses within "
                  f"{100 * worst:.3f}% of its, {same} of {len(base_losses)} equal to the bit"
                  + (f", the first differing at step {first} ({our_losses[first - 1]!r} against "
                     f"{base_losses[first - 1]!r})" if first else ""), flush=True)

if __name__ == "__main__":
    main()
