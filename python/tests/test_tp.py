"""Tensor parallelism of the tiny MiniMax-M3 (python/examples/tiny_m3_tp.py).

Two ranks launched with torchrun over gloo on the CPU must reproduce the
unsharded model (fp32: the same greedy tokens, logits within 1e-5; bf16:
logits within 1e-2); one rank must reproduce it exactly; each rank's
weights must be its heads' slices; splits the library refuses must raise.
On a host with two GPUs and a CUDA build of the library the two ranks also
run over nccl.

Runs under pytest or unittest, or as a program (CTest runs it so): it then
prints "N passed, N failed, N skipped" and exits 77 when torch (or NumPy)
is missing.
"""

import contextlib
import io
import json
import os
import re
import subprocess
import sys
import types
import unittest

import unittest_counts  # beside this file

try:
    import numpy  # noqa: F401  (the package needs it)
    import torch
    import torch.distributed as dist
except ImportError as e:  # pragma: no cover - the runner below reports a skip
    torch = None
    _MISSING = e.name
    if __name__ != "__main__":
        raise unittest.SkipTest("skipped: %s not installed" % e.name)

HERE = os.path.dirname(os.path.abspath(__file__))
EXAMPLES = os.path.join(os.path.dirname(HERE), "examples")
EXAMPLE = os.path.join(EXAMPLES, "tiny_m3_tp.py")
if torch is not None:
    if os.environ.get("MSA_TEST_INSTALLED") != "1":
        sys.path.insert(0, os.path.dirname(HERE))
    sys.path.insert(0, EXAMPLES)
    import msa
    import tiny_m3
    import tiny_m3_tp


def launch(nproc, *args, timeout=240):
    """The example under torchrun (torch.distributed.run) with nproc ranks
    on this host; returns (exit status, output)."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc-per-node", str(nproc), EXAMPLE] + list(args)
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")
    p = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=timeout, env=env)
    return p.returncode, p.stdout


def report(test, out, ranks, backend):
    """Checks the example's report of an fp32 run then a bf16 run."""
    test.assertEqual(out.count("%d tensor-parallel rank(s) (%s)" % (ranks, backend)), 2, out)
    same = [tuple(map(int, m)) for m in re.findall(r"identical tokens: (\d+) of (\d+)", out)]
    test.assertEqual(len(same), 2, out)
    test.assertEqual(same[0][0], same[0][1], "fp32 tokens differ:\n" + out)
    errs = [float(x) for x in re.findall(r"logits on the unsharded run's tokens: max rel err "
                                         r"(\S+)", out)]
    test.assertEqual(len(errs), 2, out)
    test.assertLess(errs[0], 1e-5, out)
    test.assertLess(errs[1], 1e-2, out)
    test.assertEqual(re.findall(r"^(OK|FAILED)$", out, re.M), ["OK", "OK"], out)


@unittest.skipIf(torch is None or not dist.is_available(), "torch.distributed is missing")
class TestTwoRanks(unittest.TestCase):
    def test_gloo_cpu(self):
        rc, out = launch(2, "--new-tokens", "6", "--prompts", "37,70")
        self.assertEqual(rc, 0, out)
        report(self, out, 2, "gloo")
        # Rank 0 holds half the query heads and one of the two KV and index heads.
        self.assertIn("(2/1/1 of 4/2/2)", out)

    @unittest.skipUnless(torch is not None and torch.cuda.device_count() >= 2,
                         "fewer than two CUDA devices")
    def test_nccl_cuda(self):
        if not msa.backend_available("cuda"):
            self.skipTest("the library has no CUDA backend")
        rc, out = launch(2, "--device", "cuda", "--new-tokens", "12")
        self.assertEqual(rc, 0, out)
        report(self, out, 2, "nccl")


