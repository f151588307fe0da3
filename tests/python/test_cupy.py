"""CuPy arrays on the GPU: conversions and products stay in CuPy, on CuPy's current stream.

Skipped with the reason when CuPy is not installed or no GPU answers.
"""
import numpy as np
import pytest

cp = pytest.importorskip("cupy", reason="CuPy is not installed")
from sparsek._cuda_libs import BUILT_WITH_CUDA  # noqa: E402

if not BUILT_WITH_CUDA:
    pytest.skip("sparsek was built without CUDA (SPARSEK_CUDA=OFF)", allow_module_level=True)
try:
    _ndev = cp.cuda.runtime.getDeviceCount()
except Exception as e:  # no driver / no device: CuPy raises a CUDARuntimeError
    _ndev, _why = 0, f"{type(e).__name__}: {e}"
else:
    _why = "CuPy sees no CUDA device"
if _ndev == 0:
    pytest.skip(f"no CUDA device for CuPy ({_why})", allow_module_level=True)

import sparsek  # noqa: E402
from conftest import block_sparse_dense, dense_operand  # noqa: E402


def test_conversions_and_products(rng):
    # GPU variants take f16/bf16 inputs (small integers: exact, f32 accumulation).
    A, mask = block_sparse_dense(rng, 128, 192, 32, 64, empty_rows=(2,))
    Ad = cp.asarray(A, dtype=cp.float16)
    A32 = cp.asarray(A)
    Ab = sparsek.BSRMatrix.from_dense(Ad, block=(32, 64))
    assert isinstance(Ab.values, cp.ndarray) and Ab.nnzb == mask.sum()
    cp.testing.assert_array_equal(Ab.to_dense(), Ad)
    cp.testing.assert_array_equal(Ab.T.to_dense(), Ad.T)
    B = cp.asarray(dense_operand(rng, 192, 40), dtype=cp.float16)
    C = sparsek.bsr_mm(Ab, B, out=cp.empty((128, 40), cp.float32))
    assert isinstance(C, cp.ndarray)
    cp.testing.assert_array_equal(C, A32 @ B.astype(cp.float32))
    X = cp.asarray(dense_operand(rng, 9, 128), dtype=cp.float16)
    D = sparsek.dense_bsr_mm(X, Ab, out=cp.empty((9, 192), cp.float32))
    cp.testing.assert_array_equal(D, X.astype(cp.float32) @ A32)
    P = sparsek.sampled_mm(cp.asarray(dense_operand(rng, 128, 16), dtype=cp.float16),
                           cp.asarray(dense_operand(rng, 16, 192), dtype=cp.float16), Ab)
    assert isinstance(P.values, cp.ndarray) and P.values.dtype == cp.float16
    # f32 inputs on the GPU: a clear NotImplementedError (tensor-core variants only).
    with pytest.raises(NotImplementedError, match="f32 inputs"):
        sparsek.bsr_mm(sparsek.BSRMatrix.from_dense(A32, block=(32, 64)), B.astype(cp.float32))


def test_half_inputs_and_stream(rng):
    A, _ = block_sparse_dense(rng, 256, 256, 64, 64)
    Ab = sparsek.BSRMatrix.from_dense(cp.asarray(A, dtype=cp.float16), block=(64, 64))
    B = cp.asarray(dense_operand(rng, 256, 128), dtype=cp.float16)
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        out = cp.empty((256, 128), cp.float32)
        sparsek.bsr_mm(Ab, B, out=out)
        got = out * 1  # ordered after the product only if it ran on s
    s.synchronize()
    cp.testing.assert_array_equal(got, cp.asarray(A) @ B.astype(cp.float32))


def test_errors(rng):
    A, _ = block_sparse_dense(rng, 64, 64, 32, 32)
    Ab = sparsek.BSRMatrix.from_dense(cp.asarray(A), block=(32, 32))
    with pytest.raises(ValueError, match="B dtype float64 is not supported"):
        sparsek.bsr_mm(Ab, cp.ones((64, 8)))
    with pytest.raises(ValueError, match="neither row- nor column-major"):
        sparsek.bsr_mm(Ab, cp.ones((64, 16), cp.float32)[:, ::2])
    with pytest.raises(TypeError, match="numpy array but a is a cupy array"):
        sparsek.bsr_mm(Ab, np.ones((64, 8), np.float32))
    with pytest.raises(ValueError, match=r"col_idx\[0\]=9 is out of range"):
        sparsek.BSRMatrix(cp.asarray([0, 1, 1], cp.int32), cp.asarray([9], cp.int32),
                          cp.ones((1, 32, 32), cp.float32), (64, 64))
