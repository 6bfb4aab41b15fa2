"""Tests of the msa package on the CPU backend.

The outputs of the library are compared with a NumPy reference written from
docs/SPEC.md (index branch, block selection, sparse / dense attention, the
index value), in double precision on exactly the values the cache holds.

Runs under pytest or unittest, or as a program (the CTest does that): it
then prints "N passed, N failed, N skipped" and exits 77 when NumPy is
missing.  The library is found as the package finds it ($MSA_LIBRARY,
msa/_lib/, the source tree's build folders).
"""

import gc
import json
import os
import sys
import tempfile
import unittest

import unittest_counts  # beside this file

try:
    import numpy as np
except ImportError:  # pragma: no cover - the runner below reports a skip
    np = None
    if __name__ != "__main__":
        raise unittest.SkipTest("NumPy is not installed")

if np is not None and os.environ.get("MSA_TEST_INSTALLED") != "1":
    # The package beside this folder (the source tree's), not an installed
    # one; MSA_TEST_INSTALLED=1 tests the installed package instead.
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

if np is not None:
    import msa
    import msa.adapters as adapters
    from msa import _ffi


# ---- reference (docs/SPEC.md sections 4 to 6) --------------------------------


def ref_select(mc, iq, ik, p):
    """Selected blocks per index head for one token at position p:
    iq [Hi][Di], ik [p+1][Di] (keys 0..p).  SPEC 4: forced local and init
    blocks, then the best scores, ties toward the lower id; ascending."""
    B, K, I, Lc = mc.block_size, mc.topk_blocks, mc.init_blocks, mc.local_blocks
    n_blocks = p // B + 1
    s = iq.astype(np.float64) @ ik[: p + 1].astype(np.float64).T  # [Hi][p+1]
    c = mc.index_softmax_scale or mc.index_dim ** -0.5
    rows = []
    for h in range(mc.num_index_heads):
        scores = []
        for n in range(n_blocks):
            blk = s[h, n * B : min((n + 1) * B, p + 1)]
            if mc.score_type == "max":
                scores.append(blk.max())
            else:
                scores.append(np.log(np.exp(c * blk).sum()))
        forced = [n for n in range(n_blocks) if n >= n_blocks - Lc or n < I]
        rest = [n for n in range(n_blocks) if n not in forced]
        rest.sort(key=lambda n: (-scores[n], n))
        take = min(K, n_blocks)
        rows.append(sorted(forced + rest[: take - len(forced)]))
    return rows


