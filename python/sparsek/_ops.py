"""The products: DSD ``bsr_mm``, DDS ``dense_bsr_mm``, SDD ``sampled_mm``.

Outputs are allocated by the inputs' framework on their device; GPU work runs on the framework's
current stream and is not synchronized. torch tensors go through ``_torch_ops`` (plans cached on
the pattern, autograd, the ``torch.ops.sparsek`` custom ops that torch.compile sees as opaque nodes);
NumPy and CuPy arrays call the binding's one-shot entry points, which check the pattern on every
call (those arrays have no version counter that would tell an in-place edit).
"""
from . import _arrays as A
from . import _fp8
from . import _sparsek as _ext
from ._bsr import BSRMatrix, BSRTranspose

_T = None  # sparsek._torch_ops once torch is in use (never imported by sparsek itself)


def torch_ops():
    """The torch integration module (imported on first use of torch tensors)."""
    global _T
    if _T is None:
        from . import _torch_ops
        _T = _torch_ops
    return _T


def _sparse_arg(x, name):
    """(BSRMatrix, transposed) from a BSRMatrix, its .T view or a torch sparse_bsr tensor."""
    if isinstance(x, BSRMatrix):
        return x, False
    if isinstance(x, BSRTranspose):
        return x.base, True
    if A.is_torch(x) and x.layout == A.torch.sparse_bsr:
        return torch_ops().bsr_of_sparse_tensor(x), False
    raise TypeError(f"{name} must be a sparsek.BSRMatrix, its .T or a torch sparse_bsr tensor, "
                    f"got {type(x).__name__}")


def _need_2d(x, name):
    if x.ndim != 2:
        raise ValueError(f"{name} must be a 2-D array, got shape {A.shape_of(x)}")


def _fp8_call(sparse_scales, dense_scales, out_dtype):
    """Whether a product is an e4m3 one (either operand brings scales)."""
    if sparse_scales is None and dense_scales is None:
        if out_dtype is not None:
            raise ValueError(f"out_dtype={out_dtype} is for e4m3 products; other products take the "
                             "output's dtype from out= (or from the dense input)")
        return False
    return True


def _dense_out(out, beta, like, shape):
    """The C array of a dense-output product: out when given, else a new one (beta needs out)."""
    if out is None:
        if beta != 0:
            raise ValueError(f"beta={beta} needs out= (the C that beta scales); got out=None")
        return A.empty(like, shape, like.dtype)
    A.check_writable(out, "out")
    return out


def bsr_mm(a, b, *, alpha=1.0, beta=0.0, out=None, b_scales=None, out_dtype=None):
    """DSD: ``alpha * a @ b + beta * out`` with ``a`` sparse (a BSRMatrix, its ``.T`` or a torch
    sparse_bsr tensor) and ``b`` dense (K x N).

    Returns ``out`` when given (written in place; with torch the result is copied into it),
    else a new (M x N) array of b's dtype. When beta == 0, out is never read (NaN does not leak).

    fp8: an e4m3 ``a`` (``BSRMatrix.quantize()``) takes an e4m3 ``b`` with ``b_scales``, one per
    column of b (shape (N,), or (N, ceil(K/128)) per 128-wide group of K; ``quantize_e4m3(b,
    per="col")`` makes both). The result is float32, or ``out_dtype`` (float16/bfloat16), or out's.
    """
    a, trans = _sparse_arg(a, "a")
    alpha, beta = A.scalar(alpha, "alpha"), A.scalar(beta, "beta")
    if _fp8_call(a.scales, b_scales, out_dtype):
        if A.is_torch(a.values):
            return torch_ops().fp8_product("dsd", a, trans, b, b_scales, alpha, beta, out, out_dtype)
        return _fp8.product("dsd", a, trans, b, b_scales, alpha, beta, out, out_dtype)
    if A.is_torch(a.values):
        return torch_ops().bsr_mm(a, trans, b, alpha, beta, out)
    A.same_framework([("a", a.values), ("b", b), ("out", out)])
    _need_2d(b, "B")
    rows, cols = a.shape
    c = _dense_out(out, beta, b, (cols if trans else rows, int(b.shape[1])))
    _ext.dsd(rows, cols, a.row_ptr, a.col_idx, a.values, b, c, alpha, beta, int(trans),
             A.stream_of(a.values), True)
    return c


