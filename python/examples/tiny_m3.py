"""A tiny MiniMax-M3-shaped language model, end to end on libmsa.

The model is written here in plain PyTorch from an HF-style config.json
(written by this program, small dimensions): token embedding, per layer
RMSNorm, q/k/v/o projections with RoPE, and on sparse layers the index
branch (index q/k projections with RoPE, and on index-value layers the
index v projection and index_o_proj), then an RMSNorm'd SwiGLU MLP, a final
RMSNorm and the LM head.  The weights are random, made from a seed.

Attention runs in one of two ways:

- "msa": libmsa through the PyTorch custom op (msa.torch_ops.forward) over
  msa's paged cache; the steps come from a vLLM-style block table through
  msa.adapters.step_from_block_table.  On a GPU the decode steps run as one
  captured CUDA graph, replayed after each plan update.
- "torch": a plain PyTorch implementation of docs/SPEC.md, in float64 over a
  contiguous per-request store: dense causal attention; sparse layers score
  blocks (max or lse), select the top K with the forced init and local
  blocks (ties toward the lower id) and mask each token to its blocks; the
  index value branch is dense causal attention of the index heads.

Both prefill a few prompts of different lengths in one step, then decode
greedily.  In fp32 both give the same tokens.  A checked run feeds every
attention call of the msa run to both implementations and reports the
largest relative error of o and idx_o per call (SPEC 11: 1e-5 for fp32,
1e-2 for bf16) and the calls whose selected blocks differ.

    python python/examples/tiny_m3.py                      # CPU, fp32 and bf16
    python python/examples/tiny_m3.py --device cuda        # GPU, CUDA graphs for decode

The library is found as the msa package finds it ($MSA_LIBRARY, ...); the
GPU needs a library built with the CUDA backend.
"""

import argparse
import json
import math
import os
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import msa  # noqa: E402
import msa.adapters  # noqa: E402
import msa.torch_ops  # noqa: E402

# Four layers: one dense, then three sparse, the first of them keeping its
# index value.  Blocks of 8 tokens and K = 3 (one init, one local block)
# make the selection matter from 24 tokens on.
CONFIG = {
    "model_type": "tiny_m3",
    "vocab_size": 256,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "max_position_embeddings": 1024,
    "sparse_attention_config": {
        "sparse_num_index_heads": 2,
        "sparse_index_dim": 16,
        "sparse_block_size": 8,
        "sparse_topk_blocks": 3,
        "sparse_init_block": 1,
        "sparse_local_block": 1,
        "sparse_score_type": "max",
        "sparse_attention_freq": [0, 1, 1, 1],
        "sparse_disable_index_value": [1, 0, 1, 1],
    },
}

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


class Config:
    """The fields of config.json the model uses, resolved as SPEC 2 says."""

    def __init__(self, d):
        d = d.get("text_config", d)
        self.vocab = d["vocab_size"]
        self.hidden = d["hidden_size"]
        self.inter = d["intermediate_size"]
        self.layers = d["num_hidden_layers"]
        self.hq = d["num_attention_heads"]
        self.hkv = d["num_key_value_heads"]
        self.d = d.get("head_dim", self.hidden // self.hq)
        self.eps = d.get("rms_norm_eps", 1e-6)
        self.theta = d.get("rope_theta", 10000.0)
        self.max_pos = d.get("max_position_embeddings", 4096)
        s = d.get("sparse_attention_config")
        s = s or {}
        self.hi = s.get("sparse_num_index_heads", 4)
        self.di = s.get("sparse_index_dim", 128)
        self.block = s.get("sparse_block_size", 128)
        self.topk = s.get("sparse_topk_blocks", 16)
        b = self.block
        self.init = s.get("sparse_init_block", math.ceil(s.get("sparse_init_tokens", 0) / b))
        self.local = s.get("sparse_local_block",
                           math.ceil(s["sparse_local_tokens"] / b) + 1
                           if "sparse_local_tokens" in s else 1)
        self.score_type = s.get("sparse_score_type", "max")
        if "sparse_attention_config" not in d:
            self.sparse = [0] * self.layers
        else:
            self.sparse = list(s.get("sparse_attention_freq", [1] * self.layers))
        self.index_value = [int(sp and not dis) for sp, dis in zip(
            self.sparse, s.get("sparse_disable_index_value", [1] * self.layers))]


# ---- the model -----------------------------------------------------------------------


def rms_norm(x, w, eps):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


def mm(x, w):
    """x @ w in the model's dtype.  A bf16 product on the CPU is computed in
    fp32 and rounded once, as a bf16 GEMM with fp32 accumulation does: torch's
    CPU bf16 GEMM of a few rows is slower than the attention by far here."""
    if x.dtype == torch.bfloat16 and x.device.type == "cpu":
        return (x.float() @ w.float()).to(torch.bfloat16)
    return x @ w


def rope(x, cos, sin):
    """x [T][H][dim] rotated by the positions' angles (cos, sin [T][dim/2])."""
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h].float(), x[..., h:].float()
    c, s = cos[:, None, :], sin[:, None, :]
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1).to(x.dtype)


