"""NumPy on the CPU backend: conversions, products against NumPy's matmul, semantics, errors.

Runs in CI (make test). Integer-valued float32 data makes every product exact, so the comparisons
are equalities; the random-valued cases use a float32 tolerance.
"""
import numpy as np
import pytest
import scipy.sparse as sp

import sparsek
from conftest import block_sparse_dense, dense_operand

BLOCKS = [(16, 16), (32, 32), (16, 64), (128, 32), (64, 128)]


# ---------------------------------------------------------------- conversions

@pytest.mark.parametrize("block", BLOCKS)
def test_from_dense_round_trip(rng, block):
    bm, bk = block
    A, mask = block_sparse_dense(rng, 3 * bm, 4 * bk, bm, bk, empty_rows=(1,))
    Ab = sparsek.BSRMatrix.from_dense(A, block=block)
    assert Ab.shape == A.shape and Ab.block == block
    assert Ab.nnzb == mask.sum()
    assert Ab.density == pytest.approx(mask.mean())
    assert Ab.row_ptr.dtype == np.int32 and Ab.col_idx.dtype == np.int32
    assert Ab.values.shape == (Ab.nnzb, bm, bk) and Ab.values.dtype == np.float32
    assert isinstance(Ab.values, np.ndarray)
    np.testing.assert_array_equal(Ab.row_ptr, np.concatenate([[0], np.cumsum(mask.sum(1))]))
    assert Ab.row_ptr[2] == Ab.row_ptr[1]  # the empty block row
    np.testing.assert_array_equal(Ab.to_dense(), A)


def test_from_dense_mask_keeps_zero_blocks(rng):
    A, mask = block_sparse_dense(rng, 64, 96, 32, 32)
    keep = np.ones_like(mask)  # every block, the all-zero ones too
    Ab = sparsek.BSRMatrix.from_dense(A, block=(32, 32), mask=keep)
    assert Ab.nnzb == keep.size
    np.testing.assert_array_equal(Ab.to_dense(), A)
    # A mask can also drop non-zero blocks.
    only_first = np.zeros_like(mask)
    only_first[0, 0] = True
    Af = sparsek.BSRMatrix.from_dense(A, block=(32, 32), mask=only_first)
    assert Af.nnzb == 1
    expected = np.zeros_like(A)
    expected[:32, :32] = A[:32, :32]
    np.testing.assert_array_equal(Af.to_dense(), expected)


def test_from_dense_all_zero_gives_empty_matrix():
    Ab = sparsek.BSRMatrix.from_dense(np.zeros((64, 32), np.float32), block=(16, 16))
    assert Ab.nnzb == 0 and Ab.density == 0.0
    np.testing.assert_array_equal(Ab.row_ptr, np.zeros(5, np.int32))
    np.testing.assert_array_equal(Ab.to_dense(), np.zeros((64, 32), np.float32))


def test_from_dense_float16_and_dtype_conversion(rng):
    A, _ = block_sparse_dense(rng, 64, 64, 32, 32, dtype=np.float64)
    with pytest.raises(ValueError, match="dtype float64 is not supported"):
        sparsek.BSRMatrix.from_dense(A, block=(32, 32))
    Ab = sparsek.BSRMatrix.from_dense(A, block=(32, 32), dtype=np.float16)
    assert Ab.values.dtype == np.float16
    np.testing.assert_array_equal(Ab.to_dense(), A.astype(np.float16))


@pytest.mark.parametrize("block", [(16, 16), (32, 64)])
def test_transpose(rng, block):
    bm, bk = block
    A, _ = block_sparse_dense(rng, 4 * bm, 3 * bk, bm, bk, empty_rows=(2,))
    Ab = sparsek.BSRMatrix.from_dense(A, block=block)
    At = Ab.T  # a view: products pass op = transpose
    assert isinstance(At, sparsek.BSRTranspose) and At.T is Ab
    assert At.shape == (A.shape[1], A.shape[0]) and At.block == (bk, bm) and At.nnzb == Ab.nnzb
    np.testing.assert_array_equal(At.to_dense(), A.T)
    np.testing.assert_array_equal(At.T.to_dense(), A)
    X = dense_operand(rng, A.shape[0], 5)
    np.testing.assert_array_equal(sparsek.bsr_mm(At, X), A.T @ X)
    np.testing.assert_array_equal(At @ X, A.T @ X)
    # to_bsr() builds the transpose's arrays: a valid BSR matrix by the library's own rules.
    Ac = At.to_bsr()
    sparsek.BSRMatrix(Ac.row_ptr, Ac.col_idx, Ac.values, Ac.shape)
    np.testing.assert_array_equal(Ac.to_dense(), A.T)


