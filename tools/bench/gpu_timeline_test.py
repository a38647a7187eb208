"""gpu_timeline on hand-made traces: the busy union across streams, the idle gaps and what
borders them, copies each way with their bytes, activities clipped to the step's window."""
import json
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_timeline as gt  # noqa: E402
import test_util  # noqa: E402


def event(cat, name, ts, dur, stream=7, **args):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 0, "tid": stream,
            "args": dict(stream=stream, **args)}


# A 100 ms step (1,000 us .. 101,000 us): the compute stream busy 0-40 and 50-90 ms, a second
# stream's kernel 35-45 (overlapping the first stretch), a copy each way, an idle 45-50 and 90-100.
TRACE = {"traceEvents": [
    {"ph": "X", "cat": "user_annotation", "name": gt.STEP, "ts": 1000, "dur": 100000, "pid": 1, "tid": 1},
    event("kernel", "ampere_bf16_gemm_fwd", 1000, 40000),
    event("kernel", "adamw_step", 36000, 10000, stream=20),
    event("gpu_memcpy", "Memcpy DtoH (Device -> Pinned)", 20000, 5000, stream=21, bytes=250_000_000),
    event("kernel", "flash_bwd", 51000, 40000),
    event("gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", 60000, 2000, stream=22, bytes=100_000_000),
    event("kernel", "outside_the_step", 200000, 5000),   # after the window: not counted
    {"ph": "i", "cat": "kernel", "name": "instant", "ts": 5000},  # not an interval
]}


class GpuTimelineTest(unittest.TestCase):
    def test_busy_idle_streams_and_copies(self):
        activities, window = gt.from_trace(TRACE)
        self.assertEqual(window, (1000.0, 101000.0))
        s = gt.summarize(activities, window)
        self.assertEqual(s["span_ms"], 100.0)
        self.assertEqual(s["busy_ms"], 85.0)   # 0-45 and 50-90 ms
        self.assertEqual(s["idle_ms"], 15.0)
        self.assertEqual(s["compute_stream"], 7)
        self.assertEqual(s["compute_kernels_ms"], 80.0)
        self.assertEqual(s["other_kernels_ms"], 10.0)
        self.assertEqual((s["DtoH_ms"], s["DtoH_GB"]), (5.0, 0.25))
        self.assertEqual((s["HtoD_ms"], s["HtoD_GB"]), (2.0, 0.1))
        self.assertEqual(s["DtoD_ms"], 0.0)

    def test_gaps_are_longest_first_and_name_their_borders(self):
        activities, window = gt.from_trace(TRACE)
        gaps = gt.summarize(activities, window)["gaps"]
        self.assertEqual([(g["at_ms"], g["ms"]) for g in gaps], [(90.0, 10.0), (45.0, 5.0)])
        self.assertEqual(gaps[0]["after"], "kernel flash_bwd")
        self.assertEqual(gaps[0]["before"], "the step's end")
        self.assertEqual(gaps[1]["after"], "kernel adamw_step")
        self.assertEqual(gaps[1]["before"], "kernel flash_bwd")

    def test_activities_are_clipped_to_the_window(self):
        activities = [gt.Activity("kernel", 7, 0, 30, "early"), gt.Activity("kernel", 7, 90, 130, "late")]
        s = gt.summarize(activities, (10, 110), gaps=5)
        self.assertEqual(s["busy_ms"], 0.04)  # 10-30 and 90-110 us
        self.assertEqual([(g["at_ms"], g["ms"]) for g in s["gaps"]], [(0.02, 0.06)])

    def test_a_trace_without_the_steps_annotation_is_refused(self):
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump({"traceEvents": [event("kernel", "k", 0, 10)]}, f)
        try:
            with self.assertRaisesRegex(ValueError, "no 'tierd_bench_step' annotation"):
                gt.summarize_trace_file(f.name)
        finally:
            os.unlink(f.name)

    def test_an_idle_step_is_one_gap(self):
        s = gt.summarize([], (0, 1000))
        self.assertEqual((s["busy_ms"], s["idle_ms"], s["compute_stream"]), (0.0, 1.0, None))
        self.assertEqual(s["gaps"], [{"at_ms": 0.0, "ms": 1.0, "after": "the step's start", "before": "the step's end"}])


if __name__ == "__main__":
    test_util.main()
