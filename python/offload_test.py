"""tierd.torch.offload(model): parameters in tierd's leases, acquired around each module's forward
and again for the backward, against the same model trained with its parameters in place (the
daemon on its fake GPU: "gpu" leases are host memory there, so the model runs on the CPU; the
lent GPU machine runs the CUDA case). Without torch every case is reported skipped."""
import copy
import unittest
import warnings

import test_util

try:
    import torch
    import tierd
    import tierd.torch as tt
    WHY_NOT = None
except ImportError as e:
    WHY_NOT = f"torch is not importable here: {e}"


class SelfCheckpointedBlock(torch.nn.Sequential if WHY_NOT is None else object):
    """A block that checkpoints its own forward, its module hooks outside the checkpoint (as
    transformers 5's layers do): the backward recomputes it without running them."""

    def forward(self, x):
        return torch.utils.checkpoint.checkpoint(super().forward, x, use_reentrant=False)


class TinyLm(torch.nn.Module if WHY_NOT is None else object):
    """Embedding, two blocks, a norm and a head tied to the embedding (one parameter, two modules).
    checkpointing: True, each block through torch.utils.checkpoint; "inside", blocks that
    checkpoint their own forward."""

    def __init__(self, vocab=64, d=32, checkpointing=False):
        super().__init__()
        self.checkpointing = checkpointing is True
        self.embed = torch.nn.Embedding(vocab, d)
        block = SelfCheckpointedBlock if checkpointing == "inside" else torch.nn.Sequential
        self.blocks = torch.nn.ModuleList(
            block(torch.nn.Linear(d, 4 * d), torch.nn.GELU(), torch.nn.Linear(4 * d, d)) for _ in range(2))
        self.norm = torch.nn.LayerNorm(d)
        self.head = torch.nn.Linear(d, vocab, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.blocks:
            if self.checkpointing:
                x = x + torch.utils.checkpoint.checkpoint(block, x, use_reentrant=False)
            else:
                x = x + block(x)
        return self.head(self.norm(x))


def data(steps, seed=5):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        t = torch.randint(0, 64, (4, 18), generator=g)
        t[:, 1::2] = t[:, ::2]
        out.append(t)
    return out


def loss_of(model, tokens):
    logits = model(tokens[:, :-1])
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))


