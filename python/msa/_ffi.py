"""The C API of libmsa through ctypes: loading the shared library, the
structures of msa.h and the prototypes of its functions.

Nothing here computes anything; the objects of the package call the C
functions declared below.
"""

import ctypes
import glob
import os

# ---- structures of include/msa/msa.h (same fields, same order) ----------


class DebugOptions(ctypes.Structure):
    _fields_ = [
        ("cuda_num_sms", ctypes.c_int),
        ("cuda_no_tma", ctypes.c_int),
        ("cuda_no_pdl", ctypes.c_int),
        ("cuda_sel_warp_rows", ctypes.c_int),
        ("cuda_sel_unions", ctypes.c_int),
        ("cuda_no_prefill_tma", ctypes.c_int),
        ("cuda_no_prefill_indexer", ctypes.c_int),
        ("cuda_no_prefill_wgmma", ctypes.c_int),
        ("cuda_timeline_path", ctypes.c_char_p),
        ("cuda_no_prefill_kbm", ctypes.c_int),
        ("cuda_prefill_kbm_chunk", ctypes.c_int),
        ("cuda_no_lean_decode", ctypes.c_int),
    ]


PARALLEL_FOR = ctypes.CFUNCTYPE(
    None,
    ctypes.c_void_p,
    ctypes.c_int,
    ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int),
    ctypes.c_void_p,
)


class ContextParams(ctypes.Structure):
    _fields_ = [
        ("backend", ctypes.c_int),
        ("num_threads", ctypes.c_int),
        ("device", ctypes.c_int),
        ("debug", ctypes.POINTER(DebugOptions)),
        ("cpu_isa_max", ctypes.c_int),
        ("parallel_for", ctypes.c_void_p),
        ("engine", ctypes.c_void_p),
    ]


class ModelConfig(ctypes.Structure):
    _fields_ = [
        ("num_layers", ctypes.c_int32),
        ("num_q_heads", ctypes.c_int32),
        ("num_kv_heads", ctypes.c_int32),
        ("head_dim", ctypes.c_int32),
        ("num_index_heads", ctypes.c_int32),
        ("index_dim", ctypes.c_int32),
        ("block_size", ctypes.c_int32),
        ("topk_blocks", ctypes.c_int32),
        ("init_blocks", ctypes.c_int32),
        ("local_blocks", ctypes.c_int32),
        ("score_type", ctypes.c_int),
        ("layer_sparse", ctypes.POINTER(ctypes.c_uint8)),
        ("layer_index_value", ctypes.POINTER(ctypes.c_uint8)),
        ("softmax_scale", ctypes.c_float),
        ("index_softmax_scale", ctypes.c_float),
    ]


class TpShard(ctypes.Structure):
    _fields_ = [
        ("q_head_begin", ctypes.c_int32),
        ("kv_head_begin", ctypes.c_int32),
        ("index_head_begin", ctypes.c_int32),
        ("kv_replicas", ctypes.c_int32),
        ("index_replicas", ctypes.c_int32),
    ]


class PlaneView(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("page_stride", ctypes.c_int64),
        ("head_stride", ctypes.c_int64),
        ("token_stride", ctypes.c_int64),
    ]


class CacheConfig(ctypes.Structure):
    _fields_ = [
        ("num_pages", ctypes.c_int64),
        ("page_size", ctypes.c_int32),
        ("kv_dtype", ctypes.c_int),
        ("index_dtype", ctypes.c_int),
    ]


class PlanParams(ctypes.Structure):
    _fields_ = [
        ("max_requests", ctypes.c_int32),
        ("max_tokens", ctypes.c_int64),
        ("max_kv_len", ctypes.c_int64),
        ("act_dtype", ctypes.c_int),
        ("max_q_len", ctypes.c_int32),
    ]


class Step(ctypes.Structure):
    _fields_ = [
        ("num_requests", ctypes.c_int32),
        ("num_tokens", ctypes.c_int64),
        ("q_len", ctypes.POINTER(ctypes.c_int32)),
        ("kv_len", ctypes.POINTER(ctypes.c_int32)),
        ("page_table", ctypes.POINTER(ctypes.c_int32)),
        ("page_table_stride", ctypes.c_int64),
    ]