def attention_inputs(c, i, L, x, rope_d, rope_i):
    """Layer i's attention inputs from its normed rows x [T][H] and weights
    L: q, k, v (RoPE on q and k), and on sparse layers the index query and
    key (RoPE on both) and, on index-value layers, the index value (else
    None); head counts from c.  rope_d, rope_i: the rows' (cos, sin) for
    the head dim and the index dim."""
    T = x.shape[0]
    q = rope(mm(x, L["wq"]).view(T, c.hq, c.d), *rope_d).contiguous()
    k = rope(mm(x, L["wk"]).view(T, c.hkv, c.d), *rope_d).contiguous()
    v = mm(x, L["wv"]).view(T, c.hkv, c.d).contiguous()
    iq = ik = iv = None
    if c.sparse[i]:
        iq = rope(mm(x, L["wiq"]).view(T, c.hi, c.di), *rope_i).contiguous()
        ik = rope(mm(x, L["wik"]).view(T, 1, c.di), *rope_i).view(T, c.di).contiguous()
        if c.index_value[i]:
            iv = mm(x, L["wiv"]).contiguous()
    return q, k, v, iq, ik, iv


class TinyM3:
    """The weights (random, from a seed) and the forward pass of one step."""

    def __init__(self, cfg, dtype, device, seed):
        self.cfg, self.dtype, self.device = cfg, dtype, device
        g = torch.Generator().manual_seed(seed)

        def w(*shape, std=None):
            std = std if std is not None else shape[0] ** -0.5
            return (torch.randn(*shape, generator=g) * std).to(dtype).to(device)

        def ones(n):
            return (1.0 + 0.1 * torch.randn(n, generator=g)).to(dtype).to(device)

        c = cfg
        self.embed = w(c.vocab, c.hidden, std=1.0)
        self.layers = []
        for i in range(c.layers):
            L = {"norm_in": ones(c.hidden), "wq": w(c.hidden, c.hq * c.d),
                 "wk": w(c.hidden, c.hkv * c.d), "wv": w(c.hidden, c.hkv * c.d),
                 "wo": w(c.hq * c.d, c.hidden), "norm_post": ones(c.hidden),
                 "gate": w(c.hidden, c.inter), "up": w(c.hidden, c.inter),
                 "down": w(c.inter, c.hidden)}
            if c.sparse[i]:
                L["wiq"] = w(c.hidden, c.hi * c.di)
                L["wik"] = w(c.hidden, c.di)
                if c.index_value[i]:
                    L["wiv"] = w(c.hidden, c.di)
                    L["wio"] = w(c.hi * c.di, c.hidden)
            self.layers.append(L)
        self.norm = ones(c.hidden)
        self.head = w(c.hidden, c.vocab)
        pos = torch.arange(c.max_pos, dtype=torch.float64)

        def table(dim):
            inv = c.theta ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)
            ang = pos[:, None] * inv[None, :]
            return torch.cos(ang).float().to(device), torch.sin(ang).float().to(device)

        self.rope_d = table(c.d)
        self.rope_di = table(c.di)

    def forward(self, ids, positions, attn):
        """Hidden states of the step's rows (ids, positions [T]) through
        every layer; attn(layer, q, k, v, idx_q, idx_k, idx_v) gives the
        layer's (o, idx_o).  Returns the final normed hidden states [T][H]."""
        c = self.cfg
        T = ids.shape[0]
        h = self.embed[ids]
        cos_d, sin_d = self.rope_d[0][positions], self.rope_d[1][positions]
        cos_i, sin_i = self.rope_di[0][positions], self.rope_di[1][positions]
        for i, L in enumerate(self.layers):
            x = rms_norm(h, L["norm_in"], c.eps)
            o, io = attn(i, *attention_inputs(c, i, L, x, (cos_d, sin_d), (cos_i, sin_i)))
            h = h + mm(o.reshape(T, -1), L["wo"])
            if io is not None:
                h = h + mm(io.reshape(T, -1), L["wio"])
            x = rms_norm(h, L["norm_post"], c.eps)
            h = h + mm(F.silu(mm(x, L["gate"])) * mm(x, L["up"]), L["down"])
        return rms_norm(h, self.norm, c.eps)

    def logits(self, hidden):
        return mm(hidden, self.head).float()


