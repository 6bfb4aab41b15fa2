"""The tiny MiniMax-M3 of tiny_m3.py with tensor parallelism over torch.distributed.

Each rank derives its share of the attention heads from the full config
with the library's helper (msa.ModelConfig.for_rank, msa_model_config_for_rank),
slices its share of the weights from the full model (made from the same
seed on every rank): the q, k, v and index q projections by head, the
output projection (and index_o_proj) by input rows, the SwiGLU MLP by its
intermediate columns.  It owns an msa model, cache and plans of its own
heads only and runs msa on them; the partial sums of the output projection
and of the MLP are all-reduced in fp32 through torch.distributed (gloo on
the CPU, nccl on CUDA), as an engine does.  Everything else (embedding,
norms, LM head) is replicated.

Checks, on rank 0: the same prompts run through the unsharded model
(tiny_m3.TinyM3 with msa over the full heads, one process).  In fp32 the
greedy tokens of the tensor-parallel run must equal the unsharded run's;
in both dtypes the logits, with the unsharded run's tokens fed to the
tensor-parallel run, must agree within SPEC 11's bound (1e-5 relative in
fp32, 1e-2 in bf16).  One rank computes the unsharded model operation for
operation, so there tokens and logits must be equal in both dtypes.  The
program exits 1 on every rank when a check fails.

    python python/examples/tiny_m3_tp.py                             # 1 rank
    torchrun --standalone --nproc-per-node 2 python/examples/tiny_m3_tp.py
    torchrun --standalone --nproc-per-node 2 python/examples/tiny_m3_tp.py --device cuda

It prints tokens/s of the tensor-parallel run and the share of its step
time spent in msa's attention and in the all-reduces (the slowest rank's).
"""

import argparse
import copy
import json
import os
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tiny_m3 as base  # noqa: E402

msa = base.msa


# ---- the ranks --------------------------------------------------------------------------


class Group:
    """This process's place among the ranks and the collectives.  One rank
    (plain python) needs no process group: the reductions are the
    identity there."""

    def __init__(self, device):
        self.size = int(os.environ.get("WORLD_SIZE", "1"))
        self.rank = int(os.environ.get("RANK", "0"))
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.local_size = int(os.environ.get("LOCAL_WORLD_SIZE", str(self.size)))
        self.backend = None
        if self.size > 1:
            self.backend = "nccl" if device.type == "cuda" else "gloo"
            dist.init_process_group(self.backend)
        self.reduce_s = 0.0

    def all_reduce(self, x, op=None):
        if self.size == 1:
            return x
        t0 = time.perf_counter()
        dist.all_reduce(x, op=op or dist.ReduceOp.SUM)
        self.reduce_s += time.perf_counter() - t0
        return x

    def broadcast(self, x, src=0):
        if self.size > 1:
            dist.broadcast(x, src)
        return x

    def close(self):
        if self.size > 1:
            # Every rank past its last collective before any rank closes
            # its connections.
            dist.barrier()
            dist.destroy_process_group()


