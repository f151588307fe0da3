"""Block-sparse attention and the top-k gate from Python: NumPy and torch (CPU; CUDA skipped with the
reason when no GPU answers) against a float64 torch reference of the same masked attention, the
gate against a torch implementation of the same pooling and top-k, FlexAttention BlockMask
conversions, the custom ops (opcheck, torch.compile, CUDA graphs) and named errors.
The backward (autograd) is in test_attention_backward.py.
"""
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
import sparsek  # noqa: E402
import sparsek.nn  # noqa: E402

from conftest import torch_cuda  # noqa: E402

HAS_CUDA, NO_CUDA = torch_cuda()
cuda_only = pytest.mark.skipif(not HAS_CUDA, reason=NO_CUDA)
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not HAS_CUDA, reason=NO_CUDA))]
F64 = torch.float64


def cdiv(a, b):
    return (a + b - 1) // b


# ---------------------------------------------------------------- the reference

def element_mask(layout, B, Hq, Hkv, Sq, Skv, causal, device="cpu"):
    """Boolean [B, Hq, Sq, Skv]: the elements the layout attends (causal inside partial blocks)."""
    bs = layout.block
    Nk = cdiv(Skv, bs)
    partial, full = (torch.as_tensor(m).to(device) if m is not None else None for m in layout.to_dense(Nk))

    def per_head(m):  # [lb, lh, Mq, Nk] -> [B, Hq, Mq, Nk]
        if m.shape[1] == Hkv and Hkv != Hq:
            m = m.repeat_interleave(Hq // Hkv, 1)
        return m.expand(B, Hq, *m.shape[2:])

    def elems(m):
        return m.repeat_interleave(bs, 2).repeat_interleave(bs, 3)[:, :, :Sq, :Skv]

    e = elems(per_head(partial))
    if causal:
        e = e & (torch.arange(Skv, device=device)[None, :] <= torch.arange(Sq, device=device)[:, None])
    if full is not None:
        e = e | elems(per_head(full))
    return e


def reference(q, k, v, layout, causal=False, scale=None, dtype=F64):
    """(O, LSE) of the masked attention, computed in `dtype` (float64: the oracle; bfloat16: the
    naive low-precision computation the GPU error is measured against)."""
    q, k, v = (torch.as_tensor(x).to(dtype) for x in (q, k, v))
    B, Hq, Sq, D = q.shape
    Hkv, Skv = k.shape[1], k.shape[2]
    scale = 1 / math.sqrt(D) if scale is None else scale
    mask = element_mask(layout, B, Hq, Hkv, Sq, Skv, causal, q.device)
    kk, vv = k.repeat_interleave(Hq // Hkv, 1), v.repeat_interleave(Hq // Hkv, 1)
    s = (q @ kk.mT) * scale
    s = s.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(s.to(F64 if dtype == F64 else torch.float32), -1)
    p = torch.softmax(s, -1).nan_to_num(0.0)  # rows with no key: 0
    o = p @ vv
    return o, lse


def random_layout(gen, lb, lh, Mq, Nk, density=0.4, block=64, full_density=0.0, empty_rows=(), device="cpu",
                  kmax_extra=0, poison=None):
    """A BlockLayout of random blocks (ascending, unique), optional full blocks disjoint from them,
    rows in `empty_rows` empty, kv_indices `kmax_extra` wider than needed with `poison` past each
    row's count."""
    r = torch.rand(lb, lh, Mq, Nk, generator=gen)
    part = r < density
    full = (r >= density) & (r < density + full_density) if full_density else None
    for i in empty_rows:
        part[:, :, i] = False
        if full is not None:
            full[:, :, i] = False
    lay = sparsek.BlockLayout.from_dense(part, full, block=block)
    if kmax_extra or poison is not None:
        num, idx = lay.kv_num_blocks, lay.kv_indices
        idx = torch.nn.functional.pad(idx, (0, kmax_extra))
        if poison is not None:
            past = torch.arange(idx.shape[-1]) >= num[..., None]
            idx = torch.where(past, torch.full_like(idx, poison), idx)
        lay = sparsek.BlockLayout(num, idx.contiguous(), lay.full_kv_num_blocks, lay.full_kv_indices, block=block)
    if device != "cpu":
        lay = lay.to(device)
    return lay


def qkv(gen, B, Hq, Hkv, Sq, Skv, D, dtype=torch.float32, device="cpu"):
    q = torch.randn(B, Hq, Sq, D, generator=gen)
    k = torch.randn(B, Hkv, Skv, D, generator=gen)
    v = torch.randn(B, Hkv, Skv, D, generator=gen)
    return (x.to(device=device, dtype=dtype) for x in (q, k, v))


def check_close(o, lse, ref_o, ref_lse, atol):
    assert torch.isfinite(o).all(), "O has non-finite values"
    torch.testing.assert_close(o.to(F64), ref_o.to(o.device), atol=atol, rtol=0)
    inf = torch.isinf(ref_lse).to(lse.device)
    assert torch.equal(torch.isinf(lse) & (lse < 0), inf), "LSE = -inf exactly on the rows that attend nothing"
    torch.testing.assert_close(lse[~inf].to(F64), ref_lse.to(lse.device)[~inf], atol=atol, rtol=0)


# ---------------------------------------------------------------- CPU: torch and NumPy

CASES = {  # name: (B, Hq, Hkv, Sq, Skv, D, block, layout batch, layout heads, causal, full_density)
    "mha": (2, 3, 3, 256, 256, 64, 64, 2, 3, False, 0.0),
    "gqa, layout per kv head": (1, 4, 2, 192, 192, 64, 64, 1, 2, False, 0.0),
    "broadcast batch and heads": (2, 4, 2, 128, 192, 64, 64, 1, 1, False, 0.0),
    "non-multiple lengths": (1, 2, 1, 200, 300, 64, 64, 1, 2, False, 0.0),
    "causal with full blocks": (1, 2, 2, 256, 256, 64, 64, 1, 2, True, 0.3),
    "causal non-multiple, mqa": (2, 4, 1, 250, 250, 128, 128, 2, 1, True, 0.0),
    "d128 block128": (1, 2, 2, 256, 384, 128, 128, 1, 2, False, 0.2),
    "one query row": (1, 2, 2, 1, 130, 64, 64, 1, 2, False, 0.0),
}


@pytest.mark.parametrize("name", list(CASES))
def test_torch_cpu_matches_reference(name):
    B, Hq, Hkv, Sq, Skv, D, bs, lb, lh, causal, fd = CASES[name]
    gen = torch.Generator().manual_seed(sum(map(ord, name)))
    q, k, v = qkv(gen, B, Hq, Hkv, Sq, Skv, D)
    lay = random_layout(gen, lb, lh, cdiv(Sq, bs), cdiv(Skv, bs), block=bs, full_density=fd,
                        empty_rows=(0,) if cdiv(Sq, bs) > 1 else ())
    o, lse = sparsek.attention(q, k, v, lay, causal=causal)
    assert o.dtype == q.dtype and o.shape == q.shape and lse.shape == (B, Hq, Sq) and lse.dtype == torch.float32
    ro, rl = reference(q, k, v, lay, causal)
    check_close(o, lse, ro, rl, atol=2e-5)
    if cdiv(Sq, bs) > 1:  # the empty query block: O = 0, LSE = -inf
        assert torch.equal(o[:, :, :bs], torch.zeros_like(o[:, :, :bs]))


def test_numpy_matches_reference():
    B, Hq, Hkv, Sq, Skv, D, bs = 1, 4, 2, 200, 260, 64, 64
    gen = torch.Generator().manual_seed(7)
    q, k, v = qkv(gen, B, Hq, Hkv, Sq, Skv, D)
    lay_t = random_layout(gen, 1, Hq, cdiv(Sq, bs), cdiv(Skv, bs), block=bs, full_density=0.2, empty_rows=(1,))
    lay = sparsek.BlockLayout(*(x.numpy() for x in lay_t.arrays()), block=bs)
    o, lse = sparsek.attention(q.numpy(), k.numpy(), v.numpy(), lay, causal=True, scale=0.1)
    assert isinstance(o, np.ndarray) and o.dtype == np.float32 and lse.dtype == np.float32
    ro, rl = reference(q, k, v, lay_t, causal=True, scale=0.1)
    check_close(torch.from_numpy(o), torch.from_numpy(lse), ro, rl, atol=2e-5)


def test_kmax_larger_than_counts_ignores_entries_past_the_count():
    gen = torch.Generator().manual_seed(3)
    q, k, v = qkv(gen, 1, 2, 2, 256, 256, 64)
    lay = random_layout(gen, 1, 2, 4, 4, block=64, kmax_extra=5, poison=12345)
    assert lay.kmax == 9
    o, lse = sparsek.attention(q, k, v, lay)
    check_close(o, lse, *reference(q, k, v, lay), atol=2e-5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cpu_half_dtypes(dtype):
    gen = torch.Generator().manual_seed(5)
    q, k, v = qkv(gen, 1, 2, 1, 128, 192, 64, dtype=dtype)
    lay = random_layout(gen, 1, 1, 2, 3, block=64)
    o, lse = sparsek.attention(q, k, v, lay, causal=True)
    assert o.dtype == dtype
    ro, rl = reference(q, k, v, lay, causal=True)
    # fp64 accumulation, one rounding of O to the dtype.
    check_close(o, lse, ro, rl, atol=2 * torch.finfo(dtype).eps * float(ro.abs().max()) + 1e-6)


def test_strided_inputs_bmhk_views():
    gen = torch.Generator().manual_seed(11)
    q, k, v = (x.transpose(1, 2).contiguous().transpose(1, 2) for x in qkv(gen, 2, 2, 2, 128, 128, 64))
    assert q.stride(-1) == 1 and not q.is_contiguous()
    lay = random_layout(gen, 2, 2, 2, 2, block=64)
    o, lse = sparsek.attention(q, k, v, lay)
    check_close(o, lse, *reference(q, k, v, lay), atol=2e-5)


# ---------------------------------------------------------------- FlexAttention BlockMask

def _flex():
    try:
        from torch.nn.attention import flex_attention as fa
        return fa
    except ImportError as e:  # pragma: no cover - depends on the torch build
        pytest.skip(f"torch.nn.attention.flex_attention is not available: {e}")


def test_block_mask_round_trip():
    fa = _flex()
    gen = torch.Generator().manual_seed(2)
    lay = random_layout(gen, 2, 3, 4, 5, block=64, full_density=0.3, empty_rows=(2,))
    bm = sparsek.block_mask_from_layout(lay, 250, 300)
    assert isinstance(bm, fa.BlockMask) and bm.BLOCK_SIZE == (64, 64)
    back = sparsek.layout_from_block_mask(bm)
    for a, b in zip(lay.to_dense(5), back.to_dense(5)):
        assert torch.equal(a, b)
    # GQA: one row per key/value head becomes one per query head.
    lay2 = random_layout(gen, 1, 2, 2, 2, block=128)
    bm2 = sparsek.block_mask_from_layout(lay2, 256, 256, q_heads=6)
    assert bm2.kv_num_blocks.shape == (1, 6, 2)
    assert torch.equal(sparsek.layout_from_block_mask(bm2).to_dense(2)[0],
                       lay2.to_dense(2)[0].repeat_interleave(3, 1))


def test_block_mask_input_matches_flex_attention_cpu():
    fa = _flex()
    S, D = 256, 64

    def causal(b, h, q_idx, kv_idx):
        return q_idx >= kv_idx

    bm = fa.create_block_mask(causal, 1, 2, S, S, device="cpu", BLOCK_SIZE=64)
    gen = torch.Generator().manual_seed(4)
    q, k, v = qkv(gen, 1, 2, 2, S, S, D)
    o, lse = sparsek.attention(q, k, v, bm, causal=True)  # a BlockMask directly
    ro, rl = reference(q, k, v, sparsek.layout_from_block_mask(bm), causal=True)
    check_close(o, lse, ro, rl, atol=2e-5)
    dense_causal = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(o, dense_causal, atol=1e-5, rtol=0)


def test_block_mask_refusals():
    fa = _flex()
    bm = fa.create_block_mask(lambda b, h, q, kv: q >= kv, 1, 1, 256, 256, device="cpu", BLOCK_SIZE=(64, 128))
    with pytest.raises(ValueError, match="square"):
        sparsek.layout_from_block_mask(bm)
    with pytest.raises(TypeError, match="BlockMask"):
        sparsek.layout_from_block_mask(object())


# ---------------------------------------------------------------- the gate

def gate_reference(q, k, topk, block, causal=False, sink=1, local=1, scale=None, scores=None, allowed=None):
    """(num, idx) [B, Hkv, Mq(, kmax)] and scores: the pooling and the top-k in float64 torch."""
    q, k = q.to(F64).cpu(), k.to(F64).cpu()
    B, Hq, Sq, D = q.shape
    Hkv, Skv = k.shape[1], k.shape[2]
    G, Mq, Nk = Hq // Hkv, cdiv(Sq, block), cdiv(Skv, block)
    if scores is None:
        pq = torch.stack([q[:, :, i * block:(i + 1) * block].reshape(B, Hkv, -1, D).mean(2) for i in range(Mq)], 2)
        pk = torch.stack([k[:, :, j * block:(j + 1) * block].mean(2) for j in range(Nk)], 2)
        scores = pq @ pk.mT * (1 / math.sqrt(D) if scale is None else scale)
    scores = scores.to(F64).cpu().clone()
    ok = torch.ones(B, Hkv, Mq, Nk, dtype=torch.bool) if allowed is None else allowed.clone()
    i = torch.arange(Mq)[:, None]
    j = torch.arange(Nk)[None, :]
    if causal:
        ok &= j * block <= torch.clamp((i + 1) * block, max=Sq) - 1
    always = ok & ((j < sink) | ((j <= i) & (j > i - local)))
    cand = ok & ~always & (scores > float("-inf"))
    kmax = min(Nk, topk + sink + local)
    num = torch.zeros(B, Hkv, Mq, dtype=torch.int32)
    idx = torch.zeros(B, Hkv, Mq, kmax, dtype=torch.int32)
    for b in range(B):
        for h in range(Hkv):
            for r in range(Mq):
                s = torch.where(cand[b, h, r], scores[b, h, r], torch.tensor(float("-inf"), dtype=F64))
                order = torch.sort(s, descending=True, stable=True).indices  # ties: lower index first
                picked = [int(x) for x in order[:topk] if cand[b, h, r, x]]
                chosen = sorted(set(picked) | set(torch.nonzero(always[b, h, r]).flatten().tolist()))
                num[b, h, r] = len(chosen)
                idx[b, h, r, :len(chosen)] = torch.tensor(chosen, dtype=torch.int32)
    return num, idx, torch.where(ok, scores, torch.tensor(float("-inf"), dtype=F64))


def int_qk(gen, B, Hq, Hkv, Sq, Skv, D, dtype, device):
    """Small integers: pooled means (power-of-two counts) and scores are exact in every dtype."""
    q = torch.randint(-2, 3, (B, Hq, Sq, D), generator=gen).to(device=device, dtype=dtype)
    k = torch.randint(-2, 3, (B, Hkv, Skv, D), generator=gen).to(device=device, dtype=dtype)
    return q, k


GATE_CASES = {  # name: (B, Hq, Hkv, Sq, Skv, D, block, topk, causal, sink, local)
    "plain": (2, 2, 2, 512, 512, 64, 64, 2, False, 1, 1),
    "gqa causal": (1, 4, 2, 512, 512, 64, 64, 3, True, 1, 2),
    "d128 block128 no sink": (1, 2, 1, 1024, 1024, 128, 128, 2, True, 0, 1),
    "topk larger than blocks": (1, 1, 1, 256, 256, 64, 64, 9, False, 1, 1),
}


def _gate_dtypes(device):
    return [torch.float32, torch.bfloat16] if device == "cpu" else [torch.float16, torch.bfloat16]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", list(GATE_CASES))
def test_gate_matches_torch_pooling_and_topk(device, name):
    B, Hq, Hkv, Sq, Skv, D, bs, topk, causal, sink, local = GATE_CASES[name]
    gen = torch.Generator().manual_seed(len(name))
    for dtype in _gate_dtypes(device):
        q, k = int_qk(gen, B, Hq, Hkv, Sq, Skv, D, dtype, device)
        lay, scores = sparsek.gate(q, k, topk, block=bs, causal=causal, sink=sink, local=local, return_scores=True)
        num, idx, rs = gate_reference(q, k, topk, bs, causal, sink, local)
        assert lay.heads == Hkv and lay.block == bs and lay.kv_indices.device.type == device
        assert torch.equal(lay.kv_num_blocks.cpu(), num), name
        assert torch.equal(lay.kv_indices.cpu(), idx), name
        torch.testing.assert_close(scores.cpu().to(F64), rs, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
def test_gate_ties_go_to_the_lower_index(device):
    # Every key block identical: all scores tie, top-k must take the lowest indices.
    dtype = torch.float32 if device == "cpu" else torch.float16
    q = torch.ones(1, 1, 512, 64, dtype=dtype, device=device)
    k = torch.ones(1, 1, 512, 64, dtype=dtype, device=device)
    lay = sparsek.gate(q, k, 2, block=64, sink=0, local=1)
    num, idx, _ = gate_reference(q, k, 2, 64, sink=0, local=1)
    assert torch.equal(lay.kv_indices.cpu(), idx) and torch.equal(lay.kv_num_blocks.cpu(), num)
    assert idx[0, 0, 7].tolist() == [0, 1, 7]


@pytest.mark.parametrize("device", DEVICES)
def test_gate_tail_blocks_and_candidates(device):
    gen = torch.Generator().manual_seed(9)
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    q, k = (x.to(device=device, dtype=dtype) for x in (torch.randn(1, 2, 300, 64, generator=gen),
                                                         torch.randn(1, 2, 330, 64, generator=gen)))
    cand = random_layout(gen, 1, 2, 5, 6, block=64, density=0.6, device=device)
    lay, scores = sparsek.gate(q, k, 2, block=64, layout=cand, return_scores=True)
    allowed = cand.to_dense(6)[0].cpu().expand(1, 2, 5, 6)
    num, idx, rs = gate_reference(q, k, 2, 64, allowed=allowed)
    torch.testing.assert_close(scores.cpu().to(F64), rs, atol=1e-4, rtol=1e-4)
    # Random data: no near-ties at this scale, so the layouts agree exactly.
    assert torch.equal(lay.kv_num_blocks.cpu(), num) and torch.equal(lay.kv_indices.cpu(), idx)


@pytest.mark.parametrize("device", DEVICES)
def test_gate_scorer_uses_the_library_pooling(device):
    from sparsek._torch_attention import pool_blocks
    gen = torch.Generator().manual_seed(12)
    dtype = torch.float32 if device == "cpu" else torch.float16
    q, k = int_qk(gen, 2, 4, 2, 512, 512, 64, dtype, device)
    seen = {}

    def dot(pq, pk):
        seen["shapes"] = (tuple(pq.shape), tuple(pk.shape))
        return pq @ pk.mT / 8.0

    plain = sparsek.gate(q, k, 3, block=64, causal=True)
    scored = sparsek.gate(q, k, 3, block=64, causal=True, scorer=dot)
    assert seen["shapes"] == ((2, 2, 8, 64), (2, 2, 8, 64))
    assert torch.equal(plain.kv_indices, scored.kv_indices) and torch.equal(plain.kv_num_blocks, scored.kv_num_blocks)
    # Another scorer: the selection follows its scores (here: prefer far-away blocks).
    far = sparsek.gate(q, k, 1, block=64, sink=0, local=1,
                       scorer=lambda pq, pk: -torch.arange(8.0, device=device).expand(2, 2, 8, 8))
    assert far.kv_indices[0, 0, 5].tolist() == [0, 5]
    pq, pk = pool_blocks(q, k, 64)
    want = torch.stack([q[:, :, i * 64:(i + 1) * 64].float().reshape(2, 2, -1, 64).mean(2) for i in range(8)], 2)
    torch.testing.assert_close(pq, want)


def test_gate_numpy():
    gen = torch.Generator().manual_seed(13)
    q, k = int_qk(gen, 1, 2, 1, 256, 256, 64, torch.float32, "cpu")
    lay = sparsek.gate(q.numpy(), k.numpy(), 2, block=64, causal=True)
    num, idx, _ = gate_reference(q, k, 2, 64, causal=True)
    assert isinstance(lay.kv_indices, np.ndarray)
    assert np.array_equal(lay.kv_num_blocks, num.numpy()) and np.array_equal(lay.kv_indices, idx.numpy())


@pytest.mark.parametrize("device", DEVICES)
def test_gate_then_attention(device):
    gen = torch.Generator().manual_seed(14)
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    q, k, v = qkv(gen, 1, 4, 2, 512, 512, 128 if device == "cuda" else 64, dtype, device)
    bs = 128 if device == "cuda" else 64
    lay = sparsek.gate(q, k, 1, block=bs, causal=True)
    o, lse = sparsek.attention(q, k, v, lay, causal=True)
    ro, rl = reference(q, k, v, lay, causal=True)
    check_close(o, lse, ro, rl, atol=2e-5 if device == "cpu" else 3e-2)


# ---------------------------------------------------------------- TopKGate.distill_loss (CPU)

def test_topk_gate_distill_loss_falls_when_training_the_scorer():
    torch.manual_seed(0)
    B, H, S, D, bs = 1, 2, 512, 64, 64
    # Structured data: keys of block j lean towards a direction the query blocks share partly.
    gen = torch.Generator().manual_seed(1)
    dirs = torch.randn(S // bs, D, generator=gen)
    q = (dirs.repeat_interleave(bs, 0) + 0.5 * torch.randn(B, H, S, D, generator=gen)) * 0.6
    k = (dirs.flip(0).repeat_interleave(bs, 0) + 0.5 * torch.randn(B, H, S, D, generator=gen)) * 0.6
    gate = sparsek.nn.TopKGate(D, block=bs, topk=2, causal=True, d_gate=16)
    opt = torch.optim.Adam(gate.parameters(), lr=3e-2)
    g = torch.Generator().manual_seed(2)
    losses = []
    for _ in range(60):
        loss = gate.distill_loss(q, k, n_sample_blocks=4, generator=g)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss))
    full = gate.distill_loss(q, k, n_sample_blocks=8)  # every block
    first = float(sparsek.nn.TopKGate(D, block=bs, topk=2, causal=True, d_gate=16).distill_loss(q, k, 8))
    assert losses[-1] < 0.5 * losses[0], losses[::10]
    assert float(full) < 0.5 * first
    layout = gate(q, k)  # the trained gate's layout
    assert layout.heads == H and int(layout.kv_num_blocks.max()) <= 2 + 1 + 1


def test_distill_loss_trains_the_scorer_only():
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(1, 4, 256, 64, generator=gen, requires_grad=True)
    k = torch.randn(1, 2, 256, 64, generator=gen, requires_grad=True)
    gate = sparsek.nn.TopKGate(64, block=64, topk=1, d_gate=8, dtype=F64)
    loss = gate.distill_loss(q, k)
    loss.backward()
    assert q.grad is None and k.grad is None
    assert gate.wq.grad is not None and gate.wk.grad is not None and float(gate.wq.grad.abs().max()) > 0
    assert float(loss) >= 0
    # The scorer's gradient through distill_loss (float64 parameters): finite differences.
    qd, kd = q.detach().double(), k.detach().double()
    assert torch.autograd.gradcheck(lambda wq, wk: _loss_with(gate, wq, wk, qd, kd),
                                    (gate.wq.detach().clone().requires_grad_(True),
                                     gate.wk.detach().clone().requires_grad_(True)), fast_mode=True)


def _loss_with(gate, wq, wk, q, k):
    saved = gate.wq, gate.wk
    try:
        del gate.wq, gate.wk
        gate.wq, gate.wk = wq, wk
        return gate.distill_loss(q, k, n_sample_blocks=4, generator=torch.Generator().manual_seed(0))
    finally:
        del gate.wq, gate.wk
        gate.wq, gate.wk = saved


# ---------------------------------------------------------------- custom ops, compile, plans

def _op_args(device, dtype, full=False):
    gen = torch.Generator().manual_seed(21)
    q, k, v = qkv(gen, 1, 2, 1, 256, 256, 64 if device == "cpu" else 128, dtype, device)
    bs = 64 if device == "cpu" else 128
    lay = random_layout(gen, 1, 1, cdiv(256, bs), cdiv(256, bs), block=bs, density=0.5,
                        full_density=0.3 if full else 0.0, device=device)
    return q, k, v, lay


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    q, k, v, lay = _op_args(device, dtype, full=True)
    torch.library.opcheck(torch.ops.sparsek.attention.default,
                          (q, k, v, *lay.arrays(), lay.block, True, 0.0, True))
    torch.library.opcheck(torch.ops.sparsek.gate.default,
                          (q, k, 1, lay.block, True, 1, 1, 0.0, None, None, None, None, None, True))


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_fullgraph(device):
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    q, k, v, lay = _op_args(device, dtype)

    def f(q, k, v, num, idx):
        o, lse = sparsek.attention(q, k, v, sparsek.BlockLayout(num, idx, block=lay.block), causal=True)
        gated = sparsek.gate(q, k, 1, block=lay.block, causal=True)
        o2, _ = sparsek.attention(q, k, v, gated, causal=True)
        return o * 2, lse, o2

    torch._dynamo.reset()
    got = torch.compile(f, fullgraph=True)(q, k, v, lay.kv_num_blocks, lay.kv_indices)
    want = f(q, k, v, lay.kv_num_blocks, lay.kv_indices)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, atol=0, rtol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_plan_reused_for_new_layout_contents(device):
    from sparsek import _torch_attention as TA
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    q, k, v, lay = _op_args(device, dtype)
    TA._plans.clear()
    sparsek.attention(q, k, v, lay)
    gen = torch.Generator().manual_seed(5)
    lay2 = random_layout(gen, 1, 1, lay.q_blocks, lay.q_blocks, block=lay.block, device=device)
    lay2 = sparsek.BlockLayout(lay2.kv_num_blocks, torch.nn.functional.pad(lay2.kv_indices, (0, lay.kmax - lay2.kmax))
                               .contiguous(), block=lay.block)
    o, lse = sparsek.attention(q, k, v, lay2)
    assert len(TA._plans) == 1  # same extents: the same plan
    check_close(o, lse, *reference(q, k, v, lay2), atol=2e-5 if device == "cpu" else 3e-2)


def test_in_place_layout_edit_is_checked_again():
    q, k, v, lay = _op_args("cpu", torch.float32)
    sparsek.attention(q, k, v, lay)
    lay.kv_indices[0, 0, 1, 0] = 77  # through torch: the version counter moves
    with pytest.raises(ValueError, match=r"kv_indices\[0, 0, 1, 0\] = 77 is out of range"):
        sparsek.attention(q, k, v, lay)
    # check_layout=False trusts the caller (no check; the kernel may not crash, values undefined).
    lay.kv_indices[0, 0, 1, 0] = 0
    lay.kv_num_blocks.zero_()
    o, lse = sparsek.attention(q, k, v, lay, check_layout=False)
    assert torch.equal(o, torch.zeros_like(o)) and bool(torch.isinf(lse).all())


@cuda_only
def test_cuda_graph_capture_gate_and_attention():
    gen = torch.Generator().manual_seed(31)
    q, k, v = qkv(gen, 1, 4, 2, 1024, 1024, 128, torch.bfloat16, "cuda")

    def step():
        lay = sparsek.gate(q, k, 2, block=128, causal=True)
        o, lse = sparsek.attention(q, k, v, lay, causal=True)
        return lay, o, lse

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()  # plans outside the capture
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        lay, o, lse = step()
    for _ in range(3):
        for x in (q, k, v):
            x.copy_(torch.randn(x.shape, generator=gen).to(x))
        o.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        num, idx, _ = gate_reference(q, k, 2, 128, causal=True)
        assert (lay.kv_num_blocks.cpu() == num).float().mean() > 0.95  # bf16 random data: rare near-ties
        check_close(o, lse, *reference(q, k, v, lay, causal=True), atol=3e-2)


@cuda_only
def test_planning_during_capture_says_to_run_first():
    from sparsek import _torch_attention as TA
    q, k, v, lay = _op_args("cuda", torch.bfloat16)
    TA._plans.clear()
    g = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="Run the same call once before capturing"):
        with torch.cuda.graph(g):
            sparsek.attention(q, k, v, lay)


# ---------------------------------------------------------------- GPU vs the reference

GPU_CASES = {  # name: (B, Hq, Hkv, S, D, block, layout heads, causal, full_density, empty rows)
    "d128": (1, 4, 4, 1024, 128, 128, 4, False, 0.0, (2,)),
    "d64": (2, 2, 2, 1024, 64, 128, 2, False, 0.0, ()),
    "gqa 4/1, kv-head layout": (1, 4, 1, 1024, 128, 128, 1, False, 0.0, ()),
    "causal + full blocks": (1, 2, 2, 1024, 128, 128, 2, True, 0.3, (3,)),
    "non-multiple length": (1, 2, 2, 1000, 128, 128, 2, True, 0.0, ()),
    "block 64": (1, 2, 2, 512, 64, 64, 2, False, 0.2, (1,)),
}


@cuda_only
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", list(GPU_CASES))
def test_gpu_matches_reference_within_twice_naive_error(name, dtype):
    B, Hq, Hkv, S, D, bs, lh, causal, fd, empty = GPU_CASES[name]
    gen = torch.Generator().manual_seed(len(name))
    q, k, v = qkv(gen, B, Hq, Hkv, S, S, D, dtype, "cuda")
    lay = random_layout(gen, 1, lh, cdiv(S, bs), cdiv(S, bs), block=bs, density=0.3, full_density=fd,
                        empty_rows=empty, device="cuda", kmax_extra=2, poison=-5)
    o, lse = sparsek.attention(q, k, v, lay, causal=causal)
    ro, rl = reference(q, k, v, lay, causal)
    naive, _ = reference(q, k, v, lay, causal, dtype=dtype)
    err = float((o.to(F64) - ro).abs().max())
    naive_err = float((naive.to(F64) - ro).abs().max())
    assert err <= 2 * naive_err, f"{name}: error {err:.3g} vs naive {dtype} {naive_err:.3g}"
    check_close(o, lse, ro, rl, atol=max(2 * naive_err, 1e-3))


# ---------------------------------------------------------------- bad input

def test_bad_layouts_and_shapes_name_the_argument():
    q, k, v, lay = _op_args("cpu", torch.float32)
    num, idx = lay.kv_num_blocks.clone(), lay.kv_indices.clone()

    def run(num=num, idx=idx, q=q, k=k, v=v, **kw):
        return sparsek.attention(q, k, v, sparsek.BlockLayout(num.clone(), idx.clone(), block=64), **kw)

    bad_idx = idx.clone()
    bad_idx[0, 0, 2, 0] = 9
    bad_num = num.clone()
    bad_num[0, 0, 3] = 99
    unsorted = torch.tensor([[[[1, 0, 2, 3]] * 4]], dtype=torch.int32)
    four = torch.full((1, 1, 4), 4, dtype=torch.int32)
    for kw, exc, pattern in [
        (dict(idx=bad_idx), ValueError, r"kv_indices\[0, 0, 2, 0\] = 9 is out of range"),
        (dict(num=bad_num), ValueError, r"kv_num_blocks\[0, 0, 3\] = 99"),
        (dict(num=four, idx=unsorted), ValueError, r"kv_indices\[0, 0, 0, 1\]"),
        (dict(num=num[:, :, :3], idx=idx[:, :, :3]), ValueError, "q_blocks"),
        (dict(q=q[..., :32], k=k[..., :32], v=v[..., :32]), ValueError, "q.d = 32 is not 64 or 128"),
        (dict(q=q[:, :1].expand(1, 3, 256, 64), k=k.expand(1, 2, 256, 64), v=v.expand(1, 2, 256, 64)), ValueError,
         "not a multiple of"),
        (dict(q=q[0]), ValueError, "q must be a 4-D"),
        (dict(k=k.numpy()), TypeError, "k is a numpy array but q is a torch array"),
        (dict(scale="x"), TypeError, "scale must be a real number"),
    ]:
        with pytest.raises(exc, match=pattern):
            run(**kw)
    with pytest.raises(ValueError, match="must be int32"):
        sparsek.BlockLayout(num.long(), idx, block=64)
    with pytest.raises(ValueError, match="block must be 64 or 128"):
        sparsek.BlockLayout(num, idx, block=32)
    with pytest.raises(ValueError, match="kv_indices must be 4-D"):
        sparsek.BlockLayout(num, idx[0], block=64)
    with pytest.raises(TypeError, match="layout must be a sparsek.BlockLayout"):
        sparsek.attention(q, k, v, (num, idx))
    with pytest.raises(ValueError, match="both or neither"):
        sparsek.BlockLayout(num, idx, num, None, block=64)
    with pytest.raises(ValueError, match="scorer returned"):
        sparsek.gate(q, k, 1, block=64, scorer=lambda pq, pk: pq)
    with pytest.raises(ValueError, match="topk must be >= 0"):
        sparsek.gate(q, k, -1, block=64)
    with pytest.raises(TypeError, match="scorer= needs torch"):
        sparsek.gate(q.numpy(), k.numpy(), 1, block=64, scorer=lambda a, b: a)


# ---------------------------------------------------------------- the xFormers-style op

def test_xformers_style_op():
    from sparsek.xformers import BlockSparseAttentionOp, Inputs
    q, k, v, lay = _op_args("cpu", torch.float32)
    bmhk = lambda x: x.transpose(1, 2)  # noqa: E731
    inp = Inputs(bmhk(q), bmhk(k), bmhk(v), attn_bias=lay, causal=True)
    assert BlockSparseAttentionOp.not_supported_reasons(inp) == []
    out, ctx = BlockSparseAttentionOp.apply(inp)
    assert out.shape == bmhk(q).shape and ctx is None
    ro, rl = reference(q, k, v, lay, True)
    check_close(out.transpose(1, 2), sparsek.attention(q, k, v, lay, True)[1], ro, rl, atol=2e-5)
    bad = Inputs(bmhk(q)[..., :32], bmhk(k).double(), bmhk(v), attn_bias="mask", p=0.1)
    reasons = BlockSparseAttentionOp.not_supported_reasons(bad)
    text = " | ".join(reasons)
    assert "float64" in text or "dtype" in text, text
    bad2 = Inputs(bmhk(q)[..., :32], bmhk(k)[..., :32], bmhk(v)[..., :32], attn_bias="mask", p=0.1)
    text2 = " | ".join(BlockSparseAttentionOp.not_supported_reasons(bad2))
    assert "head dim 32" in text2 and "dropout" in text2 and "attn_bias must be" in text2, text2
    lay3 = random_layout(torch.Generator().manual_seed(0), 1, 1, 3, 4, block=64)  # wrong q_blocks
    text3 = " | ".join(BlockSparseAttentionOp.not_supported_reasons(Inputs(bmhk(q), bmhk(k), bmhk(v), lay3)))
    assert "q_blocks" in text3, text3
    with pytest.raises(NotImplementedError, match="dropout"):
        BlockSparseAttentionOp.apply(bad2)
