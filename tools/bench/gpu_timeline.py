"""Where a training step's GPU time goes, from torch.profiler's trace (Kineto's Chrome JSON):
the step's span (a `record_function` around it), how long the GPU was busy with anything (the
union of kernels, copies and memsets on every stream), the idle rest, kernels on the busiest
stream (the compute stream) and on the others, the copies each way with their bytes, and the
longest idle gaps with the activities on either side, so a gap names what the GPU waited for.

Used by offload_optimizer_bench.py --profile; `summarize` takes plain events and is tested
without torch (gpu_timeline_test.py)."""
import json

STEP = "tierd_bench_step"  # the record_function name the bench wraps the profiled step in


class Activity:
    """One GPU interval: kind "kernel", "HtoD", "DtoH", "DtoD" or "memset"; times in microseconds."""

    def __init__(self, kind, stream, start, end, name, nbytes=0):
        self.kind, self.stream, self.start, self.end, self.name, self.nbytes = kind, stream, start, end, name, nbytes

    def __repr__(self):
        return f"Activity({self.kind}, stream {self.stream}, {self.start}-{self.end}, {self.name!r})"


def _copy_kind(name):
    for kind in ("HtoD", "DtoH", "DtoD"):
        if kind in name:
            return kind
    return "copy"


def from_trace(trace):
    """The GPU activities and the step's window (start, end) in a Chrome trace (a dict)."""
    activities, window = [], None
    for e in trace.get("traceEvents", []):
        if e.get("ph") != "X" or "dur" not in e:
            continue
        cat, name = e.get("cat", ""), e.get("name", "")
        start, end = float(e["ts"]), float(e["ts"]) + float(e["dur"])
        args = e.get("args", {}) or {}
        if cat == "kernel":
            activities.append(Activity("kernel", args.get("stream", e.get("tid")), start, end, name))
        elif cat == "gpu_memcpy":
            activities.append(Activity(_copy_kind(name), args.get("stream", e.get("tid")), start, end, name,
                                       int(args.get("bytes", 0) or 0)))
        elif cat == "gpu_memset":
            activities.append(Activity("memset", args.get("stream", e.get("tid")), start, end, name))
        elif name == STEP and cat in ("user_annotation", "cpu_op", "python_function"):
            if window is None or end - start > window[1] - window[0]:
                window = (start, end)
    return activities, window


def _union(intervals):
    merged = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return merged


def summarize(activities, window, gaps=3):
    """A dict of milliseconds (and GB for copies) for the activities inside `window`, clipped to it."""
    w0, w1 = window
    inside = [a for a in activities if a.end > w0 and a.start < w1]
    clip = [(max(a.start, w0), min(a.end, w1)) for a in inside]
    busy = _union(clip)
    busy_us = sum(e - s for s, e in busy)
    kernel_us = {}
    for a, (s, e) in zip(inside, clip):
        if a.kind == "kernel":
            kernel_us[a.stream] = kernel_us.get(a.stream, 0.0) + e - s
    compute = max(kernel_us, key=kernel_us.get) if kernel_us else None
    out = {
        "span_ms": round((w1 - w0) / 1e3, 2),
        "busy_ms": round(busy_us / 1e3, 2),
        "idle_ms": round((w1 - w0 - busy_us) / 1e3, 2),
        "compute_stream": compute,
        "compute_kernels_ms": round(kernel_us.get(compute, 0.0) / 1e3, 2),
        "other_kernels_ms": round(sum(v for k, v in kernel_us.items() if k != compute) / 1e3, 2),
    }
    for kind in ("HtoD", "DtoH", "DtoD"):
        chosen = [(a, s, e) for a, (s, e) in zip(inside, clip) if a.kind == kind]
        out[f"{kind}_ms"] = round(sum(e - s for _, s, e in chosen) / 1e3, 2)
        out[f"{kind}_GB"] = round(sum(a.nbytes for a, _, _ in chosen) / 1e9, 3)
    # Idle gaps: before the first activity, between the busy stretches, after the last.
    edges = [w0] + [x for s, e in busy for x in (s, e)] + [w1]
    holes = [(edges[i], edges[i + 1]) for i in range(0, len(edges), 2) if edges[i + 1] > edges[i]]
    holes.sort(key=lambda h: h[0] - h[1])

    def around(t, before):
        near = [a for a in inside if (a.end <= t if before else a.start >= t)]
        if not near:
            return "the step's " + ("start" if before else "end")
        a = max(near, key=lambda x: x.end) if before else min(near, key=lambda x: x.start)
        return f"{a.kind} {a.name[:60]}"

    out["gaps"] = [{"at_ms": round((s - w0) / 1e3, 2), "ms": round((e - s) / 1e3, 2),
                    "after": around(s, True), "before": around(e, False)} for s, e in holes[:gaps]]
    return out


def summarize_trace_file(path, gaps=3):
    with open(path) as f:
        trace = json.load(f)
    activities, window = from_trace(trace)
    if window is None:
        raise ValueError(f"{path}: no '{STEP}' annotation: wrap the step in torch.profiler.record_function")
    return summarize(activities, window, gaps)