class RankModel:
    """One rank's share of a tiny_m3.TinyM3: its weights sliced from the
    full model's as the library's shard says, and the forward pass of a
    step with the partial sums all-reduced."""

    def __init__(self, full, msa_full, group):
        c = full.cfg
        rc, sh = msa_full.for_rank(group.rank, group.size)
        if c.inter % group.size:
            raise ValueError("intermediate_size (%d) is not a multiple of the tensor-parallel "
                             "size (%d)" % (c.inter, group.size))
        self.shard, self.group = sh, group
        self.full_cfg = c
        # The rank's config: its head counts, every other field the full one's.
        self.cfg = copy.copy(c)
        self.cfg.hq, self.cfg.hkv, self.cfg.hi = (rc.num_q_heads, rc.num_kv_heads,
                                                  rc.num_index_heads)
        self.msa_config = rc
        self.dtype, self.device = full.dtype, full.device
        # Index heads held by several ranks (fewer index heads than ranks)
        # add their index value branch once: on the first rank that holds
        # them (replicas are consecutive ranks).
        owner = group.rank == 0 or msa_full.for_rank(group.rank - 1,
                                                     group.size)[1].index_head_begin != \
            sh.index_head_begin
        d, di = c.d, c.di
        qs = slice(sh.q_head_begin * d, (sh.q_head_begin + rc.num_q_heads) * d)
        ks = slice(sh.kv_head_begin * d, (sh.kv_head_begin + rc.num_kv_heads) * d)
        ixs = slice(sh.index_head_begin * di, (sh.index_head_begin + rc.num_index_heads) * di)
        n = c.inter // group.size
        ms = slice(group.rank * n, (group.rank + 1) * n)
        self.layers = []
        for L in full.layers:
            R = {"norm_in": L["norm_in"], "norm_post": L["norm_post"],
                 "wq": L["wq"][:, qs], "wk": L["wk"][:, ks], "wv": L["wv"][:, ks],
                 "wo": L["wo"][qs, :], "gate": L["gate"][:, ms], "up": L["up"][:, ms],
                 "down": L["down"][ms, :]}
            if "wiq" in L:
                # The index key (and index value) projection is one head,
                # which every rank needs whole.
                R["wiq"], R["wik"] = L["wiq"][:, ixs], L["wik"]
            if "wiv" in L:
                R["wiv"] = L["wiv"]
                R["wio"] = L["wio"][ixs, :] if owner else None
            self.layers.append({k: (w.contiguous() if w is not None else None)
                                for k, w in R.items()})
        self.embed, self.norm, self.head = full.embed, full.norm, full.head
        self.rope_d, self.rope_di = full.rope_d, full.rope_di

    def _partial(self, x, w):
        """x @ w in fp32: a share of a sum that the all-reduce completes."""
        return x.float() @ w.float()

    def forward(self, ids, positions, attn):
        """As tiny_m3.TinyM3.forward, on this rank's heads and MLP columns;
        the output projections' partial sums are summed over the ranks
        (fp32) and rounded once to the model's dtype."""
        c = self.cfg
        T = ids.shape[0]
        h = self.embed[ids]
        cos_d, sin_d = self.rope_d[0][positions], self.rope_d[1][positions]
        cos_i, sin_i = self.rope_di[0][positions], self.rope_di[1][positions]
        mm = base.mm
        for i, L in enumerate(self.layers):
            x = base.rms_norm(h, L["norm_in"], c.eps)
            o, io = attn(i, *base.attention_inputs(c, i, L, x, (cos_d, sin_d), (cos_i, sin_i)))
            # Each projection's sum is rounded once and added to h on its
            # own, as the unsharded model does, so that one rank computes
            # exactly the unsharded model.
            h = h + self.group.all_reduce(self._partial(o.reshape(T, -1), L["wo"])).to(self.dtype)
            if io is not None:
                part = (self._partial(io.reshape(T, -1), L["wio"]) if L["wio"] is not None
                        else torch.zeros_like(h, dtype=torch.float32))
                h = h + self.group.all_reduce(part).to(self.dtype)
            x = base.rms_norm(h, L["norm_post"], c.eps)
            act = F.silu(mm(x, L["gate"])) * mm(x, L["up"])
            h = h + self.group.all_reduce(self._partial(act, L["down"])).to(self.dtype)
        return base.rms_norm(h, self.norm, c.eps)

    def logits(self, hidden):
        return base.mm(hidden, self.head).float()


class TimedAttention:
    """An attention (begin_step, __call__) with the seconds spent in it."""

    def __init__(self, attn, sync):
        self.attn, self.sync, self.seconds = attn, sync, 0.0

    def begin_step(self, step):
        self.attn.begin_step(step)

    def __call__(self, *args):
        t0 = time.perf_counter()
        out = self.attn(*args)
        self.sync()
        self.seconds += time.perf_counter() - t0
        return out


