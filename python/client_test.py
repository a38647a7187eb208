"""The tierd package's client against the real daemon (fake GPU), without torch: leases,
bytes written and read back through the buffer protocol, DLPack's device, statistics, and
the errors (bad input, a full quota, no tierd, a tierd that dies mid-session)."""
import signal
import time
import unittest

import tierd
import test_util


class ClientTest(unittest.TestCase):
    def setUp(self):
        self.client = tierd.connect(label="client-test", gpu="8MiB", dram="16MiB", nvme="32MiB")

    def tearDown(self):
        self.client.close()

    def test_bytes_written_on_the_host_read_back(self):
        t = self.client.lease("w", (1000,), dtype="float32", tensor_class="param")
        self.assertEqual((t.name, t.nbytes, t.dtype, t.shape), ("w", 4000, "f32", (1000,)))
        pattern = bytes((i * 7 + 3) % 256 for i in range(4000))
        view = self.client.acquire(t, access="overwrite", place="host")
        self.assertFalse(view.on_gpu)
        self.assertEqual(view.__dlpack_device__(), (1, 0))  # kDLCPU
        memoryview(view)[:] = pattern
        self.client.release(t)
        # Through the (fake) GPU tier and back: the same bytes.
        self.client.acquire(t, access="read", place="gpu")
        self.client.release(t)
        view = self.client.acquire(t, access="read", place="host")
        self.assertEqual(bytes(memoryview(view)), pattern)
        self.client.release(t)

    def test_several_acquired_in_one_exchange_all_or_none(self):
        ts = [self.client.lease(f"many{i}", (100,), dtype="float32", tensor_class="opt_state") for i in range(5)]
        views = self.client.acquire_all([(t, "overwrite") for t in ts])
        self.assertEqual([v.nbytes for v in views], [400] * 5)
        for i, v in enumerate(views):
            memoryview(v)[:] = bytes([i]) * 400
            self.assertNotEqual(v.data_ptr, 0)
        self.client.release_all(ts)
        for i, t in enumerate(ts):  # one by one: what was written through acquire_all
            self.assertEqual(bytes(memoryview(self.client.acquire(t, "read", "host"))), bytes([i]) * 400)
            self.client.release(t)
        gone = self.client.lease("gone", (4,))
        self.client.unlease(gone)
        with self.assertRaises(tierd.TierdError) as e:
            self.client.acquire_all([(ts[0], "read"), (gone, "read"), (ts[1], "write")])
        self.assertEqual(e.exception.code, "NOT_FOUND")
        for t in ts[:2]:  # released again: nothing is left acquired by the refused call
            with self.assertRaises(tierd.TierdError) as e:
                self.client.release(t)
            self.assertEqual(e.exception.code, "FAILED_PRECONDITION")
        with self.assertRaises(tierd.TierdError):
            self.client.acquire_all([(ts[0], "read")], place="attic")
        with self.assertRaises(tierd.TierdError) as e:  # the extension's own check, past the wrapper
            self.client._client.acquire_all(ts[:2], ["read"], "host")
        self.assertIn("2 tensors but 1 accesses", str(e.exception))

    def test_threads_sharing_a_client_each_keep_their_bytes(self):
        # Four threads at once on one session, through four rings and through one: every
        # thread's writes read back as its own.
        import threading
        for rings in (4, 1):
            client = tierd.connect(label=f"threads-{rings}", gpu="1MiB", dram="4MiB", nvme="8MiB", rings=rings)
            errors = []

            def work(k, client=client, errors=errors):
                try:
                    t = client.lease(f"thread{k}", (256,), dtype="uint8", tensor_class="opt_state")
                    for i in range(200):
                        view = client.acquire(t, access="overwrite", place="host")
                        memoryview(view)[:] = bytes([(k * 31 + i) % 256]) * 256
                        client.release(t)
                        view = client.acquire(t, access="read", place="host")
                        if bytes(memoryview(view)) != bytes([(k * 31 + i) % 256]) * 256:
                            errors.append(f"thread {k}, round {i}: another's bytes")
                        client.release(t)
                except Exception as e:  # noqa: BLE001 (the test says which thread failed and how)
                    errors.append(f"thread {k}: {e}")
            threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            client.close()
            self.assertEqual(errors, [], f"{rings} rings")

    def test_the_sessions_usage_and_the_tiers_statistics(self):
        t = self.client.lease("a", (256, 1024), dtype="bfloat16")
        self.client.acquire(t, access="overwrite", place="host")
        self.client.release(t)
        dram = [t for t in self.client.usage()["tiers"] if t["tier"] == "TIER_DRAM"][0]
        self.assertEqual(dram["quota_bytes"], 16 << 20)
        self.assertGreaterEqual(dram["peak_bytes"], 512 << 10)  # 256 x 1024 bf16
        stats = self.client.stats()
        self.assertGreaterEqual(stats["sessions"], 1)
        self.assertEqual([t["tier"] for t in stats["tiers"]], ["TIER_GPU", "TIER_DRAM", "TIER_NVME"])
        self.assertEqual("fake GPU" in stats["gpu"], self.client.fake_gpu, stats["gpu"])
        leases = self.client.leases()["leases"]
        self.assertEqual([(l["spec"]["name"], l["spec"]["shape"], l["bytes"]) for l in leases],
                         [("a", [256, 1024], 512 << 10)])

    def test_a_registered_graph_is_planned_and_followed(self):
        names = [f"layer{i}" for i in range(4)]
        leases = [self.client.lease(n, (256, 1024), dtype="bf16") for n in names]  # 512 KiB each
        for t in leases:
            self.client.acquire(t, access="overwrite", place="host")
            self.client.release(t)
        ops = [{"name": f"forward {n}", "seconds": 0.001, "reads": [n]} for n in names]
        ops += [{"name": f"backward {n}", "seconds": 0.002, "reads": [n]} for n in reversed(names)]
        plan = self.client.register_graph([{"name": n, "bytes": 512 << 10} for n in names], ops)
        self.assertGreater(plan["predicted_step_seconds"], 0.0089, plan)  # at least the ops' own time
        self.assertIn("summary", plan)
        for i, op in enumerate(ops):  # one iteration, as a trainer would run it
            self.client.op_begin(i)
            t = leases[names.index(op["reads"][0])]
            self.client.acquire(t, access="read", place="gpu")
            self.client.release(t)
        with self.assertRaises(tierd.TierdError) as e:  # an op reading a tensor the graph does not list
            self.client.register_graph([{"name": "layer0", "bytes": 512 << 10}], [{"name": "x", "reads": ["ghost"]}])
        self.assertEqual(e.exception.code, "INVALID_ARGUMENT", str(e.exception))
        self.assertIn("ghost", str(e.exception))
        with self.assertRaisesRegex(tierd.TierdError, "GraphSpec's JSON"):
            self.client._client.register_graph_json("{not json")

    def test_pins_steps_and_the_processs_own_figures(self):
        t = self.client.lease("pinned", (1024,), dtype="f32")
        self.client.acquire(t, access="overwrite", place="host")
        self.client.release(t)
        self.client.pin(t, "dram")
        pinned = [l for l in self.client.leases()["leases"] if l["spec"]["name"] == "pinned"][0]
        self.assertIn("TIER_DRAM", str(pinned))
        self.client.unpin(t)
        with self.assertRaises(tierd.TierdError) as e:
            self.client.pin(t, "tape")
        self.assertEqual(e.exception.code, "INVALID_ARGUMENT")
        self.assertIn("tier is gpu, dram or nvme, not 'tape'", str(e.exception))
        self.client.report_step(1, 2.5, 0.1, 4096)
        times = self.client._client.ring_times()
        self.assertGreaterEqual(times["acquires"], 1)  # the acquire above went through the ring
        base, size = self.client.dram_arena()
        self.assertNotEqual(base, 0)
        self.assertEqual(size, 16 << 20)  # the session's DRAM quota, mapped here

    def test_bad_input_is_refused_with_the_reason(self):
        with self.assertRaisesRegex(ValueError, "tierd has no dtype 'complex64'"):
            self.client.lease("x", (4,), dtype="complex64")
        with self.assertRaises(tierd.TierdError) as e:
            self.client.lease("x", (4,), tensor_class="weights")
        self.assertEqual(e.exception.code, "INVALID_ARGUMENT")
        self.assertIn("unknown tensor class 'weights'", str(e.exception))
        t = self.client.lease("y", (4,))
        with self.assertRaises(tierd.TierdError) as e:
            self.client.acquire(t, access="borrow")
        self.assertEqual(e.exception.code, "INVALID_ARGUMENT")
        with self.assertRaises(tierd.TierdError) as e:
            self.client.lease("y", (4,))  # the name is taken
        self.assertNotEqual(e.exception.code, "OK")
        with self.assertRaisesRegex(ValueError, "not a size"):
            tierd.parse_bytes("lots")
        self.assertEqual(tierd.parse_bytes("1.5GiB"), 3 << 29)

    def test_a_full_quota_says_so_with_the_numbers(self):
        with self.assertRaises(tierd.TierdError) as e:  # 64 MiB: more than any tier of the session holds
            self.client.lease("big", (64 << 20,), dtype="uint8")
        self.assertEqual(e.exception.code, "RESOURCE_EXHAUSTED", str(e.exception))
        self.assertIn("cannot lease 'big' (64.0 MiB)", str(e.exception))
        self.assertIn("nvme quota 32.0 MiB", str(e.exception))
        self.client.lease("fits", (1 << 20,), dtype="uint8")  # and the session goes on

    def test_a_closed_client_refuses_calls(self):
        self.client.close()
        with self.assertRaises(tierd.TierdError) as e:
            self.client.stats()
        self.assertEqual(e.exception.code, "FAILED_PRECONDITION")


