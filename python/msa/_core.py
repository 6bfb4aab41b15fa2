"""The objects of the package: one Python object per C object of msa.h.

Each object owns one C handle.  Handles form a chain, context -> model ->
cache -> plan, and a handle frees the handles below it before itself, so
the C objects are always freed in the order the library requires (plans,
then caches, then models, then contexts), whether a program calls close(),
leaves a with block, or drops its last reference and the garbage collector
finalizes the objects.  Every object also keeps a reference to the objects
it was made from, so a parent stays alive while a child is in use.
"""

import collections
import ctypes
import dataclasses
import itertools
import os
import sys
import weakref

import numpy as np

from . import _ffi

# ---- errors and small functions ---------------------------------------------


class Error(Exception):
    """A call into libmsa failed.  `status` is the msa_status value,
    `status_name` its name ("MSA_ERR_INVALID_ARGUMENT", ...) and `message`
    the library's message (msa_context_last_error)."""

    def __init__(self, status, message):
        self.status = int(status)
        self.status_name = _ffi.STATUS_NAMES.get(self.status, "MSA_ERR_UNKNOWN")
        self.message = message
        super().__init__("%s: %s" % (self.status_name, message))


def version():
    """The linked library's version string, e.g. "0.2.0"."""
    return _ffi.lib().msa_version_string().decode()


def library_path():
    """The path of the shared library the package loaded."""
    return _ffi.lib()._msa_path


def backend_available(name):
    """True when the backend ("cpu" or "cuda") is compiled into the library
    (CUDA: and a device exists)."""
    return bool(_ffi.lib().msa_backend_available(_enum(_ffi.BACKENDS, name, "backend")))


def _enum(table, value, what):
    if isinstance(value, str) and value in table:
        return table[value]
    raise ValueError("%s must be one of %s, not %r" % (what, ", ".join(sorted(table)), value))


def _name_of(table, value):
    for name, v in table.items():
        if v == value:
            return name
    return str(value)


class _Handle:
    """One C object: its pointer, the function that frees it, and the
    handles made from it (weakly: the finalizers of their objects hold
    them).  release() frees the handles below first, then this one, once."""

    __slots__ = ("ptr", "free_name", "parent", "children", "__weakref__")

    def __init__(self, ptr, free_name, parent):
        self.ptr = ptr
        self.free_name = free_name
        self.parent = parent
        self.children = weakref.WeakSet()
        if parent is not None:
            parent.children.add(self)

    def release(self):
        if self.ptr is None:
            return
        for child in list(self.children):
            child.release()
        ptr, self.ptr = self.ptr, None
        getattr(_ffi.lib(), self.free_name)(ptr)
        if self.parent is not None:
            self.parent.children.discard(self)
            self.parent = None


class _Owned:
    """Base of the objects that own a handle: close(), with blocks and a
    finalizer that releases the handle when the object is collected."""

    _handle = None

    def _own(self, ptr, free_name, parent):
        self._handle = _Handle(ptr, free_name, parent)
        self._finalizer = weakref.finalize(self, self._handle.release)

    @property
    def _ptr(self):
        h = self._handle
        if h is None or h.ptr is None:
            raise ValueError("%s is closed" % type(self).__name__)
        return h.ptr

    @property
    def closed(self):
        return self._handle is None or self._handle.ptr is None

    def close(self):
        """Frees the C object now (and the objects made from it, first).
        Calling it again does nothing."""
        if self._handle is not None:
            self._finalizer()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


# ---- context -------------------------------------------------------------------


class Context(_Owned):
    """msa_context: the backend ("cpu" or "cuda"), its threads (CPU) or its
    device (CUDA), and the last error message."""

    def __init__(self, backend="cpu", num_threads=0, device=0):
        lib = _ffi.lib()
        params = _ffi.ContextParams()
        lib.msa_context_params_default(ctypes.byref(params))
        params.backend = _enum(_ffi.BACKENDS, backend, "backend")
        params.num_threads = _int_arg(num_threads, "num_threads")
        params.device = _int_arg(device, "device")
        out = ctypes.c_void_p()
        buf = ctypes.create_string_buffer(512)
        st = lib.msa_context_create(ctypes.byref(params), ctypes.byref(out), buf, len(buf))
        if st != _ffi.OK:
            raise Error(st, buf.value.decode(errors="replace"))
        self.device = params.device
        self._own(out.value, "msa_context_free", None)

    def _check(self, status):
        if status != _ffi.OK:
            raise Error(status, self.last_error)

    @property
    def last_error(self):
        """Message of the last failed call on this context ("" when none)."""
        return _ffi.lib().msa_context_last_error(self._ptr).decode(errors="replace")

    @property
    def backend(self):
        return _name_of(_ffi.BACKENDS, _ffi.lib().msa_context_backend(self._ptr))

    @property
    def num_threads(self):
        return _ffi.lib().msa_context_num_threads(self._ptr)

    def synchronize(self):
        """Waits for the work the context enqueued (nothing to wait for on
        the CPU)."""
        self._check(_ffi.lib().msa_synchronize(self._ptr))