@unittest.skipIf(torch is None, "torch is missing")
class TestOneRank(unittest.TestCase):
    def test_exactly_the_unsharded_model(self):
        for var in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
            self.assertNotIn(var, os.environ, "run outside torchrun")
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            rc = tiny_m3_tp.main(["--new-tokens", "6", "--prompts", "20,45", "--threads", "1"])
        out = buf.getvalue()
        self.assertEqual(rc, 0, out)
        self.assertEqual(out.count("max rel err 0.00e+00"), 2, out)
        self.assertEqual(re.findall(r"identical tokens: (\d+) of (\d+)", out),
                         [("12", "12"), ("12", "12")], out)


def tiny(**changes):
    d = json.loads(json.dumps(tiny_m3.CONFIG))
    d.update(changes)
    return d


def shard(config, rank, size, dtype=torch.float32 if torch else None):
    """RankModel of one rank of `size`, without a process group (slicing
    needs none)."""
    import tempfile

    cfg = tiny_m3.Config(config)
    full = tiny_m3.TinyM3(cfg, dtype, torch.device("cpu"), 0)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "config.json")
        with open(path, "w") as f:
            json.dump(config, f)
        msa_full = msa.ModelConfig.from_json(path)
    group = types.SimpleNamespace(rank=rank, size=size)
    return full, tiny_m3_tp.RankModel(full, msa_full, group)


@unittest.skipIf(torch is None, "torch is missing")
class TestShards(unittest.TestCase):
    def test_slices(self):
        d = 16  # head_dim = sparse_index_dim of the tiny config
        full, m = shard(tiny(), 1, 2)
        self.assertEqual((m.cfg.hq, m.cfg.hkv, m.cfg.hi), (2, 1, 1))
        self.assertEqual((full.cfg.hq, full.cfg.hkv, full.cfg.hi), (4, 2, 2))
        for F, R in zip(full.layers, m.layers):
            self.assertTrue(torch.equal(R["wq"], F["wq"][:, 2 * d:4 * d]))
            self.assertTrue(torch.equal(R["wk"], F["wk"][:, d:2 * d]))
            self.assertTrue(torch.equal(R["wv"], F["wv"][:, d:2 * d]))
            self.assertTrue(torch.equal(R["wo"], F["wo"][2 * d:4 * d, :]))
            self.assertTrue(torch.equal(R["gate"], F["gate"][:, 64:]))
            self.assertTrue(torch.equal(R["down"], F["down"][64:, :]))
            if "wiq" in F:
                self.assertTrue(torch.equal(R["wiq"], F["wiq"][:, d:2 * d]))
                self.assertTrue(torch.equal(R["wik"], F["wik"]))
            if "wio" in F:
                self.assertTrue(torch.equal(R["wio"], F["wio"][d:2 * d, :]))
        self.assertEqual(sum("wio" in L for L in m.layers), 1)

    def test_replicated_index_heads_add_once(self):
        # Four ranks over 2 KV and 2 index heads: ranks 0, 1 hold index
        # head 0 and ranks 2, 3 index head 1; the first of each adds the
        # index value branch.
        owners = []
        for rank in range(4):
            _, m = shard(tiny(), rank, 4)
            self.assertEqual((m.cfg.hq, m.cfg.hkv, m.cfg.hi), (1, 1, 1))
            self.assertEqual(m.shard.index_head_begin, rank // 2)
            self.assertEqual(m.shard.index_replicas, 2)
            owners.append(m.layers[1]["wio"] is not None)
        self.assertEqual(owners, [True, False, True, False])

    def test_refused_splits(self):
        with self.assertRaises(msa.Error) as e:
            shard(tiny(), 0, 3)
        self.assertEqual(e.exception.status_name, "MSA_ERR_INVALID_CONFIG")
        self.assertIn("num_attention_heads (4) is not a multiple of the tensor-parallel size (3)",
                      e.exception.message)
        with self.assertRaises(ValueError) as e:
            shard(tiny(intermediate_size=130), 0, 4)
        self.assertIn("intermediate_size (130)", str(e.exception))


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
