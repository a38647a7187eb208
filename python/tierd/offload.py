"""tierd.torch.offload(model): the model's parameters live in tierd, not in the GPU's memory.

    model = LlamaForCausalLM(config)                       # on the GPU, or built on the CPU
    weights = tierd.torch.offload(model, gpu="16GiB", dram="96GiB", nvme="200GiB")
    opt = tierd.torch.OffloadOptimizer(model.parameters(), client=weights.client, ...)

Each parameter becomes a lease of tierd's (class param, its dtype and shape), filled from the
model once. A module's parameters are acquired on the GPU just before its forward and released
after it; the tensors autograd saves for the backward are packed as references to their leases
(torch.autograd.graph.saved_tensors_hooks) and acquired again when the backward unpacks them, and
released once the parameter's gradient is accumulated. Between uses a parameter is a one-element
placeholder expanded to its shape: the GPU holds only what tierd keeps there, within the session's
GPU quota; tierd moves the rest when it is acquired (its online policy). OffloadOptimizer writes
each new weight into its lease.

Activation checkpointing (torch.utils.checkpoint, non-reentrant) works: a module's forward run
again by the backward keeps its weights acquired until their gradients are in.

plan=True registers the first iteration's order of parameter uses as tierd's graph (one op per
module forward and per backward use, timed) and says each op's start from then on, so tierd moves
the weights ahead of need (mark_iteration's recording did not work here: the optimizer's writes,
from its own threads, fell anywhere in the recorded iteration). On the H200 box it gave 1.10x at
1.3B (2026-12-04; 7B not yet measured validly); not the default.

torch.compile of the model's blocks works with units= (the blocks, a ModuleList of them, or their
class): a unit acquires its whole subtree's parameters in hooks that run eagerly around the
compiled code (graph breaks at the unit's edges only), so its body compiles as the same block in
place would; the same bits as the compiled model in place (tested on the CPU, both m.compile() and
torch.compile(m)). Without units, each module holding parameters is acquired on its own, which
inside a compiled block is a graph break at every such module. torch.compile of the whole model
is not supported (the hooks at the model's edges would then run traced).
"""

import math
import threading
import time
import warnings

import torch

import tierd


class _Param:
    """One parameter's lease and its uses (forward and backward) under way."""

    def __init__(self, param, lease, name):
        self.param, self.lease, self.name = param, lease, name
        self.shape, self.dtype = tuple(param.shape), param.dtype
        self.uses = 0             # acquisitions of the lease not yet released
        self.backward_uses = 0    # of those, by the backward's unpacking
        self.tensor = None        # the lease's bytes while acquired
        self.idle = threading.Event()
        self.idle.set()
        self.placeholder = torch.empty(1, dtype=param.dtype, device=param.device).expand(param.shape)


class _StepPlan:
    """tierd's planner for an offloaded model: the first iteration (a forward with gradients and
    its backward) is recorded as the order of the parameters' uses, one op per module forward and
    per backward use, timed; at the second it is registered as the session's graph, and from then
    on each op's start is said (op_begin) so tierd moves weights ahead of it. An iteration whose
    order departs from the first's stops the following (said once): tierd's online policy goes on."""

    def __init__(self, client):
        self.client, self.state, self.ops, self.position = client, "idle", [], 0
        self.prediction = None

    def iteration(self, slots):
        if self.state == "idle":
            self.state, self.ops = "recording", []
        elif self.state == "recording":
            self._register(slots)
        self.position = 0

    def op(self, key, slots):
        if self.state == "recording":
            self.ops.append((key, [s.lease.name for s in slots], time.perf_counter()))
        elif self.state == "following":
            if self.position < len(self.ops) and self.ops[self.position][0] == key:
                self.client.op_begin(self.position)
                self.position += 1
            else:
                self.state = "off"
                warnings.warn(f"tierd.torch.offload: this iteration's order of parameter uses departs from the "
                              f"first's at op {self.position} ({key[0]}): tierd's plan is no longer followed")

    def _register(self, slots):
        self.state = "off"
        if not self.ops:
            return
        starts = [t for _, _, t in self.ops] + [time.perf_counter()]
        ops = [{"name": f"{key[0]} {key[1]}", "seconds": max(1e-6, starts[i + 1] - starts[i]), "reads": names}
               for i, (key, names, _) in enumerate(self.ops)]
        tensors = [{"name": s.lease.name, "bytes": s.lease.nbytes} for s in slots]
        try:
            self.prediction = self.client.register_graph(tensors, ops)
        except tierd.TierdError as e:  # training goes on under tierd's online policy
            warnings.warn(f"tierd.torch.offload: tierd cannot plan this model's steps ({e}); its online policy "
                          "moves the weights instead")
            return
        self.state = "following"


