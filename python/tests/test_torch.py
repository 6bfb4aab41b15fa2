"""Tests of the msa package with PyTorch: torch tensors, the custom op
torch.ops.msa.forward (eager, torch.compile, CUDA graphs), the engine
adapters and the tiny MiniMax-M3 example.

Runs under pytest or unittest, or as a program (CTest runs it so): it then
prints "N passed, N failed, N skipped" and exits 77 when torch (or NumPy)
is missing.  The CUDA tests run where torch sees a GPU and the library has
the CUDA backend ($MSA_LIBRARY naming a CUDA build); they skip elsewhere.
"""

import math
import os
import sys
import unittest

import unittest_counts  # beside this file
import warnings

try:
    import numpy as np
    import torch
except ImportError as e:  # pragma: no cover - the runner below reports a skip
    torch = None
    _MISSING = e.name
    if __name__ != "__main__":
        raise unittest.SkipTest("skipped: %s not installed" % e.name)

HERE = os.path.dirname(os.path.abspath(__file__))
if torch is not None:
    if os.environ.get("MSA_TEST_INSTALLED") != "1":
        sys.path.insert(0, os.path.dirname(HERE))
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "examples"))
    import msa
    import msa.adapters as adapters
    import msa.torch_ops as torch_ops


def small_config():
    return msa.ModelConfig(num_layers=2, num_q_heads=4, num_kv_heads=2, head_dim=16,
                           num_index_heads=2, index_dim=8, block_size=8, topk_blocks=3,
                           init_blocks=1, local_blocks=1, score_type="max",
                           layer_sparse=[0, 1], layer_index_value=[0, 1])


class Setup:
    """A context, model, cache and plan of the small config."""

    def __init__(self, act="fp32", backend="cpu", num_pages=32, page_size=8, **plan_kw):
        self.ctx = msa.Context(backend, num_threads=2) if backend == "cpu" else msa.Context(backend)
        self.model = msa.Model(self.ctx, small_config())
        self.cache = msa.Cache(self.ctx, self.model, num_pages=num_pages, page_size=page_size,
                               kv_dtype=act, index_dtype=act)
        self.plan = msa.Plan(self.ctx, self.model, self.cache, act_dtype=act, **plan_kw)
        self.act = act
        self.W = self.model.topk_width

    def close(self):
        self.ctx.close()

    def inputs(self, T, seed=0, device="cpu"):
        g = torch.Generator().manual_seed(seed)
        dt = {"fp32": torch.float32, "bf16": torch.bfloat16}[self.act]

        def r(*s):
            return torch.randn(*s, generator=g).to(dt).to(device)

        # Index values of multiples of 1/8: exact scores, exactly defined ties.
        def idx(*s):
            return (torch.randint(-8, 9, s, generator=g) / 8.0).to(dt).to(device)

        return {"q": r(T, 4, 16), "k": r(T, 2, 16), "v": r(T, 2, 16), "idx_q": idx(T, 2, 8),
                "idx_k": idx(T, 8), "idx_v": r(T, 8)}

    def outputs(self, T, device="cpu"):
        dt = {"fp32": torch.float32, "bf16": torch.bfloat16}[self.act]
        return {"o": torch.full((T, 4, 16), math.nan, dtype=dt, device=device),
                "idx_o": torch.full((T, 2, 8), math.nan, dtype=dt, device=device),
                "lse": torch.full((T, 4), math.nan, device=device),
                "topk": torch.full((T, 2, self.W), -7, dtype=torch.int32, device=device)}

    def planes(self):
        return {(l, k): self.cache.tensor(l, k).clone() for l in range(2)
                for k in ("k", "v", "index_k", "index_v") if self.cache.has_plane(l, k)}


def to_np(t):
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.uint16)
    return t.numpy()


def run_layers(fwd, plan, x, outs):
    """Both layers of the small config through fwd (Plan.forward or the op)."""
    fwd(plan, 0, x["q"], x["k"], x["v"], o=outs[0]["o"], lse=outs[0]["lse"])
    fwd(plan, 1, x["q"], x["k"], x["v"], x["idx_q"], x["idx_k"], x["idx_v"], o=outs[1]["o"],
        idx_o=outs[1]["idx_o"], lse=outs[1]["lse"], topk=outs[1]["topk"])


def plan_forward(plan, layer, *a, **kw):
    return plan.forward(layer, *a, **kw)


# ---- torch tensors through Plan.forward --------------------------------------------------


