"""The products (SPEC §1): DSD ``bsr_mm``, DDS ``dense_bsr_mm``, SDD ``sampled_mm``.

Outputs are allocated by the inputs' framework on their device; GPU work runs on the framework's
current stream and is not synchronized. torch tensors go through the ``torch.ops.sparsek`` custom ops
(so torch.compile sees one opaque op with a fake kernel); NumPy and CuPy arrays call the binding
directly.
"""
from . import _arrays as A
from . import _sparsek as _ext
from ._bsr import BSRMatrix

# Imported here, not inside the functions: torch.compile traces these functions.
_T = None
if A.torch is not None and hasattr(A.torch.library, "custom_op"):
    from . import _torch_ops as _T


def _torch_path():
    if _T is None:
        raise RuntimeError(f"sparsek's torch integration needs torch >= 2.4 (torch.library.custom_op); "
                           f"found torch {A.torch.__version__}")
    return _T


def _need_bsr(x, name):
    if not isinstance(x, BSRMatrix):
        raise TypeError(f"{name} must be a sparsek.BSRMatrix, got {type(x).__name__}")


def _need_2d(x, name):
    if x.ndim != 2:
        raise ValueError(f"{name} must be a 2-D array, got shape {A.shape_of(x)}")


def _dense_out(out, beta, like, shape):
    """The C array of a dense-output product: out when given, else a new one (beta needs out)."""
    if out is None:
        if beta != 0:
            raise ValueError(f"beta={beta} needs out= (the C that beta scales); got out=None")
        return A.empty(like, shape, like.dtype)
    return out


def bsr_mm(a, b, *, alpha=1.0, beta=0.0, out=None):
    """DSD: ``alpha * a @ b + beta * out`` with ``a`` a BSRMatrix and ``b`` dense (K x N).

    Returns ``out`` when given (written in place; with torch the result is copied into it),
    else a new (M x N) array of b's dtype. When beta == 0, out is never read (NaN does not leak).
    """
    _need_bsr(a, "a")
    if A.is_torch(a.values):
        return _torch_path().bsr_mm(a, b, alpha, beta, out)
    A.same_framework([("a", a.values), ("b", b), ("out", out)])
    _need_2d(b, "B")
    c = _dense_out(out, beta, b, (a.shape[0], int(b.shape[1])))
    rows, cols = a.shape
    _ext.dsd(rows, cols, a.row_ptr, a.col_idx, a.values, b, c, float(alpha), float(beta), 0,
             A.stream_of(a.values), False)
    return c


def dense_bsr_mm(a, b, *, alpha=1.0, beta=0.0, out=None):
    """DDS: ``alpha * a @ b + beta * out`` with ``a`` dense (M x K) and ``b`` a BSRMatrix."""
    _need_bsr(b, "b")
    if A.is_torch(b.values):
        return _torch_path().dense_bsr_mm(a, b, alpha, beta, out)
    A.same_framework([("a", a), ("b", b.values), ("out", out)])
    _need_2d(a, "A")
    c = _dense_out(out, beta, a, (int(a.shape[0]), b.shape[1]))
    rows, cols = b.shape
    _ext.dds(a, rows, cols, b.row_ptr, b.col_idx, b.values, c, float(alpha), float(beta), 0,
             A.stream_of(b.values), False)
    return c


def _check_same_pattern(out, pattern):
    if out.shape != pattern.shape or out.block != pattern.block or out.nnzb != pattern.nnzb:
        raise ValueError(f"out (shape={out.shape}, block={out.block}, nnzb={out.nnzb}) must have the "
                         f"pattern's shape={pattern.shape}, block={pattern.block}, nnzb={pattern.nnzb}")


def sampled_mm(a, b, pattern, *, alpha=1.0, beta=0.0, out=None):
    """SDD: ``alpha * (a @ b) + beta * pattern`` computed only on ``pattern``'s stored blocks.

    a: dense (M x K), b: dense (K x N), pattern: a BSRMatrix (M x N) whose structure the result
    takes and whose values beta scales (as torch.sparse.sampled_addmm). Returns a new BSRMatrix
    sharing pattern's index arrays, with values of pattern's dtype; or, with out= (a BSRMatrix of
    the same structure; may be pattern itself), writes out.values and returns out.
    """
    _need_bsr(pattern, "pattern")
    if out is not None:
        _need_bsr(out, "out")
        _check_same_pattern(out, pattern)
    if A.is_torch(pattern.values):
        values = _torch_path().sampled_mm(a, b, pattern, alpha, beta, out)
        if out is not None:
            out.values.copy_(values)
            return out
        return BSRMatrix(pattern.row_ptr, pattern.col_idx, values, pattern.shape, check=False)
    A.same_framework([("a", a), ("b", b), ("pattern", pattern.values),
                      ("out", None if out is None else out.values)])
    if out is None:
        values = pattern.values.copy() if beta != 0 else A.empty(pattern.values, pattern.values.shape,
                                                                 pattern.values.dtype)
        result = BSRMatrix(pattern.row_ptr, pattern.col_idx, values, pattern.shape, check=False)
    else:
        if beta != 0 and out is not pattern:
            out.values[...] = pattern.values
        result = out
    rows, cols = pattern.shape
    _ext.sdd(a, b, rows, cols, pattern.row_ptr, pattern.col_idx, result.values, float(alpha),
             float(beta), A.stream_of(pattern.values), False)
    return result


# Operators of BSRMatrix (defined here, next to the products they call).
def _matmul(self, other):
    return bsr_mm(self, other)


def _rmatmul(self, other):
    return dense_bsr_mm(other, self)


BSRMatrix.__matmul__ = _matmul
BSRMatrix.__rmatmul__ = _rmatmul