@unittest.skipIf(WHY_NOT is not None, WHY_NOT or "")
class OffloadTest(unittest.TestCase):
    def setUp(self):
        self.closing = []

    def tearDown(self):
        for c in reversed(self.closing):
            c()

    def session(self, label):
        client = tierd.connect(label=label, gpu="4MiB", dram="16MiB", nvme="16MiB")
        self.closing.append(client.close)
        return client

    def trained(self, model, tokens, offloaded=None, accumulate=1, clip=1.0, name="opt", opt="adamw", gpu_share=0.0):
        client = offloaded.client if offloaded else self.session(f"plain-{name}")
        opt = tt.OffloadOptimizer(model.parameters(), opt=opt, lr=3e-3, max_grad_norm=clip,
                                  accumulation_steps=accumulate, client=client, name=name, gpu_share=gpu_share)
        losses = test_util.train_steps(model, opt, tokens, loss_of, accumulate)
        opt.close()  # its hooks go; the client (the offloaded model's too) stays
        return losses, opt

    def test_an_offloaded_model_trains_as_the_same_model_in_place(self):
        torch.manual_seed(0)
        plain = TinyLm()
        moved = copy.deepcopy(plain)
        weights = tt.offload(moved, client=self.session("offloaded"))
        tokens = data(6)
        for accumulate, clip in ((1, 1.0), (2, None)):  # updates at step(); and started in the backward
            want, _ = self.trained(plain, tokens, accumulate=accumulate, clip=clip, name=f"p{accumulate}")
            got, _ = self.trained(moved, tokens, weights, accumulate=accumulate, clip=clip, name=f"o{accumulate}")
            self.assertEqual(got, want)  # the same optimizer, the same math: the same bits
            state = weights.state_dict()
            for name, p in plain.named_parameters():
                self.assertTrue(torch.equal(state[name], p.detach()), name)
        self.assertLess(want[-1], want[0])

    def test_a_bf16_model_offloaded_trains_as_in_place(self):
        # bf16 weights: each update writes the new weights straight into the parameter's lease.
        for opt in ("adamw", "adamw8bit"):
            torch.manual_seed(0)
            plain = TinyLm().to(torch.bfloat16)
            moved = copy.deepcopy(plain)
            before = {name: p.detach().clone() for name, p in plain.named_parameters()}
            weights = tt.offload(moved, client=self.session(f"bf16-{opt}"), units=list(moved.blocks))
            tokens = data(4)
            for clip in (None, 1.0):
                want, _ = self.trained(plain, tokens, clip=clip, name=f"p-{opt}-{clip}", opt=opt)
                got, _ = self.trained(moved, tokens, weights, clip=clip, name=f"o-{opt}-{clip}", opt=opt)
                self.assertEqual(got, want, opt)
                state = weights.state_dict()
                for name, p in plain.named_parameters():
                    self.assertEqual(state[name].dtype, torch.bfloat16)
                    self.assertTrue(torch.equal(state[name], p.detach()), f"{opt} {name}")
            moved_any = [name for name in before if not torch.equal(weights.state_dict()[name], before[name])]
            self.assertEqual(len(moved_any), len(before), opt)  # every weight was updated

    def test_an_offloaded_share_stepped_on_the_gpu_trains_as_in_place(self):
        # Stepped on (tierd's fake) GPU, the new weights go straight into the leases there; the
        # forward after waits for them (on a real GPU: for the step's kernel, through its stream).
        client = self.session("share")
        if not client.fake_gpu:  # a CPU model's leases are host memory then: test_on_the_gpu's share runs it
            self.skipTest("tierd runs on the real GPU: test_on_the_gpu_it_trains_as_in_place has this case")
        torch.manual_seed(0)
        plain = TinyLm().to(torch.bfloat16)
        moved = copy.deepcopy(plain)
        weights = tt.offload(moved, client=client, units=list(moved.blocks))
        tokens = data(4)
        for clip in (None, 1.0):
            want, _ = self.trained(plain, tokens, clip=clip, name=f"p-share-{clip}", opt="adamw8bit")
            got, opt = self.trained(moved, tokens, weights, clip=clip, name=f"o-share-{clip}", opt="adamw8bit",
                                    gpu_share=0.6)
            self.assertGreater(opt.gpu_values, 0)
            self.assertEqual(got, want, clip)
            state = weights.state_dict()
            for name, p in plain.named_parameters():
                self.assertTrue(torch.equal(state[name], p.detach()), f"{clip} {name}")

    def test_activation_checkpointing_recomputes_with_the_leases(self):
        torch.manual_seed(3)
        plain = TinyLm(checkpointing=True)
        moved = copy.deepcopy(plain)
        weights = tt.offload(moved, client=self.session("checkpointed"))
        tokens = data(4)
        want, _ = self.trained(plain, tokens, name="ckpt-plain")
        got, _ = self.trained(moved, tokens, weights, name="ckpt-moved")
        self.assertEqual(got, want)
        self.assertEqual([s.uses for s in weights._slots], [0] * len(weights._slots))

    def test_a_unit_that_checkpoints_its_own_forward_recomputes_with_the_leases(self):
        # Its hooks stay outside the checkpoint: the unit's weights are acquired again when its
        # output's gradient arrives, before the recomputation, not left as placeholders.
        for units in (True, False):
            torch.manual_seed(3)
            plain = TinyLm(checkpointing="inside")
            moved = copy.deepcopy(plain)
            weights = tt.offload(moved, client=self.session(f"inside-{units}"),
                                 units=list(moved.blocks) if units else None)
            tokens = data(4)
            want, _ = self.trained(plain, tokens, name=f"inside-plain-{units}")
            got, _ = self.trained(moved, tokens, weights, name=f"inside-moved-{units}")
            self.assertEqual(got, want, f"units {units}")
            state = weights.state_dict()
            for name, p in plain.named_parameters():
                self.assertTrue(torch.equal(state[name], p.detach()), f"units {units}: {name}")
            self.assertEqual([s.uses for s in weights._slots], [0] * len(weights._slots))

    def test_a_transformers_llama_with_checkpointing_trains_as_in_place(self):
        # transformers 5 checkpoints each decoder layer's forward with the module hooks outside.
        try:
            import transformers
        except ImportError as e:
            self.skipTest(f"transformers is not importable here: {e}")
        torch.manual_seed(0)
        config = transformers.LlamaConfig(hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                                          num_attention_heads=4, num_key_value_heads=2, vocab_size=64,
                                          max_position_embeddings=32)
        plain = transformers.LlamaForCausalLM(config).to(torch.bfloat16)
        plain.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        moved = copy.deepcopy(plain)
        layer = transformers.models.llama.modeling_llama.LlamaDecoderLayer
        weights = tt.offload(moved, client=self.session("llama"), units=layer)
        tokens = data(4)
        llama_loss = lambda m, t: m(input_ids=t, labels=t).loss  # noqa: E731
        want = test_util.train_steps(plain, self._opt(plain, self.session("llama-plain")), tokens, llama_loss)
        got = test_util.train_steps(moved, self._opt(moved, weights.client), tokens, llama_loss)
        self.assertEqual(got, want)
        self.assertLess(want[-1], want[0])
        self.assertEqual([s.uses for s in weights._slots], [0] * len(weights._slots))

    def test_a_checkpointed_llama_updated_during_its_backward_in_a_small_quota_trains_as_in_place(self):
        # The 7B benchmark's loop in small: bf16 weights, each layer checkpointed, no clipping (each
        # parameter is updated as soon as its gradient is in, while the backward goes on), 8-bit
        # AdamW under a warm-up schedule, and a GPU quota that holds fewer than half the layers, so
        # tierd moves the weights while the optimizer writes them. On the lent GPU the kernels run
        # behind the host, which is where an update racing a read would show.
        try:
            import transformers
        except ImportError as e:
            self.skipTest(f"transformers is not importable here: {e}")
        device = "cuda" if torch.cuda.is_available() else "cpu"
        config = transformers.LlamaConfig(hidden_size=128, intermediate_size=352, num_hidden_layers=4,
                                          num_attention_heads=4, num_key_value_heads=2, vocab_size=64,
                                          max_position_embeddings=32, tie_word_embeddings=False,
                                          attn_implementation="eager")  # no atomics: runs repeat their bits
        layer_bytes = 2 * (2 * 128 * 128 + 2 * 128 * 64 + 3 * 128 * 352 + 2 * 128)
        torch.manual_seed(0)
        plain = transformers.LlamaForCausalLM(config).to(device=device, dtype=torch.bfloat16)
        plain.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        moved, again = copy.deepcopy(plain), copy.deepcopy(plain)
        client = tierd.connect(label="llama-small-quota", gpu=2 * layer_bytes, dram="16MiB", nvme="16MiB")
        self.closing.append(client.close)
        weights = tt.offload(moved, client=client, units=transformers.models.llama.modeling_llama.LlamaDecoderLayer)
        tokens = [t.to(device) for t in data(8)]

        def train(model, client, name):
            opt = tt.OffloadOptimizer(model.parameters(), opt="adamw8bit", lr=3e-3, max_grad_norm=None,
                                      client=client, name=name)
            self.closing.append(opt.close)
            sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 4))
            losses = []
            for t in tokens:
                loss = model(input_ids=t, labels=t).loss
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
                sched.step()
                losses.append(loss.item())
            return losses

        want = train(plain, self.session("llama-small-plain"), "small-plain")
        self.assertEqual(train(again, self.session("llama-small-again"), "small-again"), want,
                         "the loop in place does not repeat its own bits: no comparison would mean anything")
        fetched = lambda: sum(l.get("bytes", 0) for l in client.stats()["links"] if l["link"] == "dram->gpu")  # noqa: E731
        before = fetched()  # (protobuf JSON leaves out a count of 0)
        got = train(moved, weights.client, "small-moved")
        self.assertEqual(got, want)
        self.assertLess(want[-1], want[0])
        # The weights went back and forth: more came to the GPU than the model holds, each step.
        model_bytes = sum(p.numel() * p.element_size() for p in plain.parameters())
        self.assertGreater(fetched() - before, len(tokens) * model_bytes)

    def _opt(self, model, client):
        opt = tt.OffloadOptimizer(model.parameters(), lr=3e-3, max_grad_norm=1.0, client=client, name="llama")
        self.closing.append(opt.close)  # closed before its client (tearDown goes in reverse)
        return opt

    def test_a_units_parameter_the_forward_did_not_use_is_released(self):
        model = TinyLm(checkpointing="inside")
        model.blocks[0].append(torch.nn.Linear(32, 32))  # in the unit, never called
        model.blocks[0].forward = lambda x, block=model.blocks[0]: torch.utils.checkpoint.checkpoint(
            lambda y: block[2](block[1](block[0](y))), x, use_reentrant=False)
        weights = tt.offload(model, client=self.session("unused"), units=list(model.blocks))
        loss_of(model, data(1)[0]).backward()
        self.assertEqual([s.uses for s in weights._slots], [0] * len(weights._slots))
        self.assertTrue(all(s.idle.is_set() for s in weights._slots))

    def test_a_refused_acquire_in_the_backward_holds_nothing(self):
        model = TinyLm(checkpointing="inside")
        weights = tt.offload(model, client=self.session("refused-backward"), units=list(model.blocks))
        loss = loss_of(model, data(1)[0])
        gone = [s for s in weights._slots if s.name.startswith("blocks.1.")][0]
        weights.client.unlease(gone.lease)  # the backward's acquire of block 1 is refused
        with self.assertRaises(tierd.TierdError) as e:
            loss.backward()
        self.assertEqual(e.exception.code, "NOT_FOUND")
        self.assertIn("the backward of 'blocks.1'", str(e.exception))
        self.assertEqual([s.uses for s in weights._slots], [0] * len(weights._slots))
        self.assertTrue(all(s.idle.is_set() for s in weights._slots))

    def test_the_planner_follows_the_first_iterations_order(self):
        torch.manual_seed(4)
        plain = TinyLm()
        moved = copy.deepcopy(plain)
        weights = tt.offload(moved, client=self.session("planned"), plan=True)
        tokens = data(5)
        want, _ = self.trained(plain, tokens, name="plan-plain")
        # The optimizer's own leases in a session of their own: its writes are not in the graph.
        opt = tt.OffloadOptimizer(moved.parameters(), lr=3e-3, max_grad_norm=1.0, client=self.session("plan-opt"),
                                  name="plan-moved")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = test_util.train_steps(moved, opt, tokens, loss_of)
            opt.close()
        self.assertEqual(got, want)  # the plan moves bytes, not values
        self.assertEqual(weights.plan.state, "following", [str(w.message) for w in caught])
        kinds = [key[0] for key, _, _ in weights.plan.ops]  # 7 module forwards, then the saved weights' backward uses
        self.assertEqual(kinds, ["forward"] * 7 + ["backward"] * (len(kinds) - 7))
        self.assertGreaterEqual(len(kinds), 7 + 5)  # the four block weights and the tied head at least
        self.assertGreater(weights.plan.prediction["predicted_step_seconds"], 0)
        self.assertEqual(weights.plan.position, len(weights.plan.ops))  # the last iteration followed to its end
        self.assertFalse(any("departs" in str(w.message) for w in caught))
        moved.checkpointing = True  # another order: recomputations in the backward
        with self.assertWarnsRegex(UserWarning, "departs from the first's"):
            loss_of(moved, tokens[0]).backward()
        self.assertEqual(weights.plan.state, "off")

    def test_a_plan_tierd_refuses_leaves_training_to_the_online_policy(self):
        torch.manual_seed(6)
        plain = TinyLm()
        moved = copy.deepcopy(plain)
        client = self.session("refused")
        weights = tt.offload(moved, client=client, plan=True)

        def refuse(tensors, ops, host=False):  # as a 7B's graph under a too-small NVMe quota was refused
            raise tierd.TierdError("cannot plan this graph under the session's quotas: the tiers below the GPU "
                                   "need 12.6 GiB of NVMe at the peak (DRAM budget 79.8 GiB); the NVMe budget is 8.00 GiB")

        client.register_graph = refuse
        tokens = data(4)
        want, _ = self.trained(plain, tokens, name="refused-plain")
        opt = tt.OffloadOptimizer(moved.parameters(), lr=3e-3, max_grad_norm=1.0, client=self.session("refused-opt"),
                                  name="refused-moved")
        with self.assertWarnsRegex(UserWarning, "cannot plan this model's steps .*12.6 GiB of NVMe.*online policy"):
            got = test_util.train_steps(moved, opt, tokens, loss_of)
        opt.close()
        self.assertEqual(got, want)
        self.assertEqual(weights.plan.state, "off")

    def test_compiled_blocks_train_as_the_same_compiled_model_in_place(self):
        # units: each block's parameters acquired around its call, outside the compiled code (in
        # place: m.compile(); or the wrapper torch.compile(m) returns), with clipping and without,
        # with activation checkpointing. Both sides compiled alike: the same graphs, the same bits.
        for form, checkpointing, clip in (("in-place", False, 1.0), ("wrapper", True, None)):
            torch.manual_seed(7)
            plain = TinyLm(checkpointing=checkpointing)
            moved = copy.deepcopy(plain)
            for m in (plain, moved):
                for i, block in enumerate(m.blocks):
                    if form == "in-place":
                        block.compile()
                    else:
                        m.blocks[i] = torch.compile(block)
            units = moved.blocks if form == "in-place" else torch.nn.Sequential
            weights = tt.offload(moved, client=self.session(f"compiled-{form}"), units=units)
            self.assertEqual(len(weights._hook_slots), 2 + 3)  # the blocks, the embedding (tied), the norm
            tokens = data(4)
            want, _ = self.trained(plain, tokens, clip=clip, name=f"c-plain-{form}")
            got, _ = self.trained(moved, tokens, weights, clip=clip, name=f"c-moved-{form}")
            # Bit for bit where the CPU code inductor generates is the same for both; on the lent
            # machine's CPU one step's loss of the wrapper form came out 2 ulp apart (steps after it
            # equal again), so the losses are compared to 1e-6 and the weights' training checked
            # by the last loss.
            for g, w in zip(got, want):
                self.assertAlmostEqual(g, w, delta=1e-6 * abs(w), msg=form)
            self.assertLess(got[-1], got[0], form)
            self.assertEqual([s.uses for s in weights._slots], [0] * len(weights._slots))

    def test_units_are_modules_of_the_model(self):
        model = TinyLm()
        with self.assertRaisesRegex(ValueError, "no module of class"):
            tt.offload(model, client=self.session("units-class"), units=torch.nn.GRU)
        with self.assertRaisesRegex(ValueError, "units are modules of the model"):
            tt.offload(TinyLm(), client=self.session("units-foreign"), units=[torch.nn.Linear(2, 2)])

    def test_between_uses_the_parameters_hold_no_memory(self):
        model = TinyLm()
        weights = tt.offload(model, client=self.session("idle"))
        self.trained(model, data(2), weights)
        for slot in weights._slots:
            self.assertEqual(slot.uses, 0, slot.name)
            self.assertEqual(slot.param.stride(), tuple(0 for _ in slot.shape), slot.name)  # the placeholder
        self.assertEqual(len(weights._slots), 11)  # the tied head counted once

    def test_a_forward_without_gradients_and_close(self):
        torch.manual_seed(1)
        plain = TinyLm()
        moved = copy.deepcopy(plain)
        weights = tt.offload(moved, client=self.session("eval"))
        tokens = data(1)[0]
        with torch.no_grad():
            self.assertTrue(torch.equal(moved(tokens), plain(tokens)))
        weights.close()
        self.assertTrue(torch.equal(moved(tokens), plain(tokens)))
        self.assertTrue(all(p.stride() != (0,) * p.dim() for p in moved.parameters()))

    def test_a_forward_that_raises_releases_what_it_held(self):
        model = TinyLm()
        weights = tt.offload(model, client=self.session("raises"))
        with self.assertRaises(IndexError):
            model(torch.full((2, 4), 999))  # no such token
        self.assertEqual([s.uses for s in weights._slots], [0] * len(weights._slots))
        self.assertEqual(weights._saving, [])
        loss_of(model, data(1)[0]).backward()  # and the next one works
        self.assertEqual([s.uses for s in weights._slots], [0] * len(weights._slots))

    def test_a_refused_acquire_raises_tierds_error_and_holds_nothing(self):
        model = TinyLm()
        weights = tt.offload(model, client=self.session("refused"), units=list(model.blocks))
        block = [s for s in weights._slots if s.name.startswith("blocks.0.")]
        self.assertGreater(len(block), 2)  # a unit's parameters, acquired in one exchange
        weights.client.unlease(block[1].lease)  # tierd no longer knows it: its acquire is refused
        with self.assertRaises(tierd.TierdError) as e:
            loss_of(model, data(1)[0])
        self.assertEqual(e.exception.code, "NOT_FOUND")
        self.assertEqual([s.uses for s in weights._slots], [0] * len(weights._slots))
        self.assertTrue(all(s.idle.is_set() for s in weights._slots))
        for slot in (block[0], block[2]):  # granted beside the refused one, then released again
            with self.assertRaises(tierd.TierdError) as e:
                weights.client.release(slot.lease)
            self.assertEqual(e.exception.code, "FAILED_PRECONDITION")

    def test_a_unit_larger_than_the_gpu_quota_is_named(self):
        client = tierd.connect(label="tiny-gpu", gpu="4KiB", dram="16MiB", nvme="16MiB")
        self.closing.append(client.close)
        # Leased in the GPU place: a CUDA model on the real GPU, a CPU one on tierd's fake GPU.
        device = "cpu" if client.fake_gpu else "cuda"
        model = TinyLm().to(device)
        weights = tt.offload(model, client=client, units=list(model.blocks))
        with self.assertRaises(tierd.TierdError) as e:
            loss_of(model, data(1)[0].to(device))
        text = str(e.exception)
        self.assertEqual(e.exception.code, "RESOURCE_EXHAUSTED", text)
        self.assertRegex(text, r"the forward of '\S+' needs \d+ parameters .* at once")
        self.assertIn("must fit the session's GPU quota together", text)
        self.assertEqual([s.uses for s in weights._slots], [0] * len(weights._slots))

    def test_a_frozen_parameter_is_released_after_the_backward(self):
        model = TinyLm()
        model.norm.weight.requires_grad_(False)
        weights = tt.offload(model, client=self.session("frozen"))
        loss_of(model, data(1)[0]).backward()
        self.assertEqual([s.uses for s in weights._slots], [0] * len(weights._slots))

    def test_a_checkpoint_of_the_weights_loads_back(self):
        model = TinyLm()
        weights = tt.offload(model, client=self.session("ckpt"))
        state = weights.state_dict()
        other = TinyLm()
        other_weights = tt.offload(other, client=self.session("ckpt2"))
        other_weights.load_state_dict(state)
        tokens = data(1)[0]
        with torch.no_grad():
            self.assertTrue(torch.equal(model(tokens), other(tokens)))
        with self.assertRaisesRegex(ValueError, "the state's shape"):
            other_weights.load_state_dict(dict(state, **{"norm.weight": torch.zeros(3)}))
        with self.assertRaisesRegex(KeyError, "the state has no"):
            other_weights.load_state_dict({k: v for k, v in state.items() if k != "norm.bias"})

    def test_on_the_gpu_it_trains_as_in_place(self):
        if not torch.cuda.is_available():
            self.skipTest("no CUDA device (the lent GPU machine runs this case)")
        torch.manual_seed(2)
        plain = TinyLm().cuda()
        moved = copy.deepcopy(plain)
        weights = tt.offload(moved, client=self.session("gpu"))
        tokens = [t.cuda() for t in data(4)]
        want, _ = self.trained(plain, tokens, name="gpu-plain")
        got, _ = self.trained(moved, tokens, weights, name="gpu-moved")
        self.assertEqual(got, want)
        self.assertTrue(all(p.is_cuda for p in moved.parameters()))
        # bf16, a share stepped on the GPU: its kernel writes the leases there, the next forward waits for it.
        plain = plain.to(torch.bfloat16)
        moved = copy.deepcopy(plain)
        weights = tt.offload(moved, client=self.session("gpu-share"), units=list(moved.blocks))
        want, _ = self.trained(plain, tokens, name="gpu-share-plain", clip=None, opt="adamw8bit")
        got, opt = self.trained(moved, tokens, weights, name="gpu-share-moved", clip=None, opt="adamw8bit",
                                gpu_share=0.6)
        self.assertGreater(opt.gpu_values, 0)
        self.assertEqual(got, want)


if __name__ == "__main__":
    test_util.main()