@unittest.skipIf(torch is None, "torch not installed")
class TestTensors(unittest.TestCase):
    def test_torch_equals_numpy(self):
        for act in ("fp32", "bf16"):
            a, b = Setup(act), Setup(act)
            try:
                for s in (a, b):
                    s.plan.update([20, 3], [20, 9], [[3, 1, 4], [0, 5]])
                x = a.inputs(23)
                ot, on = [a.outputs(23) for _ in range(2)], [a.outputs(23) for _ in range(2)]
                run_layers(plan_forward, a.plan, x, ot)
                xn = {k: to_np(t) for k, t in x.items()}
                on = [{k: to_np(t) for k, t in d.items()} for d in on]
                run_layers(plan_forward, b.plan, xn, on)
                for layer in range(2):
                    for k in ("o", "lse", "topk") + (("idx_o",) if layer else ()):
                        np.testing.assert_array_equal(to_np(ot[layer][k]), on[layer][k],
                                                      "%s %s layer %d" % (act, k, layer))
                    self.assertFalse(torch.isnan(ot[layer]["o"].float()).any())
                self.assertTrue((ot[1]["topk"][:20, :, 0] == 0).all())  # the init block
            finally:
                a.close()
                b.close()

    def test_bad_tensors_write_nothing(self):
        s = Setup()
        try:
            s.plan.update([10], [10], [[2, 0]])
            x = s.inputs(10)
            out = s.outputs(10)
            before = s.planes()

            def fwd(**kw):
                args = dict(q=x["q"], k=x["k"], v=x["v"], o=out["o"])
                args.update(kw)
                return s.plan.forward(0, **args)

            cases = [
                (dict(q=x["q"].double()), r"q must hold fp32 .* not torch.float64"),
                (dict(q=x["q"].to(torch.bfloat16)), r"q must hold fp32 .* not bf16"),
                (dict(k=x["k"].transpose(0, 1).contiguous().transpose(0, 1)),
                 "k must be C-contiguous"),
                (dict(v=x["v"][:, :, ::2]), r"v must have shape \(10, 2, 16\)"),
                (dict(q=torch.empty((10, 4, 16), device="meta")),
                 "q is on meta; this cpu context needs tensors on cpu"),
                (dict(k=x["k"].to_sparse()), "k must be a strided"),
                (dict(o=out["o"][:9]), r"o must have shape \(10, 4, 16\)"),
            ]
            for kw, msg in cases:
                with self.assertRaisesRegex(ValueError, msg):
                    fwd(**kw)
            self.assertTrue(torch.isnan(out["o"]).all())
            for key, t in s.planes().items():
                self.assertTrue(torch.equal(t, before[key]), key)
            # [T][Hq*D] is the same tensor; a torch page table is a page table.
            s.plan.update(torch.tensor([10]), torch.tensor([10]), torch.tensor([[2, 0]]))
            fwd(q=x["q"].reshape(10, 64))
            self.assertFalse(torch.isnan(out["o"]).any())
            with self.assertRaisesRegex(ValueError, "page_table must hold integers"):
                s.plan.update([10], [10], torch.tensor([[2.0, 0.0]]))
        finally:
            s.close()

    def test_cache_tensor(self):
        s = Setup()
        try:
            s.plan.update([12], [12], [[6, 1]])
            x = s.inputs(12)
            s.plan.forward(1, x["q"], x["k"], x["v"], x["idx_q"], x["idx_k"], x["idx_v"],
                           idx_o=s.outputs(12)["idx_o"])
            for kind in ("k", "v", "index_k", "index_v"):
                t = s.cache.tensor(1, kind)
                self.assertIs(t, s.cache.tensor(1, kind))
                self.assertEqual(tuple(t.shape), s.cache.plane(1, kind).shape)
                np.testing.assert_array_equal(t.numpy(), s.cache.read_plane(1, kind))
            # msa's layout: position p of the request is page [6, 1][p // 8], row p % 8.
            k = s.cache.tensor(1, "k")
            self.assertTrue(torch.equal(k[6].transpose(0, 1), x["k"][:8]))
            self.assertTrue(torch.equal(k[1, :, :4].transpose(0, 1), x["k"][8:]))
            s.cache.tensor(0, "v")[3, 1, 2, 5] = 42.0
            self.assertEqual(s.cache.read_plane(0, "v")[3, 1, 2, 5], 42.0)
            with self.assertRaisesRegex(ValueError, "no index_k plane"):
                s.cache.tensor(0, "index_k")
            s.cache.close()
            with self.assertRaisesRegex(ValueError, "Cache is closed"):
                s.cache.tensor(1, "k")
        finally:
            s.close()


