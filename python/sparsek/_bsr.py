"""BSRMatrix: a block-sparse matrix whose arrays live in the framework (and on the device) they came from.

Layout: row_ptr int32 [mb+1], col_idx int32 [nnzb], values [nnzb, bm, bk], each block
row-major; the matrix is (mb*bm) x (kb*bk). An e4m3 (fp8) matrix also holds scales float32 [nnzb]
(one per stored block; values are the codes: see _fp8.py). Conversions (dense <-> BSR, transpose) run in the
array's own framework, so they work on the GPU too; the BSR invariants are checked by the library
(sparsek::validate) when a matrix is built from user arrays.
"""
import numpy as np

from . import _arrays as A
from . import _fp8
from . import _sparsek as _ext

_INT32_MAX = 2**31 - 1


def _block_arg(block):
    return A.pair(block, "block", A.INT32_MAX)  # the library keeps bm, bk in an int


def _as_int32(x, name):
    """Index arrays are int32 in sparsek; other integer arrays are converted when the values fit."""
    dt = A.dtype_name(x)
    if dt == "int32":
        return x
    if not (dt.startswith("int") or dt.startswith("uint")):
        raise ValueError(f"{name} must hold integers, got dtype {dt}")
    if A.is_torch(x):
        y = x.to(A.torch.int32)
        fits = bool((y.to(x.dtype) == x).all()) if x.numel() else True
    else:
        y = x.astype(A.xp(x).int32)
        fits = bool((y == x).all()) if x.size else True
    if not fits:
        raise ValueError(f"{name} holds values that do not fit in int32")
    return y


def _contiguous(x):
    if A.is_torch(x):
        return x.contiguous()
    return A.xp(x).ascontiguousarray(x)


