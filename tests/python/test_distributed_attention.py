"""sparsek.distributed.ContextParallelAttention: ranks run in this process (NumPy and torch on the
CPU backend, torch CUDA on one GPU) against sparsek.attention on the whole sequence, and a
one-rank NCCL process group bit for bit (a GPU and NCCL needed). Outputs are compared row by row
with the rows each rank holds."""
import numpy as np
import pytest

import sparsek
import sparsek.distributed as sd

from conftest import torch_cuda


def causal_topk_layout(rng, heads, nb, picks, full=False):
    """Per head and query block: the diagonal block and up to `picks` random earlier ones; with
    full, one earlier block (not among those) attended whole."""
    num = np.zeros((1, heads, nb), np.int32)
    idx = np.zeros((1, heads, nb, picks + 1), np.int32)
    fnum = np.zeros((1, heads, nb), np.int32)
    fidx = np.zeros((1, heads, nb, 1), np.int32)
    for h in range(heads):
        for i in range(nb):
            chosen = sorted({i, *rng.integers(0, i + 1, picks).tolist()})
            num[0, h, i] = len(chosen)
            idx[0, h, i, :len(chosen)] = chosen
            rest = [j for j in range(i) if j not in chosen]
            if full and rest:
                fnum[0, h, i] = 1
                fidx[0, h, i, 0] = rest[int(rng.integers(0, len(rest)))]
    if full:
        return sparsek.BlockLayout(num, idx, fnum, fidx, block=128)
    return sparsek.BlockLayout(num, idx, block=128)


def hopper_torch(nccl=False):
    """torch, or a skip saying why not: a GPU torch reaches with sparsek's sm_90 attention kernels
    (and, with nccl, the NCCL sparsek loads)."""
    torch = pytest.importorskip("torch")
    usable, why = torch_cuda()
    if not usable:
        pytest.skip(why)
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("the GPU attention kernels of this test need sm_90")
    if nccl:
        try:
            sd.nccl_version()
        except NotImplementedError as e:
            pytest.skip(str(e))
    return torch


def torch_layout(lay):
    """The same layout with torch (CPU) arrays: sparsek.attention takes a layout of q's framework."""
    import torch
    arrays = [None if a is None else torch.from_numpy(a) for a in lay.arrays()]
    return sparsek.BlockLayout(*arrays, block=lay.block)


def shards_of(cp, ranks, *tensors):
    """Per rank: the query rows of the first tensor, the key/value rows of the others (contiguous)."""
    out = []
    for r in range(ranks):
        (a, b), (c, d) = cp.q_rows(r), cp.kv_rows(r)
        first, *rest = tensors
        parts = [first[:, :, a:b]] + [t[:, :, c:d] for t in rest]
        out.append(tuple(p.contiguous() if hasattr(p, "contiguous") else np.ascontiguousarray(p) for p in parts))
    return out


@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
@pytest.mark.parametrize("causal", [True, False])
def test_numpy_ranks_match_the_whole_sequence(rng, ranks, causal):
    B, H, S, D = 1, 2, 700, 64  # 6 blocks, the last one partial
    lay = causal_topk_layout(rng, H, 6, 2, full=True)
    q, k, v = (rng.standard_normal((B, H, S, D)).astype(np.float32) for _ in range(3))
    o, lse = sparsek.attention(q, k, v, lay, causal=causal)
    cp = sd.ContextParallelAttention(lay, (B, H, S, D), dtype=np.float32, causal=causal, ranks=ranks)
    got = cp.forward_all(shards_of(cp, ranks, q, k, v))
    if ranks > 1:
        assert sum(cp.recv_bytes(r) for r in range(ranks)) > 0  # blocks do cross ranks
    for r, (o_r, lse_r) in enumerate(got):
        a, b = cp.q_rows(r)
        if ranks == 1:
            assert np.array_equal(o_r, o[:, :, a:b]) and np.array_equal(lse_r, lse[:, :, a:b])
        else:
            np.testing.assert_allclose(o_r, o[:, :, a:b], rtol=2e-5, atol=2e-5)
            np.testing.assert_allclose(lse_r, lse[:, :, a:b], rtol=2e-5, atol=2e-5)


def test_more_ranks_than_query_blocks(rng):
    B, H, S, D = 1, 2, 256, 64  # two query blocks over four ranks: two ranks hold no rows
    lay = causal_topk_layout(rng, H, 2, 1)
    q, k, v = (rng.standard_normal((B, H, S, D)).astype(np.float32) for _ in range(3))
    o, lse = sparsek.attention(q, k, v, lay, causal=True)
    cp = sd.ContextParallelAttention(lay, (B, H, S, D), dtype=np.float32, causal=True, ranks=4)
    assert any(cp.q_rows(r)[0] == cp.q_rows(r)[1] for r in range(4))
    shards = shards_of(cp, 4, q, k, v)
    got = cp.forward_all(shards)
    for r, (o_r, lse_r) in enumerate(got):
        a, b = cp.q_rows(r)
        np.testing.assert_allclose(o_r, o[:, :, a:b], rtol=2e-5, atol=2e-5)
    grads = cp.backward_all([s + (o_r, lse_r, s[0]) for s, (o_r, lse_r) in zip(shards, got)])
    assert [g[0].shape for g in grads] == [s[0].shape for s in shards]


