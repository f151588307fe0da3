"""Attention over packed sequences (``cu_seqlens``, varlen) from Python: on the CPU (NumPy and
torch) the packed result and its gradients equal attention over each sequence alone with a dense
layout, a random layout (naming blocks of other sequences) matches a float64 masked reference, the
custom ops keep working (opcheck, torch.compile, plans keyed on the packing), and bad offsets are
named. On the GPU the packed forward and backward are compared with the CPU backend's.
"""
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
import sparsek  # noqa: E402
from test_attention import F64, cdiv, cuda_only, element_mask, qkv, random_layout  # noqa: E402
from test_attention_backward import grads_of, need_backward  # noqa: E402

# Boundaries inside blocks, an empty sequence, a one-token sequence, sequences longer than a block.
LENS = (70, 0, 1, 150, 33)


def offsets(lens, like="torch", device="cpu"):
    cu = np.cumsum((0,) + tuple(lens)).astype(np.int32)
    return cu if like == "numpy" else torch.from_numpy(cu).to(device)


def dense_layout(T, block, numpy=False):
    """Every block: the layout of attention over a whole (packed) sequence of T tokens."""
    n = cdiv(T, block)
    lay = sparsek.BlockLayout.from_dense(torch.ones(1, 1, n, n, dtype=torch.bool), block=block)
    return sparsek.BlockLayout(lay.kv_num_blocks.numpy(), lay.kv_indices.numpy(), block=block) if numpy else lay


def same_sequence(cu, T, device="cpu"):
    """Boolean [T, T]: query row i and key j belong to the same sequence."""
    seq = torch.searchsorted(cu[1:].long().to(device), torch.arange(T, device=device), right=True)
    return seq[:, None] == seq[None, :]


def packed_reference(q, k, v, layout, causal, cu, dtype=F64):
    """(O, LSE) of the layout's masked attention restricted to each sequence, computed in `dtype`."""
    q, k, v = (x.to(dtype) for x in (q, k, v))
    _, Hq, T, D = q.shape
    Hkv = k.shape[1]
    mask = element_mask(layout, 1, Hq, Hkv, T, T, causal, q.device) & same_sequence(cu, T, q.device)
    kk, vv = k.repeat_interleave(Hq // Hkv, 1), v.repeat_interleave(Hq // Hkv, 1)
    s = ((q @ kk.mT) * D ** -0.5).masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(s.to(F64 if dtype == F64 else torch.float32), -1)
    o = torch.softmax(s, -1).nan_to_num(0.0) @ vv
    return o, lse


def each_alone(q, k, v, lens, causal, block):
    """O and LSE of attention over each non-empty sequence alone (a dense layout), packed again."""
    numpy = isinstance(q, np.ndarray)
    os_, lses, row = [], [], 0
    for n in lens:
        if n:
            sl = slice(row, row + n)
            o, lse = sparsek.attention(q[:, :, sl], k[:, :, sl], v[:, :, sl], dense_layout(n, block, numpy),
                                       causal=causal)
            os_.append(o)
            lses.append(lse)
        row += n
    if numpy:
        return np.concatenate(os_, axis=2), np.concatenate(lses, axis=2)
    return torch.cat(os_, 2), torch.cat(lses, 2)


# ---------------------------------------------------------------- CPU

@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("framework", ["numpy", "torch"])
def test_packed_equals_each_sequence_alone(framework, causal):
    T, block = sum(LENS), 64
    q, k, v = qkv(torch.Generator().manual_seed(1 + causal), 1, 2, 1, T, T, 64)
    if framework == "numpy":
        q, k, v = (x.numpy() for x in (q, k, v))
    lay = dense_layout(T, block, numpy=framework == "numpy")
    cu = offsets(LENS, framework)
    o, lse = sparsek.attention(q, k, v, lay, causal=causal, cu_seqlens=cu)
    want_o, want_lse = each_alone(q, k, v, LENS, causal, block)
    o, lse, want_o, want_lse = (torch.as_tensor(x) for x in (o, lse, want_o, want_lse))
    assert o.shape == (1, 2, T, 64) and lse.shape == (1, 2, T)
    torch.testing.assert_close(o, want_o, atol=2e-6, rtol=2e-6)
    torch.testing.assert_close(lse, want_lse, atol=2e-6, rtol=2e-6)


@pytest.mark.parametrize("causal", [False, True])
def test_packed_random_layout_masks_other_sequences(causal):
    """A random layout over the packed blocks names blocks of other sequences (and full blocks that
    span a boundary): their keys are masked, rows that attend nothing get O = 0, LSE = -inf."""
    T, block = sum(LENS), 64
    gen = torch.Generator().manual_seed(3 + causal)
    q, k, v = qkv(gen, 1, 4, 2, T, T, 64)
    lay = random_layout(gen, 1, 2, cdiv(T, block), cdiv(T, block), density=0.5, block=block,
                        full_density=0.3, empty_rows=(1,))
    cu = offsets(LENS)
    o, lse = sparsek.attention(q, k, v, lay, causal=causal, cu_seqlens=cu)
    ro, rl = packed_reference(q, k, v, lay, causal, cu)
    torch.testing.assert_close(o.to(F64), ro, atol=2e-5, rtol=0)
    inf = torch.isinf(rl)
    assert bool(inf.any()), "the case has rows that attend nothing"
    assert torch.equal(torch.isinf(lse) & (lse < 0), inf)
    torch.testing.assert_close(lse[~inf].to(F64), rl[~inf], atol=2e-5, rtol=0)


@pytest.mark.parametrize("causal", [False, True])
def test_packed_gradients_equal_each_sequence_alone(causal):
    need_backward()
    T, block = sum(LENS), 64
    gen = torch.Generator().manual_seed(5 + causal)
    q, k, v = qkv(gen, 1, 2, 1, T, T, 64)
    dout = torch.randn(1, 2, T, 64, generator=gen)
    lay, cu = dense_layout(T, block), offsets(LENS)
    got, _ = grads_of(lambda q, k, v: sparsek.attention(q, k, v, lay, causal=causal, cu_seqlens=cu)[0], q, k, v,
                      dout=dout)
    want, _ = grads_of(lambda q, k, v: each_alone(q, k, v, LENS, causal, block)[0], q, k, v, dout=dout)
    for g, w, n in zip(got, want, "qkv"):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5, msg=lambda m: f"d{n}: {m}")


