"""Autograd of the three products on the CPU backend: torch.autograd.gradcheck and the fp64 reference.

The library computes in float32 on the CPU (there is no float64 kernel), so gradcheck runs in
float64 around a float32 product: inputs are float64 tensors holding small integers, the function
casts them to float32, multiplies and casts back, and the finite differences use eps = 1. Every
intermediate is then an integer below 2**24, so the numerical Jacobian is exact and gradcheck's
default tolerances hold the analytical one to it. Random-valued cases compare every gradient with
torch's own autograd on the dense float64 matrices (the sparse operand's gradient taken on its
stored blocks). Covered: every differentiable input of each op, op = transpose, beta != 0 (the
gradient of C), several block shapes, an empty block row and nnzb = 0.
"""
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
import sparsek  # noqa: E402
from conftest import block_sparse_dense  # noqa: E402

F64 = torch.float64


def pattern(rng, rows, cols, block, density=0.5, empty_rows=(1,)):
    """(dense float64 with integer values, BSRMatrix over float32 values, block mask)."""
    A, mask = block_sparse_dense(rng, rows, cols, *block, density=density, empty_rows=empty_rows)
    Ab = sparsek.BSRMatrix.from_dense(torch.from_numpy(A), block=block, mask=mask)
    return torch.from_numpy(A).to(F64), Ab, mask


def ints(rng, *shape):
    return torch.from_numpy(rng.integers(-3, 4, size=shape).astype(np.float64)).requires_grad_(True)


def with_values(Ab, values):
    return sparsek.BSRMatrix(Ab.row_ptr, Ab.col_idx, values, Ab.shape, check=False)


def gradcheck(fn, inputs, fast=True):
    # fast_mode checks the Jacobians along random directions (a few products instead of one per
    # input element); the smallest block shape also runs the full, element-by-element check.
    assert torch.autograd.gradcheck(fn, inputs, eps=1.0, atol=1e-6, rtol=1e-6, fast_mode=fast)


# ---------------------------------------------------------------- gradcheck (exact)

@pytest.mark.parametrize("block", [(16, 16), (16, 32), (32, 16)])
@pytest.mark.parametrize("trans", [False, True])
def test_gradcheck_bsr_mm(rng, block, trans):
    bm, bk = block
    _, Ab, _ = pattern(rng, 2 * bm, 3 * bk, block)
    v = Ab.values.to(F64).requires_grad_(True)
    k = Ab.shape[0] if trans else Ab.shape[1]
    b = ints(rng, k, 5)
    A = lambda v: with_values(Ab, v.float())  # noqa: E731
    gradcheck(lambda v, b: sparsek.bsr_mm(A(v).T if trans else A(v), b.float()).double(), (v, b),
              fast=block != (16, 16))
    # beta != 0: the gradient of C too.
    m = Ab.shape[1] if trans else Ab.shape[0]
    c = ints(rng, m, 5)
    gradcheck(lambda v, b, c: sparsek.bsr_mm(A(v).T if trans else A(v), b.float(), alpha=2.0,
                                             beta=-3.0, out=c.float()).double(), (v, b, c))


@pytest.mark.parametrize("block", [(16, 16), (16, 32), (32, 16)])
@pytest.mark.parametrize("trans", [False, True])
def test_gradcheck_dense_bsr_mm(rng, block, trans):
    bm, bk = block
    _, Bb, _ = pattern(rng, 3 * bm, 2 * bk, block)
    v = Bb.values.to(F64).requires_grad_(True)
    k = Bb.shape[1] if trans else Bb.shape[0]
    n = Bb.shape[0] if trans else Bb.shape[1]
    a = ints(rng, 4, k)
    c = ints(rng, 4, n)
    B = lambda v: with_values(Bb, v.float())  # noqa: E731
    gradcheck(lambda a, v: sparsek.dense_bsr_mm(a.float(), B(v).T if trans else B(v)).double(), (a, v),
              fast=block != (16, 16))
    gradcheck(lambda a, v, c: sparsek.dense_bsr_mm(a.float(), B(v).T if trans else B(v), alpha=-1.0,
                                                   beta=0.5, out=c.float()).double(), (a, v, c))


