"""msa.forward as a PyTorch custom operator: torch.ops.msa.forward.

Importing this module imports torch and registers the operator (once per
process).  The operator writes its outputs (o, idx_o, lse, topk) and the
cache in place and returns nothing; it declares those writes to torch
(mutates_args), and its fake implementation does nothing, so

- torch.compile traces a function that calls msa.torch_ops.forward into one
  graph (fullgraph=True holds), without running the library while tracing;
- a CUDA graph captured around it (torch.cuda.graph) replays the library's
  kernels: the operator only enqueues work on torch's current stream.

The cache is memory the library owns.  The operator names it to torch by the
cache's planes as tensors (Cache.tensor, no copy), so that torch orders the
operator against every other reader or writer of those tensors.  The
library reads and writes the planes at their own addresses, whatever tensor
it is handed.  Inductor (torch.compile's default backend) hands the operator
the planes themselves; a backend that does not write in place (aot_eager)
hands it copies, which the operator detects by their addresses: it then
copies such a copy into the cache before the call and the cache back into
the copy after it, so the results stay right at the cost of two plane
copies per call (it warns once).

A plan is handed to the operator by a number (Plan._op_id) looked up in a
table of the live plans.  prepare(plan) enters the plan there and makes the
plane tensors; forward() does it on its first call, so only a plan first
used inside torch.compile needs prepare() beforehand.
"""

import collections
import warnings
import weakref
from typing import Optional

import torch

from . import _core

__all__ = ["forward", "prepare"]

_PLANS = weakref.WeakValueDictionary()

# What the traced wrapper reads of a plan: numbers and tensors only.
_OpInfo = collections.namedtuple(
    "_OpInfo", "op_id num_q_heads head_dim num_index_heads index_dim layer_flags planes")

_PLANE_KINDS = ("k", "v", "index_k", "index_v")


def prepare(plan):
    """Enters `plan` into the operator's table and makes the tensors of its
    cache planes; returns what forward() reads of the plan.  Call it before
    the first torch.compile trace of a function using the plan."""
    if not isinstance(plan, _core.Plan):
        raise ValueError("prepare takes an msa.Plan, not %s" % type(plan).__name__)
    info = plan._torch_op
    if info is not None and not plan.closed:
        return info
    plan._ptr  # a closed plan raises here
    mc = plan._mc
    cache = plan.cache
    planes = tuple(
        tuple(cache.tensor(layer, kind) if cache.has_plane(layer, kind) else None
              for kind in _PLANE_KINDS)
        for layer in range(mc.num_layers))
    info = _OpInfo(plan._op_id, mc.num_q_heads, mc.head_dim, mc.num_index_heads, mc.index_dim,
                   plan._layer_flags, planes)
    _PLANS[plan._op_id] = plan
    plan._torch_op = info
    return info


@torch.library.custom_op(
    "msa::forward",
    mutates_args=("o", "idx_o", "lse", "topk", "k_cache", "v_cache", "index_k_cache",
                  "index_v_cache"),
)
def _forward_op(
    plan_id: int,
    layer: int,
    q: torch.Tensor,
    k: Optional[torch.Tensor],
    v: Optional[torch.Tensor],
    idx_q: Optional[torch.Tensor],
    idx_k: Optional[torch.Tensor],
    idx_v: Optional[torch.Tensor],
    o: torch.Tensor,
    idx_o: Optional[torch.Tensor],
    lse: Optional[torch.Tensor],
    topk: Optional[torch.Tensor],
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    index_k_cache: Optional[torch.Tensor],
    index_v_cache: Optional[torch.Tensor],
    write_cache: bool,
) -> None:
    plan = _PLANS.get(plan_id)
    if plan is None or plan.closed:
        raise ValueError("msa::forward: plan %d is closed or was never prepared" % plan_id)
    given = (k_cache, v_cache, index_k_cache, index_v_cache)
    copies = []
    for kind, mine, t in zip(_PLANE_KINDS, plan._torch_op.planes[layer], given):
        if (mine is None) != (t is None) or (t is not None and (
                t.shape != mine.shape or t.dtype != mine.dtype or t.device != mine.device)):
            raise ValueError("msa::forward: the %s plane tensor of layer %d is not a plane of "
                             "the plan's cache" % (kind, layer))
        if t is not None and t.data_ptr() != mine.data_ptr():
            copies.append((mine, t))
    if copies:
        _warn_copies()
        # A copy of a plane (a compiler that did not write in place): the
        # cache takes the copy's contents, the library works on the cache,
        # and the copy takes the result, so the copy holds what torch expects.
        for mine, t in copies:
            mine.copy_(t)
    plan.forward(layer, q, k, v, idx_q, idx_k, idx_v, o=o, idx_o=idx_o, lse=lse, topk=topk,
                 write_cache=write_cache)
    for mine, t in copies:
        t.copy_(mine)


_warned = []


def _warn_copies():
    if not _warned:
        _warned.append(True)
        warnings.warn(
            "msa::forward received copies of the cache planes (the compiled graph does not "
            "write them in place, e.g. torch.compile backends other than inductor): every call "
            "copies whole planes twice.  Results are right, but slow.", RuntimeWarning,
            stacklevel=3)


@_forward_op.register_fake
def _forward_fake(plan_id, layer, q, k, v, idx_q, idx_k, idx_v, o, idx_o, lse, topk, k_cache,
                  v_cache, index_k_cache, index_v_cache, write_cache):
    # Every output is written in place: nothing to allocate, nothing to return.
    return None


def forward(plan, layer, q, k=None, v=None, idx_q=None, idx_k=None, idx_v=None, *, o=None,
            idx_o=None, lse=None, topk=None, write_cache=True):
    """Plan.forward through torch.ops.msa.forward: one layer of the plan's
    current step on torch tensors (the shapes and checks of Plan.forward).
    o is allocated like q ([T][Hq][D]) when not given; idx_o must be given
    for a layer that keeps an index value.  Returns o.  The step
    (plan.update) is set outside compiled code and outside CUDA graph
    capture."""
    info = plan._torch_op
    if info is None:
        info = prepare(plan)
    if not 0 <= layer < len(info.layer_flags):
        raise ValueError("layer %d out of range 0..%d" % (layer, len(info.layer_flags) - 1))
    if info.layer_flags[layer][1] and idx_o is None:
        raise ValueError("idx_o is required for index-value layers (layer %d)" % layer)
    if o is None:
        o = q.new_empty((q.shape[0], info.num_q_heads, info.head_dim))
    planes = info.planes[layer]
    torch.ops.msa.forward(info.op_id, layer, q, k, v, idx_q, idx_k, idx_v, o, idx_o, lse, topk,
                          planes[0], planes[1], planes[2], planes[3], bool(write_cache))
    return o
