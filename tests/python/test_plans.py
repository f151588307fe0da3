"""torch: cached plans (in-place pattern edits, CUDA graphs), interop (sparse_bsr, .T, .to, @ under
torch.compile), bad input, and the NumPy-only import.

CPU cases run everywhere torch is installed; CUDA cases skip with the reason without a GPU.
"""
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
import sparsek  # noqa: E402
from conftest import block_sparse_dense, dense_operand, torch_cuda  # noqa: E402

HAS_CUDA, NO_CUDA = torch_cuda()
cuda_only = pytest.mark.skipif(not HAS_CUDA, reason=NO_CUDA)
DEVICES = ["cpu", pytest.param("cuda", marks=cuda_only)]


def case(rng, device, rows=128, cols=96, block=(32, 32), empty_rows=(1,)):
    dtype = torch.float32 if device == "cpu" else torch.float16
    A, mask = block_sparse_dense(rng, rows, cols, *block, empty_rows=empty_rows)
    At = torch.from_numpy(A).to(device=device, dtype=dtype)
    return At, sparsek.BSRMatrix.from_dense(At, block=block)


def operand(rng, rows, cols, like):
    return torch.from_numpy(dense_operand(rng, rows, cols)).to(device=like.device, dtype=like.dtype)


def plans_of(m):
    return m.row_ptr.__dict__.get("_sparsek_plans", {})


# ---------------------------------------------------------------- plans

@pytest.mark.parametrize("device", DEVICES)
def test_plan_is_made_once_and_reused(rng, device):
    At, Ab = case(rng, device)
    B = operand(rng, 96, 16, At)
    for _ in range(3):
        assert torch.equal(sparsek.bsr_mm(Ab, B).float(), At.float() @ B.float())
    assert len(plans_of(Ab)) == 1
    # New values (same pattern, another tensor) and new dense operands reuse the plan.
    Ab2 = sparsek.BSRMatrix(Ab.row_ptr, Ab.col_idx, Ab.values * 2, Ab.shape, check=False)
    B2 = operand(rng, 96, 16, At)
    assert torch.equal(sparsek.bsr_mm(Ab2, B2).float(), 2 * At.float() @ B2.float())
    assert len(plans_of(Ab)) == 1
    # Another N, another op: plans of their own.
    sparsek.bsr_mm(Ab, operand(rng, 96, 5, At))
    sparsek.bsr_mm(Ab.T, operand(rng, 128, 5, At))
    assert len(plans_of(Ab)) == 3


@pytest.mark.parametrize("device", DEVICES)
def test_in_place_pattern_edit_replans(rng, device):
    dtype = torch.float32 if device == "cpu" else torch.float16
    mask = np.array([[1, 0, 1], [0, 1, 0], [1, 1, 1], [0, 0, 1]], bool)
    A, _ = block_sparse_dense(rng, 128, 96, 32, 32)
    At = torch.from_numpy(A).to(device=device, dtype=dtype)
    Ab = sparsek.BSRMatrix.from_dense(At, block=(32, 32), mask=mask)
    B = operand(rng, 96, 8, At)
    sparsek.bsr_mm(Ab, B)
    # A valid edit through torch (the version counter moves): row 0 now holds columns 1 and 2.
    with torch.no_grad():
        Ab.col_idx[:2] = torch.tensor([1, 2], dtype=torch.int32)
    assert torch.equal(sparsek.bsr_mm(Ab, B).float(), Ab.to_dense().float() @ B.float())
    # Invalid edits: a clear error on the next call, never a stale plan or a crash.
    with torch.no_grad():
        Ab.col_idx[0] = 1000
    with pytest.raises(ValueError, match=r"col_idx\[0\]=1000 is out of range"):
        sparsek.bsr_mm(Ab, B)
    with torch.no_grad():
        Ab.col_idx[0] = 1
        Ab.row_ptr[1] = 7
    with pytest.raises(ValueError, match="row_ptr"):
        sparsek.bsr_mm(Ab, B)


@pytest.mark.parametrize("device", DEVICES)
def test_out_written_in_place_without_autograd(rng, device):
    At, Ab = case(rng, device)
    B = operand(rng, 96, 16, At)
    C0 = operand(rng, 128, 16, At)
    out = C0.clone()
    r = sparsek.bsr_mm(Ab, B, alpha=2.0, beta=1.0, out=out)
    assert r is out
    torch.testing.assert_close(out.float(), 2 * At.float() @ B.float() + C0.float(), rtol=1e-2, atol=1e-2)
    # out aliasing an input is served through a copy, not read while written.
    Sq, Sb = case(rng, device, 96, 96)
    X = operand(rng, 96, 96, Sq)
    want = Sq.float() @ X.float()
    sparsek.bsr_mm(Sb, X, out=X)
    torch.testing.assert_close(X.float(), want, rtol=1e-2, atol=1e-2)