def ref_kv_selection(mc, rows):
    """Per KV head: the selection it uses (SPEC 4, head mappings)."""
    hi, hkv = mc.num_index_heads, mc.num_kv_heads
    out = []
    for g in range(hkv):
        if hi == hkv:
            out.append(rows[g])
        elif hi > hkv:
            m = hi // hkv
            out.append(sorted(set().union(*[rows[g * m + j] for j in range(m)])))
        else:
            out.append(rows[g // (hkv // hi)])
    return out


def ref_attend(q, k, v, scale):
    """softmax(q . k * scale) v over the given keys; q [D], k/v [J][D]."""
    logits = (k.astype(np.float64) @ q.astype(np.float64)) * scale
    mx = logits.max()
    w = np.exp(logits - mx)
    return (w @ v.astype(np.float64)) / w.sum(), mx + np.log(w.sum())


def ref_layer(mc, sparse, index_value, q_len, kv_len, hist, rows_in, num_tokens, width):
    """Outputs of one layer for a step.  hist[r] holds request r's cache
    contents by position (k, v [L][Hkv][D], idx_k, idx_v [L][Di]);
    rows_in holds the step's q [T][Hq][D] and idx_q [T][Hi][Di]."""
    hq, hkv, d = mc.num_q_heads, mc.num_kv_heads, mc.head_dim
    hi, di = mc.num_index_heads, mc.index_dim
    scale = mc.softmax_scale or d ** -0.5
    c = mc.index_softmax_scale or di ** -0.5
    o = np.zeros((num_tokens, hq, d))
    lse = np.full((num_tokens, hq), -np.inf)
    topk = np.full((num_tokens, hkv, width), -1, dtype=np.int32)
    idx_o = np.zeros((num_tokens, hi, di))
    row = 0
    for r, (ql, kl) in enumerate(zip(q_len, kv_len)):
        h = hist[r]
        for i in range(ql):
            p = kl - ql + i
            t = row + i
            if sparse:
                kv_sel = ref_kv_selection(mc, ref_select(mc, rows_in["idx_q"][t], h["idx_k"], p))
            for g in range(hkv):
                if sparse:
                    sel = kv_sel[g]
                    topk[t, g, : len(sel)] = sel
                    keys = [j for n in sel for j in range(n * mc.block_size,
                                                          (n + 1) * mc.block_size) if j <= p]
                else:
                    keys = list(range(p + 1))
                for a in range(hq // hkv):
                    head = g * (hq // hkv) + a
                    o[t, head], lse[t, head] = ref_attend(
                        rows_in["q"][t, head], h["k"][keys, g], h["v"][keys, g], scale)
            if index_value:
                for ih in range(hi):
                    idx_o[t, ih], _ = ref_attend(rows_in["idx_q"][t, ih], h["idx_k"][: p + 1],
                                                 h["idx_v"][: p + 1], c)
        row += ql
    return o, lse, topk, idx_o


def rel_err(out, ref):
    out = np.asarray(out, dtype=np.float64)
    assert not np.isnan(out).any(), "NaN in the output"
    return np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-30)


def bf16_round(x):
    """float32 -> the nearest bf16 (ties to even), as uint16 bits."""
    b = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    b = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
    return b.astype(np.uint16)


def bf16_to_f32(u):
    return (np.asarray(u, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def gather(plane, pages, length, kind):
    """Positions 0..length-1 of one request from a cache plane."""
    if kind in ("k", "v"):  # [pages][Hkv][P][D] -> [L][Hkv][D]
        per = np.concatenate([plane[pg].transpose(1, 0, 2) for pg in pages], axis=0)
    else:  # [pages][P][Di] -> [L][Di]
        per = np.concatenate([plane[pg] for pg in pages], axis=0)
    return per[:length]


# ---- the README's program ------------------------------------------------------


def minimal_inputs(T):
    """The inputs of examples/minimal.c."""
    i = np.arange(T * 64 * 128, dtype=np.int64)
    q = ((i * 7919 % 1000) / 1000.0 - 0.5).astype(np.float32).reshape(T, 64, 128)
    j = np.arange(T * 4 * 128, dtype=np.int64)
    k = ((j * 104729 % 1000) / 1000.0 - 0.5).astype(np.float32).reshape(T, 4, 128)
    v = ((j % 17 + 1) / 17.0).astype(np.float32).reshape(T, 4, 128)
    n = np.arange(T * 128, dtype=np.int64)
    ik = ((n * 31 % 101) / 101.0 - 0.5).astype(np.float32).reshape(T, 128)
    iq = np.empty((T * 128, 4), dtype=np.float32)
    for h in range(4):
        iq[:, h] = ((n + h) * 13 % 97) / 97.0 - 0.5
    # minimal.c fills iq[i * 4 + h] for i < T * 128: the same memory as
    # [T][Hi][Di] read in C order.
    return q, k, v, iq.reshape(T, 4, 128), ik


@unittest.skipIf(np is None, "NumPy is not installed")
class TestMinimalStep(unittest.TestCase):
    def test_minimal_prefill(self):
        """One prefill step of one sparse M3 layer, as examples/minimal.c,
        against the reference on the bf16 values the cache holds."""
        T = 300
        with msa.Context("cpu", num_threads=2) as ctx:
            model = msa.Model(ctx, msa.ModelConfig.default())
            cache = msa.Cache(ctx, model, num_pages=8)
            plan = msa.Plan(ctx, model, cache, act_dtype="fp32")
            plan.update(q_len=[T], kv_len=[T], page_table=[[5, 2, 7]])
            q, k, v, iq, ik = minimal_inputs(T)
            o = np.full((T, 64, 128), np.nan, dtype=np.float32)
            lse = np.full((T, 64), np.nan, dtype=np.float32)
            topk = np.full((T, 4, model.topk_width), -7, dtype=np.int32)
            out = plan.forward(0, q, k, v, iq, ik, o=o, lse=lse, topk=topk)
            self.assertIs(out, o)
            self.assertTrue(plan.kernel_name(0))

            # The cache holds bf16(k), bf16(v), bf16(idx_k) at pages 5, 2, 7.
            planes = {kind: bf16_to_f32(cache.read_plane(0, kind)) for kind in ("k", "v", "index_k")}
            hist = {"k": gather(planes["k"], [5, 2, 7], T, "k"),
                    "v": gather(planes["v"], [5, 2, 7], T, "v"),
                    "idx_k": gather(planes["index_k"], [5, 2, 7], T, "index_k")}
            np.testing.assert_array_equal(hist["k"], bf16_to_f32(bf16_round(k)))
            np.testing.assert_array_equal(hist["idx_k"], bf16_to_f32(bf16_round(ik)))
            self.assertFalse(planes["k"][[0, 1, 3, 4, 6]].any(), "pages not in the table stay zero")

            mc = model.config
            ref_o, ref_lse, ref_topk, _ = ref_layer(mc, True, False, [T], [T], [hist],
                                                    {"q": q, "idx_q": iq}, T, model.topk_width)
            # bf16 planes: SPEC 11's bound for bf16 paths.
            self.assertLess(rel_err(o, ref_o), 1e-2)
            self.assertLess(rel_err(lse, ref_lse), 1e-2)
            # 300 tokens reach at most 3 blocks: all selected, -1 after.
            np.testing.assert_array_equal(topk, ref_topk)

    def test_readme_example(self):
        """The program of python/README.md runs."""
        readme = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "README.md")
        if not os.path.exists(readme):
            self.skipTest("python/README.md is not beside the tests")
        lines, inside = [], False
        with open(readme) as f:
            for line in f:
                if line.rstrip() == "```python":
                    inside = True
                elif line.rstrip() == "```" and inside:
                    break
                elif inside:
                    lines.append(line)
        self.assertTrue(lines, "no python block in the README")
        import contextlib
        import io

        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            exec(compile("".join(lines), readme, "exec"), {"__name__": "readme"})
        self.assertIn("[ 0  1  2 -1", out.getvalue())


# ---- small shapes: selection, dense layers, index value, steps --------------------


def small_config(num_index_heads=2):
    mc = msa.ModelConfig(num_layers=2, num_q_heads=4, num_kv_heads=2, head_dim=16,
                         num_index_heads=num_index_heads, index_dim=8, block_size=8,
                         topk_blocks=3, init_blocks=1, local_blocks=1, score_type="max",
                         layer_sparse=[0, 1], layer_index_value=[0, 1])
    return mc


def make_inputs(mc, rng, act, T):
    """Random inputs of a step of T rows: the arrays to pass (act_dtype
    elements) and their values as floats."""
    x = {
        "q": rng.standard_normal((T, mc.num_q_heads, mc.head_dim)),
        "k": rng.standard_normal((T, mc.num_kv_heads, mc.head_dim)),
        "v": rng.standard_normal((T, mc.num_kv_heads, mc.head_dim)),
        # Multiples of 1/8: the index scores are exact in fp32 and in
        # double, so the selection (ties included) is exactly defined.
        "idx_q": rng.integers(-8, 9, (T, mc.num_index_heads, mc.index_dim)) / 8.0,
        "idx_k": rng.integers(-8, 9, (T, mc.index_dim)) / 8.0,
        "idx_v": rng.standard_normal((T, mc.index_dim)),
    }
    if act == "bf16":
        arrays = {n: bf16_round(a) for n, a in x.items()}
        values = {n: bf16_to_f32(a) for n, a in arrays.items()}
    else:
        arrays = {n: a.astype(np.float32) for n, a in x.items()}
        values = arrays
    return arrays, values


class Session:
    """A context, model, cache and plan of the small config, and the
    history of what each request's cache holds."""

    def __init__(self, mc, act_dtype="fp32", page_size=4, num_pages=64, seed=0):
        self.ctx = msa.Context("cpu", num_threads=2)
        self.model = msa.Model(self.ctx, mc)
        self.mc = self.model.config
        self.cache = msa.Cache(self.ctx, self.model, num_pages=num_pages, page_size=page_size,
                               kv_dtype=act_dtype, index_dtype=act_dtype)
        self.plan = msa.Plan(self.ctx, self.model, self.cache, act_dtype=act_dtype)
        self.act = act_dtype
        self.rng = np.random.default_rng(seed)
        self.page_size = page_size

    def close(self):
        self.ctx.close()

    def inputs(self, T):
        return make_inputs(self.mc, self.rng, self.act, T)

    def hist(self, layer, q_len, kv_len, tables):
        """What the cache holds for each request, read back from the planes."""
        planes = {}
        for kind in ("k", "v", "index_k", "index_v"):
            if self.cache.has_plane(layer, kind):
                a = self.cache.read_plane(layer, kind)
                planes[kind] = bf16_to_f32(a) if self.act == "bf16" else a
        out = []
        for kl, pages in zip(kv_len, tables):
            h = {"k": gather(planes["k"], pages, kl, "k"), "v": gather(planes["v"], pages, kl, "v")}
            if "index_k" in planes:
                h["idx_k"] = gather(planes["index_k"], pages, kl, "index_k")
            if "index_v" in planes:
                h["idx_v"] = gather(planes["index_v"], pages, kl, "index_v")
            out.append(h)
        return out

    def run_step(self, q_len, kv_len, tables, num_tokens, test, tol):
        """Updates the plan, runs both layers with poisoned outputs and
        compares every output, padding rows included, with the reference."""
        self.plan.update(q_len, kv_len, tables, num_tokens=num_tokens)
        arrays, values = self.inputs(num_tokens)
        mc = self.mc
        W = self.model.topk_width
        for layer in range(mc.num_layers):
            sparse = self.model.layer_is_sparse(layer)
            iv = self.model.layer_has_index_value(layer)
            o_dt = np.uint16 if self.act == "bf16" else np.float32
            o = np.full((num_tokens, mc.num_q_heads, mc.head_dim), 0x7FC0 if self.act == "bf16" else np.nan,
                        dtype=o_dt)
            lse = np.full((num_tokens, mc.num_q_heads), np.nan, dtype=np.float32)
            topk = np.full((num_tokens, mc.num_kv_heads, W), -7, dtype=np.int32)
            idx_o = (np.full((num_tokens, mc.num_index_heads, mc.index_dim), o[0, 0, 0], dtype=o_dt)
                     if iv else None)
            self.plan.forward(layer, arrays["q"], arrays["k"], arrays["v"], arrays["idx_q"],
                              arrays["idx_k"], arrays["idx_v"], o=o, idx_o=idx_o, lse=lse,
                              topk=topk)
            hist = self.hist(layer, q_len, kv_len, tables)
            ref_o, ref_lse, ref_topk, ref_idx_o = ref_layer(
                mc, sparse, iv, q_len, kv_len, hist, values, num_tokens, W)
            conv = bf16_to_f32 if self.act == "bf16" else (lambda a: a)
            test.assertLess(rel_err(conv(o), ref_o), tol, "o of layer %d" % layer)
            fin = np.isfinite(ref_lse)
            test.assertLess(rel_err(lse[fin], ref_lse[fin]), tol, "lse of layer %d" % layer)
            pad = slice(sum(q_len), num_tokens)
            test.assertTrue(np.isneginf(lse[pad]).all(), "lse of padding rows is -inf")
            test.assertFalse(conv(o)[pad].any(), "o of padding rows is 0")
            if sparse:
                np.testing.assert_array_equal(topk, ref_topk)
            if iv:
                test.assertLess(rel_err(conv(idx_o), ref_idx_o), tol, "idx_o of layer %d" % layer)


@unittest.skipIf(np is None, "NumPy is not installed")
class TestSmallShapes(unittest.TestCase):
    def steps(self, mc, act="fp32", tol=1e-5):
        s = Session(mc, act_dtype=act)
        try:
            # Two requests on pages of 4 tokens (blocks of 8): a prefill of 40
            # and one of 25 tokens, with 5 padding rows.
            t0 = list(range(0, 20)) + [40, 41]
            t1 = list(range(20, 30)) + [42, 43]
            s.run_step([40, 25], [40, 25], [t0, t1], 70, self, tol)
            # Then a decode (1 token) and a verify of 3 tokens.
            s.run_step([1, 3], [41, 28], [t0, t1], 4, self, tol)
            # A later chunk of a request with a prefix, alone in its step.
            s.run_step([6], [47], [t0], 6, self, tol)
        finally:
            s.close()

    def test_sparse_dense_index_value(self):
        self.steps(small_config())

    def test_union_of_index_heads(self):
        # Hi = 2 * Hkv: each KV head uses the union of two heads' blocks.
        self.steps(small_config(num_index_heads=4))

    def test_lse_score_type(self):
        mc = small_config()
        mc.score_type = "lse"
        self.steps(mc)

    def test_bf16_activations_as_uint16(self):
        self.steps(small_config(), act="bf16", tol=1e-2)

    def test_bf16_activations_as_ml_dtypes(self):
        try:
            import ml_dtypes
        except ImportError:
            self.skipTest("ml_dtypes is not installed")
        s = Session(small_config(), act_dtype="bf16")
        try:
            s.plan.update([9], [9], [[0, 1, 2]])
            arrays, _ = s.inputs(9)
            bf = {n: a.view(ml_dtypes.bfloat16) for n, a in arrays.items()}
            o = s.plan.forward(0, bf["q"], bf["k"], bf["v"])
            o_u16 = s.plan.forward(0, arrays["q"], arrays["k"], arrays["v"], write_cache=False)
            self.assertEqual(o.dtype, bf["q"].dtype)
            np.testing.assert_array_equal(o.view(np.uint16), o_u16)
        finally:
            s.close()

    def test_write_plane_then_forward_without_cache_write(self):
        """Planes written from Python give the outputs of a forward that
        writes the cache itself."""
        mc = small_config()
        a = Session(mc, seed=1)
        b = Session(mc, seed=1)
        try:
            for s in (a, b):
                s.plan.update([12], [12], [[3, 1, 2]])
            arrays, _ = a.inputs(12)
            o_a = a.plan.forward(1, arrays["q"], arrays["k"], arrays["v"], arrays["idx_q"],
                                 arrays["idx_k"], arrays["idx_v"],
                                 idx_o=np.empty((12, 2, 8), np.float32))
            for kind in ("k", "v", "index_k", "index_v"):
                b.cache.write_plane(1, kind, a.cache.read_plane(1, kind))
            o_b = b.plan.forward(1, arrays["q"], idx_q=arrays["idx_q"],
                                 idx_o=np.empty((12, 2, 8), np.float32), write_cache=False)
            np.testing.assert_array_equal(o_a, o_b)
        finally:
            a.close()
            b.close()


# ---- engine caches wrapped in place -------------------------------------------------


def _engine_values(rng, shape, act):
    x = rng.integers(-8, 9, shape) / 8.0 + rng.standard_normal(shape) / 64.0
    return bf16_round(x) if act == "bf16" else x.astype(np.float32)


@unittest.skipIf(np is None, "NumPy is not installed")
class TestEngineCaches(unittest.TestCase):
    """An engine's cache wrapped in place (msa.adapters.wrap_*) gives the
    outputs of the copy path (copy_into_cache into msa's own planes) bit
    for bit, and the engine's tensors end up holding what the copied
    cache's planes hold."""

    PAGES = 24

    def run_both(self, act, page_size, engine, planes_of, wrap):
        ctx = msa.Context("cpu", num_threads=2)
        try:
            model = msa.Model(ctx, small_config())
            mc = model.config
            rng = np.random.default_rng(11)
            eng = engine(mc, rng)
            # The copy path: msa's own cache, filled from the engine's arrays.
            copied = msa.Cache(ctx, model, num_pages=self.PAGES, page_size=page_size,
                               kv_dtype=act, index_dtype=act)
            for (layer, kind), (src, layout) in planes_of(eng).items():
                adapters.copy_into_cache(copied, layer, kind, src, layout)
            # The wrapped path: the library reads and writes a copy of them.
            mine = {n: [None if a is None else a.copy() for a in arrs] for n, arrs in eng.items()}
            wrapped = wrap(ctx, model, mine)
            tables = [[5, 17, 2, 9, 11, 0, 3, 21, 14, 7, 19, 4, 8, 1, 12, 6, 10, 13, 15, 16][:],
                      [18, 20, 22, 23]]
            per_page = max(1, 4 // page_size)
            tables = [sum(([p * per_page + i for i in range(per_page)] for p in t), [])
                      for t in tables] if page_size < 4 else tables
            steps = [([20, 1], [20, 9], 23), ([1, 3], [21, 12], 4)]
            outs = {}
            for name, cache in (("copied", copied), ("wrapped", wrapped)):
                plan = msa.Plan(ctx, model, cache, act_dtype=act)
                s_rng = np.random.default_rng(5)
                res = []
                for q_len, kv_len, T in steps:
                    need = [-(-k // page_size) for k in kv_len]
                    plan.update(q_len, kv_len, [t[:n] for t, n in zip(tables, need)],
                                num_tokens=T)
                    arrays, _ = make_inputs(mc, s_rng, act, T)
                    for layer in range(mc.num_layers):
                        iv = model.layer_has_index_value(layer)
                        dt = np.uint16 if act == "bf16" else np.float32
                        idx_o = np.empty((T, mc.num_index_heads, mc.index_dim), dt) if iv else None
                        lse = np.empty((T, mc.num_q_heads), np.float32)
                        o = plan.forward(layer, arrays["q"], arrays["k"], arrays["v"],
                                         arrays["idx_q"], arrays["idx_k"], arrays["idx_v"],
                                         idx_o=idx_o, lse=lse)
                        res += [o, lse] + ([idx_o] if iv else [])
                outs[name] = res
                plan.close()
            self.assertEqual(len(outs["copied"]), len(outs["wrapped"]))
            for a, b in zip(outs["copied"], outs["wrapped"]):
                np.testing.assert_array_equal(a, b)
            # The engine's arrays after the steps, laid out as msa's planes,
            # hold what the copied cache holds.
            back = msa.Cache(ctx, model, num_pages=self.PAGES, page_size=page_size,
                             kv_dtype=act, index_dtype=act)
            for (layer, kind), (src, layout) in planes_of(mine).items():
                adapters.copy_into_cache(back, layer, kind, src, layout)
                np.testing.assert_array_equal(back.read_plane(layer, kind),
                                              copied.read_plane(layer, kind))
                with self.assertRaises(ValueError):
                    wrapped.read_plane(layer, kind)  # the engine's tensor holds it
            self.assertTrue(any((a != b).any() for a, b in zip(
                [x for arrs in eng.values() for x in arrs if x is not None],
                [x for arrs in mine.values() for x in arrs if x is not None])),
                "the forwards wrote into the engine's arrays")
        finally:
            ctx.close()

    def vllm(self, act, head_major):
        P = 4

        def engine(mc, rng):
            H, D, Di = mc.num_kv_heads, mc.head_dim, mc.index_dim
            kv_shape = (self.PAGES, 2, H, P, D) if head_major else (self.PAGES, 2, P, H, D)
            return {"kv": [_engine_values(rng, kv_shape, act) for _ in range(2)],
                    "idx": [None, _engine_values(rng, (self.PAGES, 2, P, Di), act)]}

        def planes_of(eng):
            lay = "msa" if head_major else "nhd"
            out = {}
            for layer in range(2):
                out[(layer, "k")] = (eng["kv"][layer][:, 0], lay)
                out[(layer, "v")] = (eng["kv"][layer][:, 1], lay)
            out[(1, "index_k")] = (eng["idx"][1][:, 0], "nhd")
            out[(1, "index_v")] = (eng["idx"][1][:, 1], "nhd")
            return out

        def wrap(ctx, model, eng):
            return adapters.wrap_vllm_cache(ctx, model, eng["kv"], eng["idx"],
                                            head_major=head_major)

        self.run_both(act, P, engine, planes_of, wrap)

    def test_vllm_token_major(self):
        self.vllm("fp32", head_major=False)

    def test_vllm_token_major_bf16(self):
        self.vllm("bf16", head_major=False)

    def test_vllm_head_major(self):
        self.vllm("fp32", head_major=True)

    def test_sglang_page_size_1(self):
        P, slots = 1, self.PAGES * 4

        def engine(mc, rng):
            H, D, Di = mc.num_kv_heads, mc.head_dim, mc.index_dim
            return {"k": [_engine_values(rng, (slots, H, D), "bf16") for _ in range(2)],
                    "v": [_engine_values(rng, (slots, H, D), "bf16") for _ in range(2)],
                    "ik": [None, _engine_values(rng, (slots, Di), "bf16")],
                    "iv": [None, _engine_values(rng, (slots, Di), "bf16")]}

        def planes_of(eng):
            out = {}
            for layer in range(2):
                out[(layer, "k")] = (eng["k"][layer], "tokens")
                out[(layer, "v")] = (eng["v"][layer], "tokens")
            out[(1, "index_k")] = (eng["ik"][1], "tokens")
            out[(1, "index_v")] = (eng["iv"][1], "tokens")
            return out

        def wrap(ctx, model, eng):
            return adapters.wrap_sglang_cache(ctx, model, eng["k"], eng["v"], eng["ik"],
                                              eng["iv"], page_size=P)

        self.PAGES = slots  # page size 1: one slot per page
        self.run_both("bf16", P, engine, planes_of, wrap)

    def test_bad_strides_are_refused(self):
        ctx = msa.Context("cpu", num_threads=1)
        try:
            model = msa.Model(ctx, small_config())
            mc = model.config
            kv = [np.zeros((8, 2, 4, mc.num_kv_heads, mc.head_dim), np.float32)] * 2
            idx = [None, np.zeros((8, 2, 4, mc.index_dim), np.float32)]
            # K and V of a layer on the same rows: K's heads overlap its tokens.
            bad = {(l, k): (kv[l][:, 0], "nhd") for l in range(2) for k in ("k", "v")}
            views = {}
            for (l, k), (x, _) in bad.items():
                addr = x.ctypes.data
                views[(l, k)] = (addr, x.strides[0] // 4, mc.head_dim, mc.head_dim)
            views[(1, "index_k")] = (idx[1].ctypes.data, 2 * 4 * mc.index_dim, 0, mc.index_dim)
            views[(1, "index_v")] = (idx[1].ctypes.data + 4 * 4 * mc.index_dim,
                                     2 * 4 * mc.index_dim, 0, mc.index_dim)
            with self.assertRaises(msa.Error) as e:
                msa.Cache.wrap(ctx, model, views, 8, 4, "fp32", "fp32")
            self.assertIn("overlap", str(e.exception))
            with self.assertRaises(ValueError):
                adapters.wrap_vllm_cache(ctx, model, kv, [None, None])  # layer 1 is sparse
            self.assertIsNotNone(adapters.wrap_vllm_cache(ctx, model, kv, idx))
        finally:
            ctx.close()


# ---- configs, errors, lifetimes --------------------------------------------------


@unittest.skipIf(np is None, "NumPy is not installed")
class TestApi(unittest.TestCase):
    def setUp(self):
        self.s = Session(small_config())
        self.s.plan.update([5], [5], [[0, 1]])
        self.x, _ = self.s.inputs(5)

    def tearDown(self):
        self.s.close()

    def test_version_and_backends(self):
        self.assertRegex(msa.version(), r"^\d+\.\d+\.\d+")
        self.assertTrue(msa.backend_available("cpu"))
        self.assertIn(msa.backend_available("cuda"), (True, False))
        self.assertTrue(os.path.exists(msa.library_path()))
        with self.assertRaises(ValueError):
            msa.backend_available("gpu")

    def test_config_round_trip_and_json(self):
        mc = self.s.model.config
        self.assertEqual(mc.layer_sparse, [0, 1])
        self.assertEqual(mc.layer_index_value, [0, 1])
        self.assertAlmostEqual(mc.softmax_scale, 16 ** -0.5, places=6)
        d = msa.ModelConfig.default()
        self.assertEqual((d.num_q_heads, d.num_kv_heads, d.head_dim, d.topk_blocks), (64, 4, 128, 16))
        cfg = {"num_hidden_layers": 3, "num_attention_heads": 8, "num_key_value_heads": 2,
               "head_dim": 32, "sparse_attention_config": {
                   "sparse_num_index_heads": 2, "sparse_index_dim": 16, "sparse_block_size": 64,
                   "sparse_topk_blocks": 4, "sparse_local_tokens": 100,
                   "sparse_score_type": "lse", "sparse_attention_freq": [0, 1, 1],
                   "sparse_disable_index_value": [1, 0, 1]}}
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "config.json")
            with open(path, "w") as f:
                json.dump(cfg, f)
            j = msa.ModelConfig.from_json(path)
            m = msa.Model.from_json(self.s.ctx, path)
            self.assertEqual(m.config, j)
            m.close()
            with open(path, "w") as f:
                f.write("{ not json")
            with self.assertRaises(msa.Error) as e:
                msa.ModelConfig.from_json(path)
            self.assertEqual(e.exception.status_name, "MSA_ERR_IO")
        self.assertEqual((j.num_layers, j.num_q_heads, j.head_dim, j.block_size), (3, 8, 32, 64))
        self.assertEqual(j.local_blocks, 3)  # ceil(100 / 64) + 1
        self.assertEqual(j.score_type, "lse")
        self.assertEqual(j.layer_sparse, [0, 1, 1])
        self.assertEqual(j.layer_index_value, [0, 1, 0])

    def test_bad_config(self):
        mc = small_config()
        mc.num_q_heads = 5  # not a multiple of Hkv
        with self.assertRaises(msa.Error) as e:
            msa.Model(self.s.ctx, mc)
        self.assertEqual(e.exception.status, 2)
        self.assertEqual(e.exception.status_name, "MSA_ERR_INVALID_CONFIG")
        self.assertTrue(e.exception.message)
        self.assertEqual(e.exception.message, self.s.ctx.last_error)
        mc = small_config()
        mc.layer_sparse = [1]  # num_layers is 2
        with self.assertRaisesRegex(ValueError, "layer_sparse"):
            msa.Model(self.s.ctx, mc)
        mc = small_config()
        mc.score_type = "mean"
        with self.assertRaisesRegex(ValueError, "score_type"):
            msa.Model(self.s.ctx, mc)
        with self.assertRaisesRegex(ValueError, "backend"):
            msa.Context("gpu")
        if not msa.backend_available("cuda"):
            with self.assertRaises(msa.Error):
                msa.Context("cuda")

    def test_bad_tensors(self):
        plan, x = self.s.plan, self.x
        o = np.full((5, 4, 16), np.nan, dtype=np.float32)

        def fwd(**kw):
            args = dict(q=x["q"], k=x["k"], v=x["v"], o=o)
            args.update(kw)
            return plan.forward(0, **args)

        with self.assertRaisesRegex(ValueError, r"q must hold fp32 .*float64"):
            fwd(q=x["q"].astype(np.float64))
        with self.assertRaisesRegex(ValueError, r"k must have shape \(5, 2, 16\)"):
            fwd(k=x["k"][:4])
        with self.assertRaisesRegex(ValueError, "v must be C-contiguous"):
            fwd(v=np.asfortranarray(x["v"]))
        with self.assertRaisesRegex(ValueError, "q must be a NumPy array"):
            fwd(q=x["q"].tolist())
        ro = o.copy()
        ro.flags.writeable = False
        with self.assertRaisesRegex(ValueError, "o is read-only"):
            fwd(o=ro)
        with self.assertRaisesRegex(ValueError, "k is required"):
            fwd(k=None)
        with self.assertRaisesRegex(ValueError, "idx_q is required"):
            plan.forward(1, x["q"], x["k"], x["v"], o=o)
        with self.assertRaisesRegex(ValueError, "idx_o is required"):
            plan.forward(1, x["q"], x["k"], x["v"], x["idx_q"], x["idx_k"], x["idx_v"], o=o)
        with self.assertRaisesRegex(ValueError, r"lse must hold fp32 elements, not fp16"):
            fwd(lse=np.zeros((5, 4), np.float16))
        with self.assertRaisesRegex(ValueError, "out of range"):
            plan.forward(2, x["q"], x["k"], x["v"])
        # Nothing above reached the library, so nothing was written.
        self.assertTrue(np.isnan(o).all())
        self.assertFalse(self.s.cache.read_plane(0, "k").any())
        # [T][H*D] is the same tensor.
        fwd(q=x["q"].reshape(5, 64))
        self.assertFalse(np.isnan(o).any())

    def test_bad_step_and_rejected_forward(self):
        plan, x = self.s.plan, self.x
        o1 = plan.forward(0, x["q"], x["k"], x["v"])
        with self.assertRaises(msa.Error) as e:
            plan.update([6], [5], [[0, 1]])
        err = e.exception
        self.assertEqual(err.status_name, "MSA_ERR_INVALID_ARGUMENT")
        self.assertTrue(err.message.startswith("msa_plan_update:"), err.message)
        self.assertIn("q_len 6 exceeds kv_len 5", err.message)
        self.assertIn(err.message, str(err))
        with self.assertRaises(msa.Error) as e:
            plan.update([5], [5], [[0, 9999]])  # a page outside the pool
        self.assertIn("msa_plan_update", e.exception.message)
        with self.assertRaisesRegex(ValueError, "page_table has 2 rows for 1 requests"):
            plan.update([5], [5], [[0, 1], [2, 3]])
        # The rejected updates left the step: the same outputs, bit for bit.
        self.assertEqual(plan.num_tokens, 5)
        o2 = plan.forward(0, x["q"], x["k"], x["v"])
        np.testing.assert_array_equal(o1, o2)
        # A plan without a step: the library refuses, writes nothing.
        fresh = msa.Plan(self.s.ctx, self.s.model, self.s.cache, act_dtype="fp32")
        o = np.full((5, 4, 16), np.nan, dtype=np.float32)
        with self.assertRaises(msa.Error) as e:
            fresh.forward(0, x["q"], x["k"], x["v"], o=o)
        self.assertTrue(e.exception.message)
        self.assertTrue(np.isnan(o).all())

    def test_planes(self):
        c = self.s.cache
        p = c.plane(1, "index_k")
        self.assertEqual(p.shape, (64, 4, 8))
        self.assertEqual(p.dtype, "fp32")
        self.assertEqual(p.nbytes, 64 * 4 * 8 * 4)
        self.assertTrue(p.address)
        self.assertFalse(c.has_plane(0, "index_k"))  # a dense layer
        with self.assertRaisesRegex(ValueError, "no index_k plane"):
            c.plane(0, "index_k")
        with self.assertRaisesRegex(ValueError, "plane kind"):
            c.plane(0, "q")
        with self.assertRaisesRegex(ValueError, "shape"):
            c.write_plane(0, "k", np.zeros((3, 2, 4, 16), np.float32))
        with self.assertRaisesRegex(ValueError, "holds fp32"):
            c.write_plane(0, "k", np.zeros((64, 2, 4, 16), np.float64))
        a = np.arange(64 * 2 * 4 * 16, dtype=np.float32).reshape(64, 2, 4, 16)
        c.write_plane(0, "v", a)
        np.testing.assert_array_equal(c.read_plane(0, "v"), a)


class _FakeTorch:
    """The few parts of torch the package uses (torch.Tensor: data_ptr,
    shape, dtype, device, layout, is_contiguous, element_size; torch.empty,
    torch.strided), over
    NumPy arrays, so that the tensor path runs where torch is not
    installed."""

    class dtype:
        def __init__(self, name, np_dtype):
            self.name, self.np_dtype = name, np_dtype

        def __str__(self):
            return "torch." + self.name

    class device:
        def __init__(self, spec):
            self.type, _, idx = spec.partition(":")
            self.index = int(idx) if idx else None

    class Tensor:
        def __init__(self, array, dtype, device="cpu"):
            self.array, self.dtype = array, dtype
            self.device = _FakeTorch.device(device)
            self.shape = array.shape
            self.layout = "strided"

        def data_ptr(self):
            return self.array.ctypes.data

        def is_contiguous(self):
            return self.array.flags.c_contiguous

        def element_size(self):
            return self.array.itemsize

    def __init__(self):
        self.float32 = self.dtype("float32", np.float32)
        self.float16 = self.dtype("float16", np.float16)
        self.bfloat16 = self.dtype("bfloat16", np.uint16)
        self.int32 = self.dtype("int32", np.int32)
        self.float64 = self.dtype("float64", np.float64)
        self.strided = "strided"

    def tensor(self, array, dtype, device="cpu"):
        return self.Tensor(np.ascontiguousarray(array, dtype=dtype.np_dtype), dtype, device)

    def empty(self, shape, dtype, device):
        return self.Tensor(np.empty(shape, dtype=dtype.np_dtype), dtype,
                           "%s:%d" % (device.type, device.index) if device.index is not None
                           else device.type)


@unittest.skipIf(np is None, "NumPy is not installed")
class TestTorchTensors(unittest.TestCase):
    def setUp(self):
        self.saved = sys.modules.get("torch")
        if self.saved is not None and not isinstance(self.saved, _FakeTorch):
            self.skipTest("torch is imported: the fake would hide it")
        self.torch = sys.modules["torch"] = _FakeTorch()

    def tearDown(self):
        if self.saved is None:
            sys.modules.pop("torch", None)
        else:
            sys.modules["torch"] = self.saved

    def test_cpu_tensors(self):
        torch = self.torch
        s = Session(small_config())
        try:
            s.plan.update([10], [10], [[0, 1, 2]])
            x, _ = s.inputs(10)
            t = {n: torch.tensor(a, torch.float32) for n, a in x.items()}
            o_np = s.plan.forward(0, x["q"], x["k"], x["v"])
            o_t = s.plan.forward(0, t["q"], t["k"], t["v"], write_cache=False)
            self.assertIsInstance(o_t, torch.Tensor)
            np.testing.assert_array_equal(o_t.array, o_np)
            topk = torch.tensor(np.full((10, 2, 3), -7), torch.int32)
            idx_o = torch.empty((10, 2, 8), torch.float32, torch.device("cpu"))
            s.plan.forward(1, t["q"], t["k"], t["v"], t["idx_q"], t["idx_k"], t["idx_v"],
                           idx_o=idx_o, topk=topk)
            self.assertTrue((topk.array[:, :, 0] == 0).all())  # the init block
            with self.assertRaisesRegex(ValueError, "q must hold fp32 .* not torch.float64"):
                s.plan.forward(0, torch.tensor(x["q"], torch.float64), t["k"], t["v"])
            with self.assertRaisesRegex(ValueError, "k is on cuda:0; this cpu context"):
                s.plan.forward(0, t["q"], torch.tensor(x["k"], torch.float32, "cuda:0"), t["v"])
            with self.assertRaisesRegex(ValueError, "or a torch.Tensor"):
                s.plan.forward(0, [1.0], t["k"], t["v"])
        finally:
            s.close()


class _RecordingLib:
    """The loaded library, recording the order of the *_free calls."""

    def __init__(self, lib):
        self._lib = lib
        self.freed = []

    def __getattr__(self, name):
        fn = getattr(self._lib, name)
        if not name.endswith("_free"):
            return fn

        def free(ptr):
            self.freed.append((name, ptr))
            return fn(ptr)

        return free


@unittest.skipIf(np is None, "NumPy is not installed")
class TestLifetimes(unittest.TestCase):
    def setUp(self):
        self.real = _ffi.lib()
        self.rec = _RecordingLib(self.real)
        _ffi._LIB = self.rec

    def tearDown(self):
        _ffi._LIB = self.real

    def make(self):
        s = Session(small_config())
        ptrs = {"msa_context_free": s.ctx._handle.ptr, "msa_model_free": s.model._handle.ptr,
                "msa_cache_free": s.cache._handle.ptr, "msa_plan_free": s.plan._handle.ptr}
        return s, ptrs

    def order(self, ptrs):
        mine = set(ptrs.items())
        return [name for name, p in self.rec.freed if (name, p) in mine]

    ORDER = ["msa_plan_free", "msa_cache_free", "msa_model_free", "msa_context_free"]

    def test_garbage_collection_keeps_parents_and_frees_in_order(self):
        s, ptrs = self.make()
        plan = s.plan
        del s  # only the plan is referenced now
        gc.collect()
        self.assertEqual(self.order(ptrs), [])
        plan.update([5], [5], [[0, 1]])
        x, _ = make_inputs(plan.model.config, np.random.default_rng(3), "fp32", 5)
        o = plan.forward(0, x["q"], x["k"], x["v"])
        self.assertFalse(np.isnan(o).any())
        del plan, o
        gc.collect()
        self.assertEqual(self.order(ptrs), self.ORDER)

    def test_close_context_first(self):
        s, ptrs = self.make()
        s.ctx.close()  # closes what was made from it, plans first
        self.assertEqual(self.order(ptrs), self.ORDER)
        for obj in (s.plan, s.cache, s.model, s.ctx):
            self.assertTrue(obj.closed)
        with self.assertRaisesRegex(ValueError, "Plan is closed"):
            s.plan.update([1], [1], [[0]])
        with self.assertRaisesRegex(ValueError, "Cache is closed"):
            s.cache.plane(0, "k")
        s.ctx.close()
        s.plan.close()
        del s
        gc.collect()
        self.assertEqual(self.order(ptrs), self.ORDER)  # each freed once

    def test_with_blocks(self):
        with msa.Context("cpu", num_threads=1) as ctx:
            with msa.Model(ctx, small_config()) as model:
                with msa.Cache(ctx, model, num_pages=4, page_size=4, kv_dtype="fp32",
                               index_dtype="fp32") as cache:
                    with msa.Plan(ctx, model, cache, act_dtype="fp32") as plan:
                        ptrs = {"msa_context_free": ctx._handle.ptr,
                                "msa_model_free": model._handle.ptr,
                                "msa_cache_free": cache._handle.ptr,
                                "msa_plan_free": plan._handle.ptr}
        self.assertEqual(self.order(ptrs), self.ORDER)


@unittest.skipIf(np is None, "NumPy is not installed")
class TestTensorParallel(unittest.TestCase):
    """ModelConfig.for_rank (msa_model_config_for_rank): each rank's heads,
    shares that tile the full model, and refused splits."""

    def test_m3_sizes(self):
        full = msa.ModelConfig.default()
        for size in (1, 2, 4, 8, 64):
            q_heads = []
            for rank in range(size):
                rc, sh = full.for_rank(rank, size)
                kv = max(4 // size, 1)
                self.assertEqual((rc.num_q_heads, rc.num_kv_heads, rc.num_index_heads),
                                 (64 // size, kv, kv), (rank, size))
                rep = max(size // 4, 1)
                self.assertEqual(sh, msa.TpShard(rank * (64 // size), rank * kv // rep,
                                                 rank * kv // rep, rep, rep), (rank, size))
                q_heads += range(sh.q_head_begin, sh.q_head_begin + rc.num_q_heads)
                # Every other field is the full config's.
                for f in ("num_layers", "head_dim", "index_dim", "block_size", "topk_blocks",
                          "init_blocks", "local_blocks", "score_type", "layer_sparse",
                          "layer_index_value"):
                    self.assertEqual(getattr(rc, f), getattr(full, f), f)
            self.assertEqual(q_heads, list(range(64)), size)

    def test_rank_model_keeps_layers(self):
        full = small_config()  # 4 query, 2 KV, 2 index heads; layers [dense, sparse + iv]
        rc, sh = full.for_rank(1, 2)
        self.assertEqual((rc.num_q_heads, rc.num_kv_heads, rc.num_index_heads), (2, 1, 1))
        self.assertEqual(sh, msa.TpShard(2, 1, 1, 1, 1))
        self.assertEqual(rc.layer_sparse, [0, 1])
        self.assertEqual(rc.layer_index_value, [0, 1])
        with msa.Context("cpu", num_threads=1) as ctx:
            m = msa.Model(ctx, rc)
            self.assertEqual(m.config.num_q_heads, 2)
            self.assertTrue(m.layer_has_index_value(1))
            self.assertEqual(m.topk_width, 3)

    def test_refused_splits(self):
        full = msa.ModelConfig.default()
        with msa.Context("cpu", num_threads=1) as ctx:
            with self.assertRaises(msa.Error) as e:
                full.for_rank(0, 3, ctx=ctx)
            self.assertEqual(e.exception.status_name, "MSA_ERR_INVALID_CONFIG")
            self.assertIn("num_attention_heads (64) is not a multiple of the tensor-parallel "
                          "size (3)", e.exception.message)
            self.assertEqual(ctx.last_error, e.exception.message)
        with self.assertRaises(msa.Error) as e:
            full.for_rank(0, 128)
        self.assertEqual(e.exception.status_name, "MSA_ERR_INVALID_CONFIG")
        # 12 query heads split in 2, but 3 KV heads over 2 ranks do not.
        odd = msa.ModelConfig(num_q_heads=12, num_kv_heads=3, num_index_heads=3)
        with self.assertRaises(msa.Error) as e:
            odd.for_rank(1, 2)
        self.assertEqual(e.exception.status_name, "MSA_ERR_INVALID_CONFIG")
        self.assertIn("num_key_value_heads (3)", e.exception.message)
        for rank, size in ((-1, 2), (2, 2), (0, 0), (0, -4)):
            with self.assertRaises(msa.Error) as e:
                full.for_rank(rank, size)
            self.assertEqual(e.exception.status_name, "MSA_ERR_INVALID_ARGUMENT", (rank, size))
            self.assertIn("need 0 <= rank < size", e.exception.message)
        for rank, size in ((0.0, 2), (0, "2"), (True, 2), (0, 2**31)):
            with self.assertRaises(ValueError):
                full.for_rank(rank, size)
        with self.assertRaises(ValueError):
            full.for_rank(0, 2, ctx="cpu")
        # A config the library refuses as a whole is refused here too.
        bad = msa.ModelConfig(num_q_heads=6, num_kv_heads=4)
        with self.assertRaises(msa.Error) as e:
            bad.for_rank(0, 2)
        self.assertEqual(e.exception.status_name, "MSA_ERR_INVALID_CONFIG")


# ---- the program ------------------------------------------------------------------


def main():
    if np is None:
        print("NumPy is not installed: skipped")
        print("0 passed, 0 failed, 1 skipped")
        return 77
    print("msa %s from %s" % (msa.version(), msa.library_path()))
    return unittest_counts.run_module(__name__)


if __name__ == "__main__":
    sys.exit(main())
