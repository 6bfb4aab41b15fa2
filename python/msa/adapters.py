"""The step of an inference engine's attention metadata, as msa takes it.

Pure bookkeeping, no attention: each function turns one engine's per-step
tables into a Step (q_len, kv_len, page_table, num_tokens), which Plan.update
takes as plan.update(*step), and checks what msa relies on, with a
ValueError that names the first entry that breaks it.

- step_from_block_table: vLLM's metadata, a block table [num_reqs][max_blocks]
  of physical block ids, the sequence lengths (tokens in the cache after the
  step) and query_start_loc (cumulative new tokens, num_reqs + 1 entries).
- step_from_req_to_token: SGLang's req_to_token table [pool_rows][max_context]
  of token slots, the requests' rows in it, their sequence lengths and their
  new-token counts.  The slots of a page must be consecutive and page-aligned
  (slot = page * P + offset), which SGLang's paged allocator guarantees and
  its page-size-1 allocator does only when msa's page size is 1.

The cache itself: msa attends over the engine's own cache tensors in place.
wrap_vllm_cache wraps vLLM's per-layer [pages, 2, P, Hkv, D] caches (K and V
interleaved per page, token-major; head_major=True for [pages, 2, Hkv, P,
D]), wrap_sglang_cache SGLang's per-layer [tokens, Hkv, D] pools, and
wrap_cache any tensors in the layouts "msa", "nhd" or "tokens": each builds
an msa.Cache over the engine's memory through msa_cache_wrap_strided (the
strides are the tensors' own), so forward's cache writes land in the
engine's tensors and the attention reads them there, with no copy.  An
engine whose cache is in none of these layouts can still copy into msa's
planes: copy_into_cache() does that copy, for every page or for the pages
a step wrote.

Every function takes NumPy arrays, sequences or torch tensors (CPU or CUDA;
metadata is copied to the host, once per step, outside CUDA graph capture).
"""

import collections

import numpy as np

from . import _core

__all__ = ["Step", "copy_into_cache", "step_from_block_table", "step_from_req_to_token",
           "wrap_cache", "wrap_sglang_cache", "wrap_vllm_cache", "written_pages"]

Step = collections.namedtuple("Step", "q_len kv_len page_table num_tokens")
Step.__doc__ = """One step for Plan.update: int32 q_len [R], kv_len [R],
page_table [R][pages] (C order), and the token rows num_tokens."""


def _ints(name, x, ndim):
    a = np.asarray(_core._host(name, x))
    if a.ndim != ndim or (a.size and a.dtype.kind not in "iu"):
        raise ValueError("%s must be a %d-D array of integers, not %s of %s" % (
            name, ndim, "x".join(str(n) for n in a.shape) or "a scalar", a.dtype))
    a = a.astype(np.int64)
    if a.size and (a.min() < -(2**31) or a.max() >= 2**31):
        raise ValueError("%s has values outside int32" % name)
    return a


def _num_tokens(num_tokens, total):
    if num_tokens is None:
        return total
    n = _core._int_arg(num_tokens, "num_tokens")
    if n < total:
        raise ValueError("num_tokens %d is fewer than the step's %d new tokens" % (n, total))
    return n


def _check_lengths(q_len, kv_len):
    for r, (q, k) in enumerate(zip(q_len, kv_len)):
        if q < 0 or k < q:
            raise ValueError("request %d: %d new tokens and %d tokens in the cache after the "
                             "step (need 0 <= new <= cached)" % (r, q, k))


