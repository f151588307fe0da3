"""Shared helpers for the Python suite: block-sparse dense matrices with a known pattern."""
import numpy as np
import pytest


def torch_cuda():
    """(usable, why not): whether torch's CUDA tensors can reach sparsek's GPU backends here. Needs a
    sparsek built with CUDA (a CPU-only build refuses CUDA tensors) and a GPU that torch sees."""
    import torch
    from sparsek._cuda_libs import BUILT_WITH_CUDA
    if not BUILT_WITH_CUDA:
        return False, "sparsek was built without CUDA (SPARSEK_CUDA=OFF)"
    if not torch.cuda.is_available():
        return False, "no CUDA device (torch.cuda.is_available() is False)"
    return True, "a CUDA device answers"


def block_sparse_dense(rng, rows, cols, bm, bk, density=0.4, integers=True, dtype=np.float32,
                       empty_rows=()):
    """A dense (rows x cols) matrix whose (bm x bk) blocks are non-zero with probability `density`.

    Returns (dense, mask). Stored blocks hold integers in [-4, 4] with no zero block (so products in
    float32 are exact and from_dense keeps exactly the masked blocks); block rows in `empty_rows`
    hold nothing.
    """
    mb, kb = rows // bm, cols // bk
    mask = rng.random((mb, kb)) < density
    for r in empty_rows:
        mask[r] = False
    if integers:
        vals = rng.integers(-4, 5, size=(rows, cols)).astype(np.float32)
    else:
        vals = rng.standard_normal((rows, cols)).astype(np.float32)
    # Never an all-zero stored block: one fixed non-zero corner per block.
    vals[::bm, ::bk] = np.where(vals[::bm, ::bk] == 0, 1.0, vals[::bm, ::bk])
    dense = vals * np.kron(mask, np.ones((bm, bk), dtype=np.float32))
    return dense.astype(dtype), mask


def dense_operand(rng, rows, cols, integers=True, dtype=np.float32):
    if integers:
        return rng.integers(-4, 5, size=(rows, cols)).astype(dtype)
    return rng.standard_normal((rows, cols)).astype(dtype)


@pytest.fixture
def rng():
    return np.random.default_rng(1234)
