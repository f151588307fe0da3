"""fp8 (e4m3) arrays: the dense quantization helpers and what BSRMatrix and the products need for
e4m3 operands.

An e4m3 array holds the codes: a torch ``float8_e4m3fn`` tensor (the dtype sparsek creates with
torch), or a ``uint8`` array of the raw codes (NumPy and CuPy have no fp8 dtype; a torch uint8
tensor is read the same way). Its float32 scales travel beside it:

* a BSR matrix: one scale per stored block, ``scales`` of shape (nnzb,);
* a dense operand: one scale per token, along the dimension that is not reduced: per row of the
  A of ``dense_bsr_mm`` (``x @ W.T``: x's rows), per column of the B of ``bsr_mm``; shape
  (tokens,), or (tokens, ceil(K / 128)) for one scale per token and 128-wide group of K.

The value of an element is scale * (the code's value). Quantization: scale = amax / 448 per group
(448: e4m3's largest value), codes rounded to nearest even, saturating; a group of zeros gets scale
0. Host arrays must be finite (ValueError naming the element); on a GPU a group holding NaN or inf
gets a NaN scale, which the products refuse (ValueError naming the index).
"""
import numpy as np

from . import _arrays as A
from . import _sparsek as _ext

FP8_NAMES = ("float8_e4m3fn", "uint8")
_PER = {"row": 0, "col": 1}


def is_fp8(x):
    """Whether x holds e4m3 codes (a float8_e4m3fn tensor or a uint8 array)."""
    return A.dtype_name(x) in FP8_NAMES


def codes(x):
    """The uint8 view of an e4m3 array, as the binding reads it (other arrays unchanged)."""
    if A.is_torch(x):
        x = x.detach()
        return x.view(A.torch.uint8) if x.dtype != A.torch.uint8 and is_fp8(x) else x
    if A.dtype_name(x) == "float8_e4m3fn":  # an ml_dtypes NumPy array
        return x.view(np.uint8)
    return x


def fp8_dtype(like):
    """The dtype sparsek gives new e4m3 arrays in like's framework."""
    if A.is_torch(like):
        return getattr(A.torch, "float8_e4m3fn", A.torch.uint8)
    return A.xp(like).uint8


def float32(like):
    return A.torch.float32 if A.is_torch(like) else A.xp(like).float32


def detached(x):
    return x.detach() if A.is_torch(x) else x


def per_dim(per):
    if per not in _PER:
        raise ValueError(f"per must be 'row' (one scale per row) or 'col' (one per column), got {per!r}")
    return _PER[per]


def check_group(group):
    if isinstance(group, bool) or group not in (0, 128):
        raise ValueError(f"group must be 0 (one scale per token) or 128 (one per token and 128-wide "
                         f"group of K), got {group!r}")
    return group


