"""bench/fa4_layout.py: a sparsek block layout as FlashAttention-4's block-sparse lists (the
benchmark's FA4 peer). CPU only: the lists against a loop-by-loop construction, the backward lists
as the transpose, mask vs full blocks (causal diagonal, key tail), and the elements FA4 would attend
with those lists against the elements sparsek attends with the layout."""
import os
import sys

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
import sparsek  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "bench"))
from fa4_layout import fa4_lists, fa4_lists_from_layout, lists_from_dense  # noqa: E402


def cdiv(a, b):
    return (a + b - 1) // b


def random_mask(gen, B, H, nq, nk, density):
    return torch.rand(B, H, nq, nk, generator=gen) < density


def rows_of(cnt, idx):
    """Python lists of each row's indices (the first cnt entries)."""
    B, H, R = cnt.shape
    return [[[idx[b, h, r, :cnt[b, h, r]].tolist() for r in range(R)] for h in range(H)] for b in range(B)]


def loop_lists(attended, kind):
    """kind[b][h][r] -> ascending column lists of attended[b, h, r] where kind(r, c) holds."""
    B, H, R, C = attended.shape
    return [[[[c for c in range(C) if attended[b, h, r, c] and kind(r, c)] for r in range(R)] for h in range(H)]
            for b in range(B)]


def dense_of(cnt, idx, cols):
    out = torch.zeros(*cnt.shape, cols, dtype=torch.bool)
    for b, hs in enumerate(rows_of(cnt, idx)):
        for h, rs in enumerate(hs):
            for r, cs in enumerate(rs):
                assert len(set(cs)) == len(cs), "duplicate index in a row"
                out[b, h, r, cs] = True
    return out


def check_shapes(lists, B, H, nq, nk):
    for name, x in lists._asdict().items():
        assert x.dtype == torch.int32 and x.is_contiguous(), name
        # row-major strides on every dimension, size-1 ones included (FA4 checks the last one)
        assert x.stride() == torch.empty(x.shape).stride(), name
        rows = nk if name.startswith("bwd") else nq
        assert tuple(x.shape[:3]) == (B, H, rows), name
        if name.endswith("idx"):
            cols = nq if name.startswith("bwd") else nk
            cnt = getattr(lists, name.replace("idx", "cnt"))
            assert x.shape[3] == max(1, cols), name  # full width: FA4's Hopper backward broadcasts nothing
            # entries past the count are zero (FA4 never reads them)
            past = torch.arange(x.shape[3]) >= cnt[..., None].long()
            assert not x[past].any(), name


def test_lists_from_dense_ascending_packed_left():
    m = torch.tensor([[[[False, True, False, True], [False] * 4, [True] * 4]]])
    cnt, idx = lists_from_dense(m)
    assert cnt.tolist() == [[[2, 0, 4]]]
    assert idx.tolist() == [[[[1, 3, 0, 0], [0, 0, 0, 0], [0, 1, 2, 3]]]]
    assert idx.dtype == torch.int32 and cnt.dtype == torch.int32


def test_empty_mask_keeps_a_full_width_list():
    cnt, idx = lists_from_dense(torch.zeros(1, 2, 3, 5, dtype=torch.bool))
    assert cnt.sum() == 0 and tuple(idx.shape) == (1, 2, 3, 5) and not idx.any()
    cnt, idx = lists_from_dense(torch.zeros(1, 2, 3, 0, dtype=torch.bool))
    assert tuple(idx.shape) == (1, 2, 3, 1)