@cuda_only
def test_cuda_graph_capture_and_replay(rng):
    At, Ab = case(rng, "cuda", 256, 192, (64, 64), empty_rows=(2,))
    Wt, Wb = case(rng, "cuda", 256, 192, (64, 64))
    B = operand(rng, 192, 72, At)
    X = operand(rng, 40, 256, At)
    Y = operand(rng, 256, 24, At)
    Z = operand(rng, 24, 192, At)

    def step():
        return (sparsek.bsr_mm(Ab, B), sparsek.dense_bsr_mm(X, Wb), X @ Wb.T.T,
                sparsek.sampled_mm(Y, Z, Ab).values)

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()  # plans (outside the capture)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        outs = step()
    for round in range(3):
        B.copy_(operand(rng, 192, 72, At))
        X.copy_(operand(rng, 40, 256, At))
        with torch.no_grad():
            Ab.values.mul_(-1)
        for o in outs:
            o.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        Ad = Ab.to_dense().float()
        torch.testing.assert_close(outs[0].float(), Ad @ B.float(), rtol=1e-2, atol=1e-2)
        torch.testing.assert_close(outs[1].float(), X.float() @ Wt.float(), rtol=1e-2, atol=1e-2)
        torch.testing.assert_close(outs[2].float(), X.float() @ Wt.float(), rtol=1e-2, atol=1e-2)


@cuda_only
def test_cuda_graph_keeps_its_plan_when_the_pattern_cache_drops_it(rng, monkeypatch):
    """A plan a capture used stays alive after products with other shapes on the same pattern push
    it out of the pattern's plan cache, and replays stay right."""
    from sparsek import _torch_ops
    monkeypatch.setattr(_torch_ops, "_PLANS_PER_PATTERN", 1)
    At, Ab = case(rng, "cuda", 256, 192, (64, 64))
    B = operand(rng, 192, 72, At)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        sparsek.bsr_mm(Ab, B)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = sparsek.bsr_mm(Ab, B)
    captured = [e[0] for e in plans_of(Ab).values()]
    assert len(captured) == 1
    for n in (8, 16):  # other widths: each plan pushes the previous one out (a cache of 1)
        sparsek.bsr_mm(Ab, operand(rng, 192, n, At))
    assert not any(e[0] is captured[0] for e in plans_of(Ab).values()), "the cache dropped the captured plan"
    assert any(p is captured[0] for p in _torch_ops._graph_plans.values()), "the graph's plan was not kept"
    B.copy_(operand(rng, 192, 72, At))
    out.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out.float(), At.float() @ B.float(), rtol=1e-2, atol=1e-2)


@cuda_only
def test_planning_during_capture_says_to_run_first(rng):
    At, Ab = case(rng, "cuda")
    B = operand(rng, 96, 16, At)
    g = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="Run the same call once before capturing"):
        with torch.cuda.graph(g):
            sparsek.bsr_mm(Ab, B)


# ---------------------------------------------------------------- interop

@pytest.mark.parametrize("device", DEVICES)
def test_torch_sparse_bsr_is_accepted(rng, device):
    At, Ab = case(rng, device)
    t = At.to_sparse_bsr((32, 32))
    B = operand(rng, 96, 8, At)
    X = operand(rng, 5, 128, At)
    want = At.float() @ B.float()
    assert torch.equal(sparsek.bsr_mm(t, B).float(), want)
    assert torch.equal(sparsek.bsr_mm(t, B).float(), want)  # the cached conversion
    assert torch.equal(sparsek.dense_bsr_mm(X, t).float(), X.float() @ At.float())
    P = sparsek.sampled_mm(operand(rng, 128, 4, At), operand(rng, 4, 96, At), t)
    assert P.nnzb == t.values().shape[0]
    # The values are shared with the tensor, not copied.
    with torch.no_grad():
        t.values().zero_()
    assert torch.equal(sparsek.bsr_mm(t, B), B.new_zeros(128, 8))
    # An in-place edit of the tensor's pattern is seen: the conversion and the plan are redone.
    with torch.no_grad():
        t.col_indices()[0] = 1000
    with pytest.raises(ValueError, match="1000 is out of range"):
        sparsek.bsr_mm(t, B)


@pytest.mark.parametrize("device", DEVICES)
def test_transpose_view_device_and_to(rng, device):
    At, Ab = case(rng, device)
    Tv = Ab.T
    assert isinstance(Tv, sparsek.BSRTranspose) and Tv.T is Ab and Tv.shape == (96, 128)
    X = operand(rng, 128, 7, At)
    assert torch.equal((Tv @ X).float(), At.T.float() @ X.float())
    Y = operand(rng, 3, 96, At)
    assert torch.equal((Y @ Tv).float(), Y.float() @ At.T.float())
    Z = operand(rng, 96, 2, At)
    assert torch.equal(torch.mm(Ab, Z).float(), At.float() @ Z.float())
    assert Ab.device == At.device
    c = Ab.cpu()
    assert c.device.type == "cpu" and torch.equal(c.to_dense(), At.cpu())
    h = Ab.to(torch.bfloat16)
    assert h.values.dtype == torch.bfloat16 and h.row_ptr.dtype == torch.int32
    assert Ab.to(Ab.values.dtype) is Ab
    with pytest.raises(ValueError, match="values dtype float64 is not supported"):
        Ab.to(torch.float64)