class LayerIO(ctypes.Structure):
    _fields_ = [
        ("act_dtype", ctypes.c_int),
        ("q", ctypes.c_void_p),
        ("k", ctypes.c_void_p),
        ("v", ctypes.c_void_p),
        ("idx_q", ctypes.c_void_p),
        ("idx_k", ctypes.c_void_p),
        ("idx_v", ctypes.c_void_p),
        ("o", ctypes.c_void_p),
        ("idx_o", ctypes.c_void_p),
        ("lse", ctypes.c_void_p),
        ("topk", ctypes.c_void_p),
        ("write_cache", ctypes.c_int),
        ("stream", ctypes.c_void_p),
    ]


# ---- enums (stable values of msa.h) --------------------------------------

OK = 0
STATUS_NAMES = {
    0: "MSA_OK",
    1: "MSA_ERR_INVALID_ARGUMENT",
    2: "MSA_ERR_INVALID_CONFIG",
    3: "MSA_ERR_OUT_OF_RANGE",
    4: "MSA_ERR_UNSUPPORTED",
    5: "MSA_ERR_OUT_OF_MEMORY",
    6: "MSA_ERR_IO",
    7: "MSA_ERR_CAPACITY",
    8: "MSA_ERR_BACKEND",
    9: "MSA_ERR_NO_DEVICE",
}
BACKENDS = {"cpu": 0, "cuda": 1}
DTYPES = {"fp32": 0, "bf16": 1, "fp16": 2, "fp8_e4m3": 3, "nvfp4": 4}
SCORE_TYPES = {"max": 0, "lse": 1}
PLANES = {"k": 0, "v": 1, "index_k": 2, "index_v": 3}

# ---- prototypes ------------------------------------------------------------

_P = ctypes.c_void_p
_I32 = ctypes.c_int32
_SZ = ctypes.c_size_t
_ST = ctypes.c_int  # msa_status
_PP = ctypes.POINTER(ctypes.c_void_p)

PROTOTYPES = {
    "msa_version_string": (ctypes.c_char_p, []),
    "msa_version_number": (ctypes.c_uint, []),
    "msa_status_name": (ctypes.c_char_p, [ctypes.c_int]),
    "msa_dtype_name": (ctypes.c_char_p, [ctypes.c_int]),
    "msa_dtype_size": (_SZ, [ctypes.c_int]),
    "msa_backend_name": (ctypes.c_char_p, [ctypes.c_int]),
    "msa_backend_available": (ctypes.c_int, [ctypes.c_int]),
    "msa_context_params_default": (None, [ctypes.POINTER(ContextParams)]),
    "msa_context_create": (_ST, [ctypes.POINTER(ContextParams), _PP, ctypes.c_char_p, _SZ]),
    "msa_context_free": (None, [_P]),
    "msa_context_last_error": (ctypes.c_char_p, [_P]),
    "msa_context_backend": (ctypes.c_int, [_P]),
    "msa_context_num_threads": (ctypes.c_int, [_P]),
    "msa_model_config_default": (None, [ctypes.POINTER(ModelConfig)]),
    "msa_model_create": (_ST, [_P, ctypes.POINTER(ModelConfig), _PP]),
    "msa_model_load_config_file": (_ST, [_P, ctypes.c_char_p, _PP]),
    "msa_model_free": (None, [_P]),
    "msa_model_get_config": (None, [_P, ctypes.POINTER(ModelConfig)]),
    "msa_model_layer_is_sparse": (ctypes.c_int, [_P, _I32]),
    "msa_model_layer_has_index_value": (ctypes.c_int, [_P, _I32]),
    "msa_model_topk_width": (_I32, [_P]),
    "msa_model_config_for_rank": (_ST, [_P, ctypes.POINTER(ModelConfig), _I32, _I32,
                                        ctypes.POINTER(ModelConfig), ctypes.POINTER(TpShard)]),
    "msa_cache_config_default": (None, [ctypes.POINTER(CacheConfig)]),
    "msa_cache_create": (_ST, [_P, _P, ctypes.POINTER(CacheConfig), _PP]),
    "msa_cache_wrap_strided": (_ST, [_P, _P, ctypes.POINTER(CacheConfig), ctypes.POINTER(PlaneView),
                                     _PP]),
    "msa_cache_free": (None, [_P]),
    "msa_cache_get_config": (None, [_P, ctypes.POINTER(CacheConfig)]),
    "msa_cache_plane_bytes": (_SZ, [_P, _I32, ctypes.c_int]),
    "msa_cache_plane_data": (_P, [_P, _I32, ctypes.c_int]),
    "msa_copy_to_buffer": (_ST, [_P, _P, _P, _SZ]),
    "msa_copy_from_buffer": (_ST, [_P, _P, _P, _SZ]),
    "msa_synchronize": (_ST, [_P]),
    "msa_plan_params_default": (None, [ctypes.POINTER(PlanParams)]),
    "msa_plan_create": (_ST, [_P, _P, _P, ctypes.POINTER(PlanParams), _PP]),
    "msa_plan_free": (None, [_P]),
    "msa_plan_update": (_ST, [_P, ctypes.POINTER(Step), _P]),
    "msa_layer_io_default": (None, [ctypes.POINTER(LayerIO)]),
    "msa_forward": (_ST, [_P, _P, _I32, ctypes.POINTER(LayerIO)]),
    "msa_plan_kernel_name": (ctypes.c_char_p, [_P, _I32]),
    "msa_plan_fallback_reason": (ctypes.c_char_p, [_P, _I32]),
}