@pytest.mark.parametrize("ranks", [1, 3])
def test_torch_cpu_backward_matches_autograd(rng, ranks):
    torch = pytest.importorskip("torch")
    B, H, S, D = 1, 2, 512, 64
    lay = causal_topk_layout(rng, H, 4, 2)
    q, k, v, dout = (torch.from_numpy(rng.standard_normal((B, H, S, D)).astype(np.float32)) for _ in range(4))
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    o, lse = sparsek.attention(qg, kg, vg, torch_layout(lay), causal=True)
    o.backward(dout)
    cp = sd.ContextParallelAttention(lay, (B, H, S, D), dtype=torch.float32, causal=True, ranks=ranks)
    fwd = cp.forward_all(shards_of(cp, ranks, q, k, v))
    shards = []
    for r, (o_r, lse_r) in enumerate(fwd):
        (a, b), (c, d) = cp.q_rows(r), cp.kv_rows(r)
        shards.append((q[:, :, a:b].contiguous(), k[:, :, c:d].contiguous(), v[:, :, c:d].contiguous(), o_r, lse_r,
                       dout[:, :, a:b].contiguous()))
    grads = cp.backward_all(shards)
    tol = 0 if ranks == 1 else 5e-5
    for r, (dq, dk, dv) in enumerate(grads):
        (a, b), (c, d) = cp.q_rows(r), cp.kv_rows(r)
        torch.testing.assert_close(dq, qg.grad[:, :, a:b], rtol=tol, atol=tol)
        torch.testing.assert_close(dk, kg.grad[:, :, c:d], rtol=tol, atol=tol)
        torch.testing.assert_close(dv, vg.grad[:, :, c:d], rtol=tol, atol=tol)


def test_errors_name_the_argument(rng):
    lay = causal_topk_layout(rng, 2, 4, 1)
    with pytest.raises(ValueError, match="dtype must be float32, float16 or bfloat16"):
        sd.ContextParallelAttention(lay, (1, 2, 512, 64), dtype="int8", ranks=2)
    with pytest.raises(NotImplementedError, match="causal needs self-attention"):
        sd.ContextParallelAttention(lay, (1, 2, 512, 64), (1, 2, 256, 64), dtype="float32", causal=True, ranks=2)
    with pytest.raises(ValueError, match="not both"):
        sd.ContextParallelAttention(lay, (1, 2, 512, 64), dtype="float32", ranks=2, group=object())
    cp = sd.ContextParallelAttention(lay, (1, 2, 512, 64), dtype="float32", ranks=2)
    q = np.zeros((1, 2, 512, 64), np.float32)
    with pytest.raises(ValueError, match="rank 0: q is \\[1, 2, 512, 64\\] but this rank's shard is"):
        cp.forward_all([(q, q, q), (q, q, q)])
    with pytest.raises(ValueError, match="q has 1 arrays, one per rank of the plans \\(2\\) expected"):
        cp.forward_all([(q, q, q)])
    with pytest.raises(ValueError, match="name one"):
        cp.q_rows()


def test_torch_cuda_ranks_on_one_gpu(rng):
    torch = hopper_torch()
    B, H, S, D = 1, 4, 1000, 128
    lay = causal_topk_layout(rng, H, 8, 3, full=True)
    q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    o, lse = sparsek.attention(q, k, v, torch_layout(lay).to("cuda"), causal=True)
    cp = sd.ContextParallelAttention(lay, (B, H, S, D), dtype=torch.bfloat16, causal=True, ranks=2, device="cuda")
    for r, (o_r, lse_r) in enumerate(cp.forward_all(shards_of(cp, 2, q, k, v))):
        a, b = cp.q_rows(r)
        torch.testing.assert_close(o_r.float(), o[:, :, a:b].float(), rtol=2e-2, atol=2e-2)
        torch.testing.assert_close(lse_r, lse[:, :, a:b], rtol=1e-4, atol=1e-4)


def test_one_rank_group_is_bit_identical(rng, tmp_path):
    torch = hopper_torch(nccl=True)
    import torch.distributed as dist
    dist.init_process_group("nccl", init_method=f"file://{tmp_path}/store", rank=0, world_size=1,
                            device_id=torch.device("cuda", 0))
    try:
        B, H, S, D = 1, 2, 1024, 128
        lay = causal_topk_layout(rng, H, 8, 3)
        q, k, v, dout = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
        o, lse = sparsek.attention(q, k, v, torch_layout(lay).to("cuda"), causal=True)
        cp = sd.ContextParallelAttention(lay, (B, H, S, D), dtype=torch.bfloat16, causal=True)
        assert cp.q_rows() == (0, S) and cp.kv_rows() == (0, S)
        o_cp, lse_cp = cp.forward(q, k, v)
        assert torch.equal(o_cp, o) and torch.equal(lse_cp, lse)
        dq, dk, dv = cp.backward(q, k, v, o_cp, lse_cp, dout)
        qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
        o2, _ = sparsek.attention(qg, kg, vg, torch_layout(lay).to("cuda"), causal=True)
        o2.backward(dout)
        assert torch.equal(dq, qg.grad) and torch.equal(dk, kg.grad) and torch.equal(dv, vg.grad)
    finally:
        dist.destroy_process_group()


def _example():
    import os
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    return os.path.join(root, "examples", "python", "context_parallel_attention.py")


def test_the_example_says_how_many_gpus_it_needs():
    torch = pytest.importorskip("torch")
    import os
    import subprocess
    import sys
    world = (torch.cuda.device_count() if torch.cuda.is_available() else 0) + 1
    env = dict(os.environ, WORLD_SIZE=str(world), LOCAL_RANK="0")
    p = subprocess.run([sys.executable, _example()], env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 1, p.stderr
    assert f"this example needs {world} GPU" in p.stderr and "Traceback" not in p.stderr, p.stderr


def test_the_example_runs_on_one_gpu():
    hopper_torch(nccl=True)
    import subprocess
    import sys
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=1", _example()],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "rank 0/1: query rows [0, 16384)" in p.stdout and "FAILED" not in p.stdout, p.stdout