def _int_arg(value, what):
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ValueError("%s must be an integer, not %r" % (what, value))
    return int(value)


# ---- model ------------------------------------------------------------------------


@dataclasses.dataclass
class ModelConfig:
    """The fields of msa_model_config.  `score_type` is "max" or "lse";
    `layer_sparse` / `layer_index_value` are None or one 0/1 per layer
    (None: every layer sparse / no layer keeps an index value); a scale of
    0 means the default (head_dim^-1/2, index_dim^-1/2)."""

    num_layers: int = 1
    num_q_heads: int = 64
    num_kv_heads: int = 4
    head_dim: int = 128
    num_index_heads: int = 4
    index_dim: int = 128
    block_size: int = 128
    topk_blocks: int = 16
    init_blocks: int = 0
    local_blocks: int = 1
    score_type: str = "max"
    layer_sparse: list = None
    layer_index_value: list = None
    softmax_scale: float = 0.0
    index_softmax_scale: float = 0.0

    _INT_FIELDS = (
        "num_layers", "num_q_heads", "num_kv_heads", "head_dim", "num_index_heads",
        "index_dim", "block_size", "topk_blocks", "init_blocks", "local_blocks",
    )

    @classmethod
    def default(cls):
        """The M3 shape with one sparse layer (msa_model_config_default)."""
        c = _ffi.ModelConfig()
        _ffi.lib().msa_model_config_default(ctypes.byref(c))
        return cls._from_c(c)

    @classmethod
    def from_json(cls, path):
        """Reads a Hugging Face config.json the way the library does
        (msa_model_load_config_file) and returns the resolved config."""
        with Context("cpu", num_threads=1) as ctx:
            with Model.from_json(ctx, path) as model:
                return model.config

    @classmethod
    def _from_c(cls, c):
        kw = {f: int(getattr(c, f)) for f in cls._INT_FIELDS}
        n = max(kw["num_layers"], 0)
        kw["score_type"] = _name_of(_ffi.SCORE_TYPES, c.score_type)
        kw["layer_sparse"] = [int(c.layer_sparse[i]) for i in range(n)] if c.layer_sparse else None
        kw["layer_index_value"] = (
            [int(c.layer_index_value[i]) for i in range(n)] if c.layer_index_value else None
        )
        kw["softmax_scale"] = float(c.softmax_scale)
        kw["index_softmax_scale"] = float(c.index_softmax_scale)
        return cls(**kw)

    def _to_c(self):
        """The C struct and the arrays it points to (keep both alive)."""
        c = _ffi.ModelConfig()
        for f in self._INT_FIELDS:
            v = _int_arg(getattr(self, f), f)
            if not -(2**31) <= v < 2**31:
                raise ValueError("%s = %d does not fit in int32" % (f, v))
            setattr(c, f, v)
        c.score_type = _enum(_ffi.SCORE_TYPES, self.score_type, "score_type")
        keep = []
        for f in ("layer_sparse", "layer_index_value"):
            flags = getattr(self, f)
            if flags is None:
                continue
            flags = list(flags)
            # The library reads num_layers entries: a list of another length
            # would make it read past the array.
            if len(flags) != self.num_layers:
                raise ValueError(
                    "%s has %d entries, num_layers is %d" % (f, len(flags), self.num_layers)
                )
            if any(x not in (0, 1) for x in flags):
                raise ValueError("%s entries must be 0 or 1" % f)
            arr = (ctypes.c_uint8 * max(len(flags), 1))(*flags)
            keep.append(arr)
            setattr(c, f, ctypes.cast(arr, ctypes.POINTER(ctypes.c_uint8)))
        c.softmax_scale = float(self.softmax_scale)
        c.index_softmax_scale = float(self.index_softmax_scale)
        return c, keep

    def for_rank(self, rank, size, ctx=None):
        """The config of tensor-parallel rank `rank` of `size` ranks and
        where its heads lie (msa_model_config_for_rank): returns
        (ModelConfig, TpShard).  The rank holds query heads
        [shard.q_head_begin, + num_q_heads) of this config, and its KV and
        index heads likewise; every other field is this config's.  A split
        the library refuses (a head count that `size` does not divide, a
        rank outside [0, size)) raises msa.Error with the library's
        message.  `ctx` (optional) is the context whose last_error gets
        that message; without one a short-lived CPU context is used."""
        rank = _int_arg(rank, "rank")
        size = _int_arg(size, "size")
        for what, v in (("rank", rank), ("size", size)):
            if not -(2**31) <= v < 2**31:
                raise ValueError("%s = %d does not fit in int32" % (what, v))
        if ctx is not None and not isinstance(ctx, Context):
            raise ValueError("ctx must be an msa.Context or None")
        c, keep = self._to_c()
        out = _ffi.ModelConfig()
        shard = _ffi.TpShard()
        own = ctx is None
        if own:
            ctx = Context("cpu", num_threads=1)
        try:
            ctx._check(_ffi.lib().msa_model_config_for_rank(
                ctx._ptr, ctypes.byref(c), rank, size, ctypes.byref(out), ctypes.byref(shard)))
            # The output's layer arrays point into `keep`: read them now.
            config = ModelConfig._from_c(out)
        finally:
            if own:
                ctx.close()
        del keep
        return config, TpShard(*(int(getattr(shard, f)) for f in TpShard._fields))