def test_from_scipy_bsr_csr_and_back(rng):
    A, _ = block_sparse_dense(rng, 64, 128, 16, 32)
    m = sp.bsr_array(A, blocksize=(16, 32))
    Ab = sparsek.BSRMatrix.from_scipy(m)
    assert Ab.block == (16, 32) and Ab.nnzb == m.data.shape[0]
    np.testing.assert_array_equal(Ab.to_dense(), A)
    np.testing.assert_array_equal(Ab.to_scipy().toarray(), A)
    # Another format (or another block size) needs/accepts block=.
    Ac = sparsek.BSRMatrix.from_scipy(sp.csr_array(A), block=(32, 32))
    assert Ac.block == (32, 32)
    np.testing.assert_array_equal(Ac.to_dense(), A)
    with pytest.raises(ValueError, match="needs block"):
        sparsek.BSRMatrix.from_scipy(sp.csr_array(A))


def test_from_scipy_unsorted_duplicates_and_float64(rng):
    blk = rng.integers(1, 5, size=(3, 16, 16)).astype(np.float32)
    # Block row 0 holds columns 2, 0 (unsorted) and 2 again (a duplicate, summed).
    m = sp.bsr_matrix((blk, np.array([2, 0, 2]), np.array([0, 3, 3])), shape=(32, 48))
    Ab = sparsek.BSRMatrix.from_scipy(m)
    np.testing.assert_array_equal(Ab.col_idx, [0, 2])
    np.testing.assert_array_equal(Ab.to_dense(), m.toarray())
    m64 = sp.bsr_array(np.ones((32, 32)), blocksize=(16, 16))
    with pytest.raises(ValueError, match="dtype float64 is not supported"):
        sparsek.BSRMatrix.from_scipy(m64)
    assert sparsek.BSRMatrix.from_scipy(m64, dtype=np.float32).nnzb == 4


def test_constructor_validates_with_library_messages():
    vals = np.ones((2, 16, 16), np.float32)
    ok = sparsek.BSRMatrix(np.array([0, 1, 2]), np.array([1, 0]), vals, (32, 32))  # int64 indices converted
    assert ok.row_ptr.dtype == np.int32
    with pytest.raises(ValueError, match=r"col_idx\[1\]=5 is out of range \[0, 2\)"):
        sparsek.BSRMatrix(np.array([0, 1, 2], np.int32), np.array([1, 5], np.int32), vals, (32, 32))
    with pytest.raises(ValueError, match="sorted and unique"):
        sparsek.BSRMatrix(np.array([0, 2, 2], np.int32), np.array([1, 0], np.int32), vals, (32, 32))
    with pytest.raises(ValueError, match=r"row_ptr\[0\] must be 0"):
        sparsek.BSRMatrix(np.array([1, 1, 2], np.int32), np.array([0, 0], np.int32), vals, (32, 32))
    with pytest.raises(ValueError, match="row_ptr has 2 entries, expected mb\\+1=3"):
        sparsek.BSRMatrix(np.array([0, 2], np.int32), np.array([0, 1], np.int32), vals, (32, 32))
    with pytest.raises(ValueError, match="do not fit in int32"):
        sparsek.BSRMatrix(np.array([0, 1, 2]), np.array([0, 2**40]), vals, (32, 32))


# ---------------------------------------------------------------- products

@pytest.mark.parametrize("block", BLOCKS)
@pytest.mark.parametrize("n", [1, 24, 130])
def test_bsr_mm_equals_matmul(rng, block, n):
    bm, bk = block
    A, _ = block_sparse_dense(rng, 3 * bm, 2 * bk, bm, bk, empty_rows=(0,))
    B = dense_operand(rng, A.shape[1], n)
    C = sparsek.bsr_mm(sparsek.BSRMatrix.from_dense(A, block=block), B)
    assert C.shape == (A.shape[0], n) and C.dtype == np.float32
    np.testing.assert_array_equal(C, A @ B)  # integers: exact


def test_issue_example_random_values(rng):
    A, _ = block_sparse_dense(rng, 256, 192, 32, 32, integers=False)
    B = dense_operand(rng, 192, 64, integers=False)
    C = sparsek.bsr_mm(sparsek.BSRMatrix.from_dense(A, block=(32, 32)), B)
    np.testing.assert_allclose(C, A @ B, rtol=1e-5, atol=1e-4)


def test_bsr_mm_empty_matrix_gives_zeros(rng):
    Ab = sparsek.BSRMatrix.from_dense(np.zeros((64, 32), np.float32), block=(32, 32))
    out = np.full((64, 8), np.nan, np.float32)
    C = sparsek.bsr_mm(Ab, dense_operand(rng, 32, 8), out=out)
    assert C is out
    np.testing.assert_array_equal(C, 0)