# ---- attention: libmsa ------------------------------------------------------------------


class MsaAttention:
    """libmsa as the model's attention: msa's paged cache, a plan for
    prefill steps and one with fixed limits for decode steps (so that a CUDA
    graph captured on one decode step replays on the next)."""

    def __init__(self, config_path, cfg, dtype, device, num_pages, page_size, max_batch, max_len,
                 msa_config=None, num_threads=0):
        backend = "cuda" if device.type == "cuda" else "cpu"
        self.ctx = msa.Context(backend, num_threads=num_threads, device=device.index or 0)
        # The model of config.json, or a given msa.ModelConfig (a
        # tensor-parallel rank's share of the heads).
        if msa_config is not None:
            self.model = msa.Model(self.ctx, msa_config)
        else:
            self.model = msa.Model.from_json(self.ctx, config_path)
        act = {torch.float32: "fp32", torch.bfloat16: "bf16"}[dtype]
        self.cache = msa.Cache(self.ctx, self.model, num_pages=num_pages, page_size=page_size,
                               kv_dtype=act, index_dtype=act)
        self.prefill_plan = msa.Plan(self.ctx, self.model, self.cache, act_dtype=act)
        self.decode_plan = msa.Plan(self.ctx, self.model, self.cache, act_dtype=act,
                                    max_requests=max_batch, max_tokens=max_batch,
                                    max_kv_len=max_len, max_q_len=1)
        for p in (self.prefill_plan, self.decode_plan):
            msa.torch_ops.prepare(p)
        self.cfg = cfg
        self.page_size = page_size
        self.plan = None
        self.record_topk = False
        self.topk = {}

    def begin_step(self, step):
        self.plan = self.decode_plan if step.decode else self.prefill_plan
        self.plan.update(*step.msa)

    def __call__(self, layer, q, k, v, iq, ik, iv):
        c = self.cfg
        T = q.shape[0]
        io = q.new_empty((T, c.hi, c.di)) if c.index_value[layer] else None
        topk = None
        if self.record_topk and c.sparse[layer]:
            topk = torch.empty((T, c.hkv, self.model.topk_width), dtype=torch.int32,
                               device=q.device)
            self.topk[layer] = topk
        o = msa.torch_ops.forward(self.plan, layer, q, k, v, iq, ik, iv, idx_o=io, topk=topk)
        return o, io

    def close(self):
        self.ctx.close()


# ---- attention: plain PyTorch from docs/SPEC.md -----------------------------------------