def scales_shape(shape, per, group):
    rows, cols = shape
    tokens, k = (rows, cols) if per == "row" else (cols, rows)
    return (tokens,) if group == 0 else (tokens, (k + 127) // 128)


def quantize_e4m3(x, per="row", group=0):
    """Quantize a 2-D float array (float32, float16 or bfloat16) to e4m3: returns ``(codes,
    scales)`` in x's framework and on its device, codes of x's shape (float8_e4m3fn with torch,
    uint8 codes otherwise), scales float32.

    per="row": one scale per row (the A of ``dense_bsr_mm``: ``x @ W.T`` with x's rows the tokens);
    per="col": one per column (the B of ``bsr_mm``). group=0: scales of shape (tokens,); group=128:
    one per token and 128-wide group of K, shape (tokens, ceil(K / 128)). Each group: scale =
    amax / 448, codes rounded to nearest even, saturating; zeros get scale 0. With torch this is
    ``torch.ops.sparsek.quantize_e4m3`` (torch.compile traces it; no backward).
    """
    A.framework(x, "x")
    if x.ndim != 2:
        raise ValueError(f"x must be a 2-D array, got shape {A.shape_of(x)}")
    A.check_value_dtype(x, "x")
    dim, group = per_dim(per), check_group(group)
    if A.is_torch(x):
        from ._ops import torch_ops
        return torch_ops().quantize(x, dim, group)
    out = A.empty(x, A.shape_of(x), fp8_dtype(x))
    scales = A.empty(x, scales_shape(A.shape_of(x), per, group), float32(x))
    _ext.quantize_dense(detached(x), codes(out), scales, dim, A.stream_of(x))
    return out, scales


def dequantize_e4m3(q, scales, per="row", dtype=None):
    """The float array (float32, or ``dtype``) of e4m3 codes and their scales, as made by
    ``quantize_e4m3(x, per, group)`` (the group follows from the scales' shape): scale * code."""
    A.same_framework([("codes", q), ("scales", scales)])
    if q.ndim != 2:
        raise ValueError(f"codes must be a 2-D array, got shape {A.shape_of(q)}")
    dim = per_dim(per)
    out = A.empty(q, A.shape_of(q), float32(q) if dtype is None else dtype)
    _ext.dequantize_dense(codes(q), detached(scales), out, dim, A.stream_of(q))
    return out


def quantize_bsr(m):
    """The e4m3 BSRMatrix of a float one (same pattern arrays)."""
    from ._bsr import BSRMatrix

    if m.scales is not None:
        raise ValueError("quantize(): the matrix is e4m3 already")
    v = m.values
    q = A.empty(v, A.shape_of(v), fp8_dtype(v))
    scales = A.empty(v, (m.nnzb,), float32(v))
    rows, cols = m.shape
    _ext.quantize_bsr(rows, cols, detached(m.row_ptr), detached(m.col_idx), detached(v), codes(q), scales,
                      A.stream_of(v))
    return BSRMatrix(m.row_ptr, m.col_idx, q, m.shape, scales=scales, check=False)


def dequantize_bsr(m, dtype):
    """The float BSRMatrix (float32 unless dtype says otherwise) of an e4m3 one."""
    from ._bsr import BSRMatrix

    if m.scales is None:
        raise ValueError(f"dequantize(): the matrix is {A.dtype_name(m.values)}, not e4m3")
    v = m.values
    out = A.empty(v, A.shape_of(v), float32(v) if dtype is None else dtype)
    rows, cols = m.shape
    _ext.dequantize_bsr(rows, cols, detached(m.row_ptr), detached(m.col_idx), codes(v), detached(m.scales), out,
                        A.stream_of(v))
    return BSRMatrix(m.row_ptr, m.col_idx, out, m.shape, check=False)


def product(kind, sparse, trans, dense, dense_scales, alpha, beta, out, out_dtype):
    """An e4m3 DSD (kind "dsd": dense is B) or DDS ("dds": dense is A) on NumPy or CuPy arrays.
    Output: out, or a new array of out_dtype (float32 by default)."""
    A.same_framework([("the sparse operand", sparse.values), ("the dense operand", dense),
                      ("its scales", dense_scales), ("out", out)])
    if dense.ndim != 2:
        raise ValueError(f"{'B' if kind == 'dsd' else 'A'} must be a 2-D array, got shape {A.shape_of(dense)}")
    rows, cols = sparse.shape
    if kind == "dsd":
        shape = (cols if trans else rows, int(dense.shape[1]))
    else:
        shape = (int(dense.shape[0]), rows if trans else cols)
    if out is None:
        if beta != 0:
            raise ValueError(f"beta={beta} needs out= (the C that beta scales); got out=None")
        out = A.empty(dense, shape, float32(dense) if out_dtype is None else out_dtype)
    elif out_dtype is not None and A.dtype_name(out) != A.dtype_name(A.empty(out, (0,), out_dtype)):
        raise ValueError(f"out_dtype={out_dtype} differs from out's dtype {A.dtype_name(out)}")
    stream = A.stream_of(sparse.values)
    if kind == "dsd":
        _ext.dsd(rows, cols, sparse.row_ptr, sparse.col_idx, codes(sparse.values), codes(dense), out, alpha, beta,
                 int(trans), stream, True, scales=sparse.scales, b_scales=dense_scales)
    else:
        _ext.dds(codes(dense), rows, cols, sparse.row_ptr, sparse.col_idx, codes(sparse.values), out, alpha, beta,
                 int(trans), stream, True, a_scales=dense_scales, scales=sparse.scales)
    return out