def test_alpha_beta_out_and_nan_does_not_leak(rng):
    A, _ = block_sparse_dense(rng, 64, 64, 16, 32, empty_rows=(1,))
    Ab = sparsek.BSRMatrix.from_dense(A, block=(16, 32))
    B = dense_operand(rng, 64, 40)
    C0 = dense_operand(rng, 64, 40)
    out = C0.copy()
    r = sparsek.bsr_mm(Ab, B, alpha=2.0, beta=-3.0, out=out)
    assert r is out
    np.testing.assert_array_equal(out, 2 * (A @ B) - 3 * C0)
    poisoned = np.full((64, 40), np.nan, np.float32)
    sparsek.bsr_mm(Ab, B, alpha=0.5, beta=0.0, out=poisoned)
    np.testing.assert_array_equal(poisoned, 0.5 * (A @ B))
    with pytest.raises(ValueError, match="needs out="):
        sparsek.bsr_mm(Ab, B, beta=1.0)


def test_layouts_and_read_only_inputs(rng):
    A, _ = block_sparse_dense(rng, 64, 96, 32, 32)
    Ab = sparsek.BSRMatrix.from_dense(A, block=(32, 32))
    B = dense_operand(rng, 96, 33)
    ref = A @ B
    np.testing.assert_array_equal(sparsek.bsr_mm(Ab, np.asfortranarray(B)), ref)  # column-major B
    out_f = np.asfortranarray(np.full((64, 33), np.nan, np.float32))
    sparsek.bsr_mm(Ab, B, out=out_f)  # column-major C
    np.testing.assert_array_equal(out_f, ref)
    wide = np.zeros((96, 50), np.float32)
    wide[:, :33] = B
    np.testing.assert_array_equal(sparsek.bsr_mm(Ab, wide[:, :33]), ref)  # leading dim 50
    ro = B.copy()
    ro.setflags(write=False)
    np.testing.assert_array_equal(sparsek.bsr_mm(Ab, ro), ref)
    with pytest.raises(ValueError, match="neither row- nor column-major"):
        sparsek.bsr_mm(Ab, wide[:, ::2][:, :25])
    with pytest.raises(ValueError, match="neither row- nor column-major"):
        sparsek.bsr_mm(Ab, B, out=np.zeros((64, 66), np.float32)[:, ::2])


def test_matmul_operators(rng):
    A, _ = block_sparse_dense(rng, 64, 32, 16, 16)
    Ab = sparsek.BSRMatrix.from_dense(A, block=(16, 16))
    B = dense_operand(rng, 32, 5)
    X = dense_operand(rng, 7, 64)
    np.testing.assert_array_equal(Ab @ B, A @ B)
    np.testing.assert_array_equal(X @ Ab, X @ A)


@pytest.mark.parametrize("block", [(16, 16), (32, 64), (128, 16)])
@pytest.mark.parametrize("m", [1, 45])
def test_dense_bsr_mm_equals_matmul(rng, block, m):
    bm, bk = block
    Bd, _ = block_sparse_dense(rng, 2 * bm, 3 * bk, bm, bk)
    A = dense_operand(rng, m, Bd.shape[0])
    Bb = sparsek.BSRMatrix.from_dense(Bd, block=block)
    np.testing.assert_array_equal(sparsek.dense_bsr_mm(A, Bb), A @ Bd)
    C0 = dense_operand(rng, m, Bd.shape[1])
    out = C0.copy()
    sparsek.dense_bsr_mm(A, Bb, alpha=-1.0, beta=2.0, out=out)
    np.testing.assert_array_equal(out, -(A @ Bd) + 2 * C0)
    # A product with the transpose: x @ W.T for a pruned W (op = transpose, W not copied).
    X = dense_operand(rng, m, Bd.shape[1])
    np.testing.assert_array_equal(sparsek.dense_bsr_mm(X, Bb.T), X @ Bd.T)
    np.testing.assert_array_equal(X @ Bb.T, X @ Bd.T)


@pytest.mark.parametrize("block", [(16, 16), (32, 64), (64, 32)])
def test_sampled_mm(rng, block):
    bm, bk = block
    P, mask = block_sparse_dense(rng, 3 * bm, 2 * bk, bm, bk, empty_rows=(1,))
    pattern = sparsek.BSRMatrix.from_dense(P, block=block)
    A = dense_operand(rng, P.shape[0], 40)
    B = dense_operand(rng, 40, P.shape[1])
    spy = np.kron(mask, np.ones(block, np.float32))
    R = sparsek.sampled_mm(A, B, pattern)
    assert isinstance(R, sparsek.BSRMatrix) and R.nnzb == pattern.nnzb and R.shape == pattern.shape
    assert R.row_ptr is pattern.row_ptr  # the pattern is shared, values are new
    np.testing.assert_array_equal(R.to_dense(), (A @ B) * spy)
    R2 = sparsek.sampled_mm(A, B, pattern, alpha=3.0, beta=-1.0)
    np.testing.assert_array_equal(R2.to_dense(), 3 * (A @ B) * spy - P)
    # out=: written in place (here the pattern itself: C = AB + 2C).
    before = pattern.to_dense()
    r = sparsek.sampled_mm(A, B, pattern, beta=2.0, out=pattern)
    assert r is pattern
    np.testing.assert_array_equal(pattern.to_dense(), (A @ B) * spy + 2 * before)


