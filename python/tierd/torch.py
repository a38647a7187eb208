"""PyTorch on tierd: leases as tensors, and an optimizer whose state lives in tierd's tiers.

    opt = tierd.torch.OffloadOptimizer(model.parameters(), opt="adamw", lr=3e-4, max_grad_norm=1.0,
                                       dram="48GiB", nvme="200GiB")
    for batch in data:
        loss = model(batch).loss
        loss.backward()          # each gradient leaves the GPU as soon as it is accumulated
        opt.step()               # clip by global norm, step on the host, weights back ahead of the forward
        opt.zero_grad()

Nothing here is compiled against torch: tensors cross by DLPack, so any torch 2.x works.
"""

import atexit
import functools
import itertools
import math
import queue
import threading
import time
import warnings
import weakref

import torch

import tierd
from tierd import _tierd
from tierd.offload import offload  # noqa: F401  (tierd.torch.offload)

__all__ = ["as_tensor", "OffloadOptimizer", "offload", "trainer_callback"]

_FP8 = {"f8e4m3": "float8_e4m3fn", "f8e5m2": "float8_e5m2"}


def as_tensor(view):
    """A torch tensor over an acquired View's bytes (no copy; valid until the lease's release)."""
    t = torch.utils.dlpack.from_dlpack(view)
    if view.dtype in _FP8 and hasattr(torch, _FP8[view.dtype]):
        t = t.view(getattr(torch, _FP8[view.dtype]))
    return t


def _size(n):
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


class _Slot:
    """One parameter's leases (master weights, moments, gradient accumulator, all in DRAM/NVMe
    through tierd) and its pinned staging buffers (gradient in, weights out)."""

    def __init__(self, index, param, client, opt, prefix, accumulation_steps, on_gpu=False):
        self.index, self.param, self.n = index, param, param.numel()
        self.on_gpu = on_gpu  # stepped on the GPU (gpu_share): its leases are acquired there
        n = self.n
        name = f"{prefix}.{index}"
        self.master = client.lease(f"{name}.master", (n,), "f32", "opt_state")
        if opt == "adamw8bit":
            moment = (_tierd.moment8bit_bytes(n),)
            self.moments = [client.lease(f"{name}.m", moment, "u8", "opt_state"),
                            client.lease(f"{name}.v", moment, "u8", "opt_state")]
        elif opt == "adamw":
            self.moments = [client.lease(f"{name}.m", (n,), "f32", "opt_state"),
                            client.lease(f"{name}.v", (n,), "f32", "opt_state")]
        else:  # lion
            self.moments = [client.lease(f"{name}.m", (n,), "f32", "opt_state")]
        # One bf16 gradient a step (bf16 weights, no accumulation): kept as it came, and the update
        # widens it as it reads it; else an fp32 accumulator.
        self.grad_dtype = "bf16" if param.dtype == torch.bfloat16 and accumulation_steps == 1 else "f32"
        self.grad = client.lease(f"{name}.grad", (n,), self.grad_dtype, "grad")
        self.pin = param.is_cuda
        self._grad_in = self._weights_out = None  # made at first use: the pinned arena may make them unneeded
        self.norm_in = torch.empty(1, dtype=torch.float64, pin_memory=self.pin)  # the gradient's norm, from the GPU
        self.arrivals = 0          # gradients accumulated since the last update
        self.updated_early = False  # its update of this step started in the backward (no clipping)
        self.sum_squares = 0.0     # of the accumulated gradient, as of its last arrival
        self.step = 0
        self.consumed = threading.Event()  # grad_in is free: its last gradient was accumulated
        self.consumed.set()
        self.weights_ready = threading.Event()  # no update of it queued or running
        self.weights_ready.set()
        self.read_until = None     # the compute stream's use of the old weights (a CUDA event)
        self.copied_back = None    # the new weights' copy to the GPU (a CUDA event)
        self.held = None           # on_gpu, held across steps: Views of master, grad, *moments
        self.held_grad = None      # the gradient's View as a tensor

    @property
    def grad_in(self):  # (n,) param.dtype, pinned: a gradient on its way to the accumulator
        if self._grad_in is None:
            self._grad_in = torch.empty(self.n, dtype=self.param.dtype, pin_memory=self.pin)
        return self._grad_in

    @property
    def weights_out(self):  # (n,) param.dtype, pinned: new weights on their way to the GPU
        if self._weights_out is None:
            self._weights_out = torch.empty(self.n, dtype=self.param.dtype, pin_memory=self.pin)
        return self._weights_out


