"""tierd.torch.OffloadOptimizer against torch's own optimizer and against itself, on the CPU
(torch's CPU build or any other; the daemon on its fake GPU): AdamW's steps, clipping by global
norm, micro-batches accumulated on the host, bf16 weights from the fp32 master, a checkpoint that
resumes bit for bit, a non-finite gradient skipped, 8-bit AdamW and Lion, overlap on and off.
Without torch every case is reported skipped, saying so."""
import copy
import io
import os
import signal
import subprocess
import sys
import types
import unittest
import warnings

import test_util

try:
    import torch
    import tierd
    import tierd.torch as tt
    WHY_NOT = None
except ImportError as e:  # a Python without torch (e.g. Debian's, in CI): the cases say so
    WHY_NOT = f"torch is not importable here: {e}"


def share_device():
    """Where a model stepped partly on tierd's GPU (gpu_share) lives: CUDA where tierd runs on the
    real GPU (the lent machine, TIERD_TEST_GPU=cuda), the CPU where it runs on its fake one."""
    return "cuda" if os.environ.get("TIERD_TEST_GPU") == "cuda" else "cpu"


def model(seed=0, dtype=None):
    torch.manual_seed(seed)
    m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    return m.to(dtype) if dtype is not None else m


def batches(count, seed=1, dtype=torch.float32 if WHY_NOT is None else None):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(8, 16, generator=g).to(dtype), torch.randn(8, 4, generator=g).to(dtype))
            for _ in range(count)]


def learnable_batches(count, seed=3):
    """Targets a small network can learn: y = tanh(x A) B."""
    g = torch.Generator().manual_seed(seed)
    a, b = torch.randn(16, 8, generator=g), torch.randn(8, 4, generator=g)
    xs = [torch.randn(8, 16, generator=g) for _ in range(count)]
    return [(x, torch.tanh(x @ a) @ b) for x in xs]


def loss_of(m, batch):
    x, y = batch
    return torch.nn.functional.mse_loss(m(x).float(), y.float())