def step_from_block_table(block_table, seq_lens, query_start_loc, page_size, num_tokens=None,
                          engine_block_size=None):
    """A Step from vLLM-style metadata.

    block_table [R][max_blocks] holds each request's physical block ids,
    seq_lens [R] its tokens after the step (computed + new), and
    query_start_loc [R+1] the first row of each request's new tokens
    (query_start_loc[0] = 0, non-decreasing).  page_size is the msa cache's
    page size P; the engine's block size (engine_block_size, default P) must
    be P or a multiple m * P, engine block b then being msa pages
    b*m .. b*m + m - 1 (an msa cache of num_blocks * m pages).  num_tokens
    (default query_start_loc[R]) counts the rows of the token tensors,
    padding included.  Only the blocks a request uses are read and checked
    (non-negative); the rest of a row may hold anything."""
    bt = _ints("block_table", block_table, 2)
    seq = _ints("seq_lens", seq_lens, 1)
    qsl = _ints("query_start_loc", query_start_loc, 1)
    r = seq.shape[0]
    if bt.shape[0] != r:
        raise ValueError("block_table has %d rows for %d requests (seq_lens)" % (bt.shape[0], r))
    if qsl.shape[0] != r + 1:
        raise ValueError("query_start_loc has %d entries; %d requests need %d" % (
            qsl.shape[0], r, r + 1))
    if qsl[0] != 0 or (r and (np.diff(qsl) < 0).any()):
        raise ValueError("query_start_loc must start at 0 and never decrease")
    p = _core._int_arg(page_size, "page_size")
    bs = p if engine_block_size is None else _core._int_arg(engine_block_size,
                                                           "engine_block_size")
    if p < 1 or bs < 1 or bs % p:
        raise ValueError("the engine's block size %d is not a multiple of the cache's page "
                         "size %d" % (bs, p))
    m = bs // p
    q_len = np.diff(qsl)
    _check_lengths(q_len, seq)
    need = (seq + bs - 1) // bs  # blocks each request uses
    if r and need.max(initial=0) > bt.shape[1]:
        i = int(np.argmax(need))
        raise ValueError("request %d needs %d blocks for %d tokens; block_table has %d columns" % (
            i, need[i], seq[i], bt.shape[1]))
    width = max(int(((seq + p - 1) // p).max(initial=0)), 1)
    pt = np.full((max(r, 1), width), -1, dtype=np.int64)
    for i in range(r):
        blocks = bt[i, : need[i]]
        if blocks.size and blocks.min() < 0:
            j = int(np.argmax(blocks < 0))
            raise ValueError("request %d: block %d (positions %d..%d) is %d" % (
                i, j, j * bs, (j + 1) * bs - 1, blocks[j]))
        pages = (blocks[:, None] * m + np.arange(m)[None, :]).reshape(-1)
        npages = (seq[i] + p - 1) // p
        pt[i, :npages] = pages[:npages]
    if pt.size and pt.max() >= 2**31:
        raise ValueError("page ids (block id * %d) exceed int32" % m)
    return Step(q_len.astype(np.int32), seq.astype(np.int32),
                np.ascontiguousarray(pt[:r] if r else pt[:0], dtype=np.int32),
                _num_tokens(num_tokens, int(qsl[-1])))


def step_from_req_to_token(req_to_token, req_pool_indices, seq_lens, page_size, q_lens=None,
                           num_tokens=None, check_all=True):
    """A Step from SGLang-style metadata.

    req_to_token [pool_rows][max_context] maps (request row, position) to a
    token slot of the KV pool; req_pool_indices [R] gives each request's
    row, seq_lens [R] its tokens after the step, q_lens [R] its new tokens
    (SGLang's extend_seq_lens; default 1 each, a decode step).  page_size is
    the msa cache's page size P: slot s lies in page s // P at offset s % P,
    so logical page n of a request is physical page req_to_token[row][n*P]
    // P, and every position n*P + i (i < P) of it must map to slot
    page * P + i.  check_all (default) checks that for every position in
    use; False checks only the first slot of each page (cheaper, for tables
    an allocator of pages of P tokens built)."""
    r2t = _ints("req_to_token", req_to_token, 2)
    rows = _ints("req_pool_indices", req_pool_indices, 1)
    seq = _ints("seq_lens", seq_lens, 1)
    r = rows.shape[0]
    if seq.shape[0] != r:
        raise ValueError("seq_lens has %d entries for %d requests" % (seq.shape[0], r))
    q_len = np.ones(r, dtype=np.int64) if q_lens is None else _ints("q_lens", q_lens, 1)
    if q_len.shape[0] != r:
        raise ValueError("q_lens has %d entries for %d requests" % (q_len.shape[0], r))
    p = _core._int_arg(page_size, "page_size")
    if p < 1:
        raise ValueError("page_size must be positive, not %d" % p)
    _check_lengths(q_len, seq)
    if r and (rows.min() < 0 or rows.max() >= r2t.shape[0]):
        i = int(np.argmax((rows < 0) | (rows >= r2t.shape[0])))
        raise ValueError("request %d: req_pool_indices %d is outside req_to_token's %d rows" % (
            i, rows[i], r2t.shape[0]))
    if r and seq.max(initial=0) > r2t.shape[1]:
        i = int(np.argmax(seq))
        raise ValueError("request %d has %d tokens; req_to_token has %d columns" % (
            i, seq[i], r2t.shape[1]))
    npages = (seq + p - 1) // p
    width = max(int(npages.max(initial=0)), 1)
    pt = np.full((max(r, 1), width), -1, dtype=np.int64)
    for i in range(r):
        slots = r2t[rows[i], : seq[i]]
        if slots.size and slots.min() < 0:
            j = int(np.argmax(slots < 0))
            raise ValueError("request %d: position %d maps to slot %d" % (i, j, slots[j]))
        first = slots[::p]
        if (first % p).any():
            n = int(np.argmax(first % p != 0))
            raise ValueError(
                "req_to_token is not page-aligned for page size %d: request %d position %d "
                "(the start of page %d) maps to slot %d, not a multiple of %d" % (
                    p, i, n * p, n, first[n], p))
        pages = first // p
        if check_all and slots.size:
            n = slots.size
            want = pages.repeat(p)[:n] * p + np.tile(np.arange(p), pages.size)[:n]
            if (slots != want).any():
                j = int(np.argmax(slots != want))
                raise ValueError(
                    "req_to_token is not page-aligned for page size %d: request %d position %d "
                    "maps to slot %d, but its page starts at slot %d, so it must be slot %d" % (
                        p, i, j, slots[j], pages[j // p] * p, want[j]))
        pt[i, : pages.size] = pages
    return Step(q_len.astype(np.int32), seq.astype(np.int32),
                np.ascontiguousarray(pt[:r] if r else pt[:0], dtype=np.int32),
                _num_tokens(num_tokens, int(q_len.sum())))


def written_pages(step, page_size):
    """The physical pages a step writes (those holding each request's new
    positions [kv_len - q_len, kv_len)), ascending: the pages to copy after
    an engine's own kernels wrote them."""
    out = set()
    for r, (q, k) in enumerate(zip(step.q_len, step.kv_len)):
        if q:
            first, last = (int(k) - int(q)) // page_size, (int(k) - 1) // page_size
            out.update(int(x) for x in step.page_table[r, first : last + 1])
    return sorted(out)


# ---- an engine's cache, wrapped in place ------------------------------------------


def _address_and_strides(name, x):
    """Address, element strides and element type of an array or tensor."""
    torch = _core._torch()
    if torch is not None and isinstance(x, torch.Tensor):
        kind = _core._TORCH_KINDS.get(str(x.dtype).replace("torch.", ""), str(x.dtype))
        return x.data_ptr(), tuple(x.stride()), kind, x.dim()
    if isinstance(x, np.ndarray):
        size = x.dtype.itemsize
        if any(s % size for s in x.strides) or any(s < 0 for s in x.strides):
            raise ValueError("%s has strides %s, not whole non-negative elements" % (name,
                                                                                    x.strides))
        return x.ctypes.data, tuple(s // size for s in x.strides), _core._np_kind(x.dtype), x.ndim
    raise ValueError("%s must be a NumPy array or a torch.Tensor, not %s" % (name,
                                                                            type(x).__name__))


def _plane_view(name, x, kind, layout, page_size, dims):
    """(address, page, head, token strides), pages and element type of one
    plane held by x in `layout` ("msa", "nhd", "tokens"); dims: the row
    shape (Hkv, D) of K and V, (Di,) of index planes."""
    address, st, dt, ndim = _address_and_strides(name, x)
    kv = kind in ("k", "v")
    shape = tuple(x.shape)
    if layout == "tokens":
        want = (None,) + dims
    elif kv:
        want = (None, dims[0], page_size, dims[1]) if layout == "msa" else (
            None, page_size, dims[0], dims[1])
    else:
        want = (None, page_size, dims[0])
    if ndim != len(want) or any(w is not None and w != n for w, n in zip(want, shape)):
        raise ValueError("%s must have shape [pages or slots]%s in layout %r, not %s" % (
            name, "".join("[%d]" % d for d in want[1:]), layout, list(shape)))
    if st[-1] != 1:
        raise ValueError("%s: the elements of a row must be consecutive (last stride %d)" % (
            name, st[-1]))
    if layout == "tokens":
        pages = shape[0] // page_size
        page, token = st[0] * page_size, st[0]
        head = st[1] if kv else 0
    elif kv and layout == "msa":
        pages, page, head, token = shape[0], st[0], st[1], st[2]
    elif kv:
        pages, page, token, head = shape[0], st[0], st[1], st[2]
    else:
        pages, page, head, token = shape[0], st[0], 0, st[1]
    return (address, page, head, token), pages, dt


def wrap_cache(ctx, model, planes, layout, page_size):
    """An msa.Cache over an engine's tensors, read and written in place
    (msa_cache_wrap_strided).  planes maps (layer, kind) to a tensor or
    array for every plane the model's layers have ("k" and "v" of every
    layer, "index_k" of sparse layers, "index_v" of index-value layers).
    layout: "msa" [pages][Hkv][P][D], "nhd" [pages][P][Hkv][D] or "tokens"
    [slots][Hkv][D] (slot = page * P + offset), index planes [pages][P][Di]
    or [slots][Di]; any strides of the leading dimensions (such as K and V
    views of one interleaved tensor), the last one 1.  The pool has the
    fewest pages any plane holds; every plane of a kind holds one element
    type.  The cache keeps the tensors alive; with the CUDA backend they are
    device tensors, with the CPU backend host ones."""
    if layout not in _LAYOUTS:
        raise ValueError("layout must be one of %s, not %r" % (", ".join(sorted(_LAYOUTS)),
                                                              layout))
    p = _core._int_arg(page_size, "page_size")
    mc = model.config
    views, pages, dtypes = {}, [], {}
    for (layer, kind), x in planes.items():
        kv = kind in ("k", "v")
        dims = (mc.num_kv_heads, mc.head_dim) if kv else (mc.index_dim,)
        name = "plane %s of layer %d" % (kind, layer)
        view, n, dt = _plane_view(name, x, kind, layout, p, dims)
        group = "kv" if kv else "index"
        if dtypes.setdefault(group, dt) != dt:
            raise ValueError("%s holds %s; other %s planes hold %s" % (name, dt, group,
                                                                        dtypes[group]))
        views[(layer, kind)] = view
        pages.append(n)
    if not pages or min(pages) < 1:
        raise ValueError("the planes hold no whole page of %d tokens" % p)
    return _core.Cache.wrap(ctx, model, views, min(pages), p, kv_dtype=dtypes["kv"],
                            index_dtype=dtypes.get("index", dtypes["kv"]),
                            keep=list(planes.values()))


def wrap_vllm_cache(ctx, model, kv_caches, index_caches=None, head_major=False):
    """An msa.Cache over vLLM-style caches, in place: kv_caches[l] is layer
    l's [pages][2][P][Hkv][D] tensor (K then V in each page, token-major;
    head_major=True: [pages][2][Hkv][P][D]); index_caches[l] (sparse layers,
    None for dense ones) is [pages][2][P][Di] (index K, then index V for
    index-value layers) or [pages][P][Di] (index K alone)."""
    mc = model.config
    if len(kv_caches) != mc.num_layers:
        raise ValueError("kv_caches has %d layers; the model %d" % (len(kv_caches),
                                                                   mc.num_layers))
    first = kv_caches[0]
    if first.ndim != 5 or first.shape[1] != 2:
        raise ValueError("kv_caches[0] must be [pages][2][...] (5-D), not %s" % list(first.shape))
    P = first.shape[3] if head_major else first.shape[2]
    planes = {}
    for layer, kvc in enumerate(kv_caches):
        planes[(layer, "k")] = kvc[:, 0]
        planes[(layer, "v")] = kvc[:, 1]
        ic = index_caches[layer] if index_caches is not None else None
        if model.layer_is_sparse(layer):
            if ic is None:
                raise ValueError("layer %d is sparse: index_caches[%d] is required" % (layer,
                                                                                      layer))
            pair = ic.ndim == 4
            planes[(layer, "index_k")] = ic[:, 0] if pair else ic
            if model.layer_has_index_value(layer):
                if not pair:
                    raise ValueError("layer %d keeps an index value: index_caches[%d] must be "
                                     "[pages][2][P][Di]" % (layer, layer))
                planes[(layer, "index_v")] = ic[:, 1]
    return wrap_cache(ctx, model, planes, "msa" if head_major else "nhd", P)


def wrap_sglang_cache(ctx, model, k_buffers, v_buffers, index_k_buffers=None,
                      index_v_buffers=None, page_size=1):
    """An msa.Cache over SGLang-style token pools, in place: k_buffers[l],
    v_buffers[l] are layer l's [slots][Hkv][D] pools, index_k_buffers[l]
    (sparse layers) and index_v_buffers[l] (index-value layers) [slots][Di];
    slot = page * page_size + offset, so page_size 1 serves SGLang's
    token-by-token allocator and a larger one its paged allocator
    (step_from_req_to_token checks the tables)."""
    mc = model.config
    planes = {}
    for layer in range(mc.num_layers):
        planes[(layer, "k")] = k_buffers[layer]
        planes[(layer, "v")] = v_buffers[layer]
        for kind, bufs, needed in (("index_k", index_k_buffers, model.layer_is_sparse(layer)),
                                   ("index_v", index_v_buffers,
                                    model.layer_has_index_value(layer))):
            if not needed:
                continue
            if bufs is None or bufs[layer] is None:
                raise ValueError("layer %d needs its %s pool" % (layer, kind))
            planes[(layer, kind)] = bufs[layer]
    return wrap_cache(ctx, model, planes, "tokens", page_size)


# ---- the copy: an engine's cache layout into msa's planes --------------------------

_LAYOUTS = {
    # name: (what it is, dims of one K or V tensor)
    "msa": "[pages][Hkv][P][D], msa's own (FlashInfer's HND)",
    "nhd": "[pages][P][Hkv][D] (vLLM's flash-attention K or V: kv_cache[0] / kv_cache[1])",
    "tokens": "[slots][Hkv][D], slot = page * P + offset (SGLang's k_buffer / v_buffer)",
}


def copy_into_cache(cache, layer, kind, src, layout, pages=None):
    """Copies an engine's K, V, index K or index V tensor of one layer into
    plane `kind` ("k", "v", "index_k", "index_v") of the msa cache.

    layout of src for "k" / "v": "msa" [pages][Hkv][P][D], "nhd"
    [pages][P][Hkv][D] (vLLM flash-attention's kv_cache[0] and [1]), or
    "tokens" [slots][Hkv][D] with slot = page * P + offset (SGLang's
    per-layer k_buffer / v_buffer, num_pages * P slots or more).  For
    "index_k" / "index_v", whose planes are [pages][P][Di], "msa" and "nhd"
    are [pages][P][Di] and "tokens" [slots][Di].  src holds the plane's
    element type (bf16 as torch.bfloat16 or NumPy uint16).  pages (default
    all) names the physical pages to copy, e.g. written_pages(step, P).

    A torch src (CPU or the cache's GPU) is copied with torch, on torch's
    current stream, straight into the plane (Cache.tensor); a NumPy src
    through Cache.read_plane / write_plane (every page goes through the
    host).  Nothing is written when a check fails."""
    if layout not in _LAYOUTS:
        raise ValueError("layout must be one of %s, not %r" % (", ".join(sorted(_LAYOUTS)),
                                                              layout))
    plane = cache.plane(layer, kind)
    if plane.dtype not in ("fp32", "bf16", "fp16"):
        raise ValueError("plane %s of layer %d holds %s: only fp32, bf16 and fp16 planes are "
                         "copied (a quantized engine cache has its own scales)" % (
                             kind, layer, plane.dtype))
    num_pages = plane.shape[0]
    P = cache.config["page_size"]
    torch = _core._torch()
    is_torch = torch is not None and isinstance(src, torch.Tensor)
    if not is_torch and not isinstance(src, np.ndarray):
        raise ValueError("src must be a NumPy array or a torch.Tensor, not %s" % type(src).__name__)
    kv = kind in ("k", "v")
    inner = plane.shape[1:]  # (Hkv, P, D) or (P, Di)
    shape = tuple(src.shape)
    if layout == "tokens":
        per_token = (inner[0], inner[2]) if kv else (inner[1],)
        ok = len(shape) == 1 + len(per_token) and shape[1:] == per_token and \
            shape[0] >= num_pages * P
        want = "[>= %d][%s]" % (num_pages * P, "][".join(str(d) for d in per_token))
    else:
        body = inner if (layout == "msa" or not kv) else (inner[1], inner[0], inner[2])
        ok = len(shape) == 1 + len(body) and shape[1:] == body and shape[0] == num_pages
        want = "[%d][%s]" % (num_pages, "][".join(str(d) for d in body))
    if not ok:
        raise ValueError("src of layout %r must have shape %s for plane %s of layer %d, not %s" % (
            layout, want, kind, layer, list(shape)))
    if pages is None:
        idx = np.arange(num_pages)
    else:
        idx = np.asarray(_core._host("pages", pages)).reshape(-1)
        if idx.size and (idx.dtype.kind not in "iu" or idx.min() < 0 or idx.max() >= num_pages):
            raise ValueError("pages must be page ids in 0..%d" % (num_pages - 1))
        idx = idx.astype(np.int64)

    def as_msa(x):
        """x (indexed by the selected pages first) in msa's layout."""
        if layout == "tokens":
            x = x.reshape((num_pages, P) + tuple(x.shape[1:])) if x.shape[0] == num_pages * P \
                else x
            if kv:
                return x.permute(0, 2, 1, 3) if is_torch else x.transpose(0, 2, 1, 3)
            return x
        if layout == "nhd" and kv:
            return x.permute(0, 2, 1, 3) if is_torch else x.transpose(0, 2, 1, 3)
        return x

    if is_torch:
        dst = cache.tensor(layer, kind)
        if src.dtype != dst.dtype:
            raise ValueError("plane %s of layer %d holds %s; src holds %s" % (kind, layer,
                                                                              dst.dtype, src.dtype))
        if src.device != dst.device:
            raise ValueError("src is on %s; the cache is on %s" % (src.device, dst.device))
        s = src[: num_pages * P] if layout == "tokens" else src
        s = as_msa(s)
        if pages is None:
            dst.copy_(s)
        elif idx.size:
            ti = torch.as_tensor(idx, device=dst.device)
            dst.index_copy_(0, ti, s.index_select(0, ti))
        return
    if _core._np_kind(src.dtype) != plane.dtype:
        raise ValueError("plane %s of layer %d holds %s; src holds %s" % (kind, layer, plane.dtype,
                                                                          src.dtype))
    full = cache.read_plane(layer, kind)  # the plane's shape; bf16 as uint16
    s = src[: num_pages * P] if layout == "tokens" else src
    s = as_msa(s)
    full[idx] = s[idx].view(full.dtype)
    cache.write_plane(layer, kind, full)
