"""libmsa from Python: MiniMax-M3 block-sparse attention (MSA).

A thin binding over the shared library (libmsa.so) through ctypes: every
object mirrors one object of the C API (include/msa/msa.h) and every
computation happens in the library.

    import msa
    with msa.Context("cpu") as ctx:
        model = msa.Model(ctx, msa.ModelConfig.default())
        cache = msa.Cache(ctx, model, num_pages=8)
        plan = msa.Plan(ctx, model, cache, act_dtype="fp32")
        plan.update(q_len=[300], kv_len=[300], page_table=[[5, 2, 7]])
        o = plan.forward(0, q, k, v, idx_q, idx_k)

Beside the package: msa.torch_ops (imports torch) registers the custom op
torch.ops.msa.forward for torch.compile and CUDA graphs; msa.adapters
builds steps from vLLM block tables and SGLang req_to_token tables and
wraps an engine's cache tensors in place (or copies them into msa's
planes).

The library is found, in order, at $MSA_LIBRARY, in msa/_lib/ (where an
installed wheel keeps it) and in the build folders of the source tree
(build*/libmsa.so*).
"""

from ._core import (
    Cache,
    Context,
    Error,
    Model,
    ModelConfig,
    Plan,
    Plane,
    TpShard,
    backend_available,
    forward,
    library_path,
    version,
)

__all__ = [
    "Cache",
    "Context",
    "Error",
    "Model",
    "ModelConfig",
    "Plan",
    "Plane",
    "TpShard",
    "backend_available",
    "forward",
    "library_path",
    "version",
]
