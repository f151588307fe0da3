"""torch tensors: conversions, products, custom ops (opcheck, torch.compile), errors.

Runs on every device torch offers: "cpu" (the CPU backend) and "cuda" (skipped with the reason when
no GPU answers). The whole file is skipped when torch is not installed.
"""
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
import sparsek  # noqa: E402
from conftest import block_sparse_dense, dense_operand, torch_cuda  # noqa: E402

HAS_CUDA, NO_CUDA = torch_cuda()
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not HAS_CUDA, reason=NO_CUDA))]
cuda_only = pytest.mark.skipif(not HAS_CUDA, reason=NO_CUDA)


def default_dtype(device):
    # The GPU variants are tensor-core kernels: f16/bf16 inputs (f32 output allowed); f32 inputs
    # run on the CPU backend only, and on CUDA they raise NotImplementedError.
    return torch.float32 if device == "cpu" else torch.float16


def T(x, device, dtype=None):
    dtype = dtype or default_dtype(device)
    return torch.from_numpy(np.ascontiguousarray(x)).to(device=device, dtype=dtype)


def sparse_case(rng, device, rows=96, cols=128, block=(32, 32), dtype=None, empty_rows=(1,)):
    A, mask = block_sparse_dense(rng, rows, cols, *block, empty_rows=empty_rows)
    At = T(A, device, dtype)
    return At, sparsek.BSRMatrix.from_dense(At, block=block), mask


# ---------------------------------------------------------------- conversions

@pytest.mark.parametrize("device", DEVICES)
def test_round_trips_stay_in_torch(rng, device):
    At, Ab, mask = sparse_case(rng, device, block=(16, 32))
    for arr in (Ab.row_ptr, Ab.col_idx, Ab.values):
        assert isinstance(arr, torch.Tensor) and arr.device.type == device
    assert Ab.row_ptr.dtype == torch.int32 and Ab.nnzb == mask.sum()
    assert torch.equal(Ab.to_dense(), At)
    assert Ab.T.block == (32, 16) and torch.equal(Ab.T.to_dense(), At.T)
    assert torch.equal(Ab.T.to_bsr().to_dense(), At.T)
    # torch's own BSR tensors, both ways.
    tb = At.to_sparse_bsr((16, 32))
    Af = sparsek.BSRMatrix.from_torch(tb)
    assert Af.nnzb == tb.values().shape[0] and torch.equal(Af.to_dense(), At)
    assert torch.equal(Ab.to_torch().to_dense(), At)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # to_torch() raises no torch warning
        Ab.to_torch()
    with pytest.raises(ValueError, match="layout torch.sparse_bsr"):
        sparsek.BSRMatrix.from_torch(At)


@pytest.mark.parametrize("device", DEVICES)
def test_validation_on_device(device):
    vals = torch.ones((2, 16, 16), device=device)
    rp = torch.tensor([0, 1, 2], dtype=torch.int32, device=device)
    with pytest.raises(ValueError, match=r"col_idx\[1\]=7 is out of range \[0, 2\)"):
        sparsek.BSRMatrix(rp, torch.tensor([0, 7], dtype=torch.int32, device=device), vals, (32, 32))
    with pytest.raises(ValueError, match="block rows bm=20"):
        sparsek.BSRMatrix.from_dense(torch.ones(40, 40, device=device), block=(20, 20))


# ---------------------------------------------------------------- products

def _dtypes(device):
    return [torch.float32] if device == "cpu" else [torch.float16, torch.bfloat16]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("block", [(32, 32), (64, 16), (128, 128)])