def test_float16_inputs(rng):
    A, _ = block_sparse_dense(rng, 64, 64, 32, 32, dtype=np.float16)
    Ab = sparsek.BSRMatrix.from_dense(A, block=(32, 32))
    B = dense_operand(rng, 64, 16, dtype=np.float16)
    C = sparsek.bsr_mm(Ab, B)
    assert C.dtype == np.float16
    ref = A.astype(np.float32) @ B.astype(np.float32)  # small integers: exact in fp16 too
    np.testing.assert_array_equal(C.astype(np.float32), ref)
    out32 = np.full((64, 16), np.nan, np.float32)  # float32 output of float16 inputs
    sparsek.bsr_mm(Ab, B, out=out32)
    np.testing.assert_array_equal(out32, ref)


# ---------------------------------------------------------------- errors

def test_bad_block_shapes():
    A = np.ones((96, 64), np.float32)
    with pytest.raises(ValueError, match="block rows bm=48 is not one of 16, 32, 64, 128"):
        sparsek.BSRMatrix.from_dense(A, block=(48, 32))
    with pytest.raises(ValueError, match="rows=96 is not a multiple of bm=64"):
        sparsek.BSRMatrix.from_dense(A, block=(64, 32))
    with pytest.raises(ValueError, match="block must be a pair"):
        sparsek.BSRMatrix.from_dense(A, block=32)
    with pytest.raises(ValueError, match="must be 2-D"):
        sparsek.BSRMatrix.from_dense(np.ones(64, np.float32), block=(16, 16))
    with pytest.raises(ValueError, match=r"mask must have shape \(mb, kb\)=\(6, 4\)"):
        sparsek.BSRMatrix.from_dense(A, block=(16, 16), mask=np.ones((4, 6), bool))


def test_product_errors_carry_library_messages(rng):
    A, _ = block_sparse_dense(rng, 64, 64, 32, 32)
    Ab = sparsek.BSRMatrix.from_dense(A, block=(32, 32))
    B = dense_operand(rng, 64, 8)
    with pytest.raises(ValueError, match="B must be 64x8 but is 32x8"):
        sparsek.bsr_mm(Ab, B[:32])
    with pytest.raises(ValueError, match="C must be 64x8 but is 64x9"):
        sparsek.bsr_mm(Ab, B, out=np.zeros((64, 9), np.float32))
    with pytest.raises(ValueError, match="B dtype float64 is not supported"):
        sparsek.bsr_mm(Ab, B.astype(np.float64))
    with pytest.raises(ValueError, match="B dtype int32 is not supported"):
        sparsek.bsr_mm(Ab, B.astype(np.int32))
    with pytest.raises(ValueError, match="B dtype f16 differs from A's f32"):
        sparsek.bsr_mm(Ab, B.astype(np.float16))
    with pytest.raises(ValueError, match="output dtype must be f32 for f32 inputs"):
        sparsek.bsr_mm(Ab, B, out=np.zeros((64, 8), np.float16))
    with pytest.raises(ValueError, match="B must be a 2-D array"):
        sparsek.bsr_mm(Ab, B[:, 0])
    with pytest.raises(ValueError, match="alpha and beta must not be NaN"):
        sparsek.bsr_mm(Ab, B, alpha=float("nan"))
    with pytest.raises(ValueError, match="A must be 32x64 but is 32x48|A must be"):
        sparsek.dense_bsr_mm(dense_operand(rng, 32, 48), Ab)
    with pytest.raises(ValueError, match="B must be 16x64 but is 8x64"):
        sparsek.sampled_mm(dense_operand(rng, 64, 16), dense_operand(rng, 8, 64), Ab)
    with pytest.raises(ValueError, match="must have the pattern's shape"):
        sparsek.sampled_mm(dense_operand(rng, 64, 16), dense_operand(rng, 16, 64), Ab,
                           out=sparsek.BSRMatrix.from_dense(A, block=(16, 16)))
    with pytest.raises(TypeError, match="must be a sparsek.BSRMatrix"):
        sparsek.bsr_mm(A, B)
    with pytest.raises(TypeError, match="NumPy array, torch tensor or CuPy array"):
        sparsek.bsr_mm(Ab, B.tolist())


def test_version():
    assert sparsek.__version__.count(".") == 2