TpShard = collections.namedtuple(
    "TpShard", "q_head_begin kv_head_begin index_head_begin kv_replicas index_replicas")
TpShard.__doc__ = """Where one tensor-parallel rank's heads lie among the full
model's (msa_tp_shard): the first query, KV and index head it holds, and on
how many ranks each of its KV heads and index heads is held (1: on this rank
only)."""


class Model(_Owned):
    """msa_model: the layer shapes and per-layer flags, made from a
    ModelConfig (None: the default M3 config)."""

    def __init__(self, ctx, config=None):
        if not isinstance(ctx, Context):
            raise ValueError("ctx must be an msa.Context")
        if config is None:
            config = ModelConfig.default()
        if not isinstance(config, ModelConfig):
            raise ValueError("config must be an msa.ModelConfig")
        c, keep = config._to_c()
        out = ctypes.c_void_p()
        ctx._check(_ffi.lib().msa_model_create(ctx._ptr, ctypes.byref(c), ctypes.byref(out)))
        del keep  # the model copied the layer arrays
        self._adopt(ctx, out.value)

    def _adopt(self, ctx, ptr):
        self.context = ctx
        self._own(ptr, "msa_model_free", ctx._handle)

    @classmethod
    def from_json(cls, ctx, path):
        """A model from a Hugging Face config.json (msa_model_load_config_file)."""
        if not isinstance(ctx, Context):
            raise ValueError("ctx must be an msa.Context")
        out = ctypes.c_void_p()
        ctx._check(
            _ffi.lib().msa_model_load_config_file(ctx._ptr, os.fsencode(path), ctypes.byref(out))
        )
        self = cls.__new__(cls)
        self._adopt(ctx, out.value)
        return self

    @property
    def config(self):
        """The model's config, scales resolved (a copy)."""
        c = _ffi.ModelConfig()
        _ffi.lib().msa_model_get_config(self._ptr, ctypes.byref(c))
        return ModelConfig._from_c(c)

    @property
    def num_layers(self):
        return self.config.num_layers

    def layer_is_sparse(self, layer):
        return bool(_ffi.lib().msa_model_layer_is_sparse(self._ptr, layer))

    def layer_has_index_value(self, layer):
        return bool(_ffi.lib().msa_model_layer_has_index_value(self._ptr, layer))

    @property
    def topk_width(self):
        """Width W of a row of selected block ids (K, or m*K for unions)."""
        return int(_ffi.lib().msa_model_topk_width(self._ptr))


# ---- cache --------------------------------------------------------------------------

Plane = collections.namedtuple("Plane", "address nbytes shape dtype")
Plane.__doc__ = """One cache plane: its address (a device address with the CUDA
backend), its size in bytes, its shape (layout of msa.h) and dtype name."""

_NUMPY_DTYPES = {"fp32": np.dtype(np.float32), "fp16": np.dtype(np.float16),
                 "bf16": np.dtype(np.uint16)}


class _DeviceBytes:
    """nbytes bytes of device memory at address, described by the CUDA array
    interface, through which torch wraps them without a copy."""

    def __init__(self, address, nbytes):
        self.__cuda_array_interface__ = {
            "shape": (nbytes,), "typestr": "|u1", "data": (address, False),
            "strides": None, "version": 3,
        }