def generate(model, attn, engine, prompts, new_tokens, forced=None):
    """Greedy decoding as tiny_m3.generate (one prefill step, then decode
    steps), keeping each step's logits.  forced [R][new_tokens]: the tokens
    fed to the decode steps instead of the argmax (the logits of another
    run's inputs).  Returns tokens [R][new_tokens], logits
    [R][new_tokens][vocab] and the prefill and decode seconds."""
    dev = model.device
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    R = len(prompts)
    lens = [len(p) for p in prompts]
    sync()
    t0 = time.perf_counter()
    step = engine.step(lens, lens, decode=False)
    attn.begin_step(step)
    ids = torch.tensor([t for p in prompts for t in p], dtype=torch.long, device=dev)
    logits = model.logits(model.forward(ids, step.positions, attn)[step.last_rows])
    out, all_logits = [logits.argmax(-1)], [logits]
    sync()
    t1 = time.perf_counter()
    for i in range(1, new_tokens):
        tok = out[-1] if forced is None else forced[:, i - 1].to(dev)
        step = engine.step([1] * R, [n + i for n in lens], decode=True)
        attn.begin_step(step)
        logits = model.logits(model.forward(tok, step.positions, attn))
        out.append(logits.argmax(-1))
        all_logits.append(logits)
    sync()
    t2 = time.perf_counter()
    return (torch.stack(out, 1).cpu(), torch.stack(all_logits, 1).cpu(), t1 - t0, t2 - t1)


def rel_err(a, b):
    """Largest relative error (2-norm) of a over b, row by row of the last
    dimension."""
    a, b = a.double(), b.double()
    return (torch.linalg.norm(a - b, dim=-1) / torch.linalg.norm(b, dim=-1).clamp_min(1e-30)) \
        .max().item()


# ---- the program ----------------------------------------------------------------------------


