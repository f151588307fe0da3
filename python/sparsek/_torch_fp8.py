"""torch integration of the fp8 (e4m3) products and of dense quantization, as custom ops with fake
kernels (torch.compile traces them) and without a backward (inference only):

    torch.ops.sparsek.bsr_mm_fp8(row_ptr, col_idx, values, scales, rows, cols, trans, b, b_scales,
                                 alpha, beta, c, out_dtype)
    torch.ops.sparsek.dense_bsr_mm_fp8(a, a_scales, row_ptr, col_idx, values, scales, rows, cols,
                                       trans, alpha, beta, c, out_dtype)
    torch.ops.sparsek.quantize_e4m3(x, dim, group) -> (codes, scales)

values, b and a are e4m3 codes (float8_e4m3fn, or uint8), scales float32 (_fp8.py says which
shapes). The output has c's dtype when c is given (beta != 0: the C that beta scales), else
out_dtype. Plans are cached on the pattern as for the other products (_torch_ops._plan). Imported
by _torch_ops.
"""
from typing import Optional, Tuple

import torch
from torch import Tensor

from . import _sparsek as _ext
from ._torch_ops import DDS, DSD, _check_tensor, _into, _launch, _need_2d, _stream

_FP8 = getattr(torch, "float8_e4m3fn", None)
_CODE_DTYPE = _FP8 if _FP8 is not None else torch.uint8  # what new e4m3 tensors get


def _codes(t):
    """The uint8 view of an e4m3 tensor, as the library reads it (other tensors unchanged: a float
    operand then meets the library's dtype check, which names both dtypes)."""
    return t.view(torch.uint8) if _FP8 is not None and t.dtype == _FP8 else t


def _result(c, beta, shape, dtype, device):
    if c is None:
        if beta != 0:
            raise ValueError(f"beta={beta} needs c (the C that beta scales)")
        return torch.empty(shape, dtype=dtype, device=device)
    if beta != 0:
        return c.clone(memory_format=torch.contiguous_format)
    return torch.empty(c.shape, dtype=c.dtype, device=c.device)


@torch.library.custom_op("sparsek::bsr_mm_fp8", mutates_args=())
def _bsr_mm_fp8_op(row_ptr: Tensor, col_idx: Tensor, values: Tensor, scales: Optional[Tensor], rows: int,
                   cols: int, trans: bool, b: Tensor, b_scales: Optional[Tensor], alpha: float, beta: float,
                   c: Optional[Tensor], out_dtype: torch.dtype) -> Tensor:
    _need_2d(b, "B")
    out = _result(c, beta, (cols if trans else rows, b.shape[1]), out_dtype, b.device)
    _launch(DSD, trans, row_ptr, col_idx, _codes(values), rows, cols, None, _codes(b), out, alpha, beta, scales,
            b_scales)
    return out


@_bsr_mm_fp8_op.register_fake
def _(row_ptr, col_idx, values, scales, rows, cols, trans, b, b_scales, alpha, beta, c, out_dtype):
    return b.new_empty((cols if trans else rows, b.shape[1]), dtype=c.dtype if c is not None else out_dtype)


@torch.library.custom_op("sparsek::dense_bsr_mm_fp8", mutates_args=())
def _dense_bsr_mm_fp8_op(a: Tensor, a_scales: Optional[Tensor], row_ptr: Tensor, col_idx: Tensor, values: Tensor,
                         scales: Optional[Tensor], rows: int, cols: int, trans: bool, alpha: float, beta: float,
                         c: Optional[Tensor], out_dtype: torch.dtype) -> Tensor:
    _need_2d(a, "A")
    out = _result(c, beta, (a.shape[0], rows if trans else cols), out_dtype, a.device)
    _launch(DDS, trans, row_ptr, col_idx, _codes(values), rows, cols, _codes(a), None, out, alpha, beta, scales,
            a_scales)
    return out


@_dense_bsr_mm_fp8_op.register_fake
def _(a, a_scales, row_ptr, col_idx, values, scales, rows, cols, trans, alpha, beta, c, out_dtype):
    return a.new_empty((a.shape[0], rows if trans else cols), dtype=c.dtype if c is not None else out_dtype)


def _scales_shape(shape, dim, group):
    tokens, k = (shape[0], shape[1]) if dim == 0 else (shape[1], shape[0])
    return (tokens,) if group == 0 else (tokens, (k + 127) // 128)


@torch.library.custom_op("sparsek::quantize_e4m3", mutates_args=())
def _quantize_op(x: Tensor, dim: int, group: int) -> Tuple[Tensor, Tensor]:
    codes = torch.empty(x.shape, dtype=_CODE_DTYPE, device=x.device)
    scales = torch.empty(_scales_shape(x.shape, dim, group), dtype=torch.float32, device=x.device)
    _ext.quantize_dense(x.detach(), _codes(codes), scales, dim, _stream(x))
    return codes, scales


@_quantize_op.register_fake
def _(x, dim, group):
    return (x.new_empty(x.shape, dtype=_CODE_DTYPE),
            x.new_empty(_scales_shape(x.shape, dim, group), dtype=torch.float32))


# ---------------------------------------------------------------- no backward
# fp8 is for inference: a gradient through e4m3 codes would be meaningless, so any backward that
# reaches these ops stops with an error that says why, instead of a silent zero or a missing grad.

def _no_setup(ctx, inputs, output):
    pass


def _fp8_backward(*_):
    raise RuntimeError("sparsek: fp8 (e4m3) products and quantize_e4m3 have no backward: they are for "
                       "inference. Train with float16/bfloat16 (e.g. BlockSparseLinear before to_fp8()) and "
                       "quantize afterwards, or run the fp8 forward under torch.no_grad().")


for _name in ("sparsek::bsr_mm_fp8", "sparsek::dense_bsr_mm_fp8", "sparsek::quantize_e4m3"):
    torch.library.register_autograd(_name, _fp8_backward, setup_context=_no_setup)


# ---------------------------------------------------------------- what sparsek's functions call

def fp8_product(kind, s, trans, dense, dense_scales, alpha, beta, out, out_dtype):
    """sparsek.bsr_mm (kind "dsd", dense = B) / dense_bsr_mm ("dds", dense = A) with an e4m3
    sparse operand s (a BSRMatrix). Output: out, or a new tensor of out_dtype (float32 default)."""
    _check_tensor(dense, "b" if kind == "dsd" else "a")
    for t, name in ((dense_scales, "the dense operand's scales"), (out, "out")):
        if t is not None:
            _check_tensor(t, name)
    if out is not None and out_dtype is not None and out.dtype != out_dtype:
        raise ValueError(f"out_dtype={out_dtype} differs from out's dtype {out.dtype}")
    dtype = out.dtype if out is not None else torch.float32 if out_dtype is None else out_dtype
    c = out if beta != 0 else None  # read by the op only for beta != 0
    rows, cols = s.shape
    if kind == "dsd":
        r = torch.ops.sparsek.bsr_mm_fp8(s.row_ptr, s.col_idx, s.values, s.scales, rows, cols, trans, dense,
                                         dense_scales, alpha, beta, c, dtype)
    else:
        r = torch.ops.sparsek.dense_bsr_mm_fp8(dense, dense_scales, s.row_ptr, s.col_idx, s.values, s.scales,
                                               rows, cols, trans, alpha, beta, c, dtype)
    return _into(out, r)


def quantize(x, dim, group):
    """(codes, scales) of a 2-D float tensor through torch.ops.sparsek.quantize_e4m3."""
    return torch.ops.sparsek.quantize_e4m3(x, dim, group)