@pytest.mark.parametrize("density", [0.125, 0.5])
def test_non_causal_whole_blocks_are_all_full(density):
    gen = torch.Generator().manual_seed(1)
    B, H, S, bs = 2, 3, 16 * 128, 128
    nq = nk = S // bs
    mask = random_mask(gen, B, H, nq, nk, density)
    lists = fa4_lists(mask, q_len=S, kv_len=S, block=bs)
    check_shapes(lists, B, H, nq, nk)
    # nothing for the element mask to do: every attended block is a full block
    assert lists.mask_cnt.sum() == 0 and lists.bwd_mask_cnt.sum() == 0
    assert rows_of(lists.full_cnt, lists.full_idx) == loop_lists(mask, lambda r, c: True)
    # the backward lists: per key block, the query blocks that attend it (the transpose)
    assert torch.equal(dense_of(lists.bwd_full_cnt, lists.bwd_full_idx, nq), mask.transpose(-1, -2))
    assert rows_of(lists.bwd_full_cnt, lists.bwd_full_idx) == loop_lists(mask.transpose(-1, -2), lambda r, c: True)


def test_causal_diagonal_is_mask_above_dropped_below_full():
    gen = torch.Generator().manual_seed(2)
    B, H, S, bs = 1, 4, 12 * 64, 64
    n = S // bs
    mask = random_mask(gen, B, H, n, n, 0.5)
    mask[..., torch.arange(n), torch.arange(n)] = True  # the diagonal, and blocks above it too
    lists = fa4_lists(mask, q_len=S, kv_len=S, block=bs, causal=True)
    check_shapes(lists, B, H, n, n)
    assert rows_of(lists.mask_cnt, lists.mask_idx) == loop_lists(mask, lambda r, c: c == r)
    assert rows_of(lists.full_cnt, lists.full_idx) == loop_lists(mask, lambda r, c: c < r)
    t = mask.transpose(-1, -2)  # rows: key blocks, columns: query blocks
    assert rows_of(lists.bwd_mask_cnt, lists.bwd_mask_idx) == loop_lists(t, lambda r, c: c == r)
    assert rows_of(lists.bwd_full_cnt, lists.bwd_full_idx) == loop_lists(t, lambda r, c: c > r)
    # every query block has its diagonal: one mask block per row, forward and backward
    assert (lists.mask_cnt == 1).all() and (lists.bwd_mask_cnt == 1).all()


def test_key_tail_block_is_a_mask_block():
    gen = torch.Generator().manual_seed(3)
    bs, Sq, Skv = 128, 5 * 128, 6 * 128 - 37  # the last key block holds 91 keys
    nq, nk = cdiv(Sq, bs), cdiv(Skv, bs)
    mask = random_mask(gen, 1, 2, nq, nk, 0.6)
    mask[:, :, 0, nk - 1] = True
    lists = fa4_lists(mask, q_len=Sq, kv_len=Skv, block=bs)
    check_shapes(lists, 1, 2, nq, nk)
    assert rows_of(lists.mask_cnt, lists.mask_idx) == loop_lists(mask, lambda r, c: c == nk - 1)
    assert rows_of(lists.full_cnt, lists.full_idx) == loop_lists(mask, lambda r, c: c < nk - 1)
    assert lists.bwd_mask_cnt[..., :nk - 1].sum() == 0 and lists.bwd_mask_cnt[..., nk - 1].min() >= 1


def test_gqa_rows_repeat_to_every_query_head_of_the_group():
    gen = torch.Generator().manual_seed(4)
    mask = random_mask(gen, 1, 2, 8, 8, 0.4)  # one row per key/value head
    lists = fa4_lists(mask, q_len=8 * 64, kv_len=8 * 64, block=64, q_heads=6)
    check_shapes(lists, 1, 6, 8, 8)
    got = dense_of(lists.full_cnt, lists.full_idx, 8)
    assert torch.equal(got, mask.repeat_interleave(3, 1))
    # a broadcast row (H = 1) stays broadcast: FA4 expands it
    assert lists_from_dense(mask[:, :1])[0].shape[1] == 1
    assert fa4_lists(mask[:, :1], q_len=512, kv_len=512, block=64, q_heads=6).full_cnt.shape[1] == 1