@pytest.mark.parametrize("block", [(16, 16), (16, 32), (32, 16)])
def test_gradcheck_sampled_mm(rng, block):
    bm, bk = block
    _, P, _ = pattern(rng, 2 * bm, 3 * bk, block)
    a = ints(rng, P.shape[0], 6)
    b = ints(rng, 6, P.shape[1])
    v = P.values.to(F64).requires_grad_(True)

    def fn(a, b, v):
        return sparsek.sampled_mm(a.float(), b.float(), with_values(P, v.float()), alpha=2.0,
                                  beta=-1.0).values.double()

    gradcheck(fn, (a, b, v), fast=block != (16, 16))


def test_gradcheck_nnzb_zero(rng):
    Ab = sparsek.BSRMatrix.from_dense(torch.zeros(32, 48), block=(16, 16))
    assert Ab.nnzb == 0
    b = ints(rng, 48, 3)
    gradcheck(lambda b: sparsek.bsr_mm(Ab, b.float()).double(), (b,))
    v = Ab.values.clone().requires_grad_(True)
    y = sparsek.bsr_mm(with_values(Ab, v), b.float())
    y.sum().backward()
    assert v.grad.shape == (0, 16, 16) and torch.equal(b.grad, torch.zeros_like(b))


# ---------------------------------------------------------------- against the fp64 reference

def masked(dense, mask, block):
    return dense * torch.from_numpy(np.kron(mask, np.ones(block))).to(dense.dtype)