# ---- the custom op ---------------------------------------------------------------------------


def op_forward(plan, layer, *a, **kw):
    return torch_ops.forward(plan, layer, *a, **kw)


@unittest.skipIf(torch is None, "torch not installed")
class TestCustomOp(unittest.TestCase):
    def test_schema_declares_the_writes(self):
        schema = str(torch.ops.msa.forward.default._schema)
        for name in ("o", "idx_o", "lse", "topk", "k_cache", "v_cache", "index_k_cache",
                     "index_v_cache"):
            self.assertRegex(schema, r"Tensor\(\w+!\)\?? %s\b" % name)
        self.assertNotRegex(schema, r"Tensor\(\w+!\)\?? (q|k|v|idx_q|idx_k|idx_v)\b")

    def test_opcheck(self):
        """torch.library.opcheck: the schema, the fake implementation and
        the declared writes agree with what the op does (it runs the op on
        copies of the arguments too, which the plane copy path serves)."""
        if not hasattr(torch.library, "opcheck"):
            self.skipTest("this torch has no torch.library.opcheck")
        s = Setup()
        try:
            s.plan.update([12], [12], [[3, 1]])
            info = torch_ops.prepare(s.plan)
            x, out = s.inputs(12), s.outputs(12)
            for layer in range(2):
                args = (info.op_id, layer, x["q"], x["k"], x["v"]) + (
                    (x["idx_q"], x["idx_k"], x["idx_v"], out["o"], out["idx_o"]) if layer else
                    (None, None, None, out["o"], None)) + (
                    out["lse"], out["topk"] if layer else None) + info.planes[layer] + (True,)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", RuntimeWarning)
                    res = torch.library.opcheck(torch.ops.msa.forward.default, args)
                self.assertEqual(set(res.values()), {"SUCCESS"}, res)
        finally:
            s.close()

    def test_eager_equals_plan_forward(self):
        a, b = Setup(), Setup()
        try:
            for s in (a, b):
                s.plan.update([17, 5], [17, 30], [[7, 2, 9], [4, 11, 12, 13]])
            x = a.inputs(22, seed=1)
            oa, ob = [a.outputs(22) for _ in range(2)], [a.outputs(22) for _ in range(2)]
            run_layers(plan_forward, a.plan, x, oa)
            run_layers(op_forward, b.plan, x, ob)
            for layer in range(2):
                for k in oa[layer]:
                    if layer == 0 and k in ("idx_o", "topk"):
                        continue
                    self.assertTrue(torch.equal(oa[layer][k], ob[layer][k]), (layer, k))
            pa, pb = a.planes(), b.planes()
            for key in pa:
                self.assertTrue(torch.equal(pa[key], pb[key]), key)
            o = torch_ops.forward(b.plan, 0, x["q"], x["k"], x["v"])  # o allocated like q
            self.assertTrue(torch.equal(o, oa[0]["o"]))
            with self.assertRaisesRegex(ValueError, "idx_o is required"):
                torch_ops.forward(b.plan, 1, x["q"], x["k"], x["v"], x["idx_q"], x["idx_k"],
                                  x["idx_v"])
            with self.assertRaisesRegex(ValueError, "out of range"):
                torch_ops.forward(b.plan, 2, x["q"])
            b.plan.close()
            with self.assertRaisesRegex(ValueError, "Plan is closed"):
                torch_ops.prepare(b.plan)
            with self.assertRaisesRegex(ValueError, "closed"):
                torch_ops.forward(b.plan, 0, x["q"], x["k"], x["v"])
        finally:
            a.close()
            b.close()

    def _compiled_equals_eager(self, backend):
        eager, comp = Setup(), Setup()
        try:
            torch_ops.prepare(comp.plan)

            def step_fn(plan, x):
                # A layer pair as a model would call it: the op twice, torch
                # work around it.
                o0 = torch_ops.forward(plan, 0, x["q"] * 0.5, x["k"], x["v"])
                idx_o = torch.empty((x["q"].shape[0], 2, 8))
                topk = torch.full((x["q"].shape[0], 2, 3), -7, dtype=torch.int32)
                o1 = torch_ops.forward(plan, 1, o0 + x["q"], x["k"], x["v"], x["idx_q"],
                                       x["idx_k"], x["idx_v"], idx_o=idx_o, topk=topk)
                return o1 * 2.0 - 1.0, idx_o * 2, topk

            compiled = torch.compile(step_fn, fullgraph=True, backend=backend)
            steps = [([24], [24], [[5, 3, 8]]), ([1], [25], [[5, 3, 8, 1]]),
                     ([3], [28], [[5, 3, 8, 1]])]
            for i, (ql, kl, pt) in enumerate(steps):
                eager.plan.update(ql, kl, pt)
                comp.plan.update(ql, kl, pt)
                x = eager.inputs(ql[0], seed=10 + i)
                want = step_fn(eager.plan, x)
                got = compiled(comp.plan, x)
                for j, (w, g) in enumerate(zip(want, got)):
                    self.assertTrue(torch.equal(w, g), "step %d output %d: max diff %s" % (
                        i, j, (w.double() - g.double()).abs().max().item()))
            pe, pc = eager.planes(), comp.planes()
            for key in pe:
                self.assertTrue(torch.equal(pe[key], pc[key]), key)
            self.assertTrue(pc[(1, "index_v")].any())
        finally:
            eager.close()
            comp.close()

    def test_compile_fullgraph_inductor(self):
        """torch.compile(fullgraph=True) with the default backend: one graph,
        the planes written in place, outputs equal to eager."""
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)  # no plane copies
            self._compiled_equals_eager("inductor")

    def test_compile_fullgraph_aot_eager(self):
        """A backend that does not write in place hands the op copies of the
        planes: the results stay right (and the op warns)."""
        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            self._compiled_equals_eager("aot_eager")

    @unittest.skipUnless(torch is not None and torch.cuda.is_available(), "no CUDA device")
    def test_cuda_tensors_and_graph_capture(self):
        if not msa.backend_available("cuda"):
            self.skipTest("the library has no CUDA backend")
        dev = torch.device("cuda")
        cpu = Setup("bf16")
        gpu = Setup("bf16", backend="cuda", max_requests=2, max_tokens=2, max_kv_len=64,
                    max_q_len=1)
        try:
            prefix = ([30, 20], [30, 20], [[0, 1, 2, 3, 7], [4, 5, 6]])
            steps = [([1, 1], [31 + i, 21 + i], [[0, 1, 2, 3, 7], [4, 5, 6]]) for i in range(4)]
            # The prefix: through a growing CUDA plan on the same cache.
            grow = msa.Plan(gpu.ctx, gpu.model, gpu.cache, act_dtype="bf16")
            for plan, d in ((cpu.plan, "cpu"), (grow, dev)):
                plan.update(*prefix)
                x = cpu.inputs(50, seed=3, device=d)
                plan.forward(0, x["q"], x["k"], x["v"])
                plan.forward(1, x["q"], x["k"], x["v"], x["idx_q"], x["idx_k"], x["idx_v"],
                             idx_o=cpu.outputs(50, d)["idx_o"])
            x_static = cpu.inputs(2, seed=4, device=dev)
            out = gpu.outputs(2, dev)
            gpu.plan.update(*steps[0])
            torch_ops.prepare(gpu.plan)
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                run_layers(op_forward, gpu.plan, x_static, [out, out])
            torch.cuda.current_stream().wait_stream(side)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                run_layers(op_forward, gpu.plan, x_static, [out, out])
            for i, st in enumerate(steps):
                x = cpu.inputs(2, seed=20 + i)
                cpu.plan.update(*st)
                want = cpu.outputs(2)
                run_layers(plan_forward, cpu.plan, x, [want, want])
                gpu.plan.update(*st)
                for k in x:
                    x_static[k].copy_(x[k])
                g.replay()
                torch.cuda.synchronize()
                for k in ("o", "idx_o", "topk"):
                    w, got = want[k].float(), out[k].cpu().float()
                    err = (torch.linalg.norm(got - w) / torch.linalg.norm(w)).item()
                    self.assertLess(err, 1e-2, "step %d %s" % (i, k))
            grow.close()
        finally:
            cpu.close()
            gpu.close()