@cuda_only
def test_cuda_and_cpu_moves(rng):
    At, Ab = case(rng, "cpu")
    g = Ab.to(torch.float16).cuda()
    assert g.device.type == "cuda" and g.row_ptr.is_cuda and g.col_idx.is_cuda
    assert torch.equal(g.cpu().to_dense(), At.half())


@pytest.mark.parametrize("device", DEVICES)
def test_matmul_under_torch_compile(rng, device):
    At, Ab = case(rng, device)
    Ft = At.to_sparse_bsr((32, 32))
    Af = sparsek.BSRMatrix.from_torch(Ft)  # values share the sparse tensor's storage
    B = operand(rng, 96, 16, At)
    X = operand(rng, 5, 128, At)
    fns = {
        "A @ b": (lambda b: Ab @ b, B, At.float() @ B.float()),
        "from_torch @ b": (lambda b: Af @ b, B, At.float() @ B.float()),
        "torch.mm": (lambda b: torch.mm(Ab, b), B, At.float() @ B.float()),
        "x @ A": (lambda x: x @ Ab, X, X.float() @ At.float()),
        "x @ A.T.T": (lambda x: x @ Ab.T.T, X, X.float() @ At.float()),
        "torch.matmul(x, A)": (lambda x: torch.matmul(x, Ab), X, X.float() @ At.float()),
    }
    for name, (fn, arg, want) in fns.items():
        torch._dynamo.reset()
        got = torch.compile(fn, fullgraph=True)(arg)
        assert torch.equal(got.float(), want), name
    # Shapes for which A @ t and t @ A are both defined are refused under compile (dynamo traces
    # both as the same call), never guessed.
    Sq, Sb = case(rng, device, 96, 96)
    S = operand(rng, 96, 96, Sq)
    torch._dynamo.reset()
    with pytest.raises(Exception, match="use sparsek.bsr_mm"):
        torch.compile(lambda t: Sb @ t, fullgraph=True)(S)
    assert torch.equal((Sb @ S).float(), Sq.float() @ S.float())  # eager is unambiguous


# ---------------------------------------------------------------- bad input

def test_bad_arguments_name_the_argument(rng):
    At, Ab = case(rng, "cpu")
    B = operand(rng, 96, 8, At)
    with pytest.raises(TypeError, match="alpha must be a real number, got str '2'"):
        sparsek.bsr_mm(Ab, B, alpha="2")
    with pytest.raises(TypeError, match="beta must be a real number, got bool"):
        sparsek.dense_bsr_mm(operand(rng, 2, 128, At), Ab, beta=True)
    with pytest.raises(TypeError, match=r"shape\[1\] must be an int, got float 64.7"):
        sparsek.BSRMatrix(Ab.row_ptr, Ab.col_idx, Ab.values, (128, 64.7))
    with pytest.raises(ValueError, match=r"shape must be a pair of ints, got 1 entries: \(128,\)"):
        sparsek.BSRMatrix(Ab.row_ptr, Ab.col_idx, Ab.values, (128,))
    with pytest.raises(ValueError, match="block must be a pair of ints"):
        sparsek.BSRMatrix.from_dense(At, block=(32,))
    with pytest.raises(TypeError, match=r"block\[0\] must be an int, got str"):
        sparsek.BSRMatrix.from_dense(At, block=("32", 32))
    with pytest.raises(TypeError, match="a must be a sparsek.BSRMatrix, its .T or a torch sparse_bsr"):
        sparsek.bsr_mm(At, B)
    with pytest.raises(ValueError, match="B must be 96x8 but is 95x8"):
        sparsek.bsr_mm(Ab, B[:95])
    with pytest.raises(ValueError, match="B dtype float64 is not supported"):
        sparsek.bsr_mm(Ab, B.double())
    # Backward with a gradient of the wrong dtype/shape is torch's own check; a wrong-device
    # operand is named by the library.
    if HAS_CUDA:
        with pytest.raises(ValueError, match="B is in device memory but the sparse operand is in host"):
            sparsek.bsr_mm(Ab, B.cuda())


def test_import_does_not_import_torch():
    code = ("import sys, time; t = time.perf_counter(); import sparsek; "
            "dt = time.perf_counter() - t; "
            "print('torch' in sys.modules, dt)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded, seconds = out.stdout.split()
    assert loaded == "False", "import sparsek imported torch"
    # The time is reported, not asserted (timing targets live in benchmarks).
    print(f"import sparsek (NumPy only): {float(seconds):.3f} s")


def test_torch_imported_after_sparsek(rng):
    code = ("import sparsek, torch, numpy as np; "
            "A = sparsek.BSRMatrix.from_dense(torch.ones(32, 32), block=(16, 16)); "
            "print(float(sparsek.bsr_mm(A, torch.ones(32, 2)).sum()), hasattr(torch.ops.sparsek, 'bsr_mm'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["2048.0", "True"]
