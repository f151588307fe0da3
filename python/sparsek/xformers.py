"""sparsek's block-sparse attention as an xFormers-style forward op.

    from sparsek.xformers import BlockSparseAttentionOp, Inputs
    inp = Inputs(query, key, value, attn_bias=layout)      # BMHK: [batch, seq, heads, dim]
    reasons = BlockSparseAttentionOp.not_supported_reasons(inp)   # [] when it can run
    out, ctx = BlockSparseAttentionOp.apply(inp, needs_gradient=False)   # out [B, Mq, Hq, K]

Tensors follow xFormers' BMHK convention ([batch, sequence, heads, head dim]; key/value may have
fewer heads than the query, a divisor of them: GQA); ``attn_bias`` is a ``sparsek.BlockLayout`` or
a FlexAttention ``BlockMask``; ``scale`` None means 1/sqrt(head dim). The class works without
xFormers. When xFormers is importable it also derives from xFormers' ``AttentionFwOpBase``, so it
can be passed where xFormers takes a forward op class (``memory_efficient_attention_forward(...,
op=BlockSparseAttentionOp)``). Importing this module imports torch.
"""
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np
import torch

from . import _arrays as A
from . import _attention

try:  # NOTE: any failure (missing, or an xFormers that moved its classes) leaves the plain class.
    from xformers.ops.fmha.common import AttentionFwOpBase as _XBase
except Exception:  # noqa: BLE001
    _XBase = object


@dataclass
class Inputs:
    """The fields of xFormers' ``fmha.Inputs`` that the op reads."""
    query: torch.Tensor
    key: torch.Tensor
    value: torch.Tensor
    attn_bias: Any = None
    p: float = 0.0
    scale: Optional[float] = None
    causal: bool = False  # sparsek's causal mask inside the layout's partial blocks


def _bias_layout(bias):
    """The BlockLayout of an attn_bias, or the reason there is none."""
    try:
        return _attention.as_layout(bias), None
    except TypeError:
        return None, (f"attn_bias must be a sparsek.BlockLayout or a FlexAttention BlockMask, got "
                      f"{type(bias).__name__}")
    except ValueError as e:
        return None, f"attn_bias: {e}"


class BlockSparseAttentionOp(_XBase):
    """Block-sparse attention forward (sparsek) in xFormers' op shape."""
    NAME = "sparsek_block_sparse_fwd"
    OPERATOR = None
    SUPPORTED_DEVICES = {"cuda", "cpu"}
    SUPPORTED_DTYPES = {torch.float16, torch.bfloat16, torch.float32}
    SUPPORTED_MAX_K = 128
    SUPPORTED_ATTN_BIAS_TYPES = (_attention.BlockLayout,)
    SUPPORTS_DROPOUT = False
    SUPPORTS_CUSTOM_SCALE = True
    SUPPORTS_DIFFERENT_VALUE_EMBED = False
    SUPPORTS_OUTPUT_DTYPE = False
    SUPPORTS_PARTIAL = False
    IS_DETERMINISTIC = True

    @classmethod
    def not_supported_reasons(cls, d) -> list:
        """Why this op cannot run ``d`` (an Inputs, or xFormers' fmha.Inputs); empty when it can."""
        reasons = []
        q, k, v = getattr(d, "query", None), getattr(d, "key", None), getattr(d, "value", None)
        tensors = (("query", q), ("key", k), ("value", v))
        for name, x in tensors:
            if not isinstance(x, torch.Tensor):
                reasons.append(f"{name} is not a torch tensor ({type(x).__name__})")
        if reasons:
            return reasons
        for name, x in tensors:
            if x.dim() != 4:
                reasons.append(f"{name} has shape {tuple(x.shape)}: sparsek takes 4-D BMHK "
                               "[batch, seq, heads, head dim] tensors")
            if x.dtype not in cls.SUPPORTED_DTYPES:
                reasons.append(f"{name} dtype {x.dtype} is not float16, bfloat16 or float32")
            if x.device.type not in cls.SUPPORTED_DEVICES:
                reasons.append(f"{name} is on {x.device}; sparsek runs on CUDA devices and the CPU")
        if reasons:
            return reasons
        if len({x.dtype for _, x in tensors}) > 1:
            reasons.append(f"query, key and value dtypes differ ({q.dtype}, {k.dtype}, {v.dtype})")
        if len({x.device for _, x in tensors}) > 1:
            reasons.append(f"query, key and value are on different devices ({q.device}, {k.device}, {v.device})")
        if q.is_cuda and q.dtype == torch.float32:
            reasons.append("float32 runs on the CPU only (the GPU kernels take float16 or bfloat16)")
        if q.shape[-1] not in (64, 128):
            reasons.append(f"head dim {q.shape[-1]} is not 64 or 128")
        if k.shape[-1] != q.shape[-1] or v.shape[-1] != q.shape[-1]:
            reasons.append(f"key/value head dims {k.shape[-1]}, {v.shape[-1]} differ from the query's "
                           f"{q.shape[-1]}")
        if k.shape != v.shape:
            reasons.append(f"key {tuple(k.shape)} and value {tuple(v.shape)} shapes differ")
        if k.shape[0] != q.shape[0]:
            reasons.append(f"key batch {k.shape[0]} differs from the query's {q.shape[0]}")
        if k.shape[2] == 0 or q.shape[2] % k.shape[2]:
            reasons.append(f"query heads {q.shape[2]} are not a multiple of key/value heads {k.shape[2]}")
        if any(x.stride(-1) != 1 for _, x in tensors):
            reasons.append("the head dim must be contiguous (stride 1)")
        if getattr(d, "p", 0.0):
            reasons.append(f"dropout p={d.p} is not supported")
        causal = getattr(d, "causal", False)
        if not isinstance(causal, (bool, np.bool_)):  # a string "False" would be truthy
            reasons.append(f"causal must be True or False, got {type(causal).__name__} {causal!r}")
        layout, why = _bias_layout(getattr(d, "attn_bias", None))
        if why:
            reasons.append(why)
        if reasons:
            return reasons
        # The library's own verdict on this exact problem (shapes, layout extents, device).
        qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        try:
            from . import _sparsek as _ext
            o = torch.empty(qt.shape, dtype=q.dtype, device=q.device)
            lse = torch.empty(qt.shape[:3], dtype=torch.float32, device=q.device)
            reasons += _ext.attention_unsupported_reasons(
                qt.detach(), kt.detach(), vt.detach(), o, lse, *layout.arrays(), layout.block,
                bool(causal), _attention._scale(getattr(d, "scale", None)))
        except (ValueError, TypeError) as e:
            reasons.append(str(e))
        return reasons

    @classmethod
    def apply(cls, inp, needs_gradient: bool = False):
        """(out [B, Mq, Hq, K], ctx) with ctx = None, or (out, lse [B, Hq, Mq]) when needs_gradient."""
        needs_gradient = A.flag(needs_gradient, "needs_gradient")
        causal = A.flag(getattr(inp, "causal", False), "causal")
        reasons = cls.not_supported_reasons(inp)
        if reasons:
            raise NotImplementedError(f"{cls.NAME} does not support these inputs: " + "; ".join(reasons))
        layout = _attention.as_layout(inp.attn_bias)
        o, lse = _attention.attention(inp.query.transpose(1, 2), inp.key.transpose(1, 2), inp.value.transpose(1, 2),
                                      layout, causal, getattr(inp, "scale", None))
        return o.transpose(1, 2), (lse if needs_gradient else None)
