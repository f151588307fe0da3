"""fp8 (e4m3): quantization of BSR matrices and dense arrays, the e4m3 products (NumPy on the CPU
backend; torch on the CPU and, with a Hopper GPU, on CUDA), the torch custom ops under
torch.compile, BlockSparseLinear.to_fp8(), and the named errors of bad scales.

Exact checks use integer-valued operands whose block (token) maximum is 448, so that every scale is
exactly 1 and every value is an e4m3 code: the products are then exact in fp32.
"""
import numpy as np
import pytest

import sparsek
from conftest import block_sparse_dense, torch_cuda

E4M3_MAX = 448.0


def code_value(code):
    """The value of an e4m3 code, from the format's definition."""
    code = int(code)
    sign, exp, mant = code >> 7, (code >> 3) & 15, code & 7
    if exp == 15 and mant == 7:
        return float("nan")
    mag = mant * 2.0 ** -9 if exp == 0 else (1 + mant / 8) * 2.0 ** (exp - 7)
    return -mag if sign else mag


def decode(codes):
    table = np.array([code_value(c) for c in range(256)], dtype=np.float64)
    return table[np.asarray(codes, dtype=np.uint8)]


def exact_bsr(rng, rows, cols, block, density=0.5):
    """A dense matrix of e4m3-exact integers whose stored blocks each hold a 448 (scale exactly 1)."""
    bm, bk = block
    dense, mask = block_sparse_dense(rng, rows, cols, bm, bk, density=density)
    dense[::bm, ::bk] = np.where(mask, E4M3_MAX, 0)
    return dense, mask


def exact_dense(rng, rows, cols, per="row"):
    """Integers in [-4, 4] with 448 in each row (per="row") or column: every token's scale is 1."""
    x = rng.integers(-4, 5, size=(rows, cols)).astype(np.float32)
    if per == "row":
        x[:, 0] = E4M3_MAX
    else:
        x[0, :] = E4M3_MAX
    return x


# ---------------------------------------------------------------- quantization (NumPy)

def test_bsr_quantize_scales_codes_and_dequantize(rng):
    dense, mask = block_sparse_dense(rng, 64, 96, 16, 32, integers=False)
    dense *= np.float32(3.7)
    A = sparsek.BSRMatrix.from_dense(dense, block=(16, 32))
    Q = A.quantize()
    assert Q.is_fp8 and not A.is_fp8
    assert Q.values.dtype == np.uint8 and Q.values.shape == A.values.shape
    assert Q.scales.dtype == np.float32 and Q.scales.shape == (A.nnzb,)
    assert Q.row_ptr is A.row_ptr and Q.col_idx is A.col_idx
    amax = np.abs(A.values).max(axis=(1, 2))
    np.testing.assert_array_equal(Q.scales, (amax / np.float32(E4M3_MAX)).astype(np.float32))
    assert (np.abs(decode(Q.values)).max(axis=(1, 2)) == E4M3_MAX).all()  # each block reaches the top
    D = Q.dequantize()
    assert D.values.dtype == np.float32
    want = (Q.scales[:, None, None] * decode(Q.values).astype(np.float32)).astype(np.float32)
    np.testing.assert_array_equal(D.values, want)
    # Within half an e4m3 step of the original.
    err = np.abs(D.values - A.values)
    bound = np.maximum(np.abs(A.values) / 16, Q.scales[:, None, None] * 2.0 ** -10) * 1.000001
    assert (err <= bound).all()
    np.testing.assert_array_equal(Q.to_dense(), D.to_dense())
    assert "e4m3" in repr(Q)


def test_zero_block_gets_scale_zero():
    dense = np.zeros((32, 32), np.float32)
    A = sparsek.BSRMatrix.from_dense(dense, block=(16, 16), mask=np.ones((2, 2), bool))
    Q = A.quantize()
    np.testing.assert_array_equal(Q.scales, np.zeros(4, np.float32))
    assert not Q.values.any()