class StreamTest(unittest.TestCase):
    def test_torchs_default_stream_is_a_stream_to_release_after(self):
        # torch's default stream is CUDA's legacy stream, whose cuda_stream is 0: a release after
        # its work must wait for that work (it was taken for "now", and tierd could move bytes a
        # kernel still read). None is now.
        seen = []

        class Recorder:
            def release(self, tensor, stream):
                seen.append(("release", stream))

            def release_all(self, tensors, stream):
                seen.append(("release_all", stream))

        client = tierd.Client.__new__(tierd.Client)
        client._client = Recorder()

        class Stream:
            def __init__(self, handle):
                self.cuda_stream = handle

        client.release("t", Stream(0))
        client.release("t")
        client.release("t", 7)
        client.release_all(["t"], Stream(0))
        client.release_all(["t"], None)
        self.assertEqual(seen, [("release", 0), ("release", None), ("release", 7), ("release_all", 0),
                                ("release_all", None)])


class GpuStepTest(unittest.TestCase):
    def test_bad_gpu_steps_are_refused_saying_why(self):
        step = tierd._tierd.gpu_step
        args = dict(master=0, m=0, v=0, weights_bf16=0, grads=0, n=4, lr=1e-3, beta1=0.9, beta2=0.999, eps=1e-8,
                    weight_decay=0.0, step=1, grad_scale=1.0, decay=False, grads_dtype="f32", cuda_stream=0)
        for change, words in (({"opt": "sgd"}, "adamw, adamw8bit and lion, not sgd"),
                              ({"grads_dtype": "f16"}, "f32 or bf16, not f16"),
                              ({"n": -1}, "negative element count"),
                              ({"step": 0}, "counts from 1"),
                              # a host address: no CUDA in the build, or not device memory
                              ({"master": id(args)}, "without a CUDA toolkit|not in GPU memory|null pointer")):
            with self.assertRaisesRegex(tierd.TierdError, words):
                step(**{"opt": "adamw", **args, **change})


