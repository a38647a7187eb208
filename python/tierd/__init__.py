"""tierd for Python: lease tensors from the node's tierd daemon, as the C++ shim does.

    import tierd
    with tierd.connect(dram="32GiB", nvme="64GiB") as client:   # TIERD_DIR or /tmp/tierd
        w = client.lease("layers.0.w", (4096, 4096), dtype="bf16")
        view = client.acquire(w, access="write", place="host")     # torch.from_dlpack(view)
        ...
        client.release(w)
        print(client.stats()["tiers"])

`tierd.torch` has the PyTorch side: leases as tensors, and OffloadOptimizer (the optimizer's
state in tierd's tiers, stepped on the host). Errors are tierd.TierdError with the status's
`code` ("UNAVAILABLE" when tierd is gone: every call after that fails within seconds, naming
the socket; "RESOURCE_EXHAUSTED" when a quota or a tier is full, with the numbers).
"""

import json
import os
import re

from tierd._tierd import TierdError, Tensor, View  # noqa: F401  (re-exported)
from tierd import _tierd

__version__ = "0.1.0"

__all__ = ["connect", "Client", "TierdError", "Tensor", "View", "parse_bytes"]

_UNITS = {"": 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40,
          "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12}

# torch's and NumPy's dtype names, and tierd's own, as tierd's.
_DTYPES = {"float32": "f32", "f32": "f32", "bfloat16": "bf16", "bf16": "bf16", "float16": "f16", "f16": "f16",
           "float8_e4m3fn": "f8e4m3", "f8e4m3": "f8e4m3", "float8_e5m2": "f8e5m2", "f8e5m2": "f8e5m2",
           "int32": "i32", "i32": "i32", "int64": "i64", "i64": "i64", "uint8": "u8", "u8": "u8"}


def _numbers(value, key=""):
    """A reply's JSON with its 64-bit integers (strings in protobuf's JSON) as ints."""
    if isinstance(value, dict):
        return {k: _numbers(v, k) for k, v in value.items()}
    if isinstance(value, list):
        return [_numbers(v, key) for v in value]
    if isinstance(value, str) and key not in ("name", "label", "gpu") and value.lstrip("-").isdigit():
        return int(value)
    return value


def _error_in_context(error, text):
    """A TierdError saying `text` before tierd's own words, with the same code."""
    wrapped = TierdError(f"{text}: {error}")
    wrapped.code, wrapped.status = getattr(error, "code", "UNKNOWN"), getattr(error, "status", 2)
    return wrapped


def _stream_handle(stream):
    """None (release now), or the stream's cudaStream_t as an integer: 0 is the legacy default stream."""
    return None if stream is None else int(getattr(stream, "cuda_stream", stream))


def parse_bytes(size):
    """8 << 30, "8GiB", "512MiB", "1.5GB" -> bytes (an int)."""
    if isinstance(size, int):
        if size < 0:
            raise ValueError(f"a size cannot be negative: {size}")
        return size
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([KMGT]i?B|B)?\s*", str(size))
    if not m:
        raise ValueError(f"not a size: {size!r} (e.g. 8GiB, 512MiB, 1.5GB, or bytes as an int)")
    return int(float(m.group(1)) * _UNITS[m.group(2) or ""])


def dtype_name(dtype):
    """tierd's name for a dtype given as torch's (torch.bfloat16), NumPy's or tierd's own."""
    name = str(dtype).replace("torch.", "")
    if name not in _DTYPES:
        raise ValueError(f"tierd has no dtype {dtype!r} (float32, bfloat16, float16, float8_e4m3fn, "
                         "float8_e5m2, int32, int64, uint8)")
    return _DTYPES[name]


class Client:
    """A session with tierd. Its leases, and their bytes, last until close() (or the process's end)."""

    def __init__(self, runtime_dir=None, label="python", gpu=0, dram=0, nvme=0, use_ring=True, rings=4):
        self.runtime_dir = runtime_dir or os.environ.get("TIERD_DIR", "/tmp/tierd")
        self._client = _tierd.Client(self.runtime_dir, label, parse_bytes(gpu), parse_bytes(dram),
                                     parse_bytes(nvme), use_ring, int(rings))

    def lease(self, name, shape, dtype="bf16", tensor_class="param"):
        """A tensor of `shape` and `dtype` named `name` (unique in the session); tensor_class is
        param, grad, opt_state, activation or scratch (the planner's eviction order reads it)."""
        return self._client.lease(name, tensor_class, dtype_name(dtype), [int(d) for d in shape])

    def unlease(self, tensor):
        self._client.unlease(tensor)

    def acquire(self, tensor, access="read", place="gpu"):
        """The tensor's bytes at `place` (gpu or host) until release: a View for torch.from_dlpack.
        access: read, write, or overwrite (every byte will be written unread: nothing is fetched)."""
        return self._client.acquire(tensor, access, place)

    def release(self, tensor, stream=None):
        """Done with the bytes. `stream`: a torch.cuda.Stream (or its cuda_stream integer) whose
        queued work still uses them; tierd waits for it before it moves them. None: now. (torch's
        default stream is CUDA's legacy stream, cuda_stream 0: a stream like any other here.)"""
        self._client.release(tensor, _stream_handle(stream))

    def acquire_all(self, items, place="host"):
        """Several tensors in one exchange with tierd (about one round trip, not one each): items
        are (tensor, access) pairs; their Views come back in order. All or none: if tierd refuses
        one, the others are released again and the refusal raised."""
        items = list(items)
        return self._client.acquire_all([t for t, _ in items], [a for _, a in items], place)

    def release_all(self, tensors, stream=None):
        """release() of each in one exchange (after `stream`'s queued work, as release()); every
        one is released that can be, then the first refusal raised."""
        self._client.release_all(list(tensors), _stream_handle(stream))

    def pin(self, tensor, tier):
        """Keep the tensor in `tier` (gpu, dram or nvme) until unpin."""
        self._client.pin(tensor, tier)

    def unpin(self, tensor):
        self._client.unpin(tensor)

    def mark_iteration(self):
        """Call at each iteration's start: tierd records the first, then moves tensors ahead of use."""
        return _numbers(json.loads(self._client.mark_iteration()))

    def register_graph(self, tensors, ops, host=False):
        """The iteration's graph, so tierd's planner moves tensors ahead of each op: `tensors` a
        list of {"name", "bytes", optionally "pinned"} (the leases), `ops` in order, each {"name",
        "seconds", and lists "reads", "writes", "overwrites" of lease names (on the GPU), and
        "host_reads", "host_writes", "host_overwrites" (on the host)}. Returns the plan's
        prediction. Then call op_begin(i) as op i starts, every iteration."""
        graph = {"tensors": tensors, "ops": ops, "host": host}
        return _numbers(json.loads(self._client.register_graph_json(json.dumps(graph))))

    def op_begin(self, op):
        """Op `op` of the registered graph starts now (microseconds, through the ring)."""
        self._client.op_begin(int(op))

    def report_step(self, step, loss, seconds, tokens):
        self._client.report_step(int(step), float(loss), float(seconds), float(tokens))

    def stats(self):
        """Every tier's capacity, use and peak, the links' traffic, the sessions (as `tierctl stats`)."""
        return _numbers(json.loads(self._client.stats_json()))

    def usage(self, reset_peaks=False):
        """This session's bytes in each tier, now and at their peak."""
        return _numbers(json.loads(self._client.usage_json(reset_peaks)))

    def leases(self, every_session=False):
        return _numbers(json.loads(self._client.leases_json(every_session)))

    @property
    def fake_gpu(self):
        """True when tierd runs on its fake GPU (no CUDA): "gpu" places are host memory then."""
        return self._client.fake_gpu

    def dram_arena(self):
        """(address, bytes) of this process's mapping of the session's DRAM arena: every host
        pointer acquire returns lies in it, fixed while the client lives."""
        return self._client.dram_arena()

    @property
    def session_id(self):
        return self._client.session_id

    def session_open(self):
        return self._client.session_open()

    def close(self):
        self._client.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def connect(runtime_dir=None, label="python", gpu=0, dram=0, nvme=0, use_ring=True, rings=4):
    """A session with the tierd at runtime_dir (default: $TIERD_DIR, else /tmp/tierd), with these
    quotas (bytes or "8GiB"; all 0: the daemon's default). TierdError("UNAVAILABLE") naming the
    socket when no tierd answers there. rings: hot-path rings for the session, each served by a
    thread of tierd's (1 to 8), so that threads calling at once (an optimizer's beside the
    forward's fetches) do not wait for one another's exchanges; one per such thread."""
    return Client(runtime_dir, label, gpu, dram, nvme, use_ring, rings)
