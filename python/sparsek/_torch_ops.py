"""torch integration: the products as ``torch.library`` custom ops with fake kernels.

    torch.ops.sparsek.bsr_mm(row_ptr, col_idx, values, rows, cols, b, alpha, beta, c, check_indices)
    torch.ops.sparsek.dense_bsr_mm(a, row_ptr, col_idx, values, rows, cols, alpha, beta, c, check_indices)
    torch.ops.sparsek.sampled_mm(a, b, row_ptr, col_idx, values, rows, cols, alpha, beta, check_indices)

The ops are functional (they return fresh tensors and mutate nothing), so torch.compile and
torch.export treat them as opaque nodes whose output shapes come from the fake kernels. `c`
(dense ops) gives the output's dtype and shape and, when beta != 0, the C that beta scales; for
sampled_mm the pattern's values play that role. `out=` of the Python functions is served by copying
the op's result into it.

This module is imported only when torch is importable (sparsek/__init__.py).
"""
from typing import Optional

import torch
from torch import Tensor

from . import _sparsek as _ext

if not hasattr(torch.library, "custom_op"):
    raise ImportError(f"sparsek's torch integration needs torch >= 2.4 (torch.library.custom_op); "
                      f"found torch {torch.__version__}")


def _stream(t: Tensor) -> int:
    return torch.cuda.current_stream(t.device).cuda_stream if t.is_cuda else 0


def _dense_result(c: Optional[Tensor], beta: float, shape, like: Tensor) -> Tensor:
    if c is None:
        return torch.empty(shape, dtype=like.dtype, device=like.device)
    if beta != 0:
        return c.clone(memory_format=torch.contiguous_format)
    # c's shape (not `shape`) so that a wrong c is reported by the library's shape check.
    return torch.empty(c.shape, dtype=c.dtype, device=c.device)


# NOTE: tensors are detached before DLPack export: torch refuses __dlpack__ on tensors that
# require grad. The custom ops have no autograd formula (yet): backward through them raises.


@torch.library.custom_op("sparsek::bsr_mm", mutates_args=())
def _bsr_mm_op(row_ptr: Tensor, col_idx: Tensor, values: Tensor, rows: int, cols: int, b: Tensor,
               alpha: float, beta: float, c: Optional[Tensor], check_indices: bool) -> Tensor:
    if c is None and beta != 0:
        raise ValueError(f"beta={beta} needs c (the C that beta scales)")
    n = b.shape[1] if b.dim() == 2 else 0
    out = _dense_result(c, beta, (rows, n), b)
    _ext.dsd(rows, cols, row_ptr.detach(), col_idx.detach(), values.detach(), b.detach(), out,
             alpha, beta, 0, _stream(values), check_indices)
    return out


@_bsr_mm_op.register_fake
def _(row_ptr, col_idx, values, rows, cols, b, alpha, beta, c, check_indices):
    dtype = c.dtype if c is not None else b.dtype
    return b.new_empty((rows, b.shape[1]), dtype=dtype)


@torch.library.custom_op("sparsek::dense_bsr_mm", mutates_args=())
def _dense_bsr_mm_op(a: Tensor, row_ptr: Tensor, col_idx: Tensor, values: Tensor, rows: int,
                     cols: int, alpha: float, beta: float, c: Optional[Tensor],
                     check_indices: bool) -> Tensor:
    if c is None and beta != 0:
        raise ValueError(f"beta={beta} needs c (the C that beta scales)")
    m = a.shape[0] if a.dim() == 2 else 0
    out = _dense_result(c, beta, (m, cols), a)
    _ext.dds(a.detach(), rows, cols, row_ptr.detach(), col_idx.detach(), values.detach(), out,
             alpha, beta, 0, _stream(values), check_indices)
    return out


@_dense_bsr_mm_op.register_fake
def _(a, row_ptr, col_idx, values, rows, cols, alpha, beta, c, check_indices):
    dtype = c.dtype if c is not None else a.dtype
    return a.new_empty((a.shape[0], cols), dtype=dtype)


@torch.library.custom_op("sparsek::sampled_mm", mutates_args=())
def _sampled_mm_op(a: Tensor, b: Tensor, row_ptr: Tensor, col_idx: Tensor, values: Tensor,
                   rows: int, cols: int, alpha: float, beta: float, check_indices: bool) -> Tensor:
    if beta != 0:
        out = values.clone(memory_format=torch.contiguous_format)
    else:
        out = torch.empty(values.shape, dtype=values.dtype, device=values.device)
    _ext.sdd(a.detach(), b.detach(), rows, cols, row_ptr.detach(), col_idx.detach(), out, alpha,
             beta, _stream(values), check_indices)
    return out


@_sampled_mm_op.register_fake
def _(a, b, row_ptr, col_idx, values, rows, cols, alpha, beta, check_indices):
    return torch.empty_like(values, memory_format=torch.contiguous_format)


# ---- what sparsek.bsr_mm & co. call for torch matrices (traceable by dynamo: only torch ops) ----

def _check_tensor(x, name):
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch tensor like the BSR matrix's arrays, "
                        f"got {type(x).__name__}")


def _into(out, result):
    if out is None:
        return result
    _check_tensor(out, "out")
    if tuple(out.shape) != tuple(result.shape):
        raise ValueError(f"out has shape {tuple(out.shape)}, the product is {tuple(result.shape)}")
    out.copy_(result)
    return out


def bsr_mm(a, b, alpha, beta, out):
    _check_tensor(b, "b")
    rows, cols = a.shape
    r = torch.ops.sparsek.bsr_mm(a.row_ptr, a.col_idx, a.values, rows, cols, b, float(alpha),
                                 float(beta), out, False)
    return _into(out, r)


def dense_bsr_mm(a, b, alpha, beta, out):
    _check_tensor(a, "a")
    rows, cols = b.shape
    r = torch.ops.sparsek.dense_bsr_mm(a, b.row_ptr, b.col_idx, b.values, rows, cols, float(alpha),
                                       float(beta), out, False)
    return _into(out, r)


def sampled_mm(a, b, pattern, alpha, beta, out):
    """The result's values (sparsek.sampled_mm wraps them in a BSRMatrix or copies them into out)."""
    _check_tensor(a, "a")
    _check_tensor(b, "b")
    rows, cols = pattern.shape
    return torch.ops.sparsek.sampled_mm(a, b, pattern.row_ptr, pattern.col_idx, pattern.values, rows,
                                        cols, float(alpha), float(beta), False)