# ---- adapters --------------------------------------------------------------------------------


@unittest.skipIf(torch is None, "torch not installed")
class TestAdapters(unittest.TestCase):
    def test_block_table(self):
        bt = torch.tensor([[3, 1, 0, 0], [7, 2, 6, 0], [0, 0, 0, 0]], dtype=torch.int32)
        st = adapters.step_from_block_table(bt, torch.tensor([12, 20, 0]),
                                            torch.tensor([0, 12, 13, 13]), page_size=8,
                                            num_tokens=16)
        np.testing.assert_array_equal(st.q_len, [12, 1, 0])
        np.testing.assert_array_equal(st.kv_len, [12, 20, 0])
        np.testing.assert_array_equal(st.page_table, [[3, 1, -1], [7, 2, 6], [-1, -1, -1]])
        self.assertEqual(st.num_tokens, 16)
        self.assertEqual(st.page_table.dtype, np.int32)
        self.assertEqual(adapters.written_pages(st, 8), [1, 3, 6])
        # Engine blocks of 16 tokens over pages of 8: block b is pages 2b, 2b+1.
        st = adapters.step_from_block_table([[3, 1]], [20], [0, 4], page_size=8,
                                            engine_block_size=16)
        np.testing.assert_array_equal(st.page_table, [[6, 7, 2]])  # 20 tokens: 3 pages
        bad = [
            (([[3, 1, 5]], [20], [0, 4, 5]), {}, "query_start_loc has 3 entries"),
            (([[3, 1, 5]], [20], [1, 4]), {}, "must start at 0"),
            (([[3, 1]], [3], [0, 4]), {}, "request 0: 4 new tokens and 3 tokens"),
            (([[3]], [20], [0, 4]), {}, "request 0 needs 3 blocks for 20 tokens"),
            (([[3, -1, 5]], [20], [0, 4]), {}, r"request 0: block 1 \(positions 8..15\) is -1"),
            (([[3, 1, 5]], [20], [0, 4]), {"engine_block_size": 12}, "not a multiple"),
            (([[3, 1, 5]], [20], [0, 4]), {"num_tokens": 3}, "num_tokens 3 is fewer"),
            (([3, 1], [20], [0, 4]), {}, "block_table must be a 2-D array"),
            ((torch.tensor([[3.0, 1.0]]), [20], [0, 4]), {}, "block_table must hold integers"),
        ]
        for args, kw, msg in bad:
            with self.assertRaisesRegex(ValueError, msg):
                adapters.step_from_block_table(*args, **dict({"page_size": 8}, **kw))

    def test_req_to_token(self):
        r2t = torch.full((4, 40), -1, dtype=torch.int32)
        r2t[2, :20] = torch.arange(20) + 40  # pages 10, 11, 12 of 4 tokens... of P=4
        r2t[0, :6] = torch.tensor([8, 9, 10, 11, 0, 1])
        st = adapters.step_from_req_to_token(r2t, [2, 0], [20, 6], page_size=4, q_lens=[20, 1])
        np.testing.assert_array_equal(st.page_table, [[10, 11, 12, 13, 14], [2, 0, -1, -1, -1]])
        self.assertEqual(st.num_tokens, 21)
        # Page size 1: any slots; the pages are the slots.
        r2t[1, :5] = torch.tensor([9, 3, 17, 4, 0])
        st = adapters.step_from_req_to_token(r2t, [1], [5], page_size=1)
        np.testing.assert_array_equal(st.page_table, [[9, 3, 17, 4, 0]])
        np.testing.assert_array_equal(st.q_len, [1])
        with self.assertRaisesRegex(ValueError, "not page-aligned for page size 4: request 0 "
                                    r"position 0 \(the start of page 0\) maps to slot 9"):
            adapters.step_from_req_to_token(r2t, [1], [5], page_size=4)
        r2t[2, 6] = 99
        with self.assertRaisesRegex(ValueError, "request 0 position 6 maps to slot 99, but its "
                                    "page starts at slot 44, so it must be slot 46"):
            adapters.step_from_req_to_token(r2t, [2], [20], page_size=4)
        st = adapters.step_from_req_to_token(r2t, [2], [20], page_size=4, check_all=False)
        np.testing.assert_array_equal(st.page_table, [[10, 11, 12, 13, 14]])
        with self.assertRaisesRegex(ValueError, "req_pool_indices 7 is outside"):
            adapters.step_from_req_to_token(r2t, [7], [5], page_size=1)
        with self.assertRaisesRegex(ValueError, "position 5 maps to slot -1"):
            adapters.step_from_req_to_token(r2t, [1], [6], page_size=1)
        with self.assertRaisesRegex(ValueError, "41 tokens; req_to_token has 40 columns"):
            adapters.step_from_req_to_token(r2t, [1], [41], page_size=1)

    def test_adapter_steps_drive_the_plan(self):
        """A step from the block table gives the outputs of the same step
        written by hand."""
        a, b = Setup(), Setup()
        try:
            a.plan.update([12, 1], [12, 20], [[3, 1], [7, 2, 6]])
            st = adapters.step_from_block_table([[3, 1, 0], [7, 2, 6]], [12, 20], [0, 12, 13],
                                                page_size=8)
            b.plan.update(*st)
            x = a.inputs(13)
            oa, ob = a.outputs(13), b.outputs(13)
            for s, o in ((a, oa), (b, ob)):
                s.plan.forward(1, x["q"], x["k"], x["v"], x["idx_q"], x["idx_k"], x["idx_v"],
                               o=o["o"], idx_o=o["idx_o"], topk=o["topk"])
            for k in ("o", "idx_o", "topk"):
                self.assertTrue(torch.equal(oa[k], ob[k]), k)
        finally:
            a.close()
            b.close()

    def test_copy_into_cache(self):
        s = Setup("bf16", num_pages=6, page_size=4)
        try:
            g = torch.Generator().manual_seed(5)
            nhd = torch.randn(6, 4, 2, 16, generator=g).to(torch.bfloat16)  # [pages][P][Hkv][D]
            adapters.copy_into_cache(s.cache, 0, "k", nhd, "nhd")
            self.assertTrue(torch.equal(s.cache.tensor(0, "k"), nhd.transpose(1, 2)))
            tokens = torch.randn(6 * 4 + 4, 2, 16, generator=g).to(torch.bfloat16)  # [slots]...
            adapters.copy_into_cache(s.cache, 0, "v", tokens, "tokens", pages=[1, 4])
            v = s.cache.tensor(0, "v")
            for p in range(6):
                want = tokens[p * 4:(p + 1) * 4].transpose(0, 1)
                self.assertEqual(torch.equal(v[p], want), p in (1, 4), p)
            ik = torch.randn(6 * 4, 8, generator=g).to(torch.bfloat16)
            adapters.copy_into_cache(s.cache, 1, "index_k", ik, "tokens")
            self.assertTrue(torch.equal(s.cache.tensor(1, "index_k"), ik.view(6, 4, 8)))
            # NumPy: through read_plane / write_plane, bf16 as uint16.
            hnd = to_np(torch.randn(6, 2, 4, 16, generator=g).to(torch.bfloat16))
            adapters.copy_into_cache(s.cache, 1, "v", hnd, "msa", pages=np.array([0, 5]))
            got = s.cache.read_plane(1, "v")
            np.testing.assert_array_equal(got[[0, 5]], hnd[[0, 5]])
            self.assertFalse(got[1:5].any())
            before = s.planes()
            bad = [
                ((0, "k", nhd.float(), "nhd"), {}, "holds torch.bfloat16; src holds torch.float32"),
                ((0, "k", nhd, "msa"), {}, r"must have shape \[6\]\[2\]\[4\]\[16\]"),
                ((0, "k", tokens[:20], "tokens"), {}, r"\[>= 24\]\[2\]\[16\]"),
                ((0, "k", nhd, "hd"), {}, "layout must be one of"),
                ((0, "k", nhd, "nhd"), {"pages": [6]}, r"pages must be page ids in 0..5"),
                ((0, "index_k", ik, "tokens"), {}, "no index_k plane"),
                ((1, "v", hnd.astype(np.float16), "msa"), {}, "holds bf16; src holds float16"),
                ((1, "v", hnd.tolist(), "msa"), {}, "src must be a NumPy array or a torch"),
            ]
            for args, kw, msg in bad:
                with self.assertRaisesRegex(ValueError, msg):
                    adapters.copy_into_cache(s.cache, *args, **kw)
            for key, t in s.planes().items():
                self.assertTrue(torch.equal(t, before[key]), key)
        finally:
            s.close()

    def test_vllm_cache_wrapped_in_place(self):
        """vLLM's [pages, 2, P, Hkv, D] caches wrapped in place: forward
        writes the step into the engine's tensors and gives the outputs of
        msa's own cache filled by copy_into_cache, bit for bit."""
        a = Setup("bf16", num_pages=8, page_size=4)
        try:
            g = torch.Generator().manual_seed(9)
            kv = [torch.randn(8, 2, 4, 2, 16, generator=g).to(torch.bfloat16) for _ in range(2)]
            idx = [None, torch.randn(8, 2, 4, 8, generator=g).to(torch.bfloat16)]
            for layer in range(2):
                adapters.copy_into_cache(a.cache, layer, "k", kv[layer][:, 0], "nhd")
                adapters.copy_into_cache(a.cache, layer, "v", kv[layer][:, 1], "nhd")
            adapters.copy_into_cache(a.cache, 1, "index_k", idx[1][:, 0], "nhd")
            adapters.copy_into_cache(a.cache, 1, "index_v", idx[1][:, 1], "nhd")
            mine_kv = [t.clone() for t in kv]
            mine_idx = [None, idx[1].clone()]
            cache = adapters.wrap_vllm_cache(a.ctx, a.model, mine_kv, mine_idx)
            # The wrapped planes as tensors: strided views of the engine's.
            self.assertTrue(torch.equal(cache.tensor(0, "k"), mine_kv[0][:, 0].transpose(1, 2)))
            self.assertEqual(cache.tensor(0, "k").data_ptr(), mine_kv[0].data_ptr())
            plan = msa.Plan(a.ctx, a.model, cache, act_dtype="bf16")
            x = a.inputs(14, seed=3)
            for p in (a.plan, plan):
                p.update([10, 4], [14, 6], [[3, 6, 1, 0], [7, 2]])
            for layer in range(2):
                oa, ob = a.outputs(14), a.outputs(14)
                for p, o in ((a.plan, oa), (plan, ob)):
                    p.forward(layer, x["q"], x["k"], x["v"], x["idx_q"], x["idx_k"], x["idx_v"],
                              o=o["o"], idx_o=o["idx_o"] if layer else None, lse=o["lse"])
                for k in ("o", "lse") + (("idx_o",) if layer else ()):
                    self.assertTrue(torch.equal(oa[k], ob[k]), (layer, k))
            for layer in range(2):
                self.assertTrue(torch.equal(a.cache.tensor(layer, "v"),
                                            mine_kv[layer][:, 1].transpose(1, 2)), layer)
            self.assertTrue(torch.equal(a.cache.tensor(1, "index_v"), mine_idx[1][:, 1]))
            self.assertFalse(torch.equal(mine_kv[1], kv[1]), "the step was written in place")
            plan.close()
        finally:
            a.close()

    def test_engine_cache_then_forward_without_cache_write(self):
        """An engine that keeps its own token-major cache (SGLang's layout),
        writes the step there and copies the written pages into msa's cache:
        forward with write_cache=False equals forward writing the cache."""
        a, b = Setup(page_size=4), Setup(page_size=4)
        try:
            r2t = torch.zeros((2, 32), dtype=torch.int32)
            r2t[0, :14] = torch.cat([torch.arange(20, 24), torch.arange(4, 8),
                                     torch.arange(36, 42)])
            st = adapters.step_from_req_to_token(r2t, [0], [14], page_size=4, q_lens=[14])
            np.testing.assert_array_equal(st.page_table, [[5, 1, 9, 10]])
            x = a.inputs(14, seed=7)
            eng = {kind: torch.zeros((32 * 4,) + tuple(x[n].shape[1:]))
                   for kind, n in (("k", "k"), ("v", "v"), ("index_k", "idx_k"),
                                   ("index_v", "idx_v"))}
            slots = r2t[0, :14].long()
            for kind, n in (("k", "k"), ("v", "v"), ("index_k", "idx_k"), ("index_v", "idx_v")):
                eng[kind][slots] = x[n]  # the engine's own cache write
            pages = adapters.written_pages(st, 4)
            self.assertEqual(pages, [1, 5, 9, 10])
            for kind in eng:
                adapters.copy_into_cache(b.cache, 1, kind, eng[kind], "tokens", pages=pages)
            oa, ob = a.outputs(14), b.outputs(14)
            a.plan.update(*st)
            b.plan.update(*st)
            a.plan.forward(1, x["q"], x["k"], x["v"], x["idx_q"], x["idx_k"], x["idx_v"],
                           o=oa["o"], idx_o=oa["idx_o"], topk=oa["topk"])
            b.plan.forward(1, x["q"], idx_q=x["idx_q"], o=ob["o"], idx_o=ob["idx_o"],
                           topk=ob["topk"], write_cache=False)
            for k in ("o", "idx_o", "topk"):
                self.assertTrue(torch.equal(oa[k], ob[k]), k)
        finally:
            a.close()
            b.close()