class _Saved:
    """What autograd keeps instead of a tensor that is a parameter's bytes (or a view of them)."""

    __slots__ = ("slot", "shape", "stride", "offset")

    def __init__(self, slot, t):
        self.slot, self.shape, self.stride, self.offset = slot, t.shape, t.stride(), t.storage_offset()


class Offloaded:
    """The handle offload() returns: the session (client), the parameters' leases, and the
    model's weights as CPU tensors (state_dict) while they live in tierd."""

    def __init__(self, model, client, name, place, plan=False, units=None):
        self.model, self.client, self.place = model, client, place
        self.plan = _StepPlan(client) if plan else None
        self._names = {id(m): n or "model" for n, m in model.named_modules()}
        self._lock = threading.Lock()
        self._slots, self._by_param, self._by_pointer = [], {}, {}
        self._handles = []
        self.waits = []  # fn(slots) before slots are acquired for a forward: an optimizer's updates still to come
        named = list(model.named_parameters(remove_duplicate=True))
        for fqn, p in named:
            try:
                lease = client.lease(f"{name}.{fqn}", tuple(p.shape) or (1,), str(p.dtype), "param")
            except tierd.TierdError as e:
                total = sum(q.numel() * q.element_size() for _, q in named)
                raise tierd._error_in_context(
                    e, f"tierd.torch.offload: the model's {len(named)} parameters need {total / 2**20:,.1f} MiB in the "
                       f"session's tiers; leasing {fqn} ({len(self._slots)} leased before it) failed "
                       "(gpu=/dram=/nvme= set the quotas)") from e
            slot = _Param(p, lease, fqn)
            with torch.no_grad():
                host = torch.utils.dlpack.from_dlpack(client.acquire(lease, "overwrite", "host"))
                host.view(p.dtype).reshape(p.shape).copy_(p.detach().cpu())
                del host
            client.release(lease)
            p.data = slot.placeholder
            p._tierd_offload = (self, slot)
            self._slots.append(slot)
            self._by_param[id(p)] = slot
            if p.requires_grad:
                self._handles.append(p.register_post_accumulate_grad_hook(self._gradient_accumulated))
        # Which modules acquire which parameters: each unit its whole subtree's, any other module
        # its own (those not inside a unit).
        self._hook_slots = {}
        inside = set()
        self._units = set()
        for unit in _units_of(model, units):
            slots = list({id(s): s for p in unit.parameters() if (s := self._by_param.get(id(p))) is not None}.values())
            self._hook_slots[unit] = slots
            self._units.add(id(unit))
            inside.update(id(m) for m in unit.modules())
        for module in model.modules():
            if id(module) in inside:
                continue
            slots = [self._by_param[id(p)] for p in module.parameters(recurse=False) if id(p) in self._by_param]
            if slots:
                self._hook_slots[module] = slots
        # The hooks run eagerly even inside a region torch.compile traces: there they are graph
        # breaks (at a unit's edges, so the unit's body compiles whole).
        before, after = torch._dynamo.disable(self._before), torch._dynamo.disable(self._after)
        for module in self._hook_slots:
            self._handles.append(module.register_forward_pre_hook(before))
            # always_call: a forward that raises still releases what it acquired
            self._handles.append(module.register_forward_hook(after, always_call=True))
        self._handles.append(model.register_forward_pre_hook(torch._dynamo.disable(self._model_before)))
        self._handles.append(model.register_forward_hook(torch._dynamo.disable(self._model_after), always_call=True))
        self._saving = []

    # ---- acquire and release, counted ----

    def _use(self, slot, what):
        self._use_all([slot], what)
        return slot.tensor

    def _use_all(self, slots, what):
        """A use of each slot; those not held yet acquired in one exchange with tierd. Where the
        acquire fails, the uses stay counted (without bytes): the forward hook that always runs
        after a failed forward takes them back."""
        fresh = []
        with self._lock:
            for slot in slots:
                slot.uses += 1
                if slot.uses == 1:
                    slot.idle.clear()
                    fresh.append(slot)
        if not fresh:
            return
        try:
            views = self.client.acquire_all([(slot.lease, "read") for slot in fresh], self.place)
        except tierd.TierdError as e:
            size = sum(math.prod(slot.shape) * slot.dtype.itemsize for slot in fresh)
            raise tierd._error_in_context(
                e, f"tierd.torch.offload: {what} needs {len(fresh)} parameters ({size / 2**20:,.1f} MiB) on the "
                   f"{self.place} at once ({fresh[0].name}{', ...' if len(fresh) > 1 else ''}); a unit's parameters "
                   "must fit the session's GPU quota together (gpu=, or smaller units)") from e
        for slot, view in zip(fresh, views):
            t = torch.utils.dlpack.from_dlpack(view).view(slot.dtype).reshape(slot.shape)
            if t.device != slot.param.device:
                raise RuntimeError(f"tierd.torch.offload: {slot.name} came back on {t.device}, the model is on "
                                   f"{slot.param.device} (tierd's GPU is {'fake' if self.client.fake_gpu else 'real'})")
            with self._lock:
                slot.tensor = t
                self._by_pointer[t.untyped_storage().data_ptr()] = slot
                slot.param.data = t

    def _unuse(self, slot, count=1):
        self._unuse_all([slot], count)

    def _unuse_all(self, slots, count=1):
        """Ends `count` uses of each slot; those no longer used released in one exchange, after
        the kernels queued so far that read them."""
        done = []
        with self._lock:
            for slot in slots:
                slot.uses -= count
                if slot.uses > 0:
                    continue
                if slot.tensor is None:  # its acquire failed: nothing to release
                    slot.idle.set()
                    continue
                self._by_pointer.pop(slot.tensor.untyped_storage().data_ptr(), None)
                slot.param.data = slot.placeholder
                slot.tensor = None
                done.append(slot)
        if not done:
            return
        stream = torch.cuda.current_stream(done[0].param.device) if done[0].param.is_cuda else None
        try:
            self.client.release_all([slot.lease for slot in done], stream)
        finally:
            for slot in done:
                slot.idle.set()

    # ---- the hooks ----

    def _model_before(self, module, args):
        if torch.is_grad_enabled():
            hooks = torch.autograd.graph.saved_tensors_hooks(torch._dynamo.disable(self._pack),
                                                             torch._dynamo.disable(self._unpack))
            hooks.__enter__()
            self._saving.append(hooks)
            if self.plan is not None:
                self.plan.iteration(self._slots)

    def _model_after(self, module, args, out):
        if self._saving:
            self._saving.pop().__exit__(None, None, None)

    def _before(self, module, args):
        # A forward run by the backward (activation checkpointing's recomputation) saves the
        # weights themselves, outside our hooks, and may stop before its end (checkpoint's early
        # stop): its uses count as the backward's, released once the gradient is in.
        recomputing = torch.is_grad_enabled() and torch._C._current_graph_task_id() != -1
        slots = self._hook_slots[module]
        if not recomputing:
            for wait in self.waits:
                wait(slots)
        if self.plan is not None and torch.is_grad_enabled() and slots:
            self.plan.op(("recompute" if recomputing else "forward", self._names.get(id(module), "?")), slots)
        self._use_all(slots, f"the {'recomputed ' if recomputing else ''}forward of "
                             f"'{self._names.get(id(module), type(module).__name__)}'")
        if recomputing:
            for slot in slots:
                self._count_backward_use(slot)

    def _after(self, module, args, out):
        if torch.is_grad_enabled() and torch._C._current_graph_task_id() != -1:
            return  # recomputing: released with the gradient
        slots = self._hook_slots[module]
        if id(module) in self._units and torch.is_grad_enabled():
            self._acquire_before_backward(module, out, slots)
        self._unuse_all(slots)

    def _acquire_before_backward(self, module, out, slots):
        """A unit may checkpoint its own forward with its hooks outside the checkpoint (transformers
        5 checkpoints a layer's `forward`, as FSDP2 wants): the backward then recomputes it without
        running them, on the placeholders. So the unit's parameters are acquired again when the
        gradient of its output arrives, before its backward (and any recomputation) starts, as
        FSDP2 gathers its parameters; counted as backward uses, released with their gradients."""
        outputs = [t for t in _tensors_in(out) if t.requires_grad]
        if not outputs:
            return
        name = self._names.get(id(module), type(module).__name__)

        def acquire(_grads):
            if self.plan is not None:
                self.plan.op(("backward of unit", name), slots)
            try:
                self._use_all(slots, f"the backward of '{name}'")
            except BaseException:
                self._unuse_all(slots)  # no forward hook comes after a backward to take the uses back
                self._end_failed_backward()
                raise
            for slot in slots:
                self._count_backward_use(slot)
            # A parameter the forward did not use gets no gradient (and no post-accumulate hook):
            # whatever is still counted at the end of the backward is released then.
            torch.autograd.Variable._execution_engine.queue_callback(
                lambda: [self._backward_done(slot) for slot in slots])

        torch.autograd.graph.register_multi_grad_hook(outputs, torch._dynamo.disable(acquire), mode="any")

    def _count_backward_use(self, slot):
        with self._lock:
            slot.backward_uses += 1
            frozen = slot.backward_uses == 1 and not slot.param.requires_grad
        if frozen:  # no gradient hook will come: the end of the backward releases it
            torch.autograd.Variable._execution_engine.queue_callback(lambda: self._backward_done(slot))

    def _pack(self, t):
        if t.device == torch.device("meta") or t.numel() == 0:
            return t
        slot = self._by_pointer.get(t.untyped_storage().data_ptr())
        return t if slot is None else _Saved(slot, t)

    def _unpack(self, saved):
        if not isinstance(saved, _Saved):
            return saved
        slot = saved.slot
        if self.plan is not None:
            self.plan.op(("backward", slot.name), [slot])
        try:
            base = self._use(slot, f"the backward of {slot.name}")
        except BaseException:
            self._unuse(slot)
            self._end_failed_backward()
            raise
        self._count_backward_use(slot)
        return torch.as_strided(base, saved.shape, saved.stride, saved.offset)

    def _end_failed_backward(self):
        """The backward stops with an error: no more gradients will come, so what it acquired is
        released now."""
        for slot in self._slots:
            self._backward_done(slot)

    def _gradient_accumulated(self, p):
        self._backward_done(self._by_param[id(p)])

    def _backward_done(self, slot):
        with self._lock:
            count, slot.backward_uses = slot.backward_uses, 0
        if count:
            self._unuse(slot, count)

    # ---- the weights, for the optimizer and for checkpoints ----

    def state_of(self, slot):
        """A parameter's current values, a CPU tensor of its shape."""
        host = torch.utils.dlpack.from_dlpack(self.client.acquire(slot.lease, "read", "host"))
        try:
            return host.view(slot.dtype).reshape(slot.shape).clone()
        finally:
            del host
            self.client.release(slot.lease)

    def wait_idle(self, slot):
        """Waits until no forward or backward holds the parameter's lease (before it is overwritten)."""
        if not slot.idle.wait(timeout=600):
            raise RuntimeError(f"tierd.torch.offload: {slot.name} is still held by a forward or backward "
                               f"({slot.uses} uses) after 10 minutes: a backward that never ran to its end?")

    def write_weights(self, slot, write):
        """write(host_tensor) fills the parameter's lease on the host (the optimizer's new
        weights); waits until no forward or backward holds it."""
        self.wait_idle(slot)
        host = torch.utils.dlpack.from_dlpack(self.client.acquire(slot.lease, "overwrite", "host"))
        try:
            write(host.view(slot.dtype).reshape(-1))
        finally:
            del host
            self.client.release(slot.lease)

    def state_dict(self):
        """The parameters' current values, as CPU tensors by name (the model's own state_dict
        would give the placeholders)."""
        return {slot.name: self.state_of(slot) for slot in self._slots}

    def load_state_dict(self, state):
        missing = [s.name for s in self._slots if s.name not in state]
        if missing:
            raise KeyError(f"tierd.torch.offload: the state has no {missing[:3]}{' ...' if len(missing) > 3 else ''}")
        for slot in self._slots:
            value = state[slot.name]
            if tuple(value.shape) != slot.shape:
                raise ValueError(f"{slot.name}: the state's shape {tuple(value.shape)} is not the model's {slot.shape}")
            self.write_weights(slot, lambda host, v=value: host.copy_(v.reshape(-1).to(slot.dtype)))

    def close(self):
        """Puts the weights back into the model's own tensors (on its device) and ends the hooks;
        the leases go with the client's session."""
        values = self.state_dict()
        for h in self._handles:
            h.remove()
        for slot in self._slots:
            slot.param.data = values[slot.name].to(slot.param.device)
            del slot.param._tierd_offload