class Cache(_Owned):
    """msa_cache: the library-allocated paged KV pool of a model (zero-filled).
    Planes per layer: "k", "v" [num_pages][Hkv][page_size][D], "index_k",
    "index_v" [num_pages][page_size][Di] (sparse layers / index-value layers)."""

    def __init__(self, ctx, model, num_pages, page_size=128, kv_dtype="bf16", index_dtype="bf16"):
        cc = Cache._config("Cache", ctx, model, num_pages, page_size, kv_dtype, index_dtype)
        lib = _ffi.lib()
        out = ctypes.c_void_p()
        ctx._check(lib.msa_cache_create(ctx._ptr, model._ptr, ctypes.byref(cc), ctypes.byref(out)))
        self.context = ctx
        self.model = model
        self._own(out.value, "msa_cache_free", model._handle)
        self._mc = model.config

    @staticmethod
    def _config(call, ctx, model, num_pages, page_size, kv_dtype, index_dtype):
        """The arguments both constructors share, checked, as an
        msa_cache_config (call names the constructor in messages)."""
        if not isinstance(ctx, Context) or not isinstance(model, Model):
            raise ValueError("%s(ctx, model, ...) takes an msa.Context and an msa.Model" % call)
        if model.context is not ctx:
            raise ValueError("the model belongs to another context")
        cc = _ffi.CacheConfig()
        _ffi.lib().msa_cache_config_default(ctypes.byref(cc))
        cc.num_pages = _int_arg(num_pages, "num_pages")
        cc.page_size = _int_arg(page_size, "page_size")
        cc.kv_dtype = _enum(_ffi.DTYPES, kv_dtype, "kv_dtype")
        cc.index_dtype = _enum(_ffi.DTYPES, index_dtype, "index_dtype")
        return cc

    @classmethod
    def wrap(cls, ctx, model, views, num_pages, page_size, kv_dtype="bf16", index_dtype="bf16",
             keep=None):
        """msa_cache_wrap_strided: a cache over an engine's own memory, read
        and written in place.  views maps (layer, kind) to (address,
        page_stride, head_stride, token_stride), strides in elements (every
        plane the model's layers have; msa.adapters.wrap_cache builds it
        from tensors).  keep: objects the cache keeps alive (the engine's
        tensors).  The library checks the strides (msa.Error otherwise)."""
        cc = Cache._config("Cache.wrap", ctx, model, num_pages, page_size, kv_dtype, index_dtype)
        lib = _ffi.lib()
        mc = model.config
        arr = (_ffi.PlaneView * (4 * mc.num_layers))()
        strides = {}
        for (layer, kind), view in views.items():
            layer = _int_arg(layer, "layer")
            if not 0 <= layer < mc.num_layers:
                raise ValueError("views name layer %d of a %d-layer model" % (layer,
                                                                              mc.num_layers))
            i = layer * 4 + _enum(_ffi.PLANES, kind, "plane kind")
            address, page, head, token = (int(x) for x in view)
            arr[i].data = address
            arr[i].page_stride, arr[i].head_stride, arr[i].token_stride = page, head, token
            strides[(layer, kind)] = (page, head, token)
        out = ctypes.c_void_p()
        ctx._check(lib.msa_cache_wrap_strided(ctx._ptr, model._ptr, ctypes.byref(cc), arr,
                                              ctypes.byref(out)))
        self = cls.__new__(cls)
        self.context = ctx
        self.model = model
        self._own(out.value, "msa_cache_free", model._handle)
        self._mc = mc
        self._strides = strides
        self._keep = keep
        return self

    def _strided(self, layer, kind):
        """The strides a wrapped plane was given; None in the library layout."""
        s = getattr(self, "_strides", {}).get((layer, kind))
        return None if s is None or s == (0, 0, 0) else s

    @property
    def config(self):
        """dict: num_pages, page_size, kv_dtype, index_dtype."""
        cc = _ffi.CacheConfig()
        _ffi.lib().msa_cache_get_config(self._ptr, ctypes.byref(cc))
        return {
            "num_pages": int(cc.num_pages),
            "page_size": int(cc.page_size),
            "kv_dtype": _name_of(_ffi.DTYPES, cc.kv_dtype),
            "index_dtype": _name_of(_ffi.DTYPES, cc.index_dtype),
        }

    def has_plane(self, layer, kind):
        k = _enum(_ffi.PLANES, kind, "plane kind")
        return _ffi.lib().msa_cache_plane_bytes(self._ptr, self._layer(layer), k) > 0

    def _layer(self, layer):
        layer = _int_arg(layer, "layer")
        if not 0 <= layer < self._mc.num_layers:
            raise ValueError("layer %d out of range 0..%d" % (layer, self._mc.num_layers - 1))
        return layer

    def plane(self, layer, kind):
        """Where plane `kind` ("k", "v", "index_k", "index_v") of `layer`
        lies: a Plane (address, nbytes, shape, dtype)."""
        k = _enum(_ffi.PLANES, kind, "plane kind")
        layer = self._layer(layer)
        lib = _ffi.lib()
        nbytes = lib.msa_cache_plane_bytes(self._ptr, layer, k)
        if nbytes == 0:
            raise ValueError("layer %d has no %s plane" % (layer, kind))
        cfg = self.config
        mc = self._mc
        if kind in ("k", "v"):
            shape = (cfg["num_pages"], mc.num_kv_heads, cfg["page_size"], mc.head_dim)
            dtype = cfg["kv_dtype"]
        else:
            shape = (cfg["num_pages"], cfg["page_size"], mc.index_dim)
            dtype = cfg["index_dtype"]
        return Plane(lib.msa_cache_plane_data(self._ptr, layer, k), int(nbytes), shape, dtype)

    def _library_layout(self, layer, kind, what):
        if self._strided(self._layer(layer), kind):
            raise ValueError("%s: plane %s of layer %d lies in an engine's layout (Cache.wrap); "
                             "read or write the engine's tensor instead" % (what, kind, layer))

    def _host_array(self, p):
        dt = _NUMPY_DTYPES.get(p.dtype)
        if dt is None or int(np.prod(p.shape)) * dt.itemsize != p.nbytes:
            return np.uint8, (p.nbytes,)
        return dt, p.shape

    def read_plane(self, layer, kind):
        """A NumPy copy of the plane (bf16 as uint16), through
        msa_copy_from_buffer, so it works for both backends."""
        p = self.plane(layer, kind)
        self._library_layout(layer, kind, "read_plane")
        dt, shape = self._host_array(p)
        out = np.empty(shape, dtype=dt)
        self.context._check(
            _ffi.lib().msa_copy_from_buffer(
                self.context._ptr, out.ctypes.data, p.address, p.nbytes
            )
        )
        return out

    def tensor(self, layer, kind):
        """The plane as a torch tensor over the cache's own memory (no copy):
        a CPU tensor on the CPU backend, a CUDA tensor of the context's
        device on the CUDA backend, of the plane's shape and element type
        (fp32, bf16, fp16 as themselves, fp8_e4m3 as torch.float8_e4m3fn,
        nvfp4 as its bytes, uint8 [nbytes]).  Writes through it change the
        cache.  The tensor does not keep the cache alive: it is valid while
        the cache is open.  The program must have imported torch.  The
        tensors are made once per plane and handed out again."""
        torch = _torch()
        if torch is None:
            raise ValueError("Cache.tensor needs torch: import torch first")
        self._ptr  # a closed cache raises here, before a memo is handed out
        memo = self.__dict__.setdefault("_tensors", {})
        key = (layer, kind)
        if key in memo:
            return memo[key]
        p = self.plane(layer, kind)
        dt = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16,
              "fp8_e4m3": getattr(torch, "float8_e4m3fn", None)}.get(p.dtype)
        if self.context.backend == "cuda":
            raw = torch.as_tensor(_DeviceBytes(p.address, p.nbytes),
                                  device="cuda:%d" % self.context.device)
        else:
            buf = (ctypes.c_uint8 * p.nbytes).from_address(p.address)
            raw = torch.frombuffer(buf, dtype=torch.uint8)
        itemsize = torch.empty((), dtype=dt).element_size() if dt is not None else 0
        st = self._strided(self._layer(layer), kind)
        if st is not None and dt is not None:
            # The plane's rows where the engine keeps them: a strided view
            # of the library layout's shape.
            page, head, token = st
            elems = raw.view(dt)
            if kind in ("k", "v"):
                t = elems.as_strided(p.shape, (page, head, token, 1))
            else:
                t = elems.as_strided(p.shape, (page, token, 1))
        elif dt is None or int(np.prod(p.shape)) * itemsize != p.nbytes:
            t = raw
        else:
            t = raw.view(dt).view(p.shape)
        memo[key] = t
        return t

    def write_plane(self, layer, kind, array):
        """Copies a NumPy array of the plane's shape and element type (bf16:
        uint16 or ml_dtypes.bfloat16) into the plane."""
        p = self.plane(layer, kind)
        self._library_layout(layer, kind, "write_plane")
        dt, shape = self._host_array(p)
        if not isinstance(array, np.ndarray):
            raise ValueError("write_plane takes a NumPy array")
        if array.dtype.itemsize != np.dtype(dt).itemsize or _np_kind(array.dtype) != (
            p.dtype if dt is not np.uint8 else "uint8"
        ):
            raise ValueError(
                "plane %s of layer %d holds %s; got an array of %s" % (kind, layer, p.dtype, array.dtype)
            )
        if tuple(array.shape) != tuple(shape):
            raise ValueError(
                "plane %s of layer %d has shape %s; got %s" % (kind, layer, tuple(shape), array.shape)
            )
        array = np.ascontiguousarray(array)
        self.context._check(
            _ffi.lib().msa_copy_to_buffer(
                self.context._ptr, p.address, array.ctypes.data, p.nbytes
            )
        )