# ---- the README's example ------------------------------------------------------------------


@unittest.skipIf(torch is None, "torch not installed")
class TestReadme(unittest.TestCase):
    def test_readme_python_example(self):
        """The first Python block of README.md runs, on the tiny model's
        config.json and a decode step of two requests."""
        import json
        import tempfile

        import tiny_m3

        readme = os.path.join(HERE, "..", "..", "README.md")
        if not os.path.exists(readme):
            self.skipTest("README.md is not beside the package")
        lines, inside = [], False
        with open(readme) as f:
            for line in f:
                if line.rstrip() == "```python":
                    inside = True
                elif line.rstrip() == "```" and inside:
                    break
                elif inside:
                    lines.append(line)
        self.assertTrue(lines, "no python block in README.md")
        cfg = tiny_m3.Config(tiny_m3.CONFIG)
        T = 2
        g = torch.Generator().manual_seed(0)

        def r(*shape):
            return torch.randn(*shape, generator=g).to(torch.bfloat16)

        env = {"__name__": "readme", "block_table": torch.tensor([[3, 0], [5, 9]]),
               "seq_lens": torch.tensor([130, 7]), "query_start_loc": torch.tensor([0, 1, 2]),
               "q": r(T, cfg.hq, cfg.d), "k": r(T, cfg.hkv, cfg.d), "v": r(T, cfg.hkv, cfg.d),
               "idx_q": r(T, cfg.hi, cfg.di), "idx_k": r(T, cfg.di), "idx_v": r(T, cfg.di)}
        cwd = os.getcwd()
        with tempfile.TemporaryDirectory() as tmp:
            with open(os.path.join(tmp, "config.json"), "w") as f:
                json.dump(tiny_m3.CONFIG, f)
            os.chdir(tmp)
            try:
                exec(compile("".join(lines), readme, "exec"), env)
            finally:
                os.chdir(cwd)
        self.assertEqual(tuple(env["o"].shape), (T, cfg.hq, cfg.d))
        self.assertFalse(torch.isnan(env["o"].float()).any())
        self.assertIsNone(env["idx_o"])  # the last layer keeps no index value
        env["ctx"].close()