def test_quantize_refuses_non_finite_on_the_host():
    dense = np.ones((32, 32), np.float32)
    dense[17, 3] = np.nan
    A = sparsek.BSRMatrix.from_dense(dense, block=(16, 16))
    with pytest.raises(ValueError, match=r"values\[block 2, row 1, col 3\]=nan is not finite"):
        A.quantize()
    x = np.ones((4, 8), np.float32)
    x[1, 2] = np.inf
    with pytest.raises(ValueError, match=r"in\(1, 2\)=inf is not finite"):
        sparsek.quantize_e4m3(x)


@pytest.mark.parametrize("per", ["row", "col"])
@pytest.mark.parametrize("group", [0, 128])
def test_dense_quantize_matches_the_rule(rng, per, group):
    x = (rng.standard_normal((37, 300)) * 5).astype(np.float32)
    x[4] = 0
    codes, scales = sparsek.quantize_e4m3(x, per=per, group=group)
    assert codes.dtype == np.uint8 and codes.shape == x.shape
    tokens, k = (37, 300) if per == "row" else (300, 37)
    assert scales.shape == ((tokens,) if group == 0 else (tokens, (k + 127) // 128))
    xt = x if per == "row" else x.T
    g = k if group == 0 else 128
    for t in range(0, tokens, 7):
        for j in range(0, (k + g - 1) // g):
            part = xt[t, j * g:(j + 1) * g]
            s = scales[t] if group == 0 else scales[t, j]
            assert s == np.float32(np.abs(part).max() / np.float32(E4M3_MAX))
    back = sparsek.dequantize_e4m3(codes, scales, per=per)
    assert back.dtype == np.float32
    s_full = scales[:, None] if group == 0 else np.repeat(scales, 128, axis=1)[:, :k]
    want = (s_full * decode(codes if per == "row" else codes.T)).astype(np.float32)
    np.testing.assert_array_equal(back if per == "row" else back.T, want)


def test_dense_quantize_arguments():
    x = np.ones((4, 8), np.float32)
    with pytest.raises(ValueError, match="per must be 'row'"):
        sparsek.quantize_e4m3(x, per="token")
    with pytest.raises(ValueError, match="group must be 0"):
        sparsek.quantize_e4m3(x, group=64)
    with pytest.raises(ValueError, match="2-D"):
        sparsek.quantize_e4m3(np.ones(8, np.float32))
    with pytest.raises(ValueError, match="dtype int32 is not supported"):
        sparsek.quantize_e4m3(np.ones((4, 8), np.int32))


# ---------------------------------------------------------------- products (NumPy, CPU backend)

@pytest.mark.parametrize("block", [(16, 16), (32, 64), (64, 32), (128, 128)])
@pytest.mark.parametrize("trans", [False, True])
def test_bsr_mm_fp8_exact(rng, block, trans):
    bm, bk = block
    dense, _ = exact_bsr(rng, 2 * bm, 3 * bk, block)
    W = sparsek.BSRMatrix.from_dense(dense, block=block).quantize()
    np.testing.assert_array_equal(W.scales, np.ones(W.nnzb, np.float32))
    A = W.T if trans else W
    K = dense.shape[0] if trans else dense.shape[1]
    b = exact_dense(rng, K, 11, per="col")
    bq, bs = sparsek.quantize_e4m3(b, per="col")
    np.testing.assert_array_equal(bs, np.ones(11, np.float32))
    ref = (dense.T if trans else dense).astype(np.float64) @ b.astype(np.float64)
    c = sparsek.bsr_mm(A, bq, b_scales=bs, alpha=2.0)
    assert c.dtype == np.float32
    np.testing.assert_array_equal(c, (2 * ref).astype(np.float32))
    c16 = sparsek.bsr_mm(A, bq, b_scales=bs, alpha=2.0 ** -10, out_dtype=np.float16)  # (448^2 > f16's range)
    assert c16.dtype == np.float16
    np.testing.assert_array_equal(c16, (ref / 1024).astype(np.float16))


@pytest.mark.parametrize("group", [0, 128])
def test_dense_bsr_mm_fp8_x_at_w_t(rng, group):
    dense, _ = exact_bsr(rng, 96, 320, (32, 64))
    W = sparsek.BSRMatrix.from_dense(dense, block=(32, 64)).quantize()
    x = exact_dense(rng, 9, 320, per="row")
    if group:
        x[:, 128] = x[:, 256] = E4M3_MAX  # every 128-wide group of every row holds the maximum
    xq, xs = sparsek.quantize_e4m3(x, per="row", group=group)
    y = sparsek.dense_bsr_mm(xq, W.T, a_scales=xs)
    np.testing.assert_array_equal(y, (x.astype(np.float64) @ dense.T.astype(np.float64)).astype(np.float32))
    # beta with out=
    out = np.full((9, 96), 3.0, np.float32)
    r = sparsek.dense_bsr_mm(xq, W.T, a_scales=xs, beta=-1.0, out=out)
    assert r is out
    np.testing.assert_array_equal(out, (x.astype(np.float64) @ dense.T - 3).astype(np.float32))


def test_real_valued_products_are_close(rng):
    dense, _ = block_sparse_dense(rng, 128, 256, 64, 64, integers=False)
    A = sparsek.BSRMatrix.from_dense(dense, block=(64, 64))
    W = A.quantize()
    b = rng.standard_normal((256, 40)).astype(np.float32)
    bq, bs = sparsek.quantize_e4m3(b, per="col", group=128)
    ref = W.to_dense().astype(np.float64) @ sparsek.dequantize_e4m3(bq, bs, per="col").astype(np.float64)
    c = sparsek.bsr_mm(W, bq, b_scales=bs)
    assert np.abs(c - ref).max() <= 1e-4 * np.abs(ref).max()


def test_fp8_errors_name_the_arguments(rng):
    dense, _ = exact_bsr(rng, 64, 64, (32, 32))
    A = sparsek.BSRMatrix.from_dense(dense, block=(32, 32))
    W = A.quantize()
    b = exact_dense(rng, 64, 8, per="col")
    bq, bs = sparsek.quantize_e4m3(b, per="col")
    with pytest.raises(ValueError, match="B dtype f32 differs from A's e4m3"):
        sparsek.bsr_mm(W, b)
    with pytest.raises(ValueError, match="B scales is given but B is f32"):
        sparsek.bsr_mm(W, b, b_scales=bs)
    with pytest.raises(ValueError, match="B scales is null but B is e4m3"):
        sparsek.bsr_mm(W, bq)
    with pytest.raises(ValueError, match=r"B scales must have shape \(8,\)"):
        sparsek.bsr_mm(W, bq, b_scales=bs[:7])
    bad = bs.copy()
    bad[5] = -2.0
    with pytest.raises(ValueError, match=r"B scales\[5\]=-2 is negative"):
        sparsek.bsr_mm(W, bq, b_scales=bad)
    bad[5] = np.nan
    with pytest.raises(ValueError, match=r"B scales\[5\]=nan is not finite"):
        sparsek.bsr_mm(W, bq, b_scales=bad)
    ws = W.scales.copy()
    ws[0] = np.inf
    W2 = sparsek.BSRMatrix(W.row_ptr, W.col_idx, W.values, W.shape, scales=ws, check=False)
    with pytest.raises(ValueError, match=r"A \(sparse\) scales\[0\]=inf is not finite"):
        sparsek.bsr_mm(W2, bq, b_scales=bs)
    with pytest.raises(ValueError, match=r"scales\[0\]=inf is not finite"):
        sparsek.BSRMatrix(W.row_ptr, W.col_idx, W.values, W.shape, scales=ws)
    with pytest.raises(ValueError, match="holds e4m3 codes: pass their scales="):
        sparsek.BSRMatrix(W.row_ptr, W.col_idx, W.values, W.shape)
    with pytest.raises(ValueError, match="scales is given but the values are f32"):
        sparsek.BSRMatrix(A.row_ptr, A.col_idx, A.values, A.shape, scales=W.scales)
    with pytest.raises(ValueError, match="out_dtype=.* is for e4m3 products"):
        sparsek.bsr_mm(A, b, out_dtype=np.float16)
    with pytest.raises(NotImplementedError, match="sdd does not take e4m3"):
        sparsek.sampled_mm(np.ones((64, 16), np.float32), np.ones((16, 64), np.float32), W)
    with pytest.raises(ValueError, match="quantize\\(\\): the matrix is e4m3 already"):
        W.quantize()
    with pytest.raises(ValueError, match="dequantize\\(\\): the matrix is float32, not e4m3"):
        A.dequantize()


def test_transpose_keeps_each_blocks_scale(rng):
    dense, _ = block_sparse_dense(rng, 64, 96, 16, 32, integers=False)
    W = sparsek.BSRMatrix.from_dense(dense, block=(16, 32)).quantize()
    Wt = W.T.to_bsr()
    assert Wt.is_fp8
    np.testing.assert_array_equal(Wt.to_dense(), W.to_dense().T)
    F = sparsek.BSRMatrix.from_dense(dense, block=(16, 32), dtype="e4m3")
    np.testing.assert_array_equal(F.values, W.values)
    np.testing.assert_array_equal(F.scales, W.scales)


# ---------------------------------------------------------------- torch

def _torch():
    return pytest.importorskip("torch", reason="torch is not installed")


def _hopper():
    torch = _torch()
    return torch_cuda()[0] and torch.cuda.get_device_capability() == (9, 0)


@pytest.fixture(params=["cpu", "cuda"])
def device(request):
    torch = _torch()
    if request.param == "cuda" and not _hopper():
        pytest.skip("fp8 products on CUDA need a Hopper (sm_90) GPU and its fp8 kernel")
    return torch.device(request.param)


def test_torch_quantize_products_and_compile(rng, device):
    torch = _torch()
    dense, _ = exact_bsr(rng, 128, 256, (64, 64))
    # fp8 tensor cores add products with less than fp32's precision (about 2^-11 of the largest term
    # here), so an exact f32 result needs small partial sums: the 448 anchors that fix the scales at 1
    # only ever meet zeros (x's anchor sits in a column W leaves empty, x is zero where W's anchors are).
    dense[:, 1] = 0
    x = exact_dense(rng, 24, 256, per="row")
    x[:, 1] = E4M3_MAX
    x[:, ::64] = 0
    W = sparsek.BSRMatrix.from_dense(torch.from_numpy(dense).to(device=device, dtype=torch.bfloat16),
                                     block=(64, 64)).quantize()
    assert W.values.dtype == torch.float8_e4m3fn and W.scales.dtype == torch.float32
    x = torch.from_numpy(x).to(device=device, dtype=torch.bfloat16)
    xq, xs = sparsek.quantize_e4m3(x)
    assert xq.dtype == torch.float8_e4m3fn and xs.shape == (24,)
    want = x.double() @ torch.from_numpy(dense).to(device).double().T
    y = sparsek.dense_bsr_mm(xq, W.T, a_scales=xs, out_dtype=torch.bfloat16)
    assert y.dtype == torch.bfloat16
    torch.testing.assert_close(y.double(), want.to(torch.bfloat16).double(), rtol=0, atol=0)
    y32 = sparsek.bsr_mm(W, xq.mT, b_scales=xs).mT  # (W @ x^T)^T: the same scales, per column of x^T
    torch.testing.assert_close(y32.double(), want, rtol=0, atol=0)

    @torch.compile(fullgraph=True)
    def f(x):
        q, s = sparsek.quantize_e4m3(x)
        return sparsek.dense_bsr_mm(q, W.T, a_scales=s, out_dtype=torch.float32)

    torch.testing.assert_close(f(x).double(), want, rtol=0, atol=0)


def test_torch_opcheck(rng):
    torch = _torch()
    dense, _ = exact_bsr(rng, 64, 128, (32, 32))
    W = sparsek.BSRMatrix.from_dense(torch.from_numpy(dense), block=(32, 32)).quantize()
    x = torch.from_numpy(exact_dense(rng, 8, 128, per="row"))
    xq, xs = torch.ops.sparsek.quantize_e4m3(x, 0, 0)
    rows, cols = W.shape
    # (test_schema compares outputs arithmetically, which torch does not define for float8 on the CPU)
    torch.library.opcheck(torch.ops.sparsek.quantize_e4m3, (x, 0, 128), test_utils=("test_faketensor",))
    torch.library.opcheck(torch.ops.sparsek.dense_bsr_mm_fp8,
                          (xq, xs, W.row_ptr, W.col_idx, W.values, W.scales, rows, cols, True, 1.0, 0.0, None,
                           torch.float32), test_utils=("test_faketensor",))
    torch.library.opcheck(torch.ops.sparsek.bsr_mm_fp8,
                          (W.row_ptr, W.col_idx, W.values, W.scales, rows, cols, False, xq.mT, xs, 1.0, 0.0, None,
                           torch.float16), test_utils=("test_faketensor",))


def test_torch_errors(rng):
    torch = _torch()
    dense, _ = exact_bsr(rng, 64, 64, (32, 32))
    W = sparsek.BSRMatrix.from_dense(torch.from_numpy(dense), block=(32, 32)).quantize()
    x = torch.from_numpy(exact_dense(rng, 4, 64, per="row"))
    xq, xs = sparsek.quantize_e4m3(x)
    with pytest.raises(ValueError, match="A dtype f32 differs from B's e4m3"):
        sparsek.dense_bsr_mm(x, W.T)
    with pytest.raises(ValueError, match="A scales is given but A is f32"):
        sparsek.dense_bsr_mm(x, W.T, a_scales=xs)
    with pytest.raises(ValueError, match=r"A scales\[2\]=-1 is negative"):
        sparsek.dense_bsr_mm(xq, W.T, a_scales=torch.tensor([1.0, 1.0, -1.0, 1.0]))
    with pytest.raises(ValueError, match="out_dtype=torch.float16 differs from out's dtype torch.float32"):
        sparsek.dense_bsr_mm(xq, W.T, a_scales=xs, out=torch.empty(4, 64), out_dtype=torch.float16)
    with pytest.raises(ValueError, match="an e4m3 matrix changes dtype through dequantize"):
        W.to(torch.float16)
    with pytest.raises(ValueError, match="holds no block scales"):
        W.to_torch()
    D = W.dequantize(torch.bfloat16)
    assert D.values.dtype == torch.bfloat16 and not D.is_fp8


def test_block_sparse_linear_to_fp8(rng, device):
    torch = _torch()
    import sparsek.nn

    dt = torch.bfloat16 if device.type == "cuda" else torch.float32
    layer = sparsek.nn.BlockSparseLinear(256, 128, block=(64, 64), density=0.5, device=device, dtype=dt,
                                         method="dds", generator=torch.Generator().manual_seed(0))
    x = torch.randn(3, 5, 256, device=device, dtype=dt)
    with torch.no_grad():
        ref = layer(x)
    w8 = layer.weight.quantize()
    assert layer.to_fp8() is layer and layer.fp8
    assert layer.values.dtype == torch.float8_e4m3fn and "values" not in dict(layer.named_parameters())
    torch.testing.assert_close(layer.scales.detach(), w8.scales)
    assert "fp8=e4m3" in repr(layer)
    with torch.no_grad():
        y = layer(x)
    assert y.shape == (3, 5, 128) and y.dtype == dt
    # fp8 error: weights and activations each within e4m3's relative step.
    assert (y.float() - ref.float()).abs().max() <= 0.15 * ref.float().abs().max()
    # The same through the DSD formulation.
    layer.method = "dsd"
    with torch.no_grad():
        torch.testing.assert_close(layer(x).float(), y.float(), rtol=2e-2, atol=2e-2 * y.float().abs().max().item())
    # Forward only: a backward says why it cannot run.
    out = layer(x.requires_grad_(True))
    with pytest.raises(RuntimeError, match=r"fp8 \(e4m3\) products and quantize_e4m3 have no backward"):
        out.sum().backward()
    out = layer(x.detach())
    with pytest.raises(RuntimeError, match="no backward"):
        out.sum().backward()
    with pytest.raises(ValueError, match="the layer is fp8 already"):
        layer.to_fp8()
    state = layer.state_dict()
    assert state["values"].dtype == torch.float8_e4m3fn and "scales" in state