def test_products_match_dense(rng, device, block):
    bm, bk = block
    for dtype in _dtypes(device):
        At, Ab, mask = sparse_case(rng, device, 2 * bm, 3 * bk, block, dtype)
        B = T(dense_operand(rng, 3 * bk, 24), device, dtype)
        ref = At.float() @ B.float()  # small integers: exact in every dtype's fp32 accumulation
        C = sparsek.bsr_mm(Ab, B, out=torch.empty(2 * bm, 24, device=device))  # fp32 out
        assert torch.equal(C, ref)
        C2 = sparsek.bsr_mm(Ab, B)
        assert C2.dtype == dtype and C2.device == B.device
        torch.testing.assert_close(C2.float(), ref, rtol=1e-2, atol=1e-2)
        X = T(dense_operand(rng, 5, 2 * bm), device, dtype)
        D = sparsek.dense_bsr_mm(X, Ab, out=torch.empty(5, 3 * bk, device=device))
        assert torch.equal(D, X.float() @ At.float())
        Xs = T(dense_operand(rng, 2 * bm, 7), device, dtype)
        Ys = T(dense_operand(rng, 7, 3 * bk), device, dtype)
        P = sparsek.sampled_mm(Xs, Ys, Ab)
        assert P.values.dtype == dtype and P.row_ptr is Ab.row_ptr
        spy = T(np.kron(mask, np.ones(block)), device)
        torch.testing.assert_close(P.to_dense().float(), (Xs.float() @ Ys.float()) * spy, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("device", DEVICES)
def test_sampled_mm_values(rng, device):
    At, Ab, mask = sparse_case(rng, device, 64, 96, (32, 32))
    X = T(dense_operand(rng, 64, 40), device)
    Y = T(dense_operand(rng, 40, 96), device)
    spy = T(np.kron(mask, np.ones((32, 32))), device)
    R = sparsek.sampled_mm(X, Y, Ab, alpha=2.0, beta=-1.0)
    assert torch.equal(R.to_dense(), 2 * (X @ Y) * spy - At)


@pytest.mark.parametrize("device", DEVICES)
def test_alpha_beta_out_nan_and_layouts(rng, device):
    At, Ab, _ = sparse_case(rng, device)
    B = T(dense_operand(rng, 128, 40), device)
    C0 = T(dense_operand(rng, 96, 40), device)
    out = C0.clone()
    r = sparsek.bsr_mm(Ab, B, alpha=2.0, beta=-3.0, out=out)
    assert r is out and torch.equal(out, 2 * (At @ B) - 3 * C0)
    poisoned = torch.full((96, 40), float("nan"), device=device)
    sparsek.bsr_mm(Ab, B, out=poisoned)
    assert torch.equal(poisoned, At @ B)
    # A transposed (column-major) B is read in place; a strided one is rejected with the reason.
    Bt = T(dense_operand(rng, 40, 128), device)
    assert torch.equal(sparsek.bsr_mm(Ab, Bt.T), At @ Bt.T)
    with pytest.raises(ValueError, match="neither row- nor column-major"):
        sparsek.bsr_mm(Ab, B[:, ::2])
    # Inputs that require grad run forward through the custom op (and record its backward).
    Bg = B.clone().requires_grad_(True)
    Cg = sparsek.bsr_mm(Ab, Bg)
    assert Cg.requires_grad and torch.equal(Cg.detach(), At @ B)


@pytest.mark.parametrize("device", DEVICES)
def test_errors(rng, device):
    At, Ab, _ = sparse_case(rng, device, dtype=torch.float32)
    B = T(dense_operand(rng, 128, 8), device, torch.float32)
    with pytest.raises(ValueError, match="B dtype float64 is not supported"):
        sparsek.bsr_mm(Ab, B.double())
    with pytest.raises(ValueError, match="B dtype f16 differs from A's f32"):
        sparsek.bsr_mm(Ab, B.half())
    with pytest.raises(ValueError, match="B must be 128x8 but is 64x8"):
        sparsek.bsr_mm(Ab, B[:64])
    with pytest.raises(TypeError, match="must be a torch tensor"):
        sparsek.bsr_mm(Ab, B.cpu().numpy())
    with pytest.raises(ValueError, match=r"B must be a 2-D tensor, got shape \(128,\)"):
        sparsek.bsr_mm(Ab, B[:, 0])
    with pytest.raises(TypeError, match="alpha must be a real number, got str '2'"):
        sparsek.bsr_mm(Ab, B, alpha="2")


@cuda_only
def test_f32_on_cuda_says_why(rng):
    At, Ab, _ = sparse_case(rng, "cuda", dtype=torch.float32)
    B = T(dense_operand(rng, 128, 8), "cuda", torch.float32)
    with pytest.raises(NotImplementedError, match="f32 inputs: tensor-core variants need f16/bf16"):
        sparsek.bsr_mm(Ab, B)


@cuda_only
def test_wrong_device(rng):
    At, Ab, _ = sparse_case(rng, "cuda")
    B = T(dense_operand(rng, 128, 8), "cpu", torch.float16)
    with pytest.raises(ValueError, match="B is in host memory but the sparse operand is in device memory"):
        sparsek.bsr_mm(Ab, B)


@cuda_only
def test_runs_on_the_current_stream(rng):
    At, Ab, _ = sparse_case(rng, "cuda", 1024, 1024, (64, 64), empty_rows=())
    B = T(dense_operand(rng, 1024, 512), "cuda")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        C = sparsek.bsr_mm(Ab, B)
        D = C * 1  # ordered after the product only if both ran on s
    s.synchronize()
    assert torch.equal(D, At @ B)


# ---------------------------------------------------------------- custom ops

def _op_samples(rng, device):
    At, Ab, _ = sparse_case(rng, device, 64, 96, (32, 32))
    rows, cols = Ab.shape
    B = T(dense_operand(rng, 96, 16), device)
    X = T(dense_operand(rng, 8, 64), device)
    A2 = T(dense_operand(rng, 64, 12), device)
    B2 = T(dense_operand(rng, 12, 96), device)
    C = T(dense_operand(rng, 64, 16), device)
    Bt = T(dense_operand(rng, 64, 16), device)
    Xt = T(dense_operand(rng, 8, 96), device)
    sp = (Ab.row_ptr, Ab.col_idx, Ab.values, rows, cols)
    values = Ab.values.clone().requires_grad_(True)
    spg = (Ab.row_ptr, Ab.col_idx, values, rows, cols)
    return [
        (torch.ops.sparsek.bsr_mm.default, (*sp, False, B, 1.0, 0.0, None)),
        (torch.ops.sparsek.bsr_mm.default, (*sp, False, B, 0.5, 2.0, C)),
        (torch.ops.sparsek.bsr_mm.default, (*spg, True, Bt.clone().requires_grad_(True), 1.0, 0.0, None)),
        (torch.ops.sparsek.bsr_mm.default, (*spg, False, B.clone().requires_grad_(True), 0.5, 2.0,
                                            C.clone().requires_grad_(True))),
        (torch.ops.sparsek.dense_bsr_mm.default, (X, *sp, False, 1.0, 0.0, None)),
        (torch.ops.sparsek.dense_bsr_mm.default, (Xt.clone().requires_grad_(True), *spg, True, 1.0, 0.0, None)),
        (torch.ops.sparsek.sampled_mm.default, (A2, B2, *sp, 1.5, -1.0)),
        (torch.ops.sparsek.sampled_mm.default, (A2.clone().requires_grad_(True),
                                                B2.clone().requires_grad_(True), *spg, 1.5, -1.0)),
    ]


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(rng, device):
    for op, args in _op_samples(rng, device):
        torch.library.opcheck(op, args)


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_fullgraph(rng, device):
    At, Ab, _ = sparse_case(rng, device, 64, 96, (32, 32))
    Wt, Wb, _ = sparse_case(rng, device, 64, 96, (32, 32))

    def f(b, x, a2, b2):
        y = sparsek.bsr_mm(Ab, b, alpha=2.0) + 1  # DSD
        z = sparsek.dense_bsr_mm(x, Wb)  # DDS
        w = sparsek.sampled_mm(a2, b2, Ab).values  # SDD
        return y, z, w

    b = T(dense_operand(rng, 96, 16), device)
    x = T(dense_operand(rng, 8, 64), device)
    a2 = T(dense_operand(rng, 64, 12), device)
    b2 = T(dense_operand(rng, 12, 96), device)
    torch._dynamo.reset()
    cf = torch.compile(f, fullgraph=True)
    got = cf(b, x, a2, b2)
    want = f(b, x, a2, b2)
    for g, w in zip(got, want):
        assert torch.equal(g, w)
    assert torch.equal(got[0], 2 * (At @ b) + 1)
    assert torch.equal(got[1], x @ Wt)
