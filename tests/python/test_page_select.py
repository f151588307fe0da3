"""Page selection for decode from Python: the summaries and the selection of the NumPy path (the CPU
backend) against a brute-force NumPy reference on integer data (exact, ties included), an update
that touches only the new tokens' pages, the selection fed to decode_attention, the named errors;
torch on the CPU and on CUDA (skipped with the reason when no GPU answers) giving the NumPy path's
bits, the custom ops (opcheck, a serving step under torch.compile) and a CUDA graph of the unchecked
calls."""
import numpy as np
import pytest

import sparsek
from test_decode import reference as decode_reference

SLOT_POISON = 30000.0  # cache slots nobody stores: a summary that reads one is wrong
SUM_POISON = -768.0    # summaries no update may touch (exact in float16 and bfloat16)


def make_case(rng, new_tokens, seq_lens, hq, hkv, d, page, integers=True):
    """q, k, v [float32], page_table, seq_lens, cu_seqlens_q of a ragged batch over shuffled physical
    pages (three spare ones nobody owns). Integer data in [-4, 4] makes every bound exact in float32;
    unstored slots of k hold SLOT_POISON."""
    B = len(new_tokens)
    cu = np.concatenate([[0], np.cumsum(new_tokens)]).astype(np.int32)
    npages = [-(-L // page) for L in seq_lens]
    max_pages = max(npages) + 1
    pages = sum(npages) + 3
    perm = rng.permutation(pages).astype(np.int32)
    pt = np.full((B, max_pages), pages + 100, np.int32)  # out of range where never read
    k = np.full((pages, page, hkv, d), SLOT_POISON, np.float32)
    nxt = 0
    for b in range(B):
        pt[b, :npages[b]] = perm[nxt:nxt + npages[b]]
        nxt += npages[b]
        for x in range(seq_lens[b]):
            k[pt[b, x // page], x % page] = rng.integers(-4, 5, (hkv, d)) if integers else rng.uniform(-1, 1, (hkv, d))
    v = rng.uniform(-1, 1, k.shape).astype(np.float32)
    T = int(cu[-1])
    q = rng.integers(-4, 5, (T, hq, d)) if integers else rng.uniform(-1, 1, (T, hq, d))
    return q.astype(np.float32), k, v, pt, np.array(seq_lens, np.int32), cu


def ref_summary(k, pt, lens, b, p):
    """[Hkv, 2, D] min and max over the stored slots of request b's logical page p."""
    page = k.shape[1]
    slots = k[pt[b, p], :min(page, lens[b] - p * page)].astype(np.float64)
    return np.stack([slots.min(axis=0), slots.max(axis=0)], axis=1)


def ref_selection(q, k, pt, lens, cu, topk, sink, local, kmax):
    """Brute force from the definition: bounds in float64, the kept pages ascending, zeros past the
    count."""
    B, hkv, page = len(lens), k.shape[2], k.shape[1]
    g = q.shape[1] // hkv
    idx = np.zeros((B, hkv, kmax), np.int32)
    cnt = np.zeros((B, hkv), np.int32)
    for b in range(B):
        npages = -(-int(lens[b]) // page)
        qs = q[cu[b]:cu[b + 1]].astype(np.float64)  # [n, Hq, D]
        for hk in range(hkv):
            group = qs[:, hk * g:(hk + 1) * g].reshape(-1, q.shape[2])  # every query of the group
            scores = []
            for p in range(npages):
                mn, mx = ref_summary(k, pt, lens, b, p)[hk]
                scores.append(np.where(group >= 0, group * mx, group * mn).sum(axis=1).max())
            keep = {p for p in range(npages) if p < sink or p >= npages - local}
            others = sorted((p for p in range(npages) if p not in keep), key=lambda p: (-scores[p], p))
            keep |= set(others[:topk])
            row = sorted(keep)
            idx[b, hk, :len(row)] = row
            cnt[b, hk] = len(row)
    return idx, cnt


def check_summaries(summaries, k, pt, lens, cu, all_pages, untouched):
    """The touched pages' summaries exactly; every other physical page still holds `untouched`."""
    page = k.shape[1]
    touched = set()
    for b in range(len(lens)):
        first = 0 if all_pages else (int(lens[b]) - int(cu[b + 1] - cu[b])) // page
        for p in range(first, -(-int(lens[b]) // page)):
            touched.add(int(pt[b, p]))
            np.testing.assert_array_equal(summaries[pt[b, p]], ref_summary(k, pt, lens, b, p),
                                          err_msg=f"request {b} page {p}")
    for pp in set(range(k.shape[0])) - touched:
        assert np.all(summaries[pp] == untouched), f"physical page {pp} was written"


SHAPES = [(4, 1, 64, 16), (8, 2, 128, 32), (2, 2, 64, 128)]  # hq, hkv, d, page_size
KEEP = [(3, 1, 1), (0, 0, 0), (1, 0, 0), (1000, 0, 0), (2, 30, 30), (4, 0, 3)]  # topk, sink, local


@pytest.mark.parametrize("hq,hkv,d,page", SHAPES)
@pytest.mark.parametrize("topk,sink,local", KEEP)
def test_numpy_matches_the_reference_exactly(rng, hq, hkv, d, page, topk, sink, local):
    q, k, _, pt, lens, cu = make_case(rng, [1, 16, 3, 1], [1, 9 * page + 5, 4 * page, 2 * page + 2], hq, hkv, d, page)
    s = sparsek.page_summaries(k)
    assert s.shape == (k.shape[0], hkv, 2, d) and s.dtype == np.float32 and not s.any()
    assert sparsek.update_page_summaries(s, k, pt, lens, cu, all_pages=True) is s
    check_summaries(s, k, pt, lens, cu, True, 0.0)
    idx, cnt = sparsek.select_pages(q, s, pt, lens, cu, topk, sink, local, page_size=page)
    kmax = min(pt.shape[1], topk + sink + local)
    assert idx.dtype == np.int32 and cnt.dtype == np.int32
    assert idx.shape == (len(lens), hkv, kmax) and cnt.shape == (len(lens), hkv)
    want_idx, want_cnt = ref_selection(q, k, pt, lens, cu, topk, sink, local, kmax)
    np.testing.assert_array_equal(cnt, want_cnt)
    np.testing.assert_array_equal(idx, want_idx)


def test_kmax_wider_than_needed_pads_with_zeros(rng):
    q, k, _, pt, lens, cu = make_case(rng, [2, 1], [100, 40], 4, 2, 64, 16)
    s = sparsek.update_page_summaries(sparsek.page_summaries(k), k, pt, lens, cu, all_pages=True)
    idx, cnt = sparsek.select_pages(q, s, pt, lens, cu, 2, page_size=16, kmax=pt.shape[1])
    want_idx, want_cnt = ref_selection(q, k, pt, lens, cu, 2, 1, 1, pt.shape[1])
    np.testing.assert_array_equal(cnt, want_cnt)
    np.testing.assert_array_equal(idx, want_idx)


def test_ties_go_to_the_lower_page(rng):
    q, k, _, pt, lens, cu = make_case(rng, [1, 2], [200, 97], 2, 1, 64, 16)
    q[:] = 1
    s = np.full((k.shape[0], 1, 2, 64), 2.0, np.float32)  # every page scores the same
    idx, cnt = sparsek.select_pages(q, s, pt, lens, cu, 3, 0, 0, page_size=16)
    np.testing.assert_array_equal(cnt, [[3], [3]])
    np.testing.assert_array_equal(idx[:, 0], [[0, 1, 2], [0, 1, 2]])


@pytest.mark.parametrize("page", [16, 32])
def test_update_touches_only_the_new_tokens_pages(rng, page):
    # 16 new tokens starting mid-page span two pages; a request of one token; one ending a page.
    q, k, _, pt, lens, cu = make_case(rng, [16, 1, 3], [5 * page + 7, 1, 3 * page], 4, 2, 64, page)
    s = np.full((k.shape[0], 2, 2, 64), SUM_POISON, np.float32)
    sparsek.update_page_summaries(s, k, pt, lens, cu)
    check_summaries(s, k, pt, lens, cu, False, SUM_POISON)


def test_a_decode_step_feeds_decode_attention(rng):
    # Prefill's summaries, then one step: append the new keys, update, select, decode.
    q, k, v, pt, lens, cu = make_case(rng, [1, 4, 2], [300, 129, 64], 8, 2, 128, 32, integers=False)
    s = sparsek.page_summaries(k)
    sparsek.update_page_summaries(s, k, pt, lens - (cu[1:] - cu[:-1]), np.array([0, 1, 2, 3], np.int32),
                                  all_pages=True)
    sparsek.update_page_summaries(s, k, pt, lens, cu)  # the step's keys are in the cache now
    check_summaries(s, k, pt, lens, cu, True, 0.0)
    sel = sparsek.select_pages(q, s, pt, lens, cu, 3, page_size=32)
    o, lse = sparsek.decode_attention(q, k, v, pt, lens, cu, selection=sel)
    ro, rl = decode_reference(q, k, v, pt, lens, cu, sel)
    np.testing.assert_allclose(o, ro, atol=1e-5)
    np.testing.assert_allclose(lse, rl, atol=1e-5)
    assert sel[1].min() >= 2  # the sink and the newest page at least: a real selection was read


def test_named_errors(rng):
    q, k, _, pt, lens, cu = make_case(rng, [1, 4], [70, 40], 4, 2, 64, 16)
    s = sparsek.update_page_summaries(sparsek.page_summaries(k), k, pt, lens, cu, all_pages=True)

    def sel(page_size=16, **kw):
        a = dict(q=q, summaries=s, page_table=pt, seq_lens=lens, cu_seqlens_q=cu, topk=2)
        a.update(kw)
        return sparsek.select_pages(page_size=page_size, **a)

    with pytest.raises(ValueError, match=r"q must be a 3-D array \[T, Hq, D\]"):
        sel(q=q[None])
    with pytest.raises(ValueError, match=r"summaries must be a 4-D array"):
        sel(summaries=s[0])
    with pytest.raises(ValueError, match="summaries dtype float16 differs from q dtype float32"):
        sel(summaries=s.astype(np.float16))
    with pytest.raises(ValueError, match=r"page_size = 24 is not supported"):
        sel(page_size=24)
    with pytest.raises(ValueError, match=r"kmax = 3 is out of range \[min\(max_pages, topk \+ sink \+ local\) = 4"):
        sel(kmax=3)
    with pytest.raises(ValueError, match=r"kmax = 99 is out of range .* max_pages = 6\]"):
        sel(kmax=99)
    with pytest.raises(ValueError, match="topk must be >= 0, got -1"):
        sel(topk=-1)
    with pytest.raises(TypeError, match="sink must be an int"):
        sel(sink=1.5)
    with pytest.raises(ValueError, match="q has 4 heads, not a multiple of the summaries' Hkv = 3"):
        sel(summaries=np.zeros((k.shape[0], 3, 2, 64), np.float32))
    with pytest.raises(ValueError, match=r"have D = 128 but q .* has D = 64"):
        sel(summaries=np.zeros((k.shape[0], 2, 2, 128), np.float32))
    with pytest.raises(ValueError, match="page_table dtype int64 must be int32"):
        sel(page_table=pt.astype(np.int64))
    with pytest.raises(TypeError, match="summaries is required, got None"):
        sel(summaries=None)
    bad = pt.copy()
    bad[1, 0] = 10_000
    with pytest.raises(ValueError, match=r"select_pages: page_table\[1, 0\] = 10000 is out of range"):
        sel(page_table=bad)
    with pytest.raises(ValueError, match=r"update_page_summaries: page_table\[1, 0\] = 10000 is out of range"):
        sparsek.update_page_summaries(s.copy(), k, bad, lens, cu)
    # Unchecked: no error, and the counts stay in range.
    idx, cnt = sel(page_table=bad, check_indices=False)
    assert cnt.min() >= 0 and cnt.max() <= idx.shape[2]
    sparsek.update_page_summaries(s.copy(), k, bad, lens, cu, check_indices=False)

    with pytest.raises(ValueError, match=r"cu_seqlens_q\[2\] = 40: a batch of 2 requests has 1 to 16 new tokens"):
        sparsek.update_page_summaries(s, k, pt, lens, np.array([0, 1, 40], np.int32))
    with pytest.raises(ValueError, match="cu_seqlens_q dtype int64 must be int32"):
        sparsek.update_page_summaries(s, k, pt, lens, cu.astype(np.int64))
    with pytest.raises(ValueError, match=r"request 1 has 0 new tokens"):
        sparsek.update_page_summaries(s, k, pt, lens, np.array([0, 2, 2], np.int32))
    with pytest.raises(ValueError, match=r"summaries has shape \(9, 2, 2, 64\), expected \[num_pages, Hkv, 2, D\]"):
        sparsek.update_page_summaries(s[:9], k, pt, lens, cu)
    with pytest.raises(ValueError, match="summaries dtype float16 differs from k_cache dtype float32"):
        sparsek.update_page_summaries(s.astype(np.float16), k, pt, lens, cu)
    with pytest.raises(ValueError, match="k_cache must be a 4-D array"):
        sparsek.update_page_summaries(s, k[0], pt, lens, cu)
    with pytest.raises(ValueError, match="summaries is a read-only array"):
        sparsek.update_page_summaries(np.broadcast_to(s, s.shape), k, pt, lens, cu)
    with pytest.raises(TypeError, match="all_pages must be True or False"):
        sparsek.update_page_summaries(s, k, pt, lens, cu, all_pages=1)
    with pytest.raises(ValueError, match="summaries overlaps k"):
        sparsek.update_page_summaries(k.reshape(-1)[:s.size].reshape(s.shape), k, pt, lens, cu)


# ---------------------------------------------------------------- torch: CPU and CUDA

torch = None
try:
    import torch  # noqa: F811
except ImportError:
    pass
HAS_CUDA = torch is not None and torch.cuda.is_available()
NO_CUDA = "torch with a CUDA device is needed"
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not HAS_CUDA, reason=NO_CUDA))]


def _t(x, device, dtype=None):
    t = torch.from_numpy(np.ascontiguousarray(x)).to(device)
    return t if dtype is None else t.to(dtype)


@pytest.mark.skipif(torch is None, reason="torch is not installed")
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("integers", [True, False])
def test_torch_gives_the_numpy_paths_bits(rng, device, dtype, integers):
    """torch tensors on `device` against the CPU backend on the same values: integer data against
    the NumPy float32 path (the values are exact in 16 bits, every bound exact), real data against
    torch CPU tensors of the same dtype (the GPU's bounds may differ from the CPU's in their last
    bits; this seeded case has no two pages that close at the threshold)."""
    tdt = getattr(torch, dtype)
    q, k, _, pt, lens, cu = make_case(rng, [1, 16, 4, 2], [300, 500, 64, 33], 8, 2, 128, 64, integers=integers)
    q16, k16 = _t(q, "cpu", tdt), _t(k, "cpu", tdt)
    if integers:
        s_want = sparsek.update_page_summaries(sparsek.page_summaries(k), k, pt, lens, cu, all_pages=True)
        idx_want, cnt_want = sparsek.select_pages(q, s_want, pt, lens, cu, 3, 1, 2, page_size=64)
        s_want = torch.from_numpy(s_want).to(tdt)
    else:
        host = [_t(x, "cpu") for x in (pt, lens, cu)]
        s_want = sparsek.update_page_summaries(sparsek.page_summaries(k16), k16, *host, all_pages=True)
        idx_want, cnt_want = (x.numpy() for x in sparsek.select_pages(q16, s_want, *host, 3, 1, 2, page_size=64))

    ints = [_t(x, device) for x in (pt, lens, cu)]
    s = sparsek.page_summaries(_t(k, device, tdt))
    assert s.device.type == device and s.dtype == tdt and s.shape == (k.shape[0], 2, 2, 128)
    sparsek.update_page_summaries(s, _t(k, device, tdt), *ints, all_pages=True)
    idx, cnt = sparsek.select_pages(_t(q, device, tdt), s, *ints, 3, 1, 2, page_size=64)
    assert idx.device.type == device and idx.dtype == torch.int32 and cnt.dtype == torch.int32
    assert torch.equal(s.cpu(), s_want)
    np.testing.assert_array_equal(cnt.cpu().numpy(), cnt_want)
    np.testing.assert_array_equal(idx.cpu().numpy(), idx_want)
    # The selection is what decode_attention takes, on the device.
    v16 = _t(rng.uniform(-1, 1, k.shape).astype(np.float32), device, tdt)
    o, lse = sparsek.decode_attention(_t(q, device, tdt), _t(k, device, tdt), v16, *ints, selection=(idx, cnt))
    assert torch.isfinite(lse).all()


@pytest.mark.skipif(torch is None, reason="torch is not installed")
@pytest.mark.parametrize("device", DEVICES)
def test_torch_keeping_nothing(rng, device):
    # topk = sink = local = 0: kmax 0, every count 0, and decode_attention takes that (O = 0, LSE = -inf).
    q, k, v, pt, lens, cu = make_case(rng, [1, 2], [40, 70], 2, 1, 64, 16)
    dt = torch.float32 if device == "cpu" else torch.float16
    qd, kd, vd = (_t(x, device, dt) for x in (q, k, v))
    ints = [_t(x, device) for x in (pt, lens, cu)]
    s = sparsek.update_page_summaries(sparsek.page_summaries(kd), kd, *ints, all_pages=True)
    idx, cnt = sparsek.select_pages(qd, s, *ints, 0, 0, 0, page_size=16)
    assert idx.shape == (2, 1, 0) and cnt.shape == (2, 1) and not cnt.any()
    o, lse = sparsek.decode_attention(qd, kd, vd, *ints, selection=(idx, cnt))
    assert torch.isneginf(lse).all() and not o.any()


@pytest.mark.skipif(torch is None, reason="torch is not installed")
def test_torch_arrays_must_share_a_device_and_a_framework(rng):
    q, k, _, pt, lens, cu = make_case(rng, [1], [40], 2, 1, 64, 16)
    s = sparsek.page_summaries(k)
    with pytest.raises(TypeError, match="is a torch array but q is a numpy array"):
        sparsek.select_pages(q, torch.from_numpy(s), pt, lens, cu, 1, page_size=16)
    with pytest.raises(ValueError, match="summaries dtype bfloat16 differs from q dtype float32"):
        sparsek.select_pages(torch.from_numpy(q), torch.from_numpy(s).bfloat16(), *(torch.from_numpy(x) for x in
                                                                                  (pt, lens, cu)), 1, page_size=16)


@pytest.mark.skipif(torch is None, reason="torch is not installed")
@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(rng, device):
    from sparsek import _torch_decode  # noqa: F401  (registers the torch.ops.sparsek ops)
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    q, k, _, pt, lens, cu = make_case(rng, [1, 3], [40, 70], 4, 2, 64, 16, integers=False)
    qd, kd = _t(q, device, dtype), _t(k, device, dtype)
    ints = [_t(x, device) for x in (pt, lens, cu)]
    update = torch.ops.sparsek.update_page_summaries.default
    # From zeros, so that every call writes the summaries it declares it mutates.
    torch.library.opcheck(update, (torch.zeros(k.shape[0], 2, 2, 64, dtype=dtype, device=device), kd, *ints,
                                   True, True))
    torch.library.opcheck(update, (torch.zeros(k.shape[0], 2, 2, 64, dtype=dtype, device=device), kd, *ints,
                                   False, False))
    s = sparsek.update_page_summaries(sparsek.page_summaries(kd), kd, *ints, all_pages=True)
    select = torch.ops.sparsek.select_pages.default
    torch.library.opcheck(select, (qd, s, *ints, 16, 2, 1, 1, 4, True))
    torch.library.opcheck(select, (qd, s, *ints, 16, 1, 0, 1, pt.shape[1], False))


@pytest.mark.skipif(torch is None, reason="torch is not installed")
def test_torch_compile_serving_step(rng):
    """A serving step (update the summaries, select the pages, decode over them) under
    torch.compile(fullgraph=True) on CPU tensors: the eager call's bits, the summaries included
    (the update mutates its input through the op)."""
    q, k, v, pt, lens, cu = make_case(rng, [1, 4, 2], [100, 49, 64], 4, 2, 64, 16, integers=False)
    qd, kd, vd = (_t(x, "cpu") for x in (q, k, v))
    ints = [_t(x, "cpu") for x in (pt, lens, cu)]
    prefill = sparsek.update_page_summaries(sparsek.page_summaries(kd), kd, ints[0],
                                            ints[1] - (ints[2][1:] - ints[2][:-1]),
                                            torch.arange(4, dtype=torch.int32), all_pages=True)

    def step(q, k, v, summaries, page_table, seq_lens, cu_seqlens_q):
        sparsek.update_page_summaries(summaries, k, page_table, seq_lens, cu_seqlens_q)
        sel = sparsek.select_pages(q, summaries, page_table, seq_lens, cu_seqlens_q, 2, page_size=16,
                                   check_indices=False)
        o, lse = sparsek.decode_attention(q, k, v, page_table, seq_lens, cu_seqlens_q, selection=sel)
        return o, lse, sel[0], sel[1]

    torch._dynamo.reset()
    s_got, s_want = prefill.clone(), prefill.clone()
    got = torch.compile(step, fullgraph=True)(qd, kd, vd, s_got, *ints)
    want = step(qd, kd, vd, s_want, *ints)
    assert not torch.equal(s_want, prefill)  # the step's update wrote something
    for a, b in zip(got + (s_got,), want + (s_want,)):
        torch.testing.assert_close(a, b, atol=0, rtol=0)
    assert want[3].min() >= 2  # the sink and the newest page at least


@pytest.mark.skipif(torch is None, reason="torch is not installed")
@pytest.mark.parametrize("device", DEVICES)
def test_unchecked_calls_run_one_problem_per_signature(rng, device):
    """check_indices=False: each page operation is checked once per signature, later calls pass
    data pointers only; the checked calls' bits, new contents followed."""
    from sparsek import _torch_decode as TD
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    q, k, _, pt, lens, cu = make_case(rng, [1, 4, 2], [100, 49, 64], 4, 2, 64, 16, integers=False)
    qd, kd = _t(q, device, dtype), _t(k, device, dtype)
    ints = [_t(x, device) for x in (pt, lens, cu)]
    TD._page_problems.clear()
    for scale in (1.0, -2.0):  # new contents through the same problems
        kx, qx = kd * scale, qd * scale
        s_want = sparsek.update_page_summaries(sparsek.page_summaries(kx), kx, *ints, all_pages=True)
        s_got = sparsek.update_page_summaries(sparsek.page_summaries(kx), kx, *ints, all_pages=True,
                                              check_indices=False)
        assert torch.equal(s_got, s_want)
        want = sparsek.select_pages(qx, s_want, *ints, 2, page_size=16)
        got = sparsek.select_pages(qx, s_want, *ints, 2, page_size=16, check_indices=False)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        assert len(TD._page_problems) == 2
    got = sparsek.select_pages(qd, s_want, *ints, 1, page_size=16, check_indices=False)  # another topk
    assert len(TD._page_problems) == 3


@pytest.mark.skipif(not HAS_CUDA, reason=NO_CUDA)
def test_cuda_mixed_places_and_graph(rng):
    q, k, _, pt, lens, cu = make_case(rng, [2, 1], [200, 65], 8, 2, 64, 32, integers=False)
    qd, kd = _t(q, "cuda", torch.bfloat16), _t(k, "cuda", torch.bfloat16)
    ints = [_t(x, "cuda") for x in (pt, lens, cu)]
    s = sparsek.page_summaries(kd)
    with pytest.raises(ValueError, match="seq_lens is in host memory but k_cache is in CUDA device"):
        sparsek.update_page_summaries(s, kd, ints[0], _t(lens, "cpu"), ints[2])
    with pytest.raises(ValueError, match="summaries is in host memory but q is in CUDA device"):
        sparsek.select_pages(qd, s.cpu(), *ints, 2, page_size=32)
    with pytest.raises(ValueError, match="seq_lens is in host memory but page_table is in CUDA device"):
        sparsek.decode_attention(qd, kd, kd, ints[0], _t(lens, "cpu"), ints[2])  # checked there too
    sparsek.update_page_summaries(s, kd, *ints, all_pages=True)
    want = sparsek.select_pages(qd, s, *ints, 2, page_size=32)

    # Unchecked calls neither synchronize nor allocate in the library: they can be captured.
    s2 = sparsek.page_summaries(kd)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        sparsek.update_page_summaries(s2, kd, *ints, all_pages=True, check_indices=False)
        got = sparsek.select_pages(qd, s2, *ints, 2, page_size=32, check_indices=False)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(s2, s)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_cupy_gives_the_numpy_paths_bits(rng):
    cp = pytest.importorskip("cupy", reason="CuPy is not installed")
    try:
        cp.cuda.runtime.getDeviceCount()
    except cp.cuda.runtime.CUDARuntimeError as e:
        pytest.skip(f"CuPy finds no CUDA device: {e}")
    q, k, _, pt, lens, cu = make_case(rng, [3, 1], [150, 64], 4, 1, 64, 16)
    s_want = sparsek.update_page_summaries(sparsek.page_summaries(k), k, pt, lens, cu, all_pages=True)
    idx_want, cnt_want = sparsek.select_pages(q, s_want, pt, lens, cu, 2, page_size=16)
    ints = [cp.asarray(x) for x in (pt, lens, cu)]
    kd = cp.asarray(k.astype(np.float16))
    s = sparsek.update_page_summaries(sparsek.page_summaries(kd), kd, *ints, all_pages=True)
    idx, cnt = sparsek.select_pages(cp.asarray(q.astype(np.float16)), s, *ints, 2, page_size=16)
    assert isinstance(idx, cp.ndarray) and idx.dtype == np.int32
    np.testing.assert_array_equal(cp.asnumpy(s), s_want.astype(np.float16))
    np.testing.assert_array_equal(cp.asnumpy(idx), idx_want)
    np.testing.assert_array_equal(cp.asnumpy(cnt), cnt_want)