def run(group, dtype, device, prompt_lens, new_tokens, seed, page_size, threads, config, out,
        repeat=1):
    """The tensor-parallel run, timed, and its checks against the unsharded
    model on rank 0.  Returns True on every rank when the checks hold."""
    tdt = base.DTYPES[dtype]
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    with tempfile.TemporaryDirectory() as tmp:
        path = config
        if path is None:
            path = os.path.join(tmp, "config.json")
            with open(path, "w") as f:
                json.dump(base.CONFIG, f, indent=1)
        with open(path) as f:
            cfg = base.Config(json.load(f))
        msa_full = msa.ModelConfig.from_json(path)
        full = base.TinyM3(cfg, tdt, device, seed)
        model = RankModel(full, msa_full, group)
        prompts = base.make_prompts(prompt_lens, cfg.vocab, seed)
        R = len(prompts)
        engine = base.Engine(prompt_lens, new_tokens, page_size, device, seed)

        def rank_attn():
            return base.MsaAttention(path, model.cfg, tdt, device, engine.num_pages, page_size, R,
                                     engine.max_len, msa_config=model.msa_config,
                                     num_threads=threads)

        # Untimed warm-up: the library's threads, torch's kernels, the
        # process group's first collectives.
        a = rank_attn()
        generate(model, a, engine, prompts, 3)
        a.close()
        best = None
        for _ in range(repeat):  # the fastest of `repeat` timed runs
            a = rank_attn()
            timed = TimedAttention(a, sync)
            group.reduce_s = 0.0
            tok_tp, _, pre_s, dec_s = generate(model, timed, engine, prompts, new_tokens)
            kernels = sorted({a.prefill_plan.kernel_name(i) for i in range(cfg.layers)}
                             | {a.decode_plan.kernel_name(i) for i in range(cfg.layers)})
            a.close()
            times = torch.tensor([pre_s, dec_s, timed.seconds, group.reduce_s],
                                 dtype=torch.float64)
            # The slowest rank's seconds: the step waits for it.
            times = group.all_reduce(times.to(device), dist.ReduceOp.MAX).cpu()
            if best is None or times[:2].sum() < best[:2].sum():
                best = times
        times = best

        # The unsharded model, in one process (rank 0); its tokens go to
        # every rank for the run on the same inputs.
        tok_ref = torch.zeros((R, new_tokens), dtype=torch.long)
        logits_ref = None
        if group.rank == 0:
            ref = base.MsaAttention(path, cfg, tdt, device, engine.num_pages, page_size, R,
                                    engine.max_len, num_threads=threads)
            tok_ref, logits_ref, _, _ = generate(full, ref, engine, prompts, new_tokens)
            ref.close()
        tok_ref = group.broadcast(tok_ref.to(device)).cpu()
        a = rank_attn()
        _, logits_tp, _, _ = generate(model, a, engine, prompts, new_tokens, forced=tok_ref)
        a.close()

    bound = 1e-5 if dtype == "fp32" else 1e-2
    verdict = torch.zeros(1, dtype=torch.int32)
    if group.rank == 0:
        same = int((tok_tp == tok_ref).sum())
        total = R * new_tokens
        err = rel_err(logits_tp, logits_ref)
        ok = err < bound and (dtype != "fp32" or same == total)
        if group.size == 1:
            # One rank computes the unsharded model operation for operation.
            ok = ok and err == 0.0 and same == total
        verdict[0] = int(ok)
        out("tiny M3, %d tensor-parallel rank(s)%s on %s, %s, %d layers, prompts %s, "
            "%d new tokens" % (group.size, " (%s)" % group.backend if group.backend else "",
                               device.type, dtype, cfg.layers, list(prompt_lens), new_tokens))
        out("rank 0 of %d: query heads %d.., KV heads %d.., index heads %d.. (%d/%d/%d of "
            "%d/%d/%d); msa kernels: %s" % (
                group.size, model.shard.q_head_begin, model.shard.kv_head_begin,
                model.shard.index_head_begin, model.cfg.hq, model.cfg.hkv, model.cfg.hi,
                cfg.hq, cfg.hkv, cfg.hi, ", ".join(k for k in kernels if k)))
        for r in range(R):
            out("request %d tensor parallel: %s" % (r, tok_tp[r].tolist()))
            out("request %d unsharded:       %s" % (r, tok_ref[r].tolist()))
        out("identical tokens: %d of %d%s" % (same, total,
                                             "" if dtype == "fp32" else " (not required in bf16)"))
        out("logits on the unsharded run's tokens: max rel err %.2e (bound %g)" % (err, bound))
        pre_s, dec_s, attn_s, red_s = times.tolist()
        step_s = pre_s + dec_s
        out("tokens/s: prefill %.0f, decode %.1f; of the step time (slowest rank): attention "
            "%.0f%%, all-reduce (with the wait for the other ranks) %.0f%%" % (sum(prompt_lens) / pre_s, R * (new_tokens - 1) / dec_s,
                                           100 * attn_s / step_s, 100 * red_s / step_s))
        out("OK" if ok else "FAILED")
    verdict = group.broadcast(verdict.to(device)).cpu()
    return bool(verdict[0])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu", help="cpu or cuda (each rank: its LOCAL_RANK GPU)")
    ap.add_argument("--dtype", choices=("fp32", "bf16", "both"), default="both")
    ap.add_argument("--prompts", default="37,70,101", help="prompt lengths, comma separated")
    ap.add_argument("--new-tokens", type=int, default=16)
    ap.add_argument("--page-size", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0,
                    help="CPU threads of each rank (torch and msa; default: the cores over the "
                         "ranks of this host)")
    ap.add_argument("--config", help="a config.json to use instead of the built-in one")
    ap.add_argument("--repeat", type=int, default=1, help="timed runs (the fastest is reported)")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            print("tiny_m3_tp: torch sees no CUDA device", file=sys.stderr)
            return 2
        if not msa.backend_available("cuda"):
            print("tiny_m3_tp: %s has no CUDA backend" % msa.library_path(), file=sys.stderr)
            return 2
    group = Group(device)
    if device.type == "cuda":
        device = torch.device("cuda", group.local_rank)
        torch.cuda.set_device(device)
    threads = args.threads or max(1, (os.cpu_count() or 1) // group.local_size)
    torch.set_num_threads(threads)
    out = print if group.rank == 0 else (lambda *a: None)
    ok = True
    try:
        for dt in (("fp32", "bf16") if args.dtype == "both" else (args.dtype,)):
            ok = run(group, dt, device, [int(x) for x in args.prompts.split(",")],
                     args.new_tokens, args.seed, args.page_size, threads, args.config,
                     out, max(args.repeat, 1)) and ok
    finally:
        group.close()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