# ---- loading -----------------------------------------------------------------

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def _candidates():
    """Paths to try, in order: $MSA_LIBRARY, a copy inside the package
    (msa/_lib/, where an installed wheel keeps it), then the build folders
    of the source tree that holds this package (build*/libmsa.so*)."""
    env = os.environ.get("MSA_LIBRARY")
    if env:
        # An explicit path is the only candidate: a wrong one must fail,
        # not fall through to another library.
        return [env], True
    found = []
    lib_dir = os.path.join(_PACKAGE_DIR, "_lib")
    for pattern in ("libmsa.so*", "*/libmsa.so*", "*/*/libmsa.so*"):
        found += sorted(glob.glob(os.path.join(lib_dir, pattern)))
    repo = os.path.dirname(os.path.dirname(_PACKAGE_DIR))
    if os.path.isfile(os.path.join(repo, "include", "msa", "msa.h")):
        # Newest build first: the one the developer built last.
        builds = glob.glob(os.path.join(repo, "build*", "libmsa.so*"))
        builds.sort(key=lambda p: os.path.getmtime(p), reverse=True)
        found += builds
    return found, False


def load():
    """Opens libmsa and declares its functions; raises OSError with the
    places searched when no library loads."""
    paths, explicit = _candidates()
    errors = []
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            errors.append("%s: %s" % (path, e))
            continue
        for name, (restype, argtypes) in PROTOTYPES.items():
            fn = getattr(lib, name)
            fn.restype = restype
            fn.argtypes = argtypes
        lib._msa_path = path
        return lib
    if explicit:
        raise OSError("MSA_LIBRARY=%s could not be loaded: %s" % (paths[0], "; ".join(errors)))
    where = [
        "$MSA_LIBRARY (unset)",
        os.path.join(_PACKAGE_DIR, "_lib"),
        os.path.join(os.path.dirname(os.path.dirname(_PACKAGE_DIR)), "build*"),
    ]
    detail = ("; ".join(errors)) if errors else "no libmsa.so* found"
    raise OSError(
        "libmsa shared library not found (searched %s): %s. Build it with "
        "-DMSA_BUILD_SHARED=ON or set MSA_LIBRARY to its path." % (", ".join(where), detail)
    )


_LIB = None


def lib():
    """The loaded library (loaded on first use)."""
    global _LIB
    if _LIB is None:
        _LIB = load()
    return _LIB