def test_packed_gradients_match_float64_reference():
    need_backward()
    T, block = sum(LENS), 64
    gen = torch.Generator().manual_seed(7)
    q, k, v = qkv(gen, 1, 2, 2, T, T, 64)
    dout = torch.randn(1, 2, T, 64, generator=gen)
    lay = random_layout(gen, 1, 2, cdiv(T, block), cdiv(T, block), density=0.6, block=block, full_density=0.2)
    cu = offsets(LENS)
    got, _ = grads_of(lambda q, k, v: sparsek.attention(q, k, v, lay, causal=True, cu_seqlens=cu)[0], q, k, v,
                      dout=dout)
    want, _ = grads_of(lambda q, k, v: packed_reference(q, k, v, lay, True, cu)[0], q.double(), k.double(),
                       v.double(), dout=dout.double())
    for g, w, n in zip(got, want, "qkv"):
        torch.testing.assert_close(g.double(), w, atol=1e-4, rtol=1e-4, msg=lambda m: f"d{n}: {m}")


def _packed_op_args():
    T = sum(LENS)
    gen = torch.Generator().manual_seed(11)
    q, k, v = qkv(gen, 1, 2, 1, T, T, 64)
    lay = random_layout(gen, 1, 1, cdiv(T, 64), cdiv(T, 64), density=0.6, block=64, full_density=0.2)
    return q, k, v, lay, offsets(LENS)


def test_packed_opcheck():
    need_backward()
    q, k, v, lay, cu = _packed_op_args()
    q, k, v = (x.requires_grad_(True) for x in (q, k, v))
    torch.library.opcheck(torch.ops.sparsek.attention.default, (q, k, v, *lay.arrays(), 64, True, 0.0, True, cu))
    o, lse = torch.ops.sparsek.attention(q, k, v, *lay.arrays(), 64, True, 0.0, True, cu)
    dout = torch.randn_like(o)
    torch.library.opcheck(torch.ops.sparsek.attention_backward.default,
                          (q.detach(), k.detach(), v.detach(), o.detach(), lse, dout, *lay.arrays(), 64, True, 0.0,
                           cu))