def spec_select(cfg, iq, ik, pos):
    """SPEC 4 for the rows of one request: iq [n][Hi][Di], ik [L][Di] (the
    request's index keys), pos [n].  Returns the selected blocks per KV
    head as a mask [Hkv][n][blocks] and as ids [n][Hkv][W] (ascending, -1
    padded)."""
    f = torch.float64
    L = ik.shape[0]
    B, K, I, Lc = cfg.block, cfg.topk, cfg.init, cfg.local
    nb = (L + B - 1) // B
    dev = iq.device
    s = torch.einsum("nhd,ld->hnl", iq.to(f), ik.to(f))  # exact products of the stored values
    visible = torch.arange(L, device=dev)[None, :] <= pos[:, None]
    if cfg.score_type == "lse":
        s = s * (cfg.di ** -0.5)
    s = F.pad(s.masked_fill(~visible[None], -math.inf), (0, nb * B - L), value=-math.inf)
    s = s.view(cfg.hi, -1, nb, B)
    score = s.amax(-1) if cfg.score_type == "max" else torch.logsumexp(s, -1)  # [Hi][n][nb]
    N = pos // B + 1
    blk = torch.arange(nb, device=dev)
    reach = blk[None, :] < N[:, None]
    forced = reach & ((blk[None, :] >= (N - Lc)[:, None]) | (blk[None, :] < I))
    key = score.masked_fill(forced[None], math.inf).masked_fill(~reach[None], -math.inf)
    # A stable descending sort keeps equal scores in ascending block order:
    # ties go to the lower id.  Forced blocks come first, unreachable last.
    order = torch.sort(key, dim=-1, descending=True, stable=True).indices
    rank = torch.empty_like(order).scatter_(-1, order, blk.expand_as(order).contiguous())
    sel = rank < torch.clamp(N, max=K)[None, :, None]  # [Hi][n][nb]
    if cfg.hi >= cfg.hkv:
        m = cfg.hi // cfg.hkv
        sel = sel.view(cfg.hkv, m, -1, nb).any(1)
        width = m * K
    else:
        sel = sel.repeat_interleave(cfg.hkv // cfg.hi, 0)
        width = K
    ids = torch.where(sel, blk, nb + width).sort(-1).values
    ids = F.pad(ids, (0, max(width - nb, 0)), value=nb + width)[..., :width]
    ids = torch.where(ids >= nb, -1, ids).permute(1, 0, 2).to(torch.int32)
    return sel, ids


def spec_attention(cfg, layer, q, k, v, iq, ik, iv, pos):
    """SPEC 5 and 6 for the rows of one request at positions pos, over the
    request's keys k, v [L][Hkv][D], ik, iv [L][Di]; float64."""
    f = torch.float64
    n, L = q.shape[0], k.shape[0]
    g = cfg.hq // cfg.hkv
    visible = torch.arange(L, device=q.device)[None, :] <= pos[:, None]  # [n][L]
    ids = None
    if cfg.sparse[layer]:
        sel, ids = spec_select(cfg, iq, ik, pos)
        blocks = torch.arange(L, device=q.device) // cfg.block
        mask = sel[:, :, blocks] & visible[None]  # [Hkv][n][L]
    else:
        mask = visible[None].expand(cfg.hkv, n, L)
    logits = torch.einsum("nhgd,lhd->hgnl", q.to(f).view(n, cfg.hkv, g, cfg.d), k.to(f))
    logits = (logits * cfg.d ** -0.5).masked_fill(~mask[:, None], -math.inf)
    o = torch.einsum("hgnl,lhd->nhgd", torch.softmax(logits, -1), v.to(f)).reshape(n, cfg.hq,
                                                                                   cfg.d)
    io = None
    if cfg.index_value[layer]:
        li = torch.einsum("nhd,ld->hnl", iq.to(f), ik.to(f)) * cfg.di ** -0.5
        li = li.masked_fill(~visible[None], -math.inf)
        io = torch.einsum("hnl,ld->nhd", torch.softmax(li, -1), iv.to(f))
    return o, io, ids


class TorchAttention:
    """The reference: keys and values of each request kept by position in
    plain tensors, attention computed per request with spec_attention."""

    def __init__(self, cfg, dtype, device, max_batch, max_len):
        self.cfg = cfg
        z = lambda *s: torch.zeros(*s, dtype=dtype, device=device)  # noqa: E731
        self.store = []
        for i in range(cfg.layers):
            st = {"k": z(max_batch, max_len, cfg.hkv, cfg.d), "v": z(max_batch, max_len, cfg.hkv,
                                                                   cfg.d)}
            if cfg.sparse[i]:
                st["ik"] = z(max_batch, max_len, cfg.di)
            if cfg.index_value[i]:
                st["iv"] = z(max_batch, max_len, cfg.di)
            self.store.append(st)
        self.step = None
        self.topk = {}

    def begin_step(self, step):
        self.step = step

    def __call__(self, layer, q, k, v, iq, ik, iv):
        st, step = self.store[layer], self.step
        os_, ios, ids_all = [], [], []
        row = 0
        for r, (ql, kl) in enumerate(zip(step.q_len, step.kv_len)):
            rows = slice(row, row + ql)
            p0 = kl - ql
            st["k"][r, p0:kl] = k[rows]  # the cache write first (SPEC 3)
            st["v"][r, p0:kl] = v[rows]
            if "ik" in st:
                st["ik"][r, p0:kl] = ik[rows]
            if "iv" in st:
                st["iv"][r, p0:kl] = iv[rows]
            pos = torch.arange(p0, kl, device=q.device)
            o, io, ids = spec_attention(
                self.cfg, layer, q[rows], st["k"][r, :kl], st["v"][r, :kl],
                iq[rows] if iq is not None else None, st["ik"][r, :kl] if "ik" in st else None,
                st["iv"][r, :kl] if "iv" in st else None, pos)
            os_.append(o)
            ios.append(io)
            ids_all.append(ids)
            row += ql
        o = torch.cat(os_).to(q.dtype)
        io = torch.cat(ios).to(q.dtype) if ios[0] is not None else None
        if ids_all[0] is not None:
            self.topk[layer] = torch.cat(ids_all)
        return o, io


class CheckedAttention:
    """Runs msa and the reference on the same inputs; the model goes on
    with msa's outputs.  Records the largest relative errors and the calls
    whose selections differ."""

    def __init__(self, msa_attn, ref_attn):
        self.msa, self.ref = msa_attn, ref_attn
        self.msa.record_topk = True
        self.max_err = {"o": 0.0, "idx_o": 0.0}
        self.calls = 0
        self.topk_mismatches = 0

    def begin_step(self, step):
        self.msa.begin_step(step)
        self.ref.begin_step(step)

    def __call__(self, layer, q, k, v, iq, ik, iv):
        o, io = self.msa(layer, q, k, v, iq, ik, iv)
        ro, rio = self.ref(layer, q, k, v, iq, ik, iv)
        self.calls += 1

        def rel(a, b):
            a, b = a.double(), b.double()
            if torch.isnan(a).any():
                return math.inf
            return (torch.linalg.norm(a - b) / torch.linalg.norm(b).clamp_min(1e-30)).item()

        self.max_err["o"] = max(self.max_err["o"], rel(o, ro))
        if io is not None:
            self.max_err["idx_o"] = max(self.max_err["idx_o"], rel(io, rio))
        if self.cfg.sparse[layer] and not torch.equal(self.msa.topk[layer].cpu(),
                                                      self.ref.topk[layer].cpu()):
            self.topk_mismatches += 1
        return o, io

    @property
    def cfg(self):
        return self.ref.cfg


# ---- the engine: requests, pages, steps ---------------------------------------------------


class Step:
    """One step: rows per request (q_len), tokens after it (kv_len), each
    row's position, each request's last row, and msa's step."""

    def __init__(self, q_len, kv_len, decode, msa_step, device):
        self.q_len, self.kv_len, self.decode, self.msa = q_len, kv_len, decode, msa_step
        pos = [p for ql, kl in zip(q_len, kv_len) for p in range(kl - ql, kl)]
        self.positions = torch.tensor(pos, dtype=torch.long, device=device)
        last = torch.tensor(q_len).cumsum(0) - 1
        self.last_rows = last.to(device)


class Engine:
    """A vLLM-style block table over the msa cache's pages: each request
    gets whole pages (page ids drawn in a shuffled order, so that tables
    are not the identity), and each step's metadata becomes msa's step
    through msa.adapters.step_from_block_table."""

    def __init__(self, prompt_lens, new_tokens, page_size, device, seed):
        self.P = page_size
        need = [-(-(n + new_tokens) // page_size) for n in prompt_lens]
        self.num_pages = sum(need) + 3
        order = torch.randperm(self.num_pages, generator=torch.Generator().manual_seed(seed + 1))
        self.block_table = torch.full((len(prompt_lens), max(need)), -1, dtype=torch.int32)
        at = 0
        for r, n in enumerate(need):
            self.block_table[r, :n] = order[at : at + n].to(torch.int32)
            at += n
        self.device = device
        self.max_len = max(prompt_lens) + new_tokens

    def step(self, q_len, seq_lens, decode):
        qsl = [0]
        for n in q_len:
            qsl.append(qsl[-1] + n)
        s = msa.adapters.step_from_block_table(self.block_table, seq_lens, qsl, self.P)
        return Step(list(q_len), list(seq_lens), decode, s, self.device)


def generate(model, attn, engine, prompts, new_tokens, cuda_graph=False):
    """Greedy decoding of every prompt: one prefill step for all, then
    new_tokens - 1 decode steps (each request one row).  Returns the tokens
    [R][new_tokens] and the prefill and decode seconds."""
    dev = model.device
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    R = len(prompts)
    lens = [len(p) for p in prompts]
    sync()
    t0 = time.perf_counter()
    step = engine.step(lens, lens, decode=False)
    attn.begin_step(step)
    ids = torch.tensor([t for p in prompts for t in p], dtype=torch.long, device=dev)
    hidden = model.forward(ids, step.positions, attn)
    tok = model.logits(hidden[step.last_rows]).argmax(-1)
    out = [tok]
    sync()
    t1 = time.perf_counter()
    graph = None
    for i in range(1, new_tokens):
        seq = [n + i for n in lens]
        step = engine.step([1] * R, seq, decode=True)
        attn.begin_step(step)  # the plan update: on the host, outside any capture
        if not cuda_graph:
            tok = model.logits(model.forward(tok, step.positions, attn)).argmax(-1)
        else:
            if graph is None:
                static_ids = tok.clone()
                static_pos = step.positions.clone()
                # Warm-up on a side stream writes this step's own keys and
                # values, so running it before the capture changes nothing.
                side = torch.cuda.Stream()
                side.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(side):
                    model.forward(static_ids, static_pos, attn)
                torch.cuda.current_stream().wait_stream(side)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    hidden = model.forward(static_ids, static_pos, attn)
                    static_tok = model.logits(hidden).argmax(-1)
            static_ids.copy_(tok)
            static_pos.copy_(step.positions)
            graph.replay()
            tok = static_tok.clone()
        out.append(tok)
    sync()
    t2 = time.perf_counter()
    return torch.stack(out, 1).cpu().tolist(), t1 - t0, t2 - t1


# ---- the program ----------------------------------------------------------------------------


def make_prompts(lengths, vocab, seed):
    g = torch.Generator().manual_seed(seed + 2)
    return [torch.randint(0, vocab, (n,), generator=g).tolist() for n in lengths]


def run(dtype="fp32", device="cpu", prompt_lens=(37, 70, 101), new_tokens=16, seed=0,
        page_size=8, cuda_graph=None, config=None, warmup=True, out=print):
    """Generates with msa and with the reference, then checks msa against
    the reference on the same inputs.  Returns a dict of the results; out
    prints the report (None: quiet).  warmup runs both paths once, untimed,
    before the timed runs."""
    out = out or (lambda *a: None)
    device = torch.device(device)
    tdt = DTYPES[dtype]
    if cuda_graph is None:
        cuda_graph = device.type == "cuda"
    with tempfile.TemporaryDirectory() as tmp:
        path = config
        if path is None:
            path = os.path.join(tmp, "config.json")
            with open(path, "w") as f:
                json.dump(CONFIG, f, indent=1)
        with open(path) as f:
            cfg = Config(json.load(f))
        model = TinyM3(cfg, tdt, device, seed)
        prompts = make_prompts(prompt_lens, cfg.vocab, seed)
        R = len(prompts)
        engine = Engine(prompt_lens, new_tokens, page_size, device, seed)

        def msa_attn():
            return MsaAttention(path, cfg, tdt, device, engine.num_pages, page_size, R,
                                engine.max_len)

        if warmup:
            # First calls pay one-time costs (the library's threads, torch's
            # kernels, CUDA contexts): a short untimed run of each path.
            w = msa_attn()
            generate(model, w, engine, prompts, 3, cuda_graph)
            w.close()
            generate(model, TorchAttention(cfg, tdt, device, R, engine.max_len), engine, prompts,
                     2, False)

        a = msa_attn()
        tok_msa, pre_msa, dec_msa = generate(model, a, engine, prompts, new_tokens, cuda_graph)
        kernels = sorted({a.prefill_plan.kernel_name(i) for i in range(cfg.layers)}
                         | {a.decode_plan.kernel_name(i) for i in range(cfg.layers)})
        a.close()
        ref = TorchAttention(cfg, tdt, device, R, engine.max_len)
        tok_ref, pre_ref, dec_ref = generate(model, ref, engine, prompts, new_tokens, False)
        checked = CheckedAttention(msa_attn(), TorchAttention(cfg, tdt, device, R, engine.max_len))
        generate(model, checked, engine, prompts, new_tokens, False)
        checked.msa.close()

    bound = 1e-5 if dtype == "fp32" else 1e-2
    same = sum(x == y for a_, b_ in zip(tok_msa, tok_ref) for x, y in zip(a_, b_))
    total = R * new_tokens
    res = {
        "tokens_msa": tok_msa, "tokens_ref": tok_ref, "same_tokens": same, "total_tokens": total,
        "max_err": dict(checked.max_err), "bound": bound, "checked_calls": checked.calls,
        "topk_mismatches": checked.topk_mismatches, "kernels": kernels,
        "tok_per_s": {
            "msa_prefill": sum(prompt_lens) / pre_msa, "msa_decode": R * (new_tokens - 1) / dec_msa,
            "ref_prefill": sum(prompt_lens) / pre_ref, "ref_decode": R * (new_tokens - 1) / dec_ref,
        },
    }
    res["ok"] = (res["max_err"]["o"] < bound and res["max_err"]["idx_o"] < bound
                 and (dtype != "fp32" or (same == total and checked.topk_mismatches == 0)))
    out("tiny M3 on %s, %s, %d layers (sparse %s, index value %s), prompts %s, %d new tokens%s" % (
        device, dtype, cfg.layers, cfg.sparse, cfg.index_value, list(prompt_lens), new_tokens,
        ", CUDA graph decode" if cuda_graph else ""))
    out("msa kernels: %s" % ", ".join(k for k in kernels if k))
    for r in range(R):
        out("request %d msa:   %s" % (r, tok_msa[r]))
        out("request %d torch: %s" % (r, tok_ref[r]))
    out("identical tokens: %d of %d" % (same, total))
    out("checked %d attention calls on msa's inputs: max rel err o %.2e, idx_o %.2e (bound %g); "
        "calls with different selections: %d" % (checked.calls, res["max_err"]["o"],
                                                  res["max_err"]["idx_o"], bound,
                                                  checked.topk_mismatches))
    tps = res["tok_per_s"]
    out("tokens/s  msa: prefill %.0f, decode %.1f   torch reference: prefill %.0f, decode %.1f" % (
        tps["msa_prefill"], tps["msa_decode"], tps["ref_prefill"], tps["ref_decode"]))
    out("OK" if res["ok"] else "FAILED")
    return res


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu", help="cpu or cuda (cuda:N)")
    ap.add_argument("--dtype", choices=("fp32", "bf16", "both"), default="both")
    ap.add_argument("--prompts", default="37,70,101", help="prompt lengths, comma separated")
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--page-size", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-cuda-graph", action="store_true", help="decode without CUDA graphs")
    ap.add_argument("--config", help="a config.json to use instead of the built-in one")
    args = ap.parse_args(argv)
    if torch.device(args.device).type == "cuda":
        if not torch.cuda.is_available():
            print("tiny_m3: torch sees no CUDA device", file=sys.stderr)
            return 2
        if not msa.backend_available("cuda"):
            print("tiny_m3: %s has no CUDA backend (build with -DMSA_CUDA=ON "
                  "-DMSA_BUILD_SHARED=ON and set MSA_LIBRARY)" % msa.library_path(),
                  file=sys.stderr)
            return 2
    ok = True
    for dt in (("fp32", "bf16") if args.dtype == "both" else (args.dtype,)):
        res = run(dt, args.device, [int(x) for x in args.prompts.split(",")], args.new_tokens,
                  args.seed, args.page_size, False if args.no_cuda_graph else None, args.config)
        ok = ok and res["ok"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