# ---- tensors -----------------------------------------------------------------------


def _np_kind(dt):
    """The element type of a NumPy dtype as the library names it."""
    if dt == np.float32:
        return "fp32"
    if dt == np.float16:
        return "fp16"
    if dt == np.uint16 or (dt.name == "bfloat16" and dt.itemsize == 2):
        return "bf16"
    if dt == np.int32:
        return "int32"
    if dt == np.uint8:
        return "uint8"
    return str(dt)


_Tensor = collections.namedtuple("_Tensor", "ptr shape kind contiguous aligned writeable device")


def _torch():
    # Only a program that imported torch can hand over a tensor; the
    # package never imports it itself.
    return sys.modules.get("torch")


_TORCH_KINDS = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "int32": "int32"}


def _tensor(name, x):
    """What the library needs to know of an array or tensor."""
    if isinstance(x, np.ndarray):
        return _Tensor(x.ctypes.data, tuple(x.shape), _np_kind(x.dtype), x.flags.c_contiguous,
                       x.flags.aligned, x.flags.writeable, "cpu")
    torch = _torch()
    if torch is not None and isinstance(x, torch.Tensor):
        kind = _TORCH_KINDS.get(str(x.dtype).replace("torch.", ""), str(x.dtype))
        dev = x.device
        if dev.type == "cuda":
            dev = "cuda:%d" % (dev.index if dev.index is not None else 0)
        else:
            dev = dev.type if dev.index is None else "%s:%d" % (dev.type, dev.index)
        # Only strided tensors of the CPU or a GPU have an address the
        # library can use (a meta or sparse tensor has none): such a tensor
        # is reported by its device or layout, never dereferenced.
        if getattr(x, "layout", torch.strided) != torch.strided:
            raise ValueError("%s must be a strided (dense) tensor, not %s" % (name, x.layout))
        has_memory = dev == "cpu" or dev.startswith("cuda:")
        ptr = x.data_ptr() if has_memory else 0
        return _Tensor(ptr, tuple(x.shape), kind, x.is_contiguous(),
                       ptr % max(x.element_size(), 1) == 0, True, dev)
    raise ValueError("%s must be a NumPy array%s, not %s" % (
        name, " or a torch.Tensor" if torch is not None else "", type(x).__name__))