class BSRMatrix:
    """A block-sparse (BSR) matrix.

    Build one with ``BSRMatrix.from_dense``, ``from_torch``, ``from_scipy`` or from its three arrays
    ``BSRMatrix(row_ptr, col_idx, values, shape)`` (validated: a bad pattern raises ValueError with
    the library's message naming the array, the index and the value).

    fp8: ``quantize()`` gives the e4m3 matrix (values: the codes, a torch float8_e4m3fn tensor or a
    uint8 array; ``scales``: float32 (nnzb,), one per block), ``dequantize()`` the float one back;
    ``BSRMatrix(row_ptr, col_idx, codes, shape, scales=scales)`` builds one from its arrays.
    """

    # NumPy: make `ndarray @ BSRMatrix` defer to __rmatmul__ instead of building an object array.
    __array_ufunc__ = None

    def __init__(self, row_ptr, col_idx, values, shape, *, scales=None, check=True):
        # check=False (internal: arrays built by sparsek itself) keeps this traceable by torch.compile.
        check = A.flag(check, "check")
        if check:
            rows, cols = A.pair(shape, "shape")
        else:
            rows, cols = shape
        if check:
            A.same_framework([("row_ptr", row_ptr), ("col_idx", col_idx), ("values", values)])
            row_ptr = _contiguous(_as_int32(row_ptr, "row_ptr"))
            col_idx = _contiguous(_as_int32(col_idx, "col_idx"))
            if scales is None and _fp8.is_fp8(values):
                raise ValueError(f"values dtype {A.dtype_name(values)} holds e4m3 codes: pass their scales= "
                                 "(float32, one per stored block), or make the matrix with quantize()")
            if scales is None or not _fp8.is_fp8(values):
                A.check_value_dtype(values, "values")  # (scales beside float values: the library says)
            values = _contiguous(values)
            if scales is not None:
                A.same_framework([("values", values), ("scales", scales)])
                scales = _contiguous(scales)
            # All BSR invariants, incl. the O(nnzb) index checks (once, here; products skip them).
            # torch refuses DLPack export of tensors that require grad: validate detached views.
            det = (lambda t: t.detach()) if A.is_torch(values) else (lambda t: t)
            _ext.validate_bsr(rows, cols, det(row_ptr), det(col_idx), _fp8.codes(values), True,
                              A.stream_of(values), None if scales is None else det(scales))
        self.row_ptr = row_ptr
        self.col_idx = col_idx
        self.values = values
        self.scales = scales
        self.shape = (rows, cols)

    # ---- properties ----
    @property
    def block(self):
        """(bm, bk)."""
        return (int(self.values.shape[1]), int(self.values.shape[2]))

    @property
    def nnzb(self):
        """Number of stored blocks."""
        return int(self.values.shape[0])

    @property
    def dtype(self):
        return self.values.dtype

    @property
    def density(self):
        """Stored blocks / all block positions."""
        bm, bk = self.block
        total = (self.shape[0] // bm) * (self.shape[1] // bk)
        return self.nnzb / total if total else 0.0

    @property
    def T(self):
        """The transpose as a view: products pass op = transpose to the library (nothing is copied).
        ``.T.to_bsr()`` builds the BSR arrays of the transpose."""
        return BSRTranspose(self)

    # ---- fp8 (e4m3) ----
    @property
    def is_fp8(self):
        """Whether the values are e4m3 codes with per-block scales."""
        return self.scales is not None

    def quantize(self):
        """The e4m3 matrix: per stored block, scale = amax / 448 and the values' codes (rounded to
        nearest even, saturating; a zero block gets scale 0). Same pattern arrays, same framework
        and device. NaN or inf values: ValueError naming the element (on a GPU: a NaN scale, which
        the products refuse)."""
        return _fp8.quantize_bsr(self)

    def dequantize(self, dtype=None):
        """The float matrix of an e4m3 one: scale * code, as float32 (or ``dtype``)."""
        return _fp8.dequantize_bsr(self, dtype)

    # ---- device and dtype (torch matrices; NumPy ones live on the host) ----
    @property
    def device(self):
        """Where the arrays live: a torch.device, a CuPy Device, or "cpu" for NumPy."""
        fw = A.framework(self.values)
        return "cpu" if fw == "numpy" else self.values.device

    def to(self, *args, **kwargs):
        """A copy on another device and/or with another values dtype, as ``torch.Tensor.to``
        (torch matrices only; the index arrays keep int32). Returns self when nothing changes."""
        if not A.is_torch(self.values):
            raise TypeError(f"to() needs a matrix whose arrays are torch tensors, this one holds "
                            f"{A.framework(self.values)} arrays")
        values = self.values.to(*args, **kwargs)
        if values is self.values:
            return self
        if self.scales is not None:
            if values.dtype != self.values.dtype:
                raise ValueError(f"to(): an e4m3 matrix changes dtype through dequantize(dtype) (asked for "
                                 f"{A.dtype_name(values)})")
            return BSRMatrix(self.row_ptr.to(device=values.device), self.col_idx.to(device=values.device),
                             values, self.shape, scales=self.scales.to(device=values.device), check=False)
        if values.dtype not in (A.torch.float32, A.torch.float16, A.torch.bfloat16):
            raise ValueError(f"to(): values dtype {A.dtype_name(values)} is not supported ({A.SUPPORTED})")
        row_ptr = self.row_ptr.to(device=values.device)
        col_idx = self.col_idx.to(device=values.device)
        return BSRMatrix(row_ptr, col_idx, values, self.shape, check=False)

    def cuda(self, device=None):
        """``to(cuda device)``."""
        return self.to(A.torch.device("cuda") if device is None else
                       A.torch.device("cuda", device) if isinstance(device, int) else device)

    def cpu(self):
        """``to("cpu")`` for torch matrices; a NumPy matrix is returned as it is."""
        if A.framework(self.values) == "numpy":
            return self
        return self.to("cpu")

    def __repr__(self):
        fw = A.framework(self.values)
        dev = f", device={self.values.device}" if fw != "numpy" else ""
        dt = "e4m3 (per-block scales)" if self.scales is not None else A.dtype_name(self.values)
        return (f"BSRMatrix(shape={self.shape}, block={self.block}, nnzb={self.nnzb}, "
                f"density={self.density:.4g}, dtype={dt}, {fw}{dev})")

    # ---- conversions ----
    @classmethod
    def from_dense(cls, array, block, mask=None, *, dtype=None):
        """Cut a dense 2-D array into (bm, bk) blocks.

        mask: a (mb, kb) array of booleans (NumPy or the array's framework) choosing the stored
        blocks; without it every block holding a non-zero is stored. dtype: convert the values
        (e.g. float64 NumPy data to float32); sparsek computes in float32, float16 and bfloat16;
        ``dtype="e4m3"`` quantizes the stored blocks (``quantize()``).
        """
        if isinstance(dtype, str) and dtype == "e4m3":
            return cls.from_dense(array, block, mask).quantize()
        fw = A.framework(array, "array")
        if array.ndim != 2:
            raise ValueError(f"array must be 2-D, got shape {A.shape_of(array)}")
        bm, bk = _block_arg(block)
        rows, cols = A.shape_of(array)
        _ext.check_block_shape(rows, cols, bm, bk)  # the library's messages for bad block shapes
        if dtype is not None:
            array = array.to(dtype) if fw == "torch" else array.astype(dtype)
        A.check_value_dtype(array, "array")
        mb, kb = rows // bm, cols // bk
        if fw == "torch":
            torch = A.torch
            blocks = array.reshape(mb, bm, kb, bk).permute(0, 2, 1, 3)  # (mb, kb, bm, bk)
            if mask is None:
                mask = (blocks != 0).flatten(2).any(-1)
            else:
                mask = torch.as_tensor(mask, device=array.device) != 0
            _check_mask(mask, mb, kb)
            r, c = torch.nonzero(mask, as_tuple=True)  # row-major order: sorted by row, then column
            row_ptr = torch.zeros(mb + 1, dtype=torch.int32, device=array.device)
            row_ptr[1:] = torch.cumsum(mask.sum(1), 0)
            values = blocks[r, c].contiguous()  # (nnzb, bm, bk)
            col_idx = c.to(torch.int32)
        else:
            xp = A.xp(array)
            blocks = array.reshape(mb, bm, kb, bk).transpose(0, 2, 1, 3)  # (mb, kb, bm, bk)
            if mask is None:
                mask = (blocks != 0).any(axis=(2, 3))
            else:
                mask = xp.asarray(mask) != 0
            _check_mask(mask, mb, kb)
            r, c = xp.nonzero(mask)  # row-major order: sorted by row, then column
            row_ptr = xp.zeros(mb + 1, dtype=xp.int32)
            row_ptr[1:] = xp.cumsum(mask.sum(axis=1))
            values = xp.ascontiguousarray(blocks[r, c])  # (nnzb, bm, bk)
            col_idx = c.astype(xp.int32)
        return cls(row_ptr, col_idx, values, (rows, cols), check=False)

    def to_dense(self):
        """The dense (rows x cols) array, in the values' framework and on their device (an e4m3
        matrix: its dequantized float32 values)."""
        if self.scales is not None:
            return self.dequantize().to_dense()
        rows, cols = self.shape
        bm, bk = self.block
        mb, kb = rows // bm, cols // bk
        block_row = _block_rows(self)
        if A.is_torch(self.values):
            out = A.torch.zeros((mb, kb, bm, bk), dtype=self.values.dtype, device=self.values.device)
            out[block_row, self.col_idx.long()] = self.values
            return out.permute(0, 2, 1, 3).reshape(rows, cols)
        xp = A.xp(self.values)
        out = xp.zeros((mb, kb, bm, bk), dtype=self.values.dtype)
        out[block_row, self.col_idx] = self.values
        return out.transpose(0, 2, 1, 3).reshape(rows, cols)

    @classmethod
    def from_torch(cls, t):
        """From a 2-D torch ``sparse_bsr`` tensor (any index dtype; values are not copied when
        already contiguous and the indices are int32)."""
        torch = A.torch
        if torch is None or not isinstance(t, torch.Tensor):
            raise TypeError(f"from_torch expects a torch sparse_bsr tensor, got {type(t).__name__}")
        if t.layout != torch.sparse_bsr:
            raise ValueError(f"from_torch expects layout torch.sparse_bsr, got {t.layout} "
                             "(use BSRMatrix.from_dense for dense tensors)")
        if t.dim() != 2 or t.values().dim() != 3:
            raise ValueError(f"only 2-D BSR tensors without batch or dense dimensions are supported, "
                             f"got shape {tuple(t.shape)} with values of shape {tuple(t.values().shape)}")
        values = t.values()
        # NOTE: values() is a view whose base is the sparse tensor; torch.compile cannot fake such
        # a view. A plain tensor over the same storage shares the data without being a view.
        plain = torch.empty(0, dtype=values.dtype, device=values.device)
        plain.set_(values.untyped_storage(), values.storage_offset(), values.shape, values.stride())
        return cls(t.crow_indices(), t.col_indices(), plain, tuple(t.shape))

    def to_torch(self):
        """A torch ``sparse_bsr`` tensor sharing this matrix's arrays (torch matrices only)."""
        if not A.is_torch(self.values):
            raise TypeError("to_torch needs a matrix whose arrays are torch tensors")
        if self.scales is not None:
            raise ValueError("to_torch: a torch sparse_bsr tensor holds no block scales; dequantize() first")
        # torch warns unless told whether to check the invariants: the pattern was validated when
        # this matrix was made, so it is not checked again (and torch says nothing).
        return A.torch.sparse_bsr_tensor(self.row_ptr, self.col_idx, self.values, size=self.shape,
                                         check_invariants=False)

    @classmethod
    def from_scipy(cls, m, block=None, *, dtype=None):
        """From a SciPy sparse matrix/array. A BSR one keeps its block size unless ``block`` is given;
        any other format needs ``block``. Duplicates are summed and columns sorted (on a copy)."""
        import scipy.sparse as sp

        if not sp.issparse(m):
            raise TypeError(f"from_scipy expects a SciPy sparse matrix or array, got {type(m).__name__}")
        if m.ndim != 2:
            raise ValueError(f"from_scipy expects a 2-D matrix, got shape {m.shape}")
        rows, cols = (int(s) for s in m.shape)
        if block is None:
            if m.format != "bsr":
                raise ValueError(f"a SciPy {m.format} matrix needs block=(bm, bk)")
            block = m.blocksize
        bm, bk = _block_arg(block)
        _ext.check_block_shape(rows, cols, bm, bk)
        if m.format != "bsr" or tuple(m.blocksize) != (bm, bk):
            m = m.tobsr(blocksize=(bm, bk))
        else:
            m = m.copy()
        m.sum_duplicates()  # also sorts the columns of every block row
        values = m.data if dtype is None else m.data.astype(dtype)
        return cls(m.indptr, m.indices, values, (rows, cols))

    def to_scipy(self):
        """A SciPy ``bsr_array`` (NumPy matrices only)."""
        import scipy.sparse as sp

        if A.framework(self.values) != "numpy":
            raise TypeError("to_scipy needs a matrix whose arrays are NumPy arrays")
        if self.scales is not None:
            raise ValueError("to_scipy: a SciPy matrix holds no block scales; dequantize() first")
        return sp.bsr_array((self.values, self.col_idx, self.row_ptr), shape=self.shape,
                            blocksize=self.block)

    # `BSRMatrix @ dense` and `dense @ BSRMatrix` are attached in _ops.py, next to the products.


def _check_mask(mask, mb, kb):
    if A.shape_of(mask) != (mb, kb):
        raise ValueError(f"mask must have shape (mb, kb)=({mb}, {kb}), got {A.shape_of(mask)}")


def _block_rows(a):
    """Block row of every stored block (int64 [nnzb]); static size, no host sync."""
    if A.is_torch(a.values):
        torch = A.torch
        ids = torch.arange(a.nnzb, dtype=torch.int64, device=a.values.device)
        return torch.searchsorted(a.row_ptr[1:].long(), ids, right=True)
    xp = A.xp(a.values)
    return xp.searchsorted(a.row_ptr[1:], xp.arange(a.nnzb), side="right")


class BSRTranspose:
    """``A.T`` of a BSRMatrix: the transpose as a view. Products (``bsr_mm``, ``dense_bsr_mm``,
    ``@``) pass op = transpose to the library, so ``x @ W.T`` never transposes W's arrays;
    ``to_bsr()`` builds the transpose's own BSR arrays (a copy)."""

    __array_ufunc__ = None  # NumPy: `ndarray @ view` defers to __rmatmul__

    def __init__(self, base):
        self.base = base

    @property
    def shape(self):
        return (self.base.shape[1], self.base.shape[0])

    @property
    def block(self):
        bm, bk = self.base.block
        return (bk, bm)

    @property
    def nnzb(self):
        return self.base.nnzb

    @property
    def dtype(self):
        return self.base.dtype

    @property
    def scales(self):
        return self.base.scales

    @property
    def is_fp8(self):
        return self.base.is_fp8

    @property
    def density(self):
        return self.base.density

    @property
    def device(self):
        return self.base.device

    @property
    def T(self):
        return self.base

    def to(self, *args, **kwargs):
        return BSRTranspose(self.base.to(*args, **kwargs))

    def cuda(self, device=None):
        return BSRTranspose(self.base.cuda(device))

    def cpu(self):
        return BSRTranspose(self.base.cpu())

    def to_dense(self):
        return self.base.to_dense().T

    def to_bsr(self):
        """The BSR matrix of the transpose (block shape (bk, bm)), built in the arrays' framework."""
        return _transpose(self.base)

    def __repr__(self):
        return f"{self.base!r}.T"


def _transpose(a):
    rows, cols = a.shape
    bm, bk = a.block
    mb, kb = rows // bm, cols // bk
    block_row = _block_rows(a)
    if A.is_torch(a.values):
        torch = A.torch
        col = a.col_idx.long()
        order = torch.argsort(col * mb + block_row)  # keys are unique: (col, row) order
        sorted_cols = col[order]
        ids = torch.arange(kb + 1, dtype=torch.int64, device=a.values.device)
        row_ptr = torch.searchsorted(sorted_cols, ids).to(torch.int32)
        col_idx = block_row[order].to(torch.int32)
        v = a.values if a.scales is None else _fp8.codes(a.values)  # (indexing is defined for uint8)
        values = v[order].transpose(1, 2).contiguous().view(a.values.dtype)  # (nnzb, bk, bm)
    else:
        xp = A.xp(a.values)
        col = a.col_idx.astype(xp.int64)
        order = xp.argsort(col * mb + block_row)
        sorted_cols = col[order]
        row_ptr = xp.searchsorted(sorted_cols, xp.arange(kb + 1), side="left").astype(xp.int32)
        col_idx = block_row[order].astype(xp.int32)
        values = xp.ascontiguousarray(a.values[order].transpose(0, 2, 1))
    scales = None if a.scales is None else a.scales[order]  # e4m3: each block keeps its scale
    return BSRMatrix(row_ptr, col_idx, values, (cols, rows), scales=scales, check=False)