@unittest.skipIf(WHY_NOT is not None, WHY_NOT or "")
class OffloadOptimizerTest(unittest.TestCase):
    def setUp(self):
        self.opened = []

    def tearDown(self):
        for opt in self.opened:
            opt.close()

    def offload(self, params, **kw):
        opt = tt.OffloadOptimizer(params, dram="16MiB", nvme="16MiB", **kw)
        self.opened.append(opt)
        return opt

    def train(self, m, opt, data, accumulate=1):
        losses = test_util.train_steps(m, opt, data, loss_of, accumulate)
        if hasattr(opt, "synchronize"):
            opt.synchronize()  # the last step's weights, read outside a forward
        return losses

    def assertResumesAsStraight(self, straight, saved, data, what, **kw):
        """A bf16 model of another seed, loaded from `saved` ({"model", "opt"}) into a new optimizer
        (kw), trained on `data`, ends with `straight`'s weights, bit for bit."""
        resumed = model(seed=7, dtype=torch.bfloat16).to(next(straight.parameters()).device)
        opt = self.offload(resumed.parameters(), lr=1e-3, max_grad_norm=1.0, **kw)
        resumed.load_state_dict(saved["model"])
        opt.load_state_dict(saved["opt"])
        self.train(resumed, opt, data)
        for a, b in zip(straight.parameters(), resumed.parameters()):
            self.assertTrue(torch.equal(a, b), what)

    def assertClose(self, a, b, tolerance):
        for (name, x), y in zip(a.named_parameters(), b.parameters()):
            err = (x.detach().float() - y.detach().float()).abs().max().item()
            scale = y.detach().float().abs().max().item()
            self.assertLessEqual(err, tolerance * scale, f"{name}: {err} against {scale}")

    def test_adamw_follows_torchs(self):
        ours, theirs = model(), model()
        data = batches(6)
        opt = self.offload(ours.parameters(), lr=1e-2, weight_decay=0.1)
        self.train(ours, opt, data)
        self.train(theirs, torch.optim.AdamW(theirs.parameters(), lr=1e-2, weight_decay=0.1), data)
        self.assertClose(ours, theirs, 1e-5)
        self.assertFalse(all(torch.equal(a, b) for a, b in zip(ours.parameters(), model().parameters())))
        t = opt.timings()  # where the time went, for the benchmarks
        self.assertEqual(set(t), {"hook_waited", "copy_waited", "accumulating", "updating", "update_kernels",
                                  "update_leases", "update_copies", "forward_waited", "step_waited"})
        self.assertGreater(t["updating"], 0)
        for part in ("update_kernels", "update_leases", "update_copies"):
            self.assertGreater(t[part], 0, part)
        self.assertLessEqual(t["update_kernels"] + t["update_leases"] + t["update_copies"], t["updating"])
        self.assertGreater(t["accumulating"], 0)
        self.assertTrue(all(v >= 0 for v in t.values()), t)

    def test_clipping_by_global_norm_follows_torchs(self):
        ours, theirs = model(), model()
        data = batches(5)
        opt = self.offload(ours.parameters(), lr=1e-2, max_grad_norm=0.05)
        self.train(ours, opt, data)
        ref = torch.optim.AdamW(theirs.parameters(), lr=1e-2)
        norms = []
        for batch in data:
            loss_of(theirs, batch).backward()
            norms.append(torch.nn.utils.clip_grad_norm_(theirs.parameters(), 0.05).item())
            ref.step()
            ref.zero_grad()
        self.assertGreater(min(norms), 0.05)  # the clip did act
        self.assertAlmostEqual(opt.last_grad_norm, norms[-1], delta=1e-4 * norms[-1])
        self.assertClose(ours, theirs, 1e-5)

    def test_micro_batches_accumulate_on_the_host(self):
        data = batches(6)
        theirs = model()
        self.train(theirs, torch.optim.AdamW(theirs.parameters(), lr=1e-2), data, accumulate=3)
        # Without clipping each update starts in the backward of the third micro-batch; with a
        # clip (never reached here) at step().
        for clip in (None, 100.0):
            ours = model()
            opt = self.offload(ours.parameters(), lr=1e-2, accumulation_steps=3, max_grad_norm=clip,
                               name=f"accumulated-{clip}")
            self.train(ours, opt, data, accumulate=3)
            self.assertClose(ours, theirs, 1e-5)
            self.assertTrue(all(p.grad is None for p in ours.parameters()))  # nothing kept beside the weights

    def test_a_learning_rate_schedule_and_parameter_groups_follow_torchs(self):
        ours, theirs = model(), model()
        data = batches(6)

        def groups(m):  # biases without weight decay, as users write it
            return [{"params": [p for n, p in m.named_parameters() if n.endswith("weight")], "weight_decay": 0.1},
                    {"params": [p for n, p in m.named_parameters() if n.endswith("bias")], "weight_decay": 0.0}]
        opt = self.offload(groups(ours), lr=1e-2)
        ref = torch.optim.AdamW(groups(theirs), lr=1e-2)
        for o, m in ((opt, ours), (ref, theirs)):
            schedule = torch.optim.lr_scheduler.LambdaLR(o, lambda step: 1.0 / (1 + step))
            for batch in data:
                loss_of(m, batch).backward()
                o.step()
                o.zero_grad()
                schedule.step()
        opt.synchronize()
        self.assertAlmostEqual(opt.param_groups[0]["lr"], 1e-2 / 7)
        self.assertClose(ours, theirs, 1e-5)

    def test_bf16_gradients_give_the_bits_of_their_fp32_widening(self):
        from tierd import _tierd
        g = torch.Generator().manual_seed(9)
        n = 3 * 16384 + 7  # across the widening's chunks, and a ragged end
        grads16 = torch.randn(n, generator=g).to(torch.bfloat16)
        start = {k: torch.randn(n, generator=g) for k in ("master", "m")}
        start["v"] = torch.rand(n, generator=g)
        moment_bytes = _tierd.moment8bit_bytes(n)
        for opt_name in ("adamw", "lion", "adamw8bit"):
            results = []
            for dtype, grads in (("f32", grads16.float()), ("bf16", grads16)):
                t = {k: v.clone() for k, v in start.items()}
                t["m8"], t["v8"] = torch.zeros(moment_bytes, dtype=torch.uint8), torch.zeros(moment_bytes, dtype=torch.uint8)
                out = torch.empty(n, dtype=torch.bfloat16)
                if opt_name == "adamw8bit":  # two steps: the second from moments the first made
                    for step in (1, 2):
                        _tierd.adamw8bit(t["master"].data_ptr(), t["m8"].data_ptr(), t["v8"].data_ptr(), out.data_ptr(),
                                         grads.data_ptr(), n, 1e-3, 0.9, 0.95, 1e-8, 0.1, step, 0.5, True, 0, dtype)
                elif opt_name == "adamw":
                    _tierd.adamw(t["master"].data_ptr(), t["m"].data_ptr(), t["v"].data_ptr(), out.data_ptr(),
                                 grads.data_ptr(), n, 1e-3, 0.9, 0.95, 1e-8, 0.1, 3, 0.5, True, 0, dtype)
                else:
                    _tierd.lion(t["master"].data_ptr(), t["m"].data_ptr(), out.data_ptr(), grads.data_ptr(), n, 1e-3,
                                0.9, 0.99, 0.1, 0.5, True, 0, dtype)
                results.append((t, out))
            (a, out_a), (b, out_b) = results
            for k in a:
                self.assertTrue(torch.equal(a[k], b[k]), f"{opt_name} {k}")
            self.assertTrue(torch.equal(out_a, out_b), opt_name)
            self.assertFalse(torch.equal(a["master"], start["master"]))  # it did step
        with self.assertRaisesRegex(Exception, "gradients are f32 or bf16, not f16"):
            _tierd.adamw(1, 1, 1, 0, 1, 1, 1e-3, 0.9, 0.95, 1e-8, 0.1, 1, 1.0, True, 0, "f16")

    def test_waiting_updates_run_in_the_models_order(self):
        from tierd.torch import _ForwardOrder
        waiting = _ForwardOrder()
        slots = {i: types.SimpleNamespace(index=i) for i in (5, 3, 9, 1)}
        for i in (9, 5, None, 3, 1):  # as a backward queues them (last layer first), the end among them
            waiting.put(None if i is None else (slots[i], 1.0, ()))
        taken = [waiting.get() for _ in range(5)]
        self.assertEqual([None if t is None else t[0].index for t in taken], [1, 3, 5, 9, None])

    def test_without_clipping_updates_start_in_the_backward(self):
        m = model()
        before = copy.deepcopy(m)
        opt = self.offload(m.parameters(), lr=1e-2)
        loss_of(m, batches(1)[0]).backward()
        opt._arrivals.join()
        opt._updates.join()  # step() not called yet: the updates ran off the backward's hooks
        self.assertFalse(any(torch.equal(a, b) for a, b in zip(m.parameters(), before.parameters())))
        opt.step()
        opt.synchronize()
        ref = copy.deepcopy(before)
        self.train(ref, torch.optim.AdamW(ref.parameters(), lr=1e-2), batches(1))
        self.assertClose(m, ref, 1e-5)

    def test_more_micro_batches_than_said_is_an_error(self):
        m = model()
        opt = self.offload(m.parameters(), lr=1e-2)  # accumulation_steps=1, no clipping
        with self.assertRaisesRegex(RuntimeError, "pass accumulation_steps=<micro-batches a step>"):
            self.train(m, opt, batches(2), accumulate=2)
        # With clipping nothing updates before step(), but a bf16 model's one-gradient leases would
        # be overwritten by the second micro-batch (before: silently, the first one's gradient lost).
        for share in (0.0, 0.8):
            m = model(dtype=torch.bfloat16).to(share_device())
            opt = self.offload(m.parameters(), lr=1e-2, max_grad_norm=1.0, gpu_share=share, name=f"bf16-more-{share}")
            data = [(x.to(share_device()), y.to(share_device())) for x, y in batches(2, dtype=torch.bfloat16)]
            with self.assertRaisesRegex(RuntimeError, r"got gradient 2 of a step with accumulation_steps=1: pass "
                                                      r"accumulation_steps=<micro-batches a step>"):
                self.train(m, opt, data, accumulate=2)

    def test_bf16_weights_are_the_fp32_master_rounded(self):
        m = model(dtype=torch.bfloat16)
        opt = self.offload(m.parameters(), lr=1e-3)
        self.train(m, opt, batches(3, dtype=torch.bfloat16))
        state = opt.state_dict()["state"]
        for s, p in zip(opt._slots, m.parameters()):
            master = state[s.index]["master"]
            self.assertTrue(torch.equal(master.to(torch.bfloat16), p.detach().reshape(-1)))
            self.assertFalse(torch.equal(master, p.detach().reshape(-1).float()))  # more bits than the weights

    def test_a_checkpoint_resumes_bit_for_bit(self):
        for opt_name in ("adamw", "adamw8bit", "lion"):
            data = batches(6, dtype=torch.bfloat16)
            straight = model(dtype=torch.bfloat16)
            opt = self.offload(straight.parameters(), opt=opt_name, lr=1e-3, max_grad_norm=1.0)
            self.train(straight, opt, data[:3])
            buffer = io.BytesIO()
            torch.save({"model": straight.state_dict(), "opt": opt.state_dict()}, buffer)
            self.train(straight, opt, data[3:])

            buffer.seek(0)
            self.assertResumesAsStraight(straight, torch.load(buffer), data[3:], opt_name, opt=opt_name,
                                         name=f"resumed-{opt_name}")

    def test_a_non_finite_gradient_skips_the_step(self):
        for clip in (1.0, None):  # the whole step skipped; without clipping, each parameter's update
            m = model()
            before = copy.deepcopy(m)
            opt = self.offload(m.parameters(), lr=1e-2, max_grad_norm=clip, name=f"nan-{clip}")
            x, y = batches(1)[0]
            x[0, 0] = float("nan")
            loss_of(m, (x, y)).backward()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                opt.step()
                opt.synchronize()
            said = "step skipped" if clip else "had non-finite gradients: their weights were kept"
            self.assertTrue(any(said in str(w.message) for w in caught), [str(w.message) for w in caught])
            self.assertEqual(opt.skipped_steps, 1 if clip else 0)
            for a, b in zip(m.parameters(), before.parameters()):
                self.assertTrue(torch.equal(a, b))
            self.train(m, opt, batches(2))  # and it goes on
            self.assertTrue(all(torch.isfinite(p).all() for p in m.parameters()))
            self.assertFalse(any(torch.equal(a, b) for a, b in zip(m.parameters(), before.parameters())))

    def test_8bit_adamw_and_lion_learn(self):
        data = learnable_batches(60)
        for opt_name, lr in (("adamw", 1e-2), ("adamw8bit", 1e-2), ("lion", 5e-3)):
            m = model()
            start = sum(loss_of(m, b).item() for b in data[:8])
            self.train(m, self.offload(m.parameters(), opt=opt_name, lr=lr, weight_decay=0.0, name=opt_name), data)
            end = sum(loss_of(m, b).item() for b in data[:8])
            self.assertLess(end, 0.5 * start, opt_name)

    def test_lion_follows_its_definition(self):
        m = model()
        ref = copy.deepcopy(m)
        data = batches(3)
        self.train(m, self.offload(m.parameters(), opt="lion", lr=1e-3, betas=(0.9, 0.99), weight_decay=0.1), data)
        moments = [torch.zeros_like(p) for p in ref.parameters()]
        for batch in data:
            loss_of(ref, batch).backward()
            with torch.no_grad():
                for p, mom in zip(ref.parameters(), moments):
                    update = torch.sign(0.9 * mom + 0.1 * p.grad)
                    p.mul_(1 - 1e-3 * 0.1).add_(update, alpha=-1e-3)
                    mom.mul_(0.99).add_(p.grad, alpha=0.01)
                    p.grad = None
        self.assertClose(m, ref, 1e-5)

    def test_overlap_changes_no_bits(self):
        data = batches(4)
        a, b = model(), model()
        self.train(a, self.offload(a.parameters(), lr=1e-2, overlap=True, name="a"), data)
        self.train(b, self.offload(b.parameters(), lr=1e-2, overlap=False, name="b"), data)
        for x, y in zip(a.parameters(), b.parameters()):
            self.assertTrue(torch.equal(x, y))

    def test_on_the_gpu_it_follows_torchs(self):
        if not torch.cuda.is_available():
            self.skipTest("no CUDA device (the lent GPU machine runs this case)")
        ours, theirs = model().cuda(), model().cuda()
        data = [(x.cuda(), y.cuda()) for x, y in batches(8)]
        opt = self.offload(ours.parameters(), lr=1e-2, max_grad_norm=0.05, name="gpu")
        self.train(ours, opt, data, accumulate=2)
        ref = torch.optim.AdamW(theirs.parameters(), lr=1e-2)
        for i in range(0, len(data), 2):
            for batch in data[i:i + 2]:
                (loss_of(theirs, batch) / 2).backward()
            torch.nn.utils.clip_grad_norm_(theirs.parameters(), 0.05)
            ref.step()
            ref.zero_grad()
        self.assertClose(ours, theirs, 1e-5)
        self.assertTrue(all(p.grad is None and p.is_cuda for p in ours.parameters()))
        bf16 = model(dtype=torch.bfloat16).cuda()
        opt = self.offload(bf16.parameters(), lr=1e-3, name="gpu-bf16")
        self.train(bf16, opt, [(x.cuda(), y.cuda()) for x, y in batches(3, dtype=torch.bfloat16)])
        state = opt.state_dict()["state"]
        for s, p in zip(opt._slots, bf16.parameters()):
            self.assertTrue(torch.equal(state[s.index]["master"].to(torch.bfloat16), p.detach().reshape(-1).cpu()))

    def test_a_share_stepped_on_the_gpu_gives_the_host_steps_bits(self):
        # Where a parameter is stepped changes no bit: the GPU's kernels are the host's arithmetic.
        # On a machine without CUDA the share is stepped on tierd's fake GPU (host memory, the
        # host's kernel) and this checks the path around it: the gradient kept in its lease on the
        # GPU tier, its norm in the clip, the state acquired there, the weights written back.
        device = "cuda" if torch.cuda.is_available() else "cpu"
        for opt_name in ("adamw", "adamw8bit", "lion"):
            for dtype in (torch.float32, torch.bfloat16):
                for clip, accumulate in ((None, 1), (0.05, 2)):
                    data = [(x.to(device), y.to(device)) for x, y in batches(6, dtype=dtype)]
                    runs = []
                    for share in (0.0, 0.8):
                        m = model(dtype=dtype).to(device)
                        opt = self.offload(m.parameters(), opt=opt_name, lr=1e-2, max_grad_norm=clip,
                                           accumulation_steps=accumulate, gpu_share=share,
                                           name=f"share-{opt_name}-{dtype}-{clip}-{share}")
                        losses = self.train(m, opt, data, accumulate=accumulate)
                        runs.append((m, losses, opt))
                    (host, host_losses, _), (split, split_losses, opt) = runs
                    what = f"{opt_name}, {dtype}, clip {clip}, {accumulate} micro-batches"
                    self.assertEqual(opt.gpu_values, 512 + 32, what)  # the first Linear's weight and bias
                    self.assertEqual(host_losses, split_losses, what)
                    for a, b in zip(host.parameters(), split.parameters()):
                        self.assertTrue(torch.equal(a, b), what)
                    self.assertTrue(all(p.grad is None for p in split.parameters()), what)
                    # The share's state lives in tierd's GPU tier, the rest in DRAM.
                    tiers = {lease["spec"]["name"]: lease["copies"] for lease in opt.client.leases()["leases"]}
                    prefix = f"share-{opt_name}-{dtype}-{clip}-0.8"
                    self.assertEqual(tiers[f"{prefix}.0.master"], ["TIER_GPU"], (what, tiers))
                    self.assertEqual(tiers[f"{prefix}.2.master"], ["TIER_DRAM"], (what, tiers))
                    for _, _, done in runs:  # each session's DRAM arena back before the next pair's
                        self.opened.remove(done)
                        done.close()

    def test_a_gpu_quota_smaller_than_the_share_moves_its_state_in_and_out(self):
        # Three 64 x 64 layers stepped on (the fake) GPU, 64 KiB of state and gradient each (AdamW), in a
        # GPU quota of 96 KiB: tierd moves each parameter's state in for its step and others out.
        def layers():
            torch.manual_seed(4)
            return torch.nn.Sequential(*(torch.nn.Linear(64, 64, bias=False) for _ in range(3)))
        g = torch.Generator().manual_seed(9)
        data = [(torch.randn(8, 64, generator=g).to(share_device()), torch.randn(8, 64, generator=g).to(share_device()))
                for _ in range(4)]
        results = []
        for share, gpu in ((0.0, 0), (1.0, "96KiB")):
            m = layers().to(share_device())
            opt = self.offload(m.parameters(), lr=1e-2, max_grad_norm=1.0, gpu_share=share, gpu=gpu,
                               name=f"streamed-{share}")
            losses = self.train(m, opt, data)
            results.append((m, losses))
            if share:
                gpu_tier = [t for t in opt.client.usage()["tiers"] if t["tier"] == "TIER_GPU"][0]
                self.assertLessEqual(gpu_tier["peak_bytes"], 96 << 10, gpu_tier)
                copies = [lease["copies"] for lease in opt.client.leases()["leases"]
                          if lease["spec"]["name"].endswith(".master")]
                self.assertTrue(any("TIER_GPU" not in c for c in copies), copies)  # some moved out
        (a, a_losses), (b, b_losses) = results
        self.assertEqual(a_losses, b_losses)
        for x, y in zip(a.parameters(), b.parameters()):
            self.assertTrue(torch.equal(x, y))

    def test_a_share_whose_quota_is_its_own_makes_no_lease_calls_a_step(self):
        # Held on the GPU across steps: the hook and the update reach the share's state without
        # tierd, for the same bits as a session that acquires it each step (a client of its own).
        data = [(x.to(share_device()), y.to(share_device())) for x, y in batches(5, dtype=torch.bfloat16)]
        results = []
        for clip in (None, 1.0):
            for given in (False, True):
                m = model(dtype=torch.bfloat16).to(share_device())
                client = tierd.connect(label="share-own-quota", gpu="1MiB", dram="16MiB", nvme="16MiB") if given else None
                opt = self.offload(m.parameters(), opt="adamw8bit", lr=1e-3, max_grad_norm=clip, gpu_share=1.0,
                                   client=client, name=f"held-{clip}-{given}")
                losses = self.train(m, opt, data[:2])
                calls = []
                for name in ("acquire", "acquire_all", "release", "release_all"):
                    def counted(*args, _call=getattr(opt.client, name), _name=name, **kw):
                        calls.append(_name)
                        return _call(*args, **kw)
                    setattr(opt.client, name, counted)
                losses += self.train(m, opt, data[2:])
                what = f"clip {clip}, {'a client given' if given else 'its own session'}"
                if given:
                    self.assertGreaterEqual(len(calls), 4 * 3 * 2, (what, calls))  # 4 a parameter a step
                else:
                    self.assertEqual(calls, [], what)
                results.append((what, m, losses))
                saved = opt.state_dict()  # lets go of them: the host reads the state
                self.assertEqual(len(saved["state"]), 4, what)
                if given:
                    self.opened.remove(opt)
                    opt.close()
                    client.close()
            (_, held, held_losses), (what, acquired, acquired_losses) = results[-2:]
            self.assertEqual(held_losses, acquired_losses, what)
            for a, b in zip(held.parameters(), acquired.parameters()):
                self.assertTrue(torch.equal(a, b), what)

    def test_closing_after_tierd_died_with_the_share_held(self):
        # The held share's leases cannot be given back to a dead tierd: close() still removes the
        # hooks and ends the session, raising nothing (its leases went with tierd).
        with test_util.private_tierd("held") as (daemon, runtime):
            m = model(dtype=torch.bfloat16)
            opt = tt.OffloadOptimizer(m.parameters(), opt="adamw8bit", lr=1e-3, gpu_share=1.0, runtime_dir=runtime,
                                      dram="1MiB", nvme="1MiB")
            self.train(m, opt, batches(2, dtype=torch.bfloat16))
            self.assertTrue(all(s.held is not None for s in opt._slots))
            daemon.send_signal(signal.SIGKILL)
            daemon.wait()
            hooks = len(torch.nn.modules.module._global_forward_pre_hooks)
            opt.close()
            self.assertEqual(len(torch.nn.modules.module._global_forward_pre_hooks), hooks - 1)

    def test_a_checkpoint_moves_between_gpu_shares(self):
        # Where parameters are stepped is not in the checkpoint: a run that stepped 80% on the GPU
        # resumes on the host alone (and back) with the straight run's bits.
        data = [(x.to(share_device()), y.to(share_device())) for x, y in batches(6, dtype=torch.bfloat16)]
        straight = model(dtype=torch.bfloat16).to(share_device())
        opt = self.offload(straight.parameters(), opt="adamw8bit", lr=1e-3, max_grad_norm=1.0, gpu_share=0.8,
                           name="moves-straight")
        self.train(straight, opt, data[:3])
        saved = {"model": copy.deepcopy(straight.state_dict()), "opt": opt.state_dict()}
        self.train(straight, opt, data[3:])
        for share in (0.0, 1.0):
            self.assertResumesAsStraight(straight, saved, data[3:], share, opt="adamw8bit", gpu_share=share,
                                         name=f"moves-{share}")

    def test_gpu_share_settings_are_checked(self):
        m = model()
        with self.assertRaisesRegex(ValueError, "gpu_share is the fraction .* from 0 to 1, not 1.5"):
            tt.OffloadOptimizer(m.parameters(), gpu_share=1.5)
        # A share whose state the daemon's GPU tier (64 MiB here) cannot hold: refused, saying what it asks.
        wide = torch.nn.Linear(2048, 4096).to(share_device())  # 8.4M values: 134 MB of master, moments and gradient
        with self.assertRaises(tierd.TierdError) as e:
            tt.OffloadOptimizer(wide.parameters(), gpu_share=1.0, dram="256MiB")
        self.assertRegex(str(e.exception), r"gpu_share=1.0 keeps the state of 2 parameters on the GPU, 12[0-9.]+ MiB "
                                           r"of GPU quota \(gpu= smaller makes tierd move it in and out\): .*gpu tier")
        # A GPU quota smaller than one parameter's gradient there: the backward says what it needs
        # (clipping: no update starts in the backward, so this is the first refusal).
        m = m.to(share_device())
        opt = self.offload(m.parameters(), gpu_share=1.0, gpu="1KiB", max_grad_norm=1.0, name="tiny-gpu")
        with self.assertRaises(tierd.TierdError) as e:
            self.train(m, opt, [(x.to(share_device()), y.to(share_device())) for x, y in batches(1)])
        text = str(e.exception)
        self.assertEqual(e.exception.code, "RESOURCE_EXHAUSTED", text)
        self.assertRegex(text, r"parameter \d \(\(\d+(, \d+)?\)\) is stepped on the GPU \(gpu_share\), and tierd "
                               r"could not place its gradient there: its state and gradient need [0-9.]+ KiB of the "
                               r"session's GPU quota at once \(gpu= sets it\)")

    def test_the_example_trains_a_transformers_llama(self):
        try:
            import transformers  # noqa: F401
        except ImportError as e:
            self.skipTest(f"transformers is not importable here: {e}")
        example = os.path.join(os.environ["TIERD_EXAMPLES"], "offload_optimizer.py")  # run_python_test.sh
        # As given, and with the weights in tierd too (bf16, checkpointing, 8-bit AdamW).
        # The second with a share of the parameters stepped on (tierd's fake) GPU.
        for extra in ([], ["--offload_weights", "4MiB", "--opt", "adamw8bit", "--clip", "0", "--accumulate", "1",
                           "--gpu_share", "0.5"]):
            done = subprocess.run([sys.executable, example, "--steps", "12", "--dram", "32MiB", "--nvme", "32MiB"] + extra,
                                  capture_output=True, text=True, timeout=300,
                                  env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
            self.assertEqual(done.returncode, 0, done.stdout + done.stderr)
            losses = [float(line.split("loss ")[1].split(",")[0]) for line in done.stdout.splitlines()
                      if line.startswith("step ")]
            self.assertEqual(len(losses), 12, done.stdout)
            self.assertLess(losses[-1], losses[0] - 0.1, done.stdout)  # it learns
            self.assertIn("saved /tmp/offload_example.pt", done.stdout)
            if "--gpu_share" in extra:
                self.assertRegex(done.stdout, r"; 5\d% of them stepped on the GPU")
            saved = torch.load("/tmp/offload_example.pt")["model"]
            self.assertEqual(saved["model.embed_tokens.weight"].shape, (256, 64))  # weights, not placeholders

    def test_hugging_faces_trainer_trains_with_it(self):
        # transformers' Trainer as users run it, given OffloadOptimizer through optimizers=: its
        # own clipping off (the gradients have left the GPU when it would clip; ours clips), the
        # same accumulation, its linear schedule with warm-up driving our groups' learning rate.
        try:
            import accelerate  # noqa: F401  (Trainer needs it)
            import transformers
        except ImportError as e:
            self.skipTest(f"transformers' Trainer is not usable here: {e}")
        config = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                          num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
                                          max_position_embeddings=64)
        g = torch.Generator().manual_seed(1)
        rows = []
        for _ in range(48):
            t = torch.randint(0, 256, (64,), generator=g)
            t[1::2] = t[::2]
            rows.append({"input_ids": t, "labels": t.clone()})

        def losses(ours):
            torch.manual_seed(0)
            llama = transformers.LlamaForCausalLM(config)
            args = transformers.TrainingArguments(
                output_dir=os.path.join(os.environ.get("TEST_TMPDIR", "/tmp"), "trainer"), per_device_train_batch_size=4,
                gradient_accumulation_steps=2, max_steps=6, learning_rate=2e-3, weight_decay=0.1, adam_beta2=0.95,
                max_grad_norm=0.0 if ours else 0.5, lr_scheduler_type="linear", warmup_steps=2, logging_steps=1,
                report_to=[], save_strategy="no", use_cpu=True, seed=0, data_seed=0, disable_tqdm=True)
            opt = None
            if ours:
                opt = self.offload(llama.parameters(), lr=2e-3, betas=(0.9, 0.95), weight_decay=0.1, max_grad_norm=0.5,
                                   accumulation_steps=2, name="trainer")
            trainer = transformers.Trainer(model=llama, args=args, train_dataset=rows, optimizers=(opt, None),
                                           callbacks=[tt.trainer_callback(opt)] if ours else None)
            trainer.train()
            return [h["loss"] for h in trainer.state.log_history if "loss" in h], opt

        theirs, _ = losses(False)
        ours, opt = losses(True)
        self.assertEqual(len(ours), 6)
        for a, b in zip(ours, theirs):
            self.assertAlmostEqual(a, b, delta=1e-4 * abs(b))  # AdamW's arithmetic in another order
        self.assertLess(ours[-1], ours[0])
        self.assertGreater(opt.last_grad_norm, 0.5)  # our clip acted
        # The callback refuses what would silently train otherwise: the Trainer's own clipping (on
        # gradients already gone), a different accumulation.
        llama = transformers.LlamaForCausalLM(config)
        opt = self.offload(llama.parameters(), lr=2e-3, max_grad_norm=0.5, accumulation_steps=2, name="trainer-bad")
        for changed, words in (({"max_grad_norm": 1.0}, r"TrainingArguments\(max_grad_norm=1.0\) would clip gradients "
                                                         r".* pass max_grad_norm=0 to the Trainer"),
                               ({"max_grad_norm": 0.0, "gradient_accumulation_steps": 4},
                                r"gradient_accumulation_steps=4\) but OffloadOptimizer\(accumulation_steps=2\)")):
            args = transformers.TrainingArguments(output_dir=os.path.join(os.environ.get("TEST_TMPDIR", "/tmp"), "bad"),
                                                  per_device_train_batch_size=4, max_steps=1, report_to=[],
                                                  save_strategy="no", use_cpu=True, disable_tqdm=True, **changed)
            trainer = transformers.Trainer(model=llama, args=args, train_dataset=rows, optimizers=(opt, None),
                                           callbacks=[tt.trainer_callback(opt)])
            with self.assertRaisesRegex(ValueError, words):
                trainer.train()

    def test_bad_settings_and_checkpoints_are_refused(self):
        m = model()
        with self.assertRaisesRegex(ValueError, "adamw, adamw8bit or lion, not 'sgd'"):
            tt.OffloadOptimizer(m.parameters(), opt="sgd")
        with self.assertRaisesRegex(ValueError, "max_grad_norm must be positive"):
            tt.OffloadOptimizer(m.parameters(), max_grad_norm=0)
        opt = self.offload(m.parameters(), opt="adamw")
        other = self.offload(model().parameters(), opt="lion", name="other")
        with self.assertRaisesRegex(ValueError, "of a lion optimizer, not adamw"):
            opt.load_state_dict(other.state_dict())
        small = self.offload(torch.nn.Linear(3, 3).parameters(), name="small")
        with self.assertRaisesRegex(ValueError, "holds 2 parameters' state, this optimizer 4"):
            opt.load_state_dict(small.state_dict())
        wrong = opt.state_dict()
        wrong["state"][0]["master"] = torch.zeros(5)
        with self.assertRaisesRegex(ValueError, "parameter 0: the checkpoint has 5 values, the model 512"):
            opt.load_state_dict(wrong)


    def test_a_quota_too_small_for_the_state_says_what_it_needs(self):
        big = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.Linear(256, 256))  # 131,584 values
        with self.assertRaises(tierd.TierdError) as e:
            tt.OffloadOptimizer(big.parameters(), dram="64KiB", nvme="64KiB")
        text = str(e.exception)
        self.assertEqual(e.exception.code, "RESOURCE_EXHAUSTED", text)
        self.assertIn("the state of 4 parameters (131,584 values) needs 2.01 MiB", text)  # 4 + 8 + 4 B a value
        self.assertIn("dram=/nvme= set the quota", text)
        self.assertRegex(text, "quota 64.0 KiB")  # tierd's own words follow

if __name__ == "__main__":
    test_util.main()