def element_mask_sparsek(partial, full, Sq, Skv, bs, causal):
    """The elements sparsek attends: causal inside the kv-list (partial) blocks, full blocks whole."""
    e = lambda m: m.repeat_interleave(bs, 2).repeat_interleave(bs, 3)[:, :, :Sq, :Skv]  # noqa: E731
    out = e(partial)
    if causal:
        out = out & (torch.arange(Skv)[None, :] <= torch.arange(Sq)[:, None])
    if full is not None:
        out = out | e(full)
    return out


def element_mask_fa4(lists, nk, Sq, Skv, bs, causal):
    """The elements FA4 attends with these lists: every listed block (mask or full), causal applied
    to every block it visits (its causal is a global flag), keys past Skv do not exist."""
    blocks = dense_of(lists.mask_cnt, lists.mask_idx, nk) | dense_of(lists.full_cnt, lists.full_idx, nk)
    out = blocks.repeat_interleave(bs, 2).repeat_interleave(bs, 3)[:, :, :Sq, :Skv]
    if causal:
        out = out & (torch.arange(Skv)[None, :] <= torch.arange(Sq)[:, None])
    return out


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("with_full", [False, True])
def test_fa4_attends_what_sparsek_attends(causal, with_full):
    """From a sparsek BlockLayout (kv lists, and full lists below the diagonal when causal)."""
    gen = torch.Generator().manual_seed(5)
    bs, S = 64, 7 * 64 - (0 if causal else 20)
    n = cdiv(S, bs)
    partial = random_mask(gen, 1, 3, n, n, 0.35)
    partial[..., torch.arange(n), torch.arange(n)] |= causal
    full = None
    if with_full:
        full = random_mask(gen, 1, 3, n, n, 0.35) & ~partial
        if causal:
            full &= torch.ones(n, n, dtype=torch.bool).tril(-1)
    layout = sparsek.BlockLayout.from_dense(partial, full, block=bs)
    lists = fa4_lists_from_layout(layout, q_len=S, kv_len=S, causal=causal)
    p, f = layout.to_dense(n)
    want = element_mask_sparsek(p, f, S, S, bs, causal)
    assert want.any()
    assert torch.equal(element_mask_fa4(lists, n, S, S, bs, causal), want)
    # the backward lists hold the same blocks, transposed
    for kind in ("mask", "full"):
        fwd = dense_of(getattr(lists, f"{kind}_cnt"), getattr(lists, f"{kind}_idx"), n)
        bwd = dense_of(getattr(lists, f"bwd_{kind}_cnt"), getattr(lists, f"bwd_{kind}_idx"), n)
        assert torch.equal(bwd, fwd.transpose(-1, -2)), kind


def test_errors_name_the_argument():
    m = torch.zeros(1, 1, 4, 4, dtype=torch.bool)
    with pytest.raises(ValueError, match="causal needs q_len == kv_len"):
        fa4_lists(torch.zeros(1, 1, 2, 4, dtype=torch.bool), q_len=256, kv_len=512, block=128, causal=True)
    with pytest.raises(ValueError, match="q_len=512, kv_len=256"):
        fa4_lists(m, q_len=512, kv_len=256, block=128)
    with pytest.raises(ValueError, match="partial must be a 4-D bool mask"):
        fa4_lists(m.int(), q_len=512, kv_len=512, block=128)
    with pytest.raises(ValueError, match="full must be a bool mask"):
        fa4_lists(m, m[0], q_len=512, kv_len=512, block=128)
    diag = torch.eye(4, dtype=torch.bool)[None, None]
    with pytest.raises(ValueError, match="full block on or above the causal diagonal"):
        fa4_lists(m, diag, q_len=512, kv_len=512, block=128, causal=True)
    with pytest.raises(ValueError, match="q_heads=5 is not a multiple"):
        fa4_lists(torch.zeros(1, 2, 4, 4, dtype=torch.bool), q_len=512, kv_len=512, block=128, q_heads=5)