def _host(name, x):
    """x as something NumPy reads: a torch tensor (of any device) is copied
    to the host; other values are returned as they are."""
    torch = _torch()
    if torch is not None and isinstance(x, torch.Tensor):
        if x.is_floating_point() or x.is_complex() or x.dtype == torch.bool:
            raise ValueError("%s must hold integers, not %s" % (name, x.dtype))
        return x.detach().to("cpu").numpy()
    return x


def _shape_ok(shape, rows, dims):
    if tuple(shape) == (rows,) + tuple(dims):
        return True
    # [T][H][D] may also come as [T][H*D] (the engines' projections' layout).
    return len(dims) == 2 and tuple(shape) == (rows, dims[0] * dims[1])


def _describe(rows, dims):
    full = "(%s)" % ", ".join(str(d) for d in (rows,) + tuple(dims))
    if len(dims) == 2:
        full += " or (%d, %d)" % (rows, dims[0] * dims[1])
    return full


# ---- plan ----------------------------------------------------------------------------


_PLAN_IDS = itertools.count(1)


class Plan(_Owned):
    """msa_plan: one step's request metadata, serving every layer of the
    step.  act_dtype ("fp32", "bf16", "fp16") is the element type of the
    activations of every forward; limits of 0 let the plan grow."""

    _torch_op = None  # what msa.torch_ops.prepare() made for this plan

    def __init__(self, ctx, model, cache, act_dtype="bf16", max_requests=0, max_tokens=0,
                 max_kv_len=0, max_q_len=0):
        if not (isinstance(ctx, Context) and isinstance(model, Model) and isinstance(cache, Cache)):
            raise ValueError("Plan(ctx, model, cache, ...) takes an msa.Context, Model and Cache")
        if model.context is not ctx or cache.context is not ctx or cache.model is not model:
            raise ValueError("the model and the cache must be of this context and model")
        lib = _ffi.lib()
        pp = _ffi.PlanParams()
        lib.msa_plan_params_default(ctypes.byref(pp))
        pp.act_dtype = _enum({k: _ffi.DTYPES[k] for k in ("fp32", "bf16", "fp16")}, act_dtype,
                             "act_dtype")
        pp.max_requests = _int_arg(max_requests, "max_requests")
        pp.max_tokens = _int_arg(max_tokens, "max_tokens")
        pp.max_kv_len = _int_arg(max_kv_len, "max_kv_len")
        pp.max_q_len = _int_arg(max_q_len, "max_q_len")
        out = ctypes.c_void_p()
        ctx._check(lib.msa_plan_create(ctx._ptr, model._ptr, cache._ptr, ctypes.byref(pp),
                                       ctypes.byref(out)))
        self.context = ctx
        self.model = model
        self.cache = cache
        self.act_dtype = act_dtype
        self._mc = model.config
        self._topk_width = model.topk_width
        # Per layer (sparse, keeps an index value): plain values, so that
        # code traced by torch.compile reads them without calling the library.
        self._layer_flags = tuple(
            (model.layer_is_sparse(i), model.layer_has_index_value(i))
            for i in range(self._mc.num_layers))
        self._op_id = next(_PLAN_IDS)
        self.num_tokens = None  # rows of the current step; None before an update
        self._own(out.value, "msa_plan_free", cache._handle)

    def _stream(self, stream, tensors=None):
        """The cudaStream_t to pass: the one given, else torch's current
        stream of the context's device where torch is imported, has CUDA,
        and (for a forward) the tensors are torch CUDA tensors; else none
        (the library's default).  An update takes torch's stream too, so
        that the plan's upload is ordered before the forwards that follow."""
        if stream is None:
            torch = _torch()
            if (self.context.backend == "cuda" and torch is not None
                    and (tensors is None or any(t.device.startswith("cuda") for t in tensors))
                    and torch.cuda.is_available()):
                return torch.cuda.current_stream(self.context.device).cuda_stream
            return None
        if hasattr(stream, "cuda_stream"):
            return stream.cuda_stream
        return _int_arg(stream, "stream")

    def update(self, q_len, kv_len, page_table, num_tokens=None, stream=None):
        """Sets the step: per request q_len new tokens and kv_len tokens in
        the cache after the step, and page_table[r] its physical pages
        (a 2-D integer array, or a list of lists, ragged rows allowed).
        num_tokens (default sum(q_len)) is the rows of the token tensors.
        A rejected step raises msa.Error and leaves the previous one."""
        ql = _int_vector("q_len", _host("q_len", q_len))
        kl = _int_vector("kv_len", _host("kv_len", kv_len))
        r = len(ql)
        if len(kl) != r:
            raise ValueError("q_len has %d requests, kv_len %d" % (r, len(kl)))
        pt = _page_table(_host("page_table", page_table), r)
        if num_tokens is None:
            num_tokens = int(ql.astype(np.int64).sum())
        num_tokens = _int_arg(num_tokens, "num_tokens")
        step = _ffi.Step()
        step.num_requests = r
        step.num_tokens = num_tokens
        i32p = ctypes.POINTER(ctypes.c_int32)
        step.q_len = ql.ctypes.data_as(i32p)
        step.kv_len = kl.ctypes.data_as(i32p)
        step.page_table = pt.ctypes.data_as(i32p)
        step.page_table_stride = pt.shape[1]
        st = _ffi.lib().msa_plan_update(self._ptr, ctypes.byref(step), self._stream(stream))
        self.context._check(st)
        self.num_tokens = num_tokens

    def kernel_name(self, layer):
        s = _ffi.lib().msa_plan_kernel_name(self._ptr, _int_arg(layer, "layer"))
        return s.decode() if s else None

    def fallback_reason(self, layer):
        s = _ffi.lib().msa_plan_fallback_reason(self._ptr, _int_arg(layer, "layer"))
        return s.decode() if s else None

    def forward(self, layer, q, k=None, v=None, idx_q=None, idx_k=None, idx_v=None, *, o=None,
                idx_o=None, lse=None, topk=None, write_cache=True, stream=None):
        """One layer of the current step (msa_forward): writes k, v, idx_k,
        idx_v into the cache (unless write_cache is False), then attends.
        Token tensors have num_tokens rows, C order: q, o [T][Hq][D]; k, v
        [T][Hkv][D]; idx_q, idx_o [T][Hi][Di]; idx_k, idx_v [T][Di]
        ([T][H*D] is accepted for the 3-D ones); lse float32 [T][Hq]; topk
        int32 [T][Hkv][W].  o is allocated when not given (NumPy, or torch
        like q); idx_o is required for layers that keep an index value.
        Everything is checked before the library is called (ValueError);
        the library's refusals raise msa.Error.  Returns o."""
        mc = self._mc
        layer = _int_arg(layer, "layer")
        if not 0 <= layer < mc.num_layers:
            raise ValueError("layer %d out of range 0..%d" % (layer, mc.num_layers - 1))
        write_cache = bool(write_cache)
        sparse = self.model.layer_is_sparse(layer)
        has_iv = self.model.layer_has_index_value(layer)
        if o is None:
            o = _alloc_like(q, (self.num_tokens or 0, mc.num_q_heads, mc.head_dim), self.act_dtype)
        hq, hkv, d, hi, di = (mc.num_q_heads, mc.num_kv_heads, mc.head_dim, mc.num_index_heads,
                              mc.index_dim)
        # name, value, dims after the token rows, element type, used, output
        act = self.act_dtype
        spec = [
            ("q", q, (hq, d), act, True, False),
            ("k", k, (hkv, d), act, write_cache, False),
            ("v", v, (hkv, d), act, write_cache, False),
            ("idx_q", idx_q, (hi, di), act, sparse, False),
            ("idx_k", idx_k, (di,), act, sparse and write_cache, False),
            ("idx_v", idx_v, (di,), act, has_iv and write_cache, False),
            ("o", o, (hq, d), act, True, True),
            ("idx_o", idx_o, (hi, di), act, has_iv, True),
            ("lse", lse, (hq,), "fp32", lse is not None, True),
            ("topk", topk, (hkv, self._topk_width), "int32", sparse and topk is not None, True),
        ]
        want_dev = "cpu" if self.context.backend == "cpu" else "cuda:%d" % self.context.device
        io = _ffi.LayerIO()
        _ffi.lib().msa_layer_io_default(ctypes.byref(io))
        io.act_dtype = _ffi.DTYPES[act]
        io.write_cache = 1 if write_cache else 0
        tensors = []
        rows = self.num_tokens
        for name, x, dims, kind, used, output in spec:
            if not used:
                continue
            if x is None:
                why = {"k": "write_cache", "v": "write_cache", "idx_k": "sparse layers with write_cache",
                       "idx_v": "index-value layers with write_cache", "idx_q": "sparse layers",
                       "idx_o": "index-value layers"}.get(name, "this call")
                raise ValueError("%s is required for %s (layer %d)" % (name, why, layer))
            t = _tensor(name, x)
            if t.kind != kind:
                what = "%s (the plan's act_dtype)" % kind if kind == act and name not in (
                    "lse", "topk") else kind
                raise ValueError("%s must hold %s elements, not %s" % (name, what, t.kind))
            if rows is not None and not _shape_ok(t.shape, rows, dims):
                raise ValueError("%s must have shape %s for this step, not %s" % (
                    name, _describe(rows, dims), t.shape))
            if not t.contiguous:
                raise ValueError("%s must be C-contiguous" % name)
            if not t.aligned:
                raise ValueError("%s is not aligned to its element size" % name)
            if output and not t.writeable:
                raise ValueError("%s is read-only" % name)
            if t.device != want_dev:
                raise ValueError("%s is on %s; this %s context needs tensors on %s" % (
                    name, t.device, self.context.backend, want_dev))
            setattr(io, name, t.ptr)
            tensors.append(t)
        io.stream = self._stream(stream, tensors)
        st = _ffi.lib().msa_forward(self.context._ptr, self._ptr, layer, ctypes.byref(io))
        self.context._check(st)
        return o