def dense_bsr_mm(a, b, *, alpha=1.0, beta=0.0, out=None, a_scales=None, out_dtype=None):
    """DDS: ``alpha * a @ b + beta * out`` with ``a`` dense (M x K) and ``b`` sparse (a BSRMatrix,
    its ``.T`` or a torch sparse_bsr tensor). ``x @ W.T`` runs without transposing W.

    fp8: an e4m3 ``b`` takes an e4m3 ``a`` with ``a_scales``, one per row of a (shape (M,), or
    (M, ceil(K/128)); ``quantize_e4m3(x)`` makes both). The result is float32, or ``out_dtype``,
    or out's."""
    b, trans = _sparse_arg(b, "b")
    alpha, beta = A.scalar(alpha, "alpha"), A.scalar(beta, "beta")
    if _fp8_call(b.scales, a_scales, out_dtype):
        if A.is_torch(b.values):
            return torch_ops().fp8_product("dds", b, trans, a, a_scales, alpha, beta, out, out_dtype)
        return _fp8.product("dds", b, trans, a, a_scales, alpha, beta, out, out_dtype)
    if A.is_torch(b.values):
        return torch_ops().dense_bsr_mm(a, b, trans, alpha, beta, out)
    A.same_framework([("a", a), ("b", b.values), ("out", out)])
    _need_2d(a, "A")
    rows, cols = b.shape
    c = _dense_out(out, beta, a, (int(a.shape[0]), rows if trans else cols))
    _ext.dds(a, rows, cols, b.row_ptr, b.col_idx, b.values, c, alpha, beta, int(trans),
             A.stream_of(b.values), True)
    return c


def _check_same_pattern(out, pattern):
    if out.shape != pattern.shape or out.block != pattern.block or out.nnzb != pattern.nnzb:
        raise ValueError(f"out (shape={out.shape}, block={out.block}, nnzb={out.nnzb}) must have the "
                         f"pattern's shape={pattern.shape}, block={pattern.block}, nnzb={pattern.nnzb}")


def sampled_mm(a, b, pattern, *, alpha=1.0, beta=0.0, out=None):
    """SDD: ``alpha * (a @ b) + beta * pattern`` computed only on ``pattern``'s stored blocks.

    a: dense (M x K), b: dense (K x N), pattern: a BSRMatrix (M x N) whose structure the result
    takes and whose values beta scales (as torch.sparse.sampled_addmm); a ``.T`` view or a torch
    sparse_bsr tensor is turned into a BSRMatrix first. Returns a new BSRMatrix sharing pattern's
    index arrays, with values of pattern's dtype; or, with out= (a BSRMatrix of the same structure;
    may be pattern itself), writes out.values and returns out.
    """
    pattern, trans = _sparse_arg(pattern, "pattern")
    if trans:  # the result is stored in the transpose's block order: build that pattern
        pattern = pattern.T.to_bsr()
    alpha, beta = A.scalar(alpha, "alpha"), A.scalar(beta, "beta")
    if out is not None:
        if not isinstance(out, BSRMatrix):
            raise TypeError(f"out must be a sparsek.BSRMatrix, got {type(out).__name__}")
        _check_same_pattern(out, pattern)
        A.check_writable(out.values, "out.values")
    if A.is_torch(pattern.values):
        values = torch_ops().sampled_mm(a, b, pattern, alpha, beta)
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
    _ext.sdd(a, b, rows, cols, pattern.row_ptr, pattern.col_idx, result.values, alpha, beta,
             A.stream_of(pattern.values), True)
    return result


# Operators of BSRMatrix and its .T (defined here, next to the products they call).
def _matmul(self, other):
    return bsr_mm(self, other)


def _rmatmul(self, other):
    return dense_bsr_mm(other, self)


def _is_sparse(x):
    return isinstance(x, (BSRMatrix, BSRTranspose))


@classmethod
def _torch_function(cls, func, types, args=(), kwargs=None):
    """torch's matmul entry points with a sparse operand: `t @ A`, torch.matmul, torch.mm, and
    `A @ t` under torch.compile. Eager Python calls `A @ t` through __matmul__ directly."""
    torch = A.torch
    if kwargs or len(args) != 2:
        return NotImplemented
    x, y = args
    if func is torch.Tensor.__rmatmul__:  # x.__rmatmul__(y) is y @ x
        x, y = y, x
    elif func not in (torch.matmul, torch.mm, torch.Tensor.__matmul__, torch.Tensor.matmul,
                      torch.Tensor.mm, torch._C.TensorBase.matmul):
        return NotImplemented
    if _is_sparse(x):
        return bsr_mm(x, y)
    if (func is torch._C.TensorBase.matmul and torch.compiler.is_compiling() and _is_sparse(y)
            and A.is_torch(x) and x.dim() == 2):
        # NOTE: dynamo traces `A @ t` as TensorBase.matmul(t, A), the same call as `t @ A`; the
        # shapes tell them apart unless both products are defined, which is refused, not guessed.
        left = x.shape[1] == y.shape[0]   # t @ A
        right = y.shape[1] == x.shape[0]  # A @ t
        if left and right:
            raise ValueError(f"under torch.compile, `A @ t` and `t @ A` with a sparse A of shape "
                             f"{y.shape} and t of shape {tuple(x.shape)} reach sparsek as the same "
                             "call; use sparsek.bsr_mm(A, t) or sparsek.dense_bsr_mm(t, A)")
        if right:
            return bsr_mm(y, x)
    return dense_bsr_mm(x, y)


for _cls in (BSRMatrix, BSRTranspose):
    _cls.__matmul__ = _matmul
    _cls.__rmatmul__ = _rmatmul
    _cls.__torch_function__ = _torch_function