def on_blocks(dense, Ab):
    """A dense (float64) matrix's blocks at Ab's stored positions, in Ab's block order."""
    rows, cols = Ab.shape
    bm, bk = Ab.block
    blocks = dense.reshape(rows // bm, bm, cols // bk, bk).permute(0, 2, 1, 3)
    return blocks[_mask_of(Ab)]  # row-major order of the mask = the BSR order


def _mask_of(Ab):
    rows, cols = Ab.shape
    bm, bk = Ab.block
    m = torch.zeros(rows // bm, cols // bk, dtype=torch.bool)
    rp = Ab.row_ptr.tolist()
    for r in range(len(rp) - 1):
        m[r, Ab.col_idx[rp[r]:rp[r + 1]].long()] = True
    return m


def close(got, want):
    torch.testing.assert_close(got.double(), want, rtol=2e-5, atol=2e-5 * max(1.0, float(want.abs().max())))


@pytest.mark.parametrize("block", [(32, 64), (64, 32), (128, 128), (16, 128)])
@pytest.mark.parametrize("trans", [False, True])
def test_grads_match_fp64(rng, block, trans):
    bm, bk = block
    rows, cols = 3 * bm, 2 * bk
    A, mask = block_sparse_dense(rng, rows, cols, bm, bk, integers=False, empty_rows=(1,))
    Ab = sparsek.BSRMatrix.from_dense(torch.from_numpy(A), block=block, mask=mask)
    Ad = torch.from_numpy(A).to(F64).requires_grad_(True)
    v = Ab.values.clone().requires_grad_(True)
    As = with_values(Ab, v)
    opA = As.T if trans else As
    k, m = (rows, cols) if trans else (cols, rows)
    n = 7
    B = torch.randn(k, n, dtype=F64, generator=torch.Generator().manual_seed(1))
    C = torch.randn(m, n, dtype=F64, generator=torch.Generator().manual_seed(2))
    G = torch.randn(m, n, dtype=F64, generator=torch.Generator().manual_seed(3))
    # DSD: y = 1.5 op(A) B - 0.5 C
    b32, c32 = B.float().requires_grad_(True), C.float().requires_grad_(True)
    # out= is written in place: with autograd it must not be a leaf that requires grad.
    y = sparsek.bsr_mm(opA, b32, alpha=1.5, beta=-0.5, out=c32.clone())
    y.backward(G.float())
    Bd, Cd = B.clone().requires_grad_(True), C.clone().requires_grad_(True)
    yd = 1.5 * ((Ad.T if trans else Ad) @ Bd) - 0.5 * Cd
    yd.backward(G)
    close(y.detach(), yd.detach())
    close(b32.grad, Bd.grad)
    close(c32.grad, Cd.grad)
    close(v.grad, on_blocks(Ad.grad, Ab))

    # DDS: z = 2 X op(A) + 1 C2 (op(A) is m x k... used as the right operand: X is p x m)
    p = 5
    X = torch.randn(p, m, dtype=F64, generator=torch.Generator().manual_seed(4))
    C2 = torch.randn(p, k, dtype=F64, generator=torch.Generator().manual_seed(5))
    G2 = torch.randn(p, k, dtype=F64, generator=torch.Generator().manual_seed(6))
    v.grad = None
    Ad.grad = None
    x32, c2 = X.float().requires_grad_(True), C2.float().requires_grad_(True)
    z = sparsek.dense_bsr_mm(x32, opA, alpha=2.0, beta=1.0, out=c2.clone())
    z.backward(G2.float())
    Xd, C2d = X.clone().requires_grad_(True), C2.clone().requires_grad_(True)
    zd = 2.0 * (Xd @ (Ad.T if trans else Ad)) + C2d
    zd.backward(G2)
    close(z.detach(), zd.detach())
    close(x32.grad, Xd.grad)
    close(c2.grad, C2d.grad)
    close(v.grad, on_blocks(Ad.grad, Ab))


@pytest.mark.parametrize("block", [(32, 16), (64, 64)])
def test_sampled_mm_grads_match_fp64(rng, block):
    bm, bk = block
    rows, cols, k = 2 * bm, 3 * bk, 9
    P0, mask = block_sparse_dense(rng, rows, cols, bm, bk, integers=False, empty_rows=(0,))
    P = sparsek.BSRMatrix.from_dense(torch.from_numpy(P0), block=block, mask=mask)
    gen = torch.Generator().manual_seed(7)
    Aa = torch.randn(rows, k, dtype=F64, generator=gen)
    Bb = torch.randn(k, cols, dtype=F64, generator=gen)
    G = torch.randn(rows, cols, dtype=F64, generator=gen)
    a32, b32 = Aa.float().requires_grad_(True), Bb.float().requires_grad_(True)
    pv = P.values.clone().requires_grad_(True)
    R = sparsek.sampled_mm(a32, b32, with_values(P, pv), alpha=0.5, beta=2.0)
    Gm = masked(G, mask, block)
    R.values.backward(on_blocks(Gm, P).float())
    Ad, Bd = Aa.clone().requires_grad_(True), Bb.clone().requires_grad_(True)
    Pd = torch.from_numpy(P0).to(F64).requires_grad_(True)
    Rd = masked(0.5 * (Ad @ Bd), mask, block) + 2.0 * Pd
    Rd.backward(Gm)
    close(R.to_dense().detach(), Rd.detach())
    close(a32.grad, Ad.grad)
    close(b32.grad, Bd.grad)
    close(pv.grad, on_blocks(Pd.grad, P))


def test_half_inputs_float32_output_backward(rng):
    """bf16 operands with a float32 C: the float32 incoming gradient is cast to the inputs' dtype."""
    A, mask = block_sparse_dense(rng, 64, 64, 32, 32, empty_rows=())
    Ab = sparsek.BSRMatrix.from_dense(torch.from_numpy(A), block=(32, 32), mask=mask, dtype=torch.bfloat16)
    v = Ab.values.clone().requires_grad_(True)
    b = torch.from_numpy(rng.integers(-2, 3, size=(64, 8)).astype(np.float32)).bfloat16().requires_grad_(True)
    y = sparsek.bsr_mm(with_values(Ab, v), b, out=torch.zeros(64, 8))
    assert y.dtype == torch.float32
    y.sum().backward()
    assert v.grad.dtype == torch.bfloat16 and b.grad.dtype == torch.bfloat16
    Ad = torch.from_numpy(A).double()
    close(b.grad.float(), Ad.T @ torch.ones(64, 8, dtype=F64))


def test_expanded_gradient_is_accepted(rng):
    """y.sum() hands backward a gradient with zero strides; it is made contiguous first."""
    _, Ab, _ = pattern(rng, 64, 32, (16, 16))
    b = torch.ones(32, 4, requires_grad=True)
    sparsek.bsr_mm(Ab, b).sum().backward()
    want = Ab.to_dense().double().T @ torch.ones(64, 4, dtype=F64)
    close(b.grad, want)