def offload(model, client=None, runtime_dir=None, label="offloaded-model", gpu=0, dram=0, nvme=0, name="model",
            plan=False, units=None):
    """Moves `model`'s parameters into tierd (a session of its own unless `client` is given:
    gpu, dram and nvme are its quotas, "16GiB" or bytes). Returns the Offloaded handle; pass
    its .client to OffloadOptimizer so the optimizer writes the new weights into the leases.
    plan=True: tierd's planner moves the weights ahead of their uses, from the first iteration's
    order (a separate session for the optimizer's own leases then: its writes are not in the
    graph). units: the modules whose parameters are acquired together, each around its own
    forward (e.g. the decoder layers: a list or ModuleList of them, or their class), as torch.compile
    of each unit needs; any other module acquires its own parameters."""
    if client is None:
        client = tierd.connect(runtime_dir, label, gpu=gpu or "1GiB", dram=dram or "1GiB", nvme=nvme or "1GiB")
    device = next(model.parameters()).device
    place = "gpu" if device.type == "cuda" or client.fake_gpu else "host"
    return Offloaded(model, client, name, place, plan, units)


def _tensors_in(value):
    """The tensors in a module's output: a tensor, or nested tuples, lists and dicts of them (a
    transformers ModelOutput is a dict)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _tensors_in(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors_in(v)]
    return []


def _units_of(model, units):
    """The unit modules: `units` itself (modules), or model's outermost modules of that class
    (a class or a tuple of them)."""
    if units is None:
        return []
    if isinstance(units, type) or (isinstance(units, tuple) and all(isinstance(u, type) for u in units)):
        found, inside = [], set()
        for m in model.modules():
            if id(m) not in inside and isinstance(m, units):
                found.append(m)
                inside.update(id(x) for x in m.modules())
        if not found:
            raise ValueError(f"tierd.torch.offload: the model has no module of class {units}")
        return found
    found = list(units)
    owned = {id(m) for m in model.modules()}
    for m in found:
        if not isinstance(m, torch.nn.Module) or id(m) not in owned:
            raise ValueError(f"tierd.torch.offload: units are modules of the model, not {type(m).__name__}")
    return found