# ---- the tiny model ------------------------------------------------------------------------------


@unittest.skipIf(torch is None, "torch not installed")
class TestTinyM3(unittest.TestCase):
    def test_fp32_identical_tokens(self):
        import tiny_m3

        res = tiny_m3.run("fp32", "cpu", (37, 70, 101), new_tokens=10, warmup=False,
                          out=None)
        self.assertEqual(res["tokens_msa"], res["tokens_ref"])
        self.assertEqual(res["topk_mismatches"], 0)
        self.assertLess(res["max_err"]["o"], 1e-5)
        self.assertLess(res["max_err"]["idx_o"], 1e-5)
        self.assertGreater(res["max_err"]["idx_o"], 0.0)  # the index value was checked
        self.assertIn("cpu_sparse", res["kernels"])
        self.assertTrue(res["ok"])

    def test_bf16_within_bound(self):
        import tiny_m3

        res = tiny_m3.run("bf16", "cpu", (29, 64), new_tokens=6, page_size=16,
                          warmup=False, out=None)
        self.assertLess(res["max_err"]["o"], 1e-2)
        self.assertLess(res["max_err"]["idx_o"], 1e-2)
        self.assertEqual(res["checked_calls"], 6 * 4)
        self.assertTrue(res["ok"])

    @unittest.skipUnless(torch is not None and torch.cuda.is_available(), "no CUDA device")
    def test_cuda_graph_decode(self):
        if not msa.backend_available("cuda"):
            self.skipTest("the library has no CUDA backend")
        import tiny_m3

        for dt in ("fp32", "bf16"):
            res = tiny_m3.run(dt, "cuda", (37, 70, 101), new_tokens=12, cuda_graph=True,
                              page_size=8, out=None)
            self.assertTrue(res["ok"], res)


# ---- the program ---------------------------------------------------------------------------------


def main():
    if torch is None:
        print("skipped: %s not installed" % _MISSING)
        print("0 passed, 0 failed, 1 skipped")
        return 77
    print("msa %s from %s, torch %s" % (msa.version(), msa.library_path(), torch.__version__))
    return unittest_counts.run_module(__name__)


if __name__ == "__main__":
    sys.exit(main())