def test_packed_torch_compile_fullgraph_with_backward():
    need_backward()
    q, k, v, lay, cu = _packed_op_args()

    def loss(q, k, v, num, idx, fnum, fidx, cu):
        lay = sparsek.BlockLayout(num, idx, fnum, fidx, block=64)
        return (sparsek.attention(q, k, v, lay, causal=True, cu_seqlens=cu)[0] ** 2).sum()

    torch._dynamo.reset()
    compiled = torch.compile(loss, fullgraph=True)
    got, lg = grads_of(lambda q, k, v: compiled(q, k, v, *lay.arrays(), cu), q, k, v)
    want, lw = grads_of(lambda q, k, v: loss(q, k, v, *lay.arrays(), cu), q, k, v)
    torch.testing.assert_close(lg, lw, atol=0, rtol=1e-6)  # inductor sums in its own order
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=0, rtol=0)


def test_packed_plans_are_keyed_on_the_packing_and_offsets_are_checked_again():
    from sparsek import _torch_attention as TA
    T, block = sum(LENS), 64
    q, k, v = qkv(torch.Generator().manual_seed(13), 1, 2, 1, T, T, 64)
    lay = dense_layout(T, block)
    want2 = each_alone(q, k, v, (100, 0, 54, 99, 1), False, block)[0]
    TA._plans.clear()
    sparsek.attention(q, k, v, lay, cu_seqlens=offsets(LENS))
    o2, _ = sparsek.attention(q, k, v, lay, cu_seqlens=offsets((100, 0, 54, 99, 1)))  # new offsets, same count
    assert len(TA._plans) == 1, "the same number of sequences: the same plan"
    torch.testing.assert_close(o2, want2, atol=2e-6, rtol=2e-6)
    sparsek.attention(q, k, v, lay, cu_seqlens=offsets((T // 2, T - T // 2)))
    sparsek.attention(q, k, v, lay)
    assert len(TA._plans) == 3, "another number of sequences, and none, plan again"
    # Offsets edited in place are checked again (the layout itself is unchanged).
    cu = offsets(LENS)
    sparsek.attention(q, k, v, lay, cu_seqlens=cu)
    cu[-1] = T - 1
    with pytest.raises(ValueError, match=rf"cu_seqlens\[5\] = {T - 1} is not the packed length T = q.s = {T}"):
        sparsek.attention(q, k, v, lay, cu_seqlens=cu)


@pytest.mark.parametrize("framework", ["numpy", "torch"])
def test_bad_cu_seqlens_is_named(framework):
    T = sum(LENS)
    q, k, v = qkv(torch.Generator().manual_seed(17), 1, 2, 1, T, T, 64)
    lay = dense_layout(T, 64, numpy=framework == "numpy")
    cu = offsets(LENS, framework)
    if framework == "numpy":
        q, k, v = q.numpy(), k.numpy(), v.numpy()
    cat = np.concatenate if framework == "numpy" else torch.cat

    def run(cu=cu, q=q, k=k, v=v):
        return sparsek.attention(q, k, v, lay, causal=True, cu_seqlens=cu)

    wrong_end = cu.copy() if framework == "numpy" else cu.clone()
    wrong_end[-1] = T + 1
    decreasing = cu.copy() if framework == "numpy" else cu.clone()
    decreasing[2] = 60
    two = cat([q, q], 0)
    for kw, exc, pattern in [
        (dict(cu=cu.astype(np.int64) if framework == "numpy" else cu.long()), ValueError,
         "cu_seqlens dtype int64 must be int32"),
        (dict(cu=cu.reshape(2, 3)), ValueError, r"cu_seqlens must be a 1-D array of num_seqs \+ 1 offsets, got shape "
                                                r"\(2, 3\)"),
        (dict(cu=cat([cu, cu])[::2]), ValueError, "cu_seqlens must be contiguous"),
        (dict(cu=cu[:1]), ValueError, r"cu_seqlens has shape \(1,\): it holds num_seqs \+ 1 >= 2 offsets"),
        (dict(cu=cu.tolist()), TypeError, "cu_seqlens must be a NumPy array, torch tensor or CuPy array"),
        (dict(q=two, k=cat([k, k], 0), v=cat([v, v], 0)), ValueError,
         "q.b = 2 with cu_seqlens: packed sequences are one batch row"),
        (dict(cu=wrong_end), ValueError, rf"cu_seqlens\[5\] = {T + 1} is not the packed length T = q.s = {T}"),
        (dict(cu=decreasing), ValueError, r"cu_seqlens\[2\] = 60 is less than cu_seqlens\[1\] = 70"),
        (dict(k=k[:, :, :-1], v=v[:, :, :-1]), ValueError, f"q.s = {T} differs from k.s = {T - 1} with cu_seqlens"),
    ]:
        with pytest.raises(exc, match=pattern):
            run(**kw)
    other = torch.from_numpy(cu) if framework == "numpy" else cu.numpy()
    with pytest.raises(TypeError, match=f"cu_seqlens is a {'torch' if framework == 'numpy' else 'numpy'} array"):
        run(cu=other)


def test_op_called_directly_names_a_bad_cu_seqlens():
    """torch.ops.sparsek.attention without the Python checks: the binding names cu_seqlens."""
    q, k, v, lay, cu = _packed_op_args()
    with pytest.raises(ValueError, match="cu_seqlens dtype int64 must be int32"):
        torch.ops.sparsek.attention(q, k, v, *lay.arrays(), 64, True, 0.0, True, cu.long())
    with pytest.raises(ValueError, match="cu_seqlens must be a 1-D array"):
        torch.ops.sparsek.attention(q, k, v, *lay.arrays(), 64, True, 0.0, True, cu[None])


# ---------------------------------------------------------------- GPU against the CPU backend

GPU_LENS = {  # name: sequence lengths (boundaries inside blocks, an empty and a one-token sequence)
    "mixed": (300, 0, 1, 517, 77, 128),
    "short": (1, 63, 65, 0, 129),
}


def _gpu_case(lens, D, block, seed):
    T = sum(lens)
    gen = torch.Generator().manual_seed(seed)
    q, k, v = qkv(gen, 1, 4, 2, T, T, D, torch.bfloat16)
    lay = random_layout(gen, 1, 2, cdiv(T, block), cdiv(T, block), density=0.6, block=block, full_density=0.2)
    dout = torch.randn(1, 4, T, D, generator=gen).to(torch.bfloat16)
    return q, k, v, lay, offsets(lens), dout


def _max_err(a, b):
    return float((a.double().cpu() - b.double().cpu()).abs().max())


@cuda_only
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("block", [64, 128])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("name", list(GPU_LENS))
def test_gpu_packed_forward_matches_the_cpu_backend(name, D, block, causal):
    q, k, v, lay, cu, _ = _gpu_case(GPU_LENS[name], D, block, seed=D + block + causal)
    want_o, want_lse = sparsek.attention(q.float(), k.float(), v.float(), lay, causal=causal, cu_seqlens=cu)
    naive, _ = packed_reference(q, k, v, lay, causal, cu, dtype=torch.bfloat16)
    o, lse = sparsek.attention(q.cuda(), k.cuda(), v.cuda(), lay.to("cuda"), causal=causal, cu_seqlens=cu.cuda())
    assert o.dtype == torch.bfloat16 and torch.isfinite(o).all()
    err, naive_err = _max_err(o, want_o), _max_err(naive, want_o)
    assert err <= 2 * naive_err, f"{name}: O error {err:.3g} vs naive bf16 {naive_err:.3g}"
    lse = lse.cpu()
    inf = torch.isinf(want_lse)
    assert torch.equal(torch.isinf(lse) & (lse < 0), inf), "LSE = -inf exactly where the CPU backend has it"
    torch.testing.assert_close(lse[~inf], want_lse[~inf], atol=1e-3, rtol=0)


@cuda_only
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("block", [64, 128])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("name", list(GPU_LENS))
def test_gpu_packed_backward_matches_the_cpu_backend(name, D, block, causal):
    need_backward("cuda")
    q, k, v, lay, cu, dout = _gpu_case(GPU_LENS[name], D, block, seed=100 + D + block + causal)
    want, _ = grads_of(lambda q, k, v: sparsek.attention(q, k, v, lay, causal=causal, cu_seqlens=cu)[0],
                       q.float(), k.float(), v.float(), dout=dout.float())
    naive, _ = grads_of(lambda q, k, v: packed_reference(q, k, v, lay, causal, cu, dtype=torch.bfloat16)[0],
                        q, k, v, dout=dout)
    lay_d, cu_d = lay.to("cuda"), cu.cuda()
    got, _ = grads_of(lambda q, k, v: sparsek.attention(q, k, v, lay_d, causal=causal, cu_seqlens=cu_d)[0],
                      q.cuda(), k.cuda(), v.cuda(), dout=dout.cuda())
    for g, w, nv, n in zip(got, want, naive, "qkv"):
        assert torch.isfinite(g).all(), f"d{n} has non-finite values"
        err, naive_err = _max_err(g, w), _max_err(nv, w)
        assert err <= 2 * naive_err, f"{name} d{n}: error {err:.3g} vs naive bf16 {naive_err:.3g}"


# ---- the top-k gate over packed sequences ----

@pytest.mark.parametrize("framework", ["numpy", "torch"])
@pytest.mark.parametrize("causal", [False, True])
def test_gate_packed_selects_as_each_sequence_alone(framework, causal):
    """Sequences of whole blocks: each sequence's rows select what the gate selects on it alone,
    shifted by its first block (sink counted from it; pooling never crosses a boundary here)."""
    lens, block = (256, 0, 64, 576, 192), 64
    T = sum(lens)
    gen = torch.Generator().manual_seed(5)
    q, k, _ = qkv(gen, 1, 4, 2, T, T, 64)
    cu = offsets(lens)
    if framework == "numpy":
        q, k, cu = q.numpy(), k.numpy(), cu.numpy()
    packed = sparsek.gate(q, k, 2, block=block, causal=causal, sink=1, local=2, cu_seqlens=cu)
    num, idx = np.asarray(packed.kv_num_blocks), np.asarray(packed.kv_indices)
    row = 0
    for n in lens:
        if not n:
            continue
        alone = sparsek.gate(q[:, :, row:row + n], k[:, :, row:row + n], 2, block=block, causal=causal, sink=1,
                             local=2)
        an, ai = np.asarray(alone.kv_num_blocks), np.asarray(alone.kv_indices)
        b0 = row // block
        for g in range(2):
            for i in range(an.shape[2]):
                got = idx[0, g, b0 + i, :num[0, g, b0 + i]]
                want = ai[0, g, i, :an[0, g, i]] + b0
                assert np.array_equal(got, want), f"causal {causal}, sequence at {row}, head {g}, block {i}"
        row += n


def test_gate_packed_errors_name_cu_seqlens():
    q = np.zeros((1, 2, 300, 64), np.float32)
    with pytest.raises(ValueError, match="cu_seqlens dtype int64 must be int32"):
        sparsek.gate(q, q, 2, block=64, cu_seqlens=np.array([0, 100, 300], np.int64))
    with pytest.raises(ValueError, match=r"cu_seqlens\[2\] = 299 is not the packed length T = q\.s = 300"):
        sparsek.gate(q, q, 2, block=64, cu_seqlens=np.array([0, 100, 299], np.int32))


@cuda_only
@pytest.mark.parametrize("causal", [False, True])
def test_gpu_gate_packed_matches_the_cpu(causal):
    lens, block = (300, 0, 1, 517, 77, 128), 64
    T = sum(lens)
    gen = torch.Generator().manual_seed(8)
    q, k, _ = qkv(gen, 1, 4, 2, T, T, 64, torch.bfloat16)
    cu = offsets(lens)
    want, ws = sparsek.gate(q, k, 3, block=block, causal=causal, cu_seqlens=cu, return_scores=True)
    got, gs = sparsek.gate(q.cuda(), k.cuda(), 3, block=block, causal=causal, cu_seqlens=cu.cuda(), return_scores=True)
    gs = gs.cpu()
    assert torch.equal(torch.isinf(gs), torch.isinf(ws)), "the allowed blocks (finite scores) differ"
    torch.testing.assert_close(gs[~torch.isinf(ws)], ws[~torch.isinf(ws)], atol=1e-3, rtol=1e-3)
    assert torch.equal(got.kv_num_blocks.cpu(), want.kv_num_blocks)
    # Every selected block is allowed (selections may differ between near-tied scores only).
    num, idx = got.kv_num_blocks.cpu(), got.kv_indices.cpu().long()
    for g in range(num.shape[1]):
        for i in range(num.shape[2]):
            sel = idx[0, g, i, :num[0, g, i]]
            assert torch.isfinite(ws[0, g, i, sel]).all(), f"head {g}, block {i} selected a block not allowed"