class OffloadOptimizer(torch.optim.Optimizer):
    """AdamW, 8-bit AdamW or Lion with fp32 master weights and moments in tierd's DRAM tier
    (spilling to NVMe under the session's DRAM quota), stepped on the host by the reference
    trainer's vectorised optimizers (the same bits as its host step).

    Each parameter's gradient leaves the GPU as soon as autograd has accumulated it (its
    post-accumulate hook; the GPU copy is freed) and is added into an fp32 accumulator on the
    host by a worker thread, so micro-batches accumulate there. Updates run on another host
    thread, in the order the parameters were given, and each new weight is copied back to the
    GPU at once; a module's forward waits only for its own parameters (with overlap=True; code
    that reads parameters outside their modules' forward, or saves the model, calls
    synchronize() first). When they start:
      - max_grad_norm set: at step(), once every gradient is in (the global norm needs them
        all); the update then runs under the next forward. A non-finite norm skips the step
        with a warning, nothing changed.
      - max_grad_norm None: as soon as a parameter's accumulation_steps-th gradient of the step
        is in, under the rest of the backward (torchao's CPUOffloadOptimizer's overlap). A
        parameter whose gradient is not finite keeps its weights (warned at step()). The
        learning rate (and the group's other settings) are read then: set them before the
        backward (an LR scheduler stepped after step() does that).

    gpu_share: the fraction of the parameters' values stepped on the GPU instead (whole
    parameters in the order given, from the first, until they hold at least that share): their
    master weights, moments and gradients are tierd leases acquired on the GPU, stepped there by
    the reference trainer's GPU kernels (the host step's arithmetic: the same bits), and their
    gradients never leave the GPU. The host's work shrinks by that share, for GPU memory: by
    default (gpu=0) the session's GPU quota holds their state, so it stays there, held across steps
    (a step makes no lease calls for it; a checkpoint lets go of it while it reads); a smaller gpu=
    makes tierd move it in and out around each step (PCIe instead of host arithmetic). With a
    client given, its quotas apply.

    state_dict() / load_state_dict() hold the master weights and moments (CPU tensors), so a
    checkpoint resumes with the same bits.
    """

    def __init__(self, params, opt="adamw", lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01,
                 max_grad_norm=None, accumulation_steps=1, client=None, runtime_dir=None,
                 label="offload-optimizer", dram=0, nvme=0, threads=0, overlap=True, name="opt", gpu_share=0.0,
                 gpu=0):
        if opt not in ("adamw", "adamw8bit", "lion"):
            raise ValueError(f"opt is adamw, adamw8bit or lion, not {opt!r}")
        if max_grad_norm is not None and not max_grad_norm > 0:
            raise ValueError(f"max_grad_norm must be positive (or None: no clipping), not {max_grad_norm}")
        if int(accumulation_steps) < 1:
            raise ValueError(f"accumulation_steps counts micro-batches a step, from 1, not {accumulation_steps}")
        if not 0.0 <= float(gpu_share) <= 1.0:
            raise ValueError(f"gpu_share is the fraction of the parameters' values stepped on the GPU, from 0 to 1, "
                             f"not {gpu_share}")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay))
        self.opt, self.max_grad_norm, self.threads, self.overlap = opt, max_grad_norm, threads, overlap
        self.accumulation_steps = int(accumulation_steps)
        on_gpu = self._gpu_share(float(gpu_share), client)
        self._own_client = client is None  # closed with the optimizer; a client given stays open
        gpu_quota = gpu or self._gpu_state_bytes(opt, on_gpu) + (1 << 20)
        # The share's leases are held on the GPU across steps where the session's GPU quota is the
        # share's own and holds all of it: tierd has nothing to move, so a step makes no lease calls
        # for them (four a parameter otherwise, in the backward's hook and the update).
        self._hold_share = bool(on_gpu) and client is None and (
            tierd.parse_bytes(gpu_quota) >= self._gpu_state_bytes(opt, on_gpu))
        try:
            self.client = client or tierd.connect(runtime_dir, label, gpu=gpu_quota, dram=dram or "1GiB",
                                                  nvme=nvme or "1GiB")
        except tierd.TierdError as e:
            if not on_gpu or gpu:
                raise
            raise tierd._error_in_context(
                e, f"tierd.torch.OffloadOptimizer: gpu_share={gpu_share} keeps the state of {len(on_gpu)} parameters "
                   f"on the GPU, {_size(gpu_quota)} of GPU quota (gpu= smaller makes tierd move it in and out)") from e
        self.skipped_steps = 0
        self.last_grad_norm = float("nan")
        self._slots, self._by_param = [], {}
        try:
            self._check_gpu_share(on_gpu)
            for group in self.param_groups:
                for p in group["params"]:
                    if not p.requires_grad or id(p) in self._by_param:
                        continue
                    slot = _Slot(len(self._slots), p, self.client, opt, name, self.accumulation_steps,
                                 on_gpu=id(p) in on_gpu)
                    slot.group = group
                    self._slots.append(slot)
                    self._by_param[id(p)] = slot
                    offloaded = getattr(p, "_tierd_offload", None)  # its weights live in a lease (offload())
                    self._fill_state(slot, offloaded[0].state_of(offloaded[1]) if offloaded else p.detach())
        except tierd.TierdError as e:
            text = self._state_needs(opt, len(self._slots))
            if self._own_client:
                self.client.close()
            raise tierd._error_in_context(e, text) from e
        except BaseException:
            if self._own_client:
                self.client.close()
            raise
        self.gpu_values = sum(s.n for s in self._slots if s.on_gpu)  # stepped on the GPU (gpu_share)
        cuda = any(s.param.is_cuda for s in self._slots)
        self._d2h = torch.cuda.Stream() if cuda else None
        self._h2d = torch.cuda.Stream() if cuda else None
        self._gpu_steps = torch.cuda.Stream() if cuda and self.gpu_values else None
        self._registered = self._pin_arena() if cuda else None
        self._release_later = []    # (copy's event, master lease): acquired until its copy to the GPU is done
        self._errors = []           # from the worker threads, raised at the next step() or synchronize()
        # Seconds since construction, by where they went (timings()), added under a lock: the held GPU
        # share's updates run in the thread that completes their gradient.
        self._time_lock = threading.Lock()
        self._seconds = dict.fromkeys(("hook_waited", "copy_waited", "accumulating", "updating", "update_kernels",
                                       "update_leases", "update_copies", "forward_waited", "step_waited"), 0.0)
        self._skipped_params = 0    # non-finite gradients without clipping, since the last step()
        self._arrivals, self._updates = queue.Queue(), _ForwardOrder()
        self._workers = [
            threading.Thread(target=self._serve, name="tierd-grads", daemon=True,
                             args=(self._arrivals, self._take_gradient, lambda item: item[0].consumed.set())),
            threading.Thread(target=self._serve, name="tierd-updates", daemon=True,
                             args=(self._updates, self._run_update, lambda item: item[0].weights_ready.set()))]
        for w in self._workers:
            w.start()
        _live.add(self)
        self._hooks = [s.param.register_post_accumulate_grad_hook(self._gradient_ready) for s in self._slots]
        self._pre_hook = torch.nn.modules.module.register_module_forward_pre_hook(self._before_forward)
        # An offloaded model acquires a unit's parameters before its inner modules' forwards (and
        # this hook) run: it waits for their updates first, through this.
        self._offloads = {id(h): h for s in self._slots if (h := getattr(s.param, "_tierd_offload", (None,))[0])}
        for handle in self._offloads.values():
            handle.waits.append(self._wait_for_offloaded)

    def _trainable(self):
        return list({id(p): p for g in self.param_groups for p in g["params"] if p.requires_grad}.values())

    def _gpu_share(self, share, client):
        """The ids of the parameters stepped on the GPU: whole parameters in the order given, from
        the first, until they hold at least `share` of the values. Left on the host: a parameter
        that is not contiguous or not bf16/fp32, and one offload() holds in another session or as
        fp32 (its weights are not the step's to write there)."""
        params = self._trainable()
        total, chosen, taken = sum(p.numel() for p in params), set(), 0
        for p in params:
            if taken >= share * total or share == 0:
                break
            offloaded = getattr(p, "_tierd_offload", None)  # its weights in a lease, p a placeholder
            if offloaded is None and (not p.is_contiguous() or p.dtype not in (torch.bfloat16, torch.float32)):
                continue
            if offloaded is not None and (p.dtype != torch.bfloat16 or offloaded[0].client is not client):
                continue
            chosen.add(id(p))
            taken += p.numel()
        return chosen

    def _gpu_state_bytes(self, opt, on_gpu):
        """The GPU quota that keeps the state of the parameters stepped there resident: each lease
        rounded up to 4 KiB."""
        def page(n):
            return -(-n // 4096) * 4096
        total = 0
        for p in self._trainable():
            if id(p) in on_gpu:
                n = p.numel()
                moment = _tierd.moment8bit_bytes(n) if opt == "adamw8bit" else 4 * n
                grad = 2 * n if p.dtype == torch.bfloat16 and self.accumulation_steps == 1 else 4 * n
                total += page(4 * n) + page(moment) * (1 if opt == "lion" else 2) + page(grad)
        return total

    def _check_gpu_share(self, on_gpu):
        """The GPU a parameter is stepped on is tierd's: a CUDA model needs a real GPU behind tierd
        and an extension built with CUDA; a CPU model, tierd's fake GPU (tests, machines without one)."""
        for p in self._trainable():
            if id(p) not in on_gpu:
                continue
            if p.is_cuda and self.client.fake_gpu:
                raise ValueError("gpu_share: the parameters are on a CUDA device but tierd's GPU is its fake one "
                                 "(a tierd built without CUDA, or one that found no GPU): nothing can be stepped on "
                                 "the GPU through it; use gpu_share=0")
            if p.is_cuda and not _tierd.has_cuda:
                raise ValueError("gpu_share: this tierd package was built without a CUDA toolkit, so it has no GPU "
                                 "steps; rebuild it where nvcc is, or use gpu_share=0")
            if not p.is_cuda and not self.client.fake_gpu:
                raise ValueError(f"gpu_share: the parameters are on {p.device}, not a CUDA device: a GPU step would "
                                 "leave their weights on the GPU; move the model to CUDA or use gpu_share=0")

    def _state_needs(self, opt, leased):
        """What the whole state asks of tierd, for an error: parameters, values, bytes."""
        params = self._trainable()
        values = sum(p.numel() for p in params)
        moments = {"adamw": 8.0, "adamw8bit": 2.0 + 8.0 / 256, "lion": 4.0}[opt]
        grad = sum(p.numel() * (2 if p.dtype == torch.bfloat16 and self.accumulation_steps == 1 else 4) for p in params)
        total = values * (4 + moments) + grad
        return (f"tierd.torch.OffloadOptimizer ({opt}): the state of {len(params)} parameters ({values:,} values) "
                f"needs {_size(total)} of the session's DRAM and NVMe quota (an fp32 master weight, "
                f"{moments:g} B of moments and a {'bf16' if grad < 4 * values else 'fp32'} gradient a value); "
                f"leasing parameter {leased} of them failed (dram=/nvme= set the quota)")

    def _pin_arena(self):
        """Registers the session's DRAM arena with CUDA, so gradients land straight in their fp32
        accumulators and fp32 weights leave straight from the master copy, at pinned speed."""
        base, size = self.client.dram_arena()
        rc = torch.cuda.cudart().cudaHostRegister(base, size, 0)
        if int(rc) != 0:
            warnings.warn(f"tierd.torch: CUDA could not pin the session's DRAM arena ({size / 2**30:.1f} GiB, error "
                          f"{int(rc)}): gradients and weights go through pinned staging buffers instead")
            return None
        return base

    # ---- leases as tensors, each held only while used, so tierd may move it in between ----

    def _held(self, tensor, access):
        return _Held(self.client, tensor, access)

    def _fill_state(self, slot, weights, moments=None, master=None):
        with self._held(slot.master, "overwrite") as m:
            m.copy_(master if master is not None else weights.reshape(-1).float())
        for k, lease in enumerate(slot.moments):
            with self._held(lease, "overwrite") as t:
                if moments is None:
                    t.zero_()
                else:
                    t.copy_(moments[k])

    def _raise_errors(self):
        if self._errors:
            e = self._errors[0]
            self._errors.clear()
            raise RuntimeError(f"tierd.torch: the optimizer's work in its threads failed: {e}") from e

    # ---- gradients: off the GPU at once, accumulated on the host ----

    def _gradient_ready(self, p):
        slot = self._by_param[id(p)]
        g = p.grad
        if g is None:  # another hook took it
            return
        if not slot.consumed.is_set():
            start = time.perf_counter()
            slot.consumed.wait()  # the last micro-batch's gradient is out of grad_in
            self._spend("hook_waited", time.perf_counter() - start)
        slot.consumed.clear()
        if slot.updated_early or (slot.grad_dtype == "bf16" and slot.arrivals > 0):
            # More micro-batches than accumulation_steps said: the update has taken the accumulator,
            # or a one-gradient bf16 lease would be overwritten. Nothing is touched; step() says so.
            self._arrivals.put((slot, None, "late"))
            p.grad = None
            return
        if slot.on_gpu:
            self._gradient_on_gpu(slot, g)
            p.grad = None
            return
        direct = False
        if g.is_cuda:
            compute = torch.cuda.current_stream(g.device)
            slot.read_until = torch.cuda.Event()
            slot.read_until.record(compute)  # kernels queued so far may still read the old weights
            self._d2h.wait_stream(compute)
            # The step's first fp32 gradient goes straight into its accumulator (the arena is pinned),
            # a bf16 one kept as bf16 into its lease; the norm taken on the GPU: no pass over it on
            # the host.
            direct = slot.grad_dtype == "bf16" or (
                self._registered is not None and g.dtype == torch.float32 and slot.arrivals == 0)
            with torch.cuda.stream(self._d2h):
                if direct:
                    accumulator = as_tensor(self.client.acquire(slot.grad, "overwrite", "host"))
                    norm = torch.linalg.vector_norm(g.reshape(-1), dtype=torch.float32)
                    accumulator.copy_(g.reshape(-1), non_blocking=True)
                    slot.norm_in.copy_(norm.reshape(1), non_blocking=True)
                else:
                    slot.grad_in.copy_(g.reshape(-1), non_blocking=True)
                event = torch.cuda.Event(blocking=True)  # its waiter sleeps: spinning took a core the host step uses
                event.record(self._d2h)
            g.record_stream(self._d2h)  # the caching allocator keeps it until the copy is done
        elif slot.grad_dtype == "bf16":
            direct, event = True, None
            accumulator = as_tensor(self.client.acquire(slot.grad, "overwrite", "host"))
            accumulator.copy_(g.reshape(-1))
            slot.norm_in.copy_(torch.linalg.vector_norm(g.reshape(-1), dtype=torch.float32).reshape(1))
        else:
            slot.grad_in.copy_(g.reshape(-1))
            event = None
        p.grad = None
        self._arrivals.put((slot, event, "direct" if direct else "staged"))

    def _gradient_on_gpu(self, slot, g):
        """A gradient of a parameter stepped on the GPU goes into its accumulator lease there (copied,
        or added in fp32), on the compute stream; only its norm leaves the GPU, taken as the host
        path takes it (fp32 from a bf16 or first direct gradient, else float64 as the host's sums)."""
        first = slot.arrivals == 0
        if self._hold_share:
            self._share_views(slot)
            acc = slot.held_grad
        else:
            try:
                acc = as_tensor(self.client.acquire(slot.grad, "overwrite" if first else "write", "gpu"))
            except tierd.TierdError as e:
                raise self._gpu_quota_error(e, slot, "its gradient") from e
        wide = slot.grad_dtype == "bf16" or (g.is_cuda and self._registered is not None and first and
                                             g.dtype == torch.float32)  # the host path's "direct" cases
        compute = torch.cuda.current_stream(g.device) if g.is_cuda else None
        if compute is not None:
            self._wait_for(slot)  # its last update (on the GPU steps' stream) has read the accumulator
            slot.read_until = torch.cuda.Event()
            slot.read_until.record(compute)  # kernels queued so far may still read the old weights
        source = g.reshape(-1)
        if first:
            acc.copy_(source)
        else:
            acc.add_(source)
        norm = torch.linalg.vector_norm(acc, dtype=torch.float32 if wide else torch.float64)
        slot.norm_in.copy_(norm.double().reshape(1), non_blocking=compute is not None)
        del acc
        event = None
        if compute is not None:
            event = torch.cuda.Event(blocking=True)
            event.record(compute)
        if not self._hold_share:
            self.client.release(slot.grad, compute)
        self._arrivals.put((slot, event, "gpu"))

    def _share_views(self, slot):
        """A GPU-share slot's held Views (master, grad, *moments), acquired on the GPU at its first
        use after construction or a checkpoint (_let_go_of_share)."""
        if slot.held is None:
            items = [(slot.master, "write"), (slot.grad, "write")] + [(x, "write") for x in slot.moments]
            try:
                slot.held = self.client.acquire_all(items, "gpu")
            except tierd.TierdError as e:
                raise self._gpu_quota_error(e, slot, "its state") from e
            slot.held_grad = as_tensor(slot.held[1]).reshape(-1)
        return slot.held

    def _let_go_of_share(self):
        """Releases the share's held leases (after the GPU steps' queued work), so the host may read
        or write them: checkpoints, close(). The next step acquires them again."""
        held = [s for s in self._slots if s.held is not None]
        for s in held:
            s.held = s.held_grad = None
        if held:
            self.client.release_all([x for s in held for x in [s.master, s.grad] + s.moments], self._gpu_steps)

    def _gpu_quota_error(self, e, slot, what):
        need = self._gpu_state_bytes(self.opt, {id(slot.param)})
        return tierd._error_in_context(
            e, f"tierd.torch.OffloadOptimizer: parameter {slot.index} ({tuple(slot.param.shape)}) is stepped on the "
               f"GPU (gpu_share), and tierd could not place {what} there: its state and gradient need "
               f"{_size(need)} of the session's GPU quota at once (gpu= sets it)")

    def _serve(self, items, handle, done):
        """A worker thread's loop: handle(item) for each item of the queue until None; an error is
        kept for the next step() or synchronize(); done(item) whatever happened."""
        while True:
            item = items.get()
            try:
                if item is None:
                    return
                handle(item)
            except BaseException as e:
                self._errors.append(e)
            finally:
                if item is not None:
                    done(item)
                items.task_done()

    def _take_gradient(self, item):
        slot, event, kind = item
        start = time.perf_counter()
        if event is not None:
            event.synchronize()
        copied = time.perf_counter()
        if kind == "direct":
            self.client.release(slot.grad)
            self._arrived(slot, float(slot.norm_in[0]) ** 2)
        elif kind == "gpu":
            self._arrived(slot, float(slot.norm_in[0]) ** 2)
        elif kind == "late":
            self._too_many(slot)
        else:
            self._accumulate(slot)
        self._spend("copy_waited", copied - start)
        self._spend("accumulating", time.perf_counter() - copied)

    def _accumulate(self, slot):
        dtype = tierd.dtype_name(slot.grad_in.dtype)
        first = slot.arrivals == 0
        with self._held(slot.grad, "overwrite" if first else "write") as acc:
            source = slot.grad_in if dtype in ("f32", "bf16") else slot.grad_in.float()
            sum_squares = _tierd.accumulate(acc.data_ptr(), source.data_ptr(), "bf16" if dtype == "bf16" else "f32",
                                            slot.n, first, self.threads)
        self._arrived(slot, sum_squares)

    def _too_many(self, slot):
        raise RuntimeError(f"parameter {slot.index} ({tuple(slot.param.shape)}) got gradient {slot.arrivals + 1} of a "
                           f"step with accumulation_steps={self.accumulation_steps}: pass "
                           "accumulation_steps=<micro-batches a step>")

    def _arrived(self, slot, sum_squares):
        """A gradient is in the slot's accumulator, whose sum of squares is now `sum_squares`."""
        if slot.updated_early:
            self._too_many(slot)
        slot.sum_squares = sum_squares
        slot.arrivals += 1
        if self.max_grad_norm is None and slot.arrivals == self.accumulation_steps:
            slot.updated_early = True
            if math.isfinite(slot.sum_squares):
                self._queue_update(slot, 1.0)
            else:
                self._skipped_params += 1
                slot.arrivals = 0

    # ---- updates: on the host, in order, each weight back to the GPU at once ----

    def _queue_update(self, slot, scale):
        slot.arrivals = 0  # the accumulator is the update's until it is done
        slot.weights_ready.clear()
        g = slot.group  # the group's settings now: a scheduler may change them before the update runs
        item = (slot, scale, (g["lr"], tuple(g["betas"]), g["eps"], g["weight_decay"]))
        if slot.on_gpu and self._hold_share:
            # Its update only queues GPU kernels (no lease calls): at once, here, rather than in the
            # update thread behind a host step (the next forward's first layers are the share's).
            try:
                self._run_update(item)
            finally:
                slot.weights_ready.set()
            return
        self._updates.put(item)

    def _run_update(self, item):
        start = time.perf_counter()
        self._update(*item)
        self._spend("updating", time.perf_counter() - start)

    def _update(self, s, scale, settings):
        if s.on_gpu:
            return self._update_on_gpu(s, scale, settings)
        bf16_out = s.param.dtype == torch.bfloat16
        s.step += 1
        # fp32 weights leave straight from the master copy (the arena is pinned), which stays
        # acquired until that copy is done.
        offloaded = getattr(s.param, "_tierd_offload", None)
        direct = (self._registered is not None and s.param.is_cuda and s.param.dtype == torch.float32
                  and offloaded is None)
        # An offloaded bf16 parameter's new weights go straight into its lease (no staging copy),
        # where it shares the optimizer's session.
        into_lease = offloaded is not None and bf16_out and offloaded[0].client is self.client
        items = [(s.master, "write"), (s.grad, "read")] + [(x, "write") for x in s.moments]
        if into_lease:
            offloaded[0].wait_idle(offloaded[1])
            items.append((offloaded[1].lease, "overwrite"))
        # The master weight, the gradient, the moments (and the weights' lease) in one exchange.
        views = self._exchange(self.client.acquire_all, items)
        master = as_tensor(views[0]).reshape(-1)
        held = [s.master, s.grad] + s.moments + ([offloaded[1].lease] if into_lease else [])
        try:
            grad = views[1].data_ptr
            m, *v = [x.data_ptr for x in views[2:2 + len(s.moments)]]
            out = views[-1].data_ptr if into_lease else s.weights_out.data_ptr() if bf16_out and not direct else 0
            self._host_step(s, scale, settings, master.data_ptr(), m, v[0] if v else 0, out, grad)
        except BaseException:
            del master, views
            self.client.release_all(held)
            raise
        del views
        if into_lease:  # tierd brings them to the GPU for the next forward
            del master
            self._exchange(self.client.release_all, held)
            return
        if direct:
            self._exchange(self.client.release_all, [s.grad] + s.moments)  # the master: once its weights have left
            self._weights_to_device(s, source=master)
            self._release_later.append((s.copied_back, s.master))
            while len(self._release_later) > 4:
                self._release_copied()
            return
        if not bf16_out:
            s.weights_out.copy_(master)
        del master
        self._exchange(self.client.release_all, [s.master, s.grad] + s.moments)
        self._weights_to_device(s)

    def _exchange(self, call, *args):
        """acquire_all / release_all for an update, its time in update_leases."""
        start = time.perf_counter()
        try:
            return call(*args)
        finally:
            self._spend("update_leases", time.perf_counter() - start)

    def _host_step(self, s, scale, settings, master, m, v, out, grad):
        """The host's kernel for s.opt on host arrays (addresses); `out`: bf16 weights (0: none)."""
        lr, (beta1, beta2), eps, wd = settings
        decay = wd > 0
        start = time.perf_counter()
        if self.opt == "lion":
            _tierd.lion(master, m, out, grad, s.n, lr, beta1, beta2, wd, scale, decay, self.threads, s.grad_dtype)
        elif self.opt == "adamw":
            _tierd.adamw(master, m, v, out, grad, s.n, lr, beta1, beta2, eps, wd, s.step, scale, decay, self.threads,
                         s.grad_dtype)
        else:
            _tierd.adamw8bit(master, m, v, out, grad, s.n, lr, beta1, beta2, eps, wd, s.step, scale, decay,
                             self.threads, s.grad_dtype)
        self._spend("update_kernels", time.perf_counter() - start)

    def _update_on_gpu(self, s, scale, settings):
        """A parameter stepped on the GPU: its master, gradient and moments (and an offloaded
        parameter's weights lease) acquired there in one exchange, the step queued on the GPU steps'
        stream after the compute stream's last reads of the old weights, the new bf16 weights
        written straight into the parameter, everything released after the step. On tierd's fake
        GPU (a CPU model) the leases are host memory and the host's kernel steps them."""
        lr, (beta1, beta2), eps, wd = settings
        s.step += 1
        offloaded = getattr(s.param, "_tierd_offload", None)
        if self._hold_share:  # no offloaded parameter: their leases are another session's (_gpu_share)
            views, held = self._share_views(s), []
        else:
            items = [(s.master, "write"), (s.grad, "read")] + [(x, "write") for x in s.moments]
            held = [s.master, s.grad] + s.moments
            if offloaded is not None:  # bf16 in this session (_gpu_share): the step writes its lease
                offloaded[0].wait_idle(offloaded[1])
                items.append((offloaded[1].lease, "overwrite"))
                held.append(offloaded[1].lease)
            try:
                views = self._exchange(self.client.acquire_all, items, "gpu")
            except tierd.TierdError as e:
                raise self._gpu_quota_error(e, s, "its state") from e
        master, grad = views[0].data_ptr, views[1].data_ptr
        m, v = views[2].data_ptr, views[3].data_ptr if len(s.moments) > 1 else 0
        bf16 = s.param.dtype == torch.bfloat16
        out = views[-1].data_ptr if offloaded is not None else s.param.data_ptr() if bf16 else 0
        stream = self._gpu_steps
        try:
            if stream is None:  # tierd's fake GPU
                self._host_step(s, scale, settings, master, m, v, out, grad)
                if not bf16:
                    s.param.data.view(-1).copy_(as_tensor(views[0]).reshape(-1))
            else:
                start = time.perf_counter()
                if s.read_until is not None:
                    stream.wait_event(s.read_until)
                _tierd.gpu_step(self.opt, master, m, v, out, grad, s.n, lr, beta1, beta2, eps, wd, s.step, scale,
                                wd > 0, s.grad_dtype, stream.cuda_stream)
                if not bf16:
                    with torch.cuda.stream(stream):
                        s.param.data.view(-1).copy_(as_tensor(views[0]).reshape(-1))
                event = torch.cuda.Event(blocking=True)
                event.record(stream)
                s.copied_back = event  # the next forward waits for it (_wait_for)
                self._spend("update_kernels", time.perf_counter() - start)
        finally:
            del views
            if held:
                self._exchange(self.client.release_all, held, stream)

    def _weights_to_device(self, s, source=None):
        start = time.perf_counter()
        try:
            self._weights_to_device_now(s, source)
        finally:
            self._spend("update_copies", time.perf_counter() - start)

    def _weights_to_device_now(self, s, source):
        offloaded = getattr(s.param, "_tierd_offload", None)
        if offloaded is not None:  # into its lease: tierd brings it to the GPU for the next forward
            source = s.weights_out if source is None else source
            offloaded[0].write_weights(offloaded[1], lambda host: host.copy_(source))
            return
        self._copy_to_param(s, source)

    def _release_copied(self):
        event, lease = self._release_later.pop(0)
        event.synchronize()
        self.client.release(lease)

    def _copy_to_param(self, s, source=None):
        p = s.param
        source = s.weights_out if source is None else source
        if p.is_cuda:
            with torch.cuda.stream(self._h2d):
                if s.read_until is not None:
                    self._h2d.wait_event(s.read_until)  # no kernel still reads the old weights
                p.data.view(-1).copy_(source, non_blocking=True)
                event = torch.cuda.Event(blocking=True)
                event.record(self._h2d)
            s.copied_back = event
        else:
            p.data.view(-1).copy_(source)

    def _wait_for(self, s):
        s.weights_ready.wait()
        event, s.copied_back = s.copied_back, None
        if event is not None:
            torch.cuda.current_stream(s.param.device).wait_event(event)

    def _before_forward(self, module, args):
        if _is_compiling():
            return  # traced into a compiled module: the eager call around it waited (below)
        for p in _params_used_by(module):
            s = self._by_param.get(id(p))
            if s is not None and (s.copied_back is not None or not s.weights_ready.is_set()):
                start = time.perf_counter()
                self._wait_for(s)
                self._spend("forward_waited", time.perf_counter() - start)

    def _wait_for_offloaded(self, offload_slots):
        for o in offload_slots:
            s = self._by_param.get(id(o.param))
            if s is not None and (s.copied_back is not None or not s.weights_ready.is_set()):
                start = time.perf_counter()
                self._wait_for(s)  # a step on the GPU: the compute stream waits for its kernel
                self._spend("forward_waited", time.perf_counter() - start)

    def _spend(self, key, seconds):
        with self._time_lock:
            self._seconds[key] += seconds

    def timings(self):
        """Seconds since construction by where they went, to find what bounds a step: the
        backward's hooks waiting for a slot's last gradient to leave its staging buffer
        (hook_waited), the gradient thread waiting for copies off the GPU (copy_waited) and adding
        them up (accumulating; with a GPU share held across steps, its updates too, which the gradient
        thread queues at once), the updates (updating: the update thread's, and a held share's queued by
        the gradient thread or step(); of it, update_kernels in the host's
        optimizer kernels themselves, or queueing the GPU's for a parameter stepped there; update_leases in
        acquiring and releasing the update's leases; update_copies in queueing the new weights' copies to
        the device, or writing them into an offloaded parameter's lease), forwards waiting for their
        parameters' updates (forward_waited), step() waiting for the gradients (step_waited)."""
        with self._time_lock:
            return dict(self._seconds)

    def synchronize(self):
        """Wait until every queued update is done and its weights are on the device (ordered
        before the current stream's next work)."""
        self._updates.join()
        while self._release_later:
            self._release_copied()
        for s in self._slots:
            self._wait_for(s)
        self._raise_errors()

    # ---- the step ----

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        start = time.perf_counter()
        self._arrivals.join()  # every gradient of the step accumulated
        self._spend("step_waited", time.perf_counter() - start)
        self._raise_errors()
        if self._h2d is not None:
            self._h2d.wait_stream(torch.cuda.current_stream())
        arrived = [s for s in self._slots if s.arrivals > 0]
        norm = math.sqrt(sum(s.sum_squares for s in self._slots if s.arrivals > 0 or s.updated_early))
        for s in self._slots:
            s.updated_early = False
        self.last_grad_norm = norm
        if self.max_grad_norm is None:
            if self._skipped_params:
                warnings.warn(f"tierd.torch: {self._skipped_params} parameters had non-finite gradients: their "
                              "weights were kept this step")
                self._skipped_params = 0
            for s in arrived:  # fewer micro-batches than accumulation_steps: their updates start now
                self._queue_update(s, 1.0)
        elif not math.isfinite(norm):
            self.skipped_steps += 1
            warnings.warn(f"tierd.torch: the gradients' norm is {norm}: step skipped, nothing changed "
                          f"({self.skipped_steps} skipped so far)")
            for s in arrived:
                s.arrivals = 0
        else:
            scale = min(1.0, self.max_grad_norm / (norm + 1e-6))
            for s in arrived:
                self._queue_update(s, scale)
        if not self.overlap:
            self.synchronize()
        return loss

    def zero_grad(self, set_to_none=True):
        """Gradients live on the host between steps, and a step consumes them; this drops any
        that arrived since (a micro-batch thrown away)."""
        self._arrivals.join()
        for s in self._slots:
            if s.weights_ready.is_set():
                s.arrivals = 0
            s.param.grad = None

    # ---- checkpoints ----

    def state_dict(self):
        self._arrivals.join()
        self.synchronize()
        self._let_go_of_share()
        state = {}
        for s in self._slots:
            with self._held(s.master, "read") as m:
                entry = {"step": s.step, "master": m.clone()}
            entry["moments"] = []
            for lease in s.moments:
                with self._held(lease, "read") as t:
                    entry["moments"].append(t.clone())
            state[s.index] = entry
        groups = [{k: v for k, v in g.items() if k != "params"} for g in self.param_groups]
        for g, group in zip(groups, self.param_groups):
            g["params"] = [self._by_param[id(p)].index for p in group["params"] if id(p) in self._by_param]
        return {"state": state, "param_groups": groups,
                "tierd": {"opt": self.opt, "max_grad_norm": self.max_grad_norm, "skipped_steps": self.skipped_steps}}

    def load_state_dict(self, state_dict):
        self._arrivals.join()
        self.synchronize()
        self._let_go_of_share()
        saved = state_dict.get("tierd", {})
        if saved.get("opt", self.opt) != self.opt:
            raise ValueError(f"this checkpoint is of a {saved['opt']} optimizer, not {self.opt}")
        if len(state_dict["state"]) != len(self._slots):
            raise ValueError(f"this checkpoint holds {len(state_dict['state'])} parameters' state, this optimizer "
                             f"{len(self._slots)}")
        for s in self._slots:
            entry = state_dict["state"][s.index]
            if entry["master"].numel() != s.n:
                raise ValueError(f"parameter {s.index}: the checkpoint has {entry['master'].numel()} values, the "
                                 f"model {s.n}")
        if self._h2d is not None:
            self._h2d.wait_stream(torch.cuda.current_stream())
        for s in self._slots:
            entry = state_dict["state"][s.index]
            self._fill_state(s, None, entry["moments"], entry["master"])
            s.step, s.arrivals, s.read_until = entry["step"], 0, None
            with self._held(s.master, "read") as m:
                s.weights_out.copy_(m)
            self._weights_to_device(s)
        for g, saved_group in zip(self.param_groups, state_dict["param_groups"]):
            g.update({k: v for k, v in saved_group.items() if k != "params"})
        self.skipped_steps = saved.get("skipped_steps", 0)
        self.synchronize()

    def close(self):
        """Removes its hooks and ends its tierd session (its leases go with it), unless the client
        was given: then its leases are given back and the client stays open."""
        self._arrivals.join()
        self.synchronize()
        self._stop_workers()
        try:
            self._let_go_of_share()
        except tierd.TierdError:
            if not self._own_client:
                raise
            # the session ends below, its leases with it
        for h in self._hooks:
            h.remove()
        self._pre_hook.remove()
        for handle in self._offloads.values():
            handle.waits.remove(self._wait_for_offloaded)
        if self._registered is not None:
            torch.cuda.cudart().cudaHostUnregister(self._registered)
            self._registered = None
        if self._own_client:
            self.client.close()
            return
        for s in self._slots:
            for lease in [s.master, s.grad] + s.moments:
                self.client.unlease(lease)

    def _stop_workers(self):
        """Its threads end once the work queued is done (each queue's last item)."""
        if all(not w.is_alive() for w in self._workers):
            return
        self._arrivals.put(None)
        self._updates.put(None)
        for w in self._workers:
            w.join()


def trainer_callback(optimizer):
    """A transformers.TrainerCallback for a Trainer handed `optimizer` (an OffloadOptimizer) through
    optimizers=(optimizer, scheduler): at the start of training it refuses the Trainer's own clipping
    (TrainingArguments.max_grad_norm > 0 clips gradients the optimizer has already taken off the
    GPU, so nothing: clipping silently off) and a gradient accumulation other than the optimizer's,
    saying what to pass instead.

        trainer = transformers.Trainer(..., optimizers=(opt, None), callbacks=[tierd.torch.trainer_callback(opt)])
    """
    import transformers

    class _Check(transformers.TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            if args.max_grad_norm is not None and args.max_grad_norm > 0:
                raise ValueError(
                    f"TrainingArguments(max_grad_norm={args.max_grad_norm}) would clip gradients that "
                    "tierd.torch.OffloadOptimizer has already taken off the GPU (nothing would be clipped): pass "
                    f"max_grad_norm=0 to the Trainer and OffloadOptimizer(max_grad_norm={args.max_grad_norm}) "
                    f"instead (it has {optimizer.max_grad_norm})")
            if args.gradient_accumulation_steps != optimizer.accumulation_steps:
                raise ValueError(
                    f"TrainingArguments(gradient_accumulation_steps={args.gradient_accumulation_steps}) but "
                    f"OffloadOptimizer(accumulation_steps={optimizer.accumulation_steps}): give both the same")

    return _Check()


# The workers are daemon threads (a script that forgets close() still exits), so at exit they
# are stopped while Python still runs: one stopped by the interpreter inside a host step would
# unwind through its C++ thread pool and abort the process ("terminate called without an active
# exception") after, say, an exception in the training loop.
_live = weakref.WeakSet()


@atexit.register
def _stop_at_exit():
    for opt in list(_live):
        opt._stop_workers()


# torch.compiler.is_compiling from torch 2.3; before it the hook is traced as it is (guards on each
# parameter it reads, so more recompiles), still correct.
_is_compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None) or (lambda: False)


def _compiled(module):
    return getattr(module, "_compiled_call_impl", None) is not None or isinstance(module, _optimized_module())


@functools.lru_cache(maxsize=None)
def _optimized_module():  # the class torch.compile(module) returns, imported once, on first use
    from torch._dynamo.eval_frame import OptimizedModule
    return OptimizedModule


def _params_used_by(module):
    """The parameters a module's forward reads that no hook of ours will see run eagerly: its own,
    and, of a module torch.compile runs (the wrapper torch.compile(m) returns, or a child compiled
    in place by m.compile(), directly or in a ModuleList or ModuleDict, whose call runs compiled
    from this module's forward), all of them."""
    if isinstance(module, _optimized_module()):
        return list(module.parameters())
    found = list(module.parameters(recurse=False))
    children = list(module.children())
    while children:
        child = children.pop()
        if _compiled(child):
            found.extend(child.parameters())
        elif isinstance(child, (torch.nn.ModuleList, torch.nn.ModuleDict)):  # never called: its members are
            children.extend(child.children())
    return found


class _ForwardOrder(queue.PriorityQueue):
    """The updates waiting, taken by their parameter's place in the model (the next forward's order)
    rather than as the backward queued them (last layer first): when the backward ends with updates
    still waiting, the first layers' come first, so the next forward starts while the rest run.
    None, the end, comes after everything queued."""

    def __init__(self):
        super().__init__()
        self._queued = itertools.count()

    def put(self, item):
        super().put((math.inf if item is None else item[0].index, next(self._queued), item))

    def get(self):
        return super().get()[2]


class _Held:
    """A lease acquired on the host as a flat torch tensor for a `with` block, then released."""

    def __init__(self, client, tensor, access):
        self.client, self.tensor, self.access = client, tensor, access

    def __enter__(self):
        view = self.client.acquire(self.tensor, self.access, "host")
        self.t = as_tensor(view).reshape(-1)
        return self.t

    def __exit__(self, *exc):
        if hasattr(self, "t"):  # acquired
            del self.t
            self.client.release(self.tensor)
        return False
