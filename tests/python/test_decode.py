"""Decode attention over a paged KV cache from Python: NumPy (the CPU backend) against a float64
NumPy reference written from the definition, selections and empty ones, plans, named errors; torch
CUDA (skipped with the reason when no GPU answers) against the same reference, and a CUDA graph
replayed with a new page table; torch CPU tensors against the NumPy path, and the custom op
(opcheck)."""
import subprocess
import sys

import numpy as np
import pytest

import sparsek
from conftest import torch_cuda


def make_case(rng, new_tokens, seq_lens, hq, hkv, d, page, sel_frac=None, empty=(), dtype=np.float32):
    B = len(new_tokens)
    cu = np.concatenate([[0], np.cumsum(new_tokens)]).astype(np.int32)
    T = int(cu[-1])
    npages = [-(-L // page) for L in seq_lens]
    max_pages = max(npages) + 1
    pages = sum(npages) + 3
    perm = rng.permutation(pages).astype(np.int32)
    pt = np.full((B, max_pages), pages + 100, np.int32)  # out of range where never read
    nxt = 0
    for b in range(B):
        pt[b, :npages[b]] = perm[nxt:nxt + npages[b]]
        nxt += npages[b]
    k = rng.uniform(-1, 1, (pages, page, hkv, d)).astype(dtype)
    v = rng.uniform(-1, 1, (pages, page, hkv, d)).astype(dtype)
    q = rng.uniform(-1, 1, (T, hq, d)).astype(dtype)
    sel = None
    if sel_frac is not None:
        idx = np.full((B, hkv, max_pages), -7, np.int32)
        cnt = np.zeros((B, hkv), np.int32)
        for b in range(B):
            for h in range(hkv):
                if (b, h) in empty:
                    continue
                chosen = [p for p in range(npages[b]) if p == npages[b] - 1 or rng.random() < sel_frac]
                idx[b, h, :len(chosen)] = chosen
                cnt[b, h] = len(chosen)
        sel = (idx, cnt)
    return q, k, v, pt, np.array(seq_lens, np.int32), cu, sel


def reference(q, k, v, pt, lens, cu, sel, causal=True, scale=None):
    T, hq, d = q.shape
    page, hkv = k.shape[1], k.shape[2]
    g = hq // hkv
    scale = 1 / np.sqrt(d) if scale is None else scale
    o = np.zeros((T, hq, d))
    lse = np.full((T, hq), -np.inf)
    for b in range(len(lens)):
        n, L = cu[b + 1] - cu[b], int(lens[b])
        for hk in range(hkv):
            pages = list(sel[0][b, hk, :sel[1][b, hk]]) if sel is not None else list(range(-(-L // page)))
            for j in range(n):
                limit = L - n + j + 1 if causal else L
                pos = [x for p in pages for x in range(p * page, min((p + 1) * page, limit))]
                if not pos:
                    continue
                kk = np.array([k[pt[b, x // page], x % page, hk] for x in pos], np.float64)
                vv = np.array([v[pt[b, x // page], x % page, hk] for x in pos], np.float64)
                for gi in range(g):
                    t, h = cu[b] + j, hk * g + gi
                    s = scale * kk @ q[t, h].astype(np.float64)
                    m = s.max()
                    p = np.exp(s - m)
                    o[t, h] = p @ vv / p.sum()
                    lse[t, h] = m + np.log(p.sum())
    return o, lse


@pytest.mark.parametrize("hq,hkv,d,page", [(4, 1, 64, 16), (8, 2, 128, 32), (2, 2, 64, 48)])
def test_numpy_matches_reference(rng, hq, hkv, d, page):
    q, k, v, pt, lens, cu, _ = make_case(rng, [1, 16, 3], [1, 100, 70], hq, hkv, d, page)
    o, lse = sparsek.decode_attention(q, k, v, pt, lens, cu)
    ro, rl = reference(q, k, v, pt, lens, cu, None)
    np.testing.assert_allclose(o, ro, atol=1e-5)
    np.testing.assert_allclose(lse, rl, atol=1e-5)


def test_selection_empty_heads_and_plan(rng):
    q, k, v, pt, lens, cu, sel = make_case(rng, [2, 1], [200, 33], 4, 2, 64, 16, sel_frac=0.3, empty={(1, 0)})
    o, lse = sparsek.decode_attention(q, k, v, pt, lens, cu, selection=sel)
    ro, rl = reference(q, k, v, pt, lens, cu, sel)
    np.testing.assert_allclose(o, ro, atol=1e-5)
    np.testing.assert_allclose(lse, rl, atol=1e-5)
    assert np.all(np.isneginf(lse[2, 0:2])) and np.all(o[2, 0:2] == 0)  # request 1, KV head 0 sees nothing
    o2, l2 = np.full_like(o, np.nan), np.full_like(lse, np.nan)
    p = sparsek.plan_decode(q, k, v, o2, l2, pt, lens, cu, selection=sel)
    assert p.kv_splits == 1 and p.workspace_bytes == 0
    p.run(q, k, v, o2, l2, pt, lens, cu, sel[0], sel[1])
    assert np.array_equal(o2, o) and np.array_equal(l2, lse)


def test_not_causal_and_scale(rng):
    q, k, v, pt, lens, cu, _ = make_case(rng, [4], [50], 2, 1, 64, 16)
    o, lse = sparsek.decode_attention(q, k, v, pt, lens, cu, causal_new=False, scale=0.2)
    ro, rl = reference(q, k, v, pt, lens, cu, None, causal=False, scale=0.2)
    np.testing.assert_allclose(o, ro, atol=1e-5)
    np.testing.assert_allclose(lse, rl, atol=1e-5)


def test_named_errors(rng):
    q, k, v, pt, lens, cu, sel = make_case(rng, [1, 4], [70, 40], 4, 2, 64, 32, sel_frac=0.5)
    bad = pt.copy()
    bad[0, 1] = 10_000
    with pytest.raises(ValueError, match=r"page_table\[0, 1\] = 10000 is out of range"):
        sparsek.decode_attention(q, k, v, bad, lens, cu)
    with pytest.raises(ValueError, match=r"seq_lens\[1\] = 3 is less than the request's 4 new tokens"):
        sparsek.decode_attention(q, k, v, pt, np.array([70, 3], np.int32), cu)
    with pytest.raises(ValueError, match=r"request 1 has 0 new tokens"):
        sparsek.decode_attention(q[:2], k, v, pt, lens, np.array([0, 1, 1], np.int32))
    idx = sel[0].copy()
    idx[0, 0, :2] = [1, 1]
    cnt = sel[1].copy()
    cnt[0, 0] = 2
    with pytest.raises(ValueError, match=r"sel_indices\[0, 0, 1\] = 1 repeats"):
        sparsek.decode_attention(q, k, v, pt, lens, cu, selection=(idx, cnt))
    cnt[0, 0] = -1
    with pytest.raises(ValueError, match=r"sel_counts\[0, 0\] = -1"):
        sparsek.decode_attention(q, k, v, pt, lens, cu, selection=(idx, cnt))
    with pytest.raises(ValueError, match="page_table dtype int64 must be int32"):
        sparsek.decode_attention(q, k, v, pt.astype(np.int64), lens, cu)
    with pytest.raises(ValueError, match=r"q must be a 3-D array"):
        sparsek.decode_attention(q[None], k, v, pt, lens, cu)
    with pytest.raises(ValueError, match=r"k.page_size = 24 is not supported"):
        kk = np.zeros((k.shape[0], 24, 2, 64), np.float32)
        sparsek.decode_attention(q, kk, kk, pt, lens, cu)
    with pytest.raises(TypeError, match="selection must be None or a pair"):
        sparsek.decode_attention(q, k, v, pt, lens, cu, selection=sel[0])


torch = None
try:
    import torch  # noqa: F811
except ImportError:
    pass
HAS_CUDA = torch is not None and torch_cuda()[0]


@pytest.mark.skipif(not HAS_CUDA, reason="torch with a CUDA device is needed")
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_torch_cuda_and_graph(rng, dtype):
    tdt = getattr(torch, dtype)
    q, k, v, pt, lens, cu, sel = make_case(rng, [1, 16, 4], [300, 500, 64], 8, 2, 128, 64, sel_frac=0.4,
                                           empty={(0, 1)})
    dev = [torch.from_numpy(x).cuda() for x in (q, k, v)]
    dev = [x.to(tdt) for x in dev]
    ints = [torch.from_numpy(x).cuda() for x in (pt, lens, cu, sel[0], sel[1])]
    o, lse = sparsek.decode_attention(dev[0], dev[1], dev[2], *ints[:3], selection=(ints[3], ints[4]))
    qr, kr, vr = (x.float().cpu().numpy() for x in dev)
    ro, rl = reference(qr, kr, vr, pt, lens, cu, sel)
    tol = 2e-2 if dtype == "bfloat16" else 3e-3
    np.testing.assert_allclose(o.float().cpu().numpy(), ro, atol=tol)
    np.testing.assert_allclose(lse.cpu().numpy(), rl, atol=2e-3)

    # A plan captured in a CUDA graph, replayed with another page table (the same pages permuted).
    o2, l2 = torch.empty_like(o), torch.empty_like(lse)
    p = sparsek.plan_decode(dev[0], dev[1], dev[2], o2, l2, *ints[:3], selection=(ints[3], ints[4]), kv_splits=3)
    s = torch.cuda.Stream()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        p.run(dev[0], dev[1], dev[2], o2, l2, *ints, torch.cuda.current_stream().cuda_stream)
    perm = rng.permutation(k.shape[0])
    inv = np.argsort(perm)
    dev[1].copy_(dev[1][torch.from_numpy(inv).cuda()])
    dev[2].copy_(dev[2][torch.from_numpy(inv).cuda()])
    ints[0].copy_(torch.from_numpy(perm[pt.clip(0, k.shape[0] - 1)].astype(np.int32)).cuda())
    g.replay()
    torch.cuda.synchronize()
    np.testing.assert_allclose(o2.float().cpu().numpy(), ro, atol=tol)
    np.testing.assert_allclose(l2.cpu().numpy(), rl, atol=2e-3)


def test_numpy_calls_do_not_import_torch():
    # The torch ops module is imported on the first torch call only.
    code = ("import sys, numpy as np, sparsek; "
            "q = np.zeros((1, 2, 64), np.float32); k = np.zeros((2, 16, 1, 64), np.float32); "
            "pt = np.array([[0, 1]], np.int32); lens = np.array([20], np.int32); cu = np.array([0, 1], np.int32); "
            "s = sparsek.update_page_summaries(sparsek.page_summaries(k), k, pt, lens, cu, all_pages=True); "
            "sel = sparsek.select_pages(q, s, pt, lens, cu, 1, page_size=16); "
            "sparsek.decode_attention(q, k, k, pt, lens, cu, selection=sel); "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False"], "a NumPy decode imported torch"


# ---------------------------------------------------------------- torch: CPU tensors, the custom op

NO_TORCH = "torch is not installed"
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not HAS_CUDA, reason="torch with a CUDA device "
                                                                                     "is needed"))]


@pytest.mark.skipif(torch is None, reason=NO_TORCH)
def test_torch_cpu_gives_the_numpy_paths_bits(rng):
    """torch CPU tensors through sparsek.decode_attention (the eager path) and through
    torch.ops.sparsek.decode_attention: the NumPy call's bits, with and without a selection."""
    q, k, v, pt, lens, cu, sel = make_case(rng, [2, 1, 4], [70, 33, 100], 4, 2, 64, 16, sel_frac=0.4,
                                           empty={(1, 0)})
    t = [torch.from_numpy(x) for x in (q, k, v, pt, lens, cu)]
    tsel = tuple(torch.from_numpy(x) for x in sel)
    for selection, tselection, causal, scale in ((None, None, True, None), (sel, tsel, True, None),
                                                 (sel, tsel, False, 0.3)):
        want = sparsek.decode_attention(q, k, v, pt, lens, cu, selection=selection, causal_new=causal, scale=scale)
        got = sparsek.decode_attention(*t, selection=tselection, causal_new=causal, scale=scale)
        assert got[0].dtype == torch.float32 and got[1].dtype == torch.float32
        idx, cnt = tselection if tselection is not None else (None, None)
        op = torch.ops.sparsek.decode_attention(*t, idx, cnt, causal, 0.0 if scale is None else scale, True)
        for o, lse in (got, op):
            np.testing.assert_array_equal(o.numpy(), want[0])
            np.testing.assert_array_equal(lse.numpy(), want[1])
    got_plain = sparsek.decode_attention(*t)
    # The named errors come from the same library call.
    bad = t[3].clone()
    bad[0, 1] = 10_000
    with pytest.raises(ValueError, match=r"page_table\[0, 1\] = 10000 is out of range"):
        sparsek.decode_attention(t[0], t[1], t[2], bad, t[4], t[5])
    # Inputs that require grad are read (the values are the same), but decode defines no gradient:
    # a backward through it raises, naming the op.
    o, _ = sparsek.decode_attention(t[0].clone().requires_grad_(), *t[1:])
    np.testing.assert_array_equal(o.detach().numpy(), got_plain[0].numpy())
    with pytest.raises(RuntimeError, match=r"sparsek\.decode_attention.*no autograd formula"):
        o.sum().backward()


@pytest.mark.skipif(torch is None, reason=NO_TORCH)
@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(rng, device):
    from sparsek import _torch_decode  # noqa: F401  (registers torch.ops.sparsek.decode_attention)
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    q, k, v, pt, lens, cu, sel = make_case(rng, [1, 3], [40, 70], 4, 2, 64, 16, sel_frac=0.5)
    q, k, v = (torch.from_numpy(x).to(device, dtype) for x in (q, k, v))
    pt, lens, cu, idx, cnt = (torch.from_numpy(x).to(device) for x in (pt, lens, cu, *sel))
    op = torch.ops.sparsek.decode_attention.default
    torch.library.opcheck(op, (q, k, v, pt, lens, cu, idx, cnt, True, 0.0, True))
    torch.library.opcheck(op, (q, k, v, pt, lens, cu, None, None, False, 0.25, False))


@pytest.mark.skipif(torch is None, reason=NO_TORCH)
@pytest.mark.parametrize("device", DEVICES)
def test_unchecked_calls_run_one_plan_per_signature(rng, device):
    """check_indices=False (the serving loop's calls): a plan made on the first call of a signature,
    later calls pass data pointers only; the same bits as the checked one-shot call, new contents
    followed, a new signature gets its own plan."""
    from sparsek import _torch_decode as TD
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    q, k, v, pt, lens, cu, sel = make_case(rng, [2, 1, 4], [70, 33, 100], 4, 2, 64, 16, sel_frac=0.4,
                                           empty={(1, 0)})
    t = [torch.from_numpy(x).to(device) for x in (q, k, v, pt, lens, cu)]
    t[:3] = [x.to(dtype) for x in t[:3]]
    tsel = tuple(torch.from_numpy(x).to(device) for x in sel)
    TD._decode_plans.clear()
    for selection in (None, tsel):
        want = sparsek.decode_attention(*t, selection=selection)
        got = sparsek.decode_attention(*t, selection=selection, check_indices=False)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, atol=0, rtol=0)
    assert len(TD._decode_plans) == 2  # with and without a selection
    # New values and a new page table (the same pages permuted) through the same plan.
    perm = torch.from_numpy(rng.permutation(k.shape[0])).to(device)
    inv = torch.argsort(perm)
    t2 = [t[0] * 0.5, t[1][inv], t[2][inv], perm.to(torch.int32)[t[3].clamp(0, k.shape[0] - 1).long()], t[4], t[5]]
    got = sparsek.decode_attention(*t2, selection=tsel, check_indices=False)
    want = sparsek.decode_attention(*t2, selection=tsel)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=0, rtol=0)
    assert len(TD._decode_plans) == 2