class NoTierdTest(unittest.TestCase):
    def test_no_tierd_names_the_socket(self):
        start = time.monotonic()
        with self.assertRaises(tierd.TierdError) as e:
            tierd.connect(runtime_dir="/nonexistent/tierd-dir")
        self.assertEqual(e.exception.code, "UNAVAILABLE")
        self.assertIn("/nonexistent/tierd-dir/tierd.sock", str(e.exception))
        self.assertLess(time.monotonic() - start, 5)

    def test_a_tierd_that_dies_fails_the_next_call_within_seconds(self):
        with test_util.private_tierd("dies") as (daemon, runtime):
            client = tierd.connect(runtime_dir=runtime, label="doomed", gpu="1MiB", dram="1MiB", nvme="1MiB")
            t = client.lease("w", (16,), dtype="f32")
            daemon.send_signal(signal.SIGKILL)
            daemon.wait()
            start = time.monotonic()
            with self.assertRaises(tierd.TierdError) as e:
                client.acquire(t, access="overwrite", place="host")
            self.assertEqual(e.exception.code, "UNAVAILABLE", str(e.exception))
            self.assertIn(runtime, str(e.exception))
            self.assertLess(time.monotonic() - start, 10)
            self.assertFalse(client.session_open())
            client.close()

if __name__ == "__main__":
    test_util.main()