def forward(plan, layer, *args, **kwargs):
    """msa_forward on `plan`: the same as plan.forward(layer, ...)."""
    return plan.forward(layer, *args, **kwargs)


def _alloc_like(q, shape, act):
    torch = _torch()
    if torch is not None and isinstance(q, torch.Tensor):
        dt = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[act]
        return torch.empty(shape, dtype=dt, device=q.device)
    if isinstance(q, np.ndarray) and act == "bf16" and q.dtype.name == "bfloat16":
        return np.empty(shape, dtype=q.dtype)
    return np.empty(shape, dtype=_NUMPY_DTYPES[act])


def _int_vector(name, x):
    a = np.asarray(x)
    if a.ndim != 1 or (a.size and a.dtype.kind not in "iu"):
        raise ValueError("%s must be a 1-D sequence of integers" % name)
    a = a.astype(np.int64)
    if a.size and (a.min() < -(2**31) or a.max() >= 2**31):
        raise ValueError("%s has values outside int32" % name)
    return np.ascontiguousarray(a, dtype=np.int32)


def _page_table(x, r):
    """A C-contiguous int32 [R][stride] page table; ragged rows are padded
    with -1 (the library reads only the pages a request uses)."""
    if isinstance(x, np.ndarray):
        a = x if x.ndim == 2 else (x.reshape(1, -1) if x.ndim == 1 and r == 1 else None)
        if a is None or (a.size and a.dtype.kind not in "iu"):
            raise ValueError("page_table must be a 2-D integer array [requests][pages]")
    else:
        rows = [list(row) for row in (x if x is not None else [])]
        width = max([len(row) for row in rows] + [1])
        a = np.full((len(rows), width), -1, dtype=np.int64)
        for i, row in enumerate(rows):
            arr = np.asarray(row)
            if arr.size and (arr.ndim != 1 or arr.dtype.kind not in "iu"):
                raise ValueError("page_table row %d must be a sequence of integers" % i)
            a[i, : len(row)] = arr
    if a.shape[0] != r:
        raise ValueError("page_table has %d rows for %d requests" % (a.shape[0], r))
    a64 = a.astype(np.int64)
    if a64.size and (a64.min() < -(2**31) or a64.max() >= 2**31):
        raise ValueError("page_table has values outside int32")
    if a64.shape[1] == 0:
        a64 = np.full((r, 1), -1, dtype=np.int64)
    if r == 0:
        a64 = np.full((1, 1), -1, dtype=np.int64)
    return np.ascontiguousarray(a64, dtype=np.int32)
