"""Autograd of block-sparse attention (gradients of q, k, v): gradcheck around the CPU backend,
gradients against torch's autograd of the float64 masked reference (CPU, and the GPU within twice
the naive low-precision error), run-to-run bit identity on the GPU, opcheck and torch.compile with
the backward, and a tiny transformer block (sparsek attention with a TopKGate + BlockSparseLinear
MLP) that trains while its gradients match a dense masked reference on every step.

Every test skips, saying why, when this build's library has no attention backward (the call
raises NotImplementedError).
"""
import math

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
import sparsek  # noqa: E402
import sparsek.nn  # noqa: E402
from test_attention import DEVICES, F64, cdiv, cuda_only, qkv, random_layout, reference  # noqa: E402

_available = {}


def need_backward(device="cpu"):
    """Skips the test when the library cannot run the attention backward on `device`."""
    if device not in _available:
        dtype = torch.float32 if device == "cpu" else torch.bfloat16
        q, k, v = (x.requires_grad_(True) for x in qkv(torch.Generator().manual_seed(0), 1, 1, 1, 128, 128,
                                                       64 if device == "cpu" else 128, dtype, device))
        lay = random_layout(torch.Generator().manual_seed(0), 1, 1, 1, 1, block=128, density=1.0, device=device)
        try:
            sparsek.attention(q, k, v, lay)[0].sum().backward()
            _available[device] = None
        except NotImplementedError as e:
            _available[device] = str(e)
    if _available[device] is not None:
        pytest.skip(f"this build has no attention backward on {device}: {_available[device]}")


def grads_of(fn, *inputs, dout=None):
    xs = [x.detach().clone().requires_grad_(True) for x in inputs]
    out = fn(*xs)
    out.backward(dout if dout is not None else torch.ones_like(out))
    return [x.grad for x in xs], out


# ---------------------------------------------------------------- CPU

@pytest.mark.parametrize("causal", [False, True])
def test_gradcheck_cpu(causal):
    """gradcheck in float64 around the float32 library call: central differences with eps = 1e-3
    see the float32 rounding of O (~1e-7) as ~1e-4 noise, far below the tolerance, while a wrong
    term of the backward (a missing Delta, a mask left out) is O(1)."""
    need_backward()
    gen = torch.Generator().manual_seed(1)
    q, k, v = (x.double().requires_grad_(True) for x in qkv(gen, 1, 2, 1, 70, 90, 64))
    lay = random_layout(gen, 1, 2, 2, 2, block=64, density=0.6, full_density=0.3 if causal else 0.0)

    def f(q, k, v):
        return sparsek.attention(q.float(), k.float(), v.float(), lay, causal=causal)[0].double()

    assert torch.autograd.gradcheck(f, (q, k, v), eps=1e-3, atol=2e-3, rtol=2e-2, fast_mode=True)


BWD_CASES = {  # name: (B, Hq, Hkv, Sq, Skv, D, block, layout heads, causal, full_density, empty q rows)
    "mha": (1, 2, 2, 256, 256, 64, 64, 2, False, 0.0, (1,)),
    "gqa, kv-head layout": (2, 4, 2, 192, 256, 64, 64, 2, False, 0.0, ()),
    "causal + full blocks": (1, 2, 2, 256, 256, 64, 64, 1, True, 0.3, (2,)),
    "non-multiple, mqa, causal": (1, 3, 1, 200, 200, 128, 128, 1, True, 0.0, ()),
    "d128": (1, 2, 1, 256, 384, 128, 128, 2, False, 0.2, ()),
}


def _bwd_case(name, device, dtype):
    B, Hq, Hkv, Sq, Skv, D, bs, lh, causal, fd, empty = BWD_CASES[name]
    gen = torch.Generator().manual_seed(len(name))
    q, k, v = qkv(gen, B, Hq, Hkv, Sq, Skv, D, dtype, device)
    lay = random_layout(gen, 1, lh, cdiv(Sq, bs), cdiv(Skv, bs), block=bs, density=0.4, full_density=fd,
                        empty_rows=empty, device=device)
    if cdiv(Skv, bs) > 2:  # an empty key/value column: no query block attends key block 1
        part, full = lay.to_dense(cdiv(Skv, bs))
        part[..., 1] = False
        if full is not None:
            full[..., 1] = False
        lay = sparsek.BlockLayout.from_dense(part, full, block=bs)
    dout = torch.randn(q.shape, generator=gen).to(device=device, dtype=dtype)
    return q, k, v, lay, causal, dout


@pytest.mark.parametrize("name", list(BWD_CASES))
def test_cpu_gradients_match_float64_reference(name):
    need_backward()
    q, k, v, lay, causal, dout = _bwd_case(name, "cpu", torch.float32)
    got, _ = grads_of(lambda q, k, v: sparsek.attention(q, k, v, lay, causal=causal)[0], q, k, v, dout=dout)
    want, _ = grads_of(lambda q, k, v: reference(q, k, v, lay, causal)[0], q.double(), k.double(), v.double(),
                       dout=dout.double())
    for g, w, n in zip(got, want, "qkv"):
        assert g.dtype == torch.float32 and torch.isfinite(g).all(), n
        torch.testing.assert_close(g.double(), w, atol=1e-4, rtol=1e-4, msg=lambda m: f"d{n}: {m}")
    # Keys no query attends get zero gradients (written, not left uninitialised).
    if lay.kv_indices.shape[-1] > 2:
        bs = lay.block
        assert torch.equal(got[1][:, :, bs:2 * bs], torch.zeros_like(got[1][:, :, bs:2 * bs]))


def test_opcheck_with_autograd():
    need_backward()
    gen = torch.Generator().manual_seed(3)
    q, k, v = (x.requires_grad_(True) for x in qkv(gen, 1, 2, 1, 128, 128, 64))
    lay = random_layout(gen, 1, 1, 2, 2, block=64, density=0.7)
    torch.library.opcheck(torch.ops.sparsek.attention.default, (q, k, v, *lay.arrays(), 64, True, 0.0, True))


def test_torch_compile_with_backward():
    need_backward()
    gen = torch.Generator().manual_seed(4)
    q, k, v = qkv(gen, 1, 2, 2, 256, 256, 64)
    lay = random_layout(gen, 1, 2, 4, 4, block=64)

    def loss(q, k, v):
        return (sparsek.attention(q, k, v, lay, causal=True)[0] ** 2).sum()

    torch._dynamo.reset()
    got, _ = grads_of(torch.compile(loss, fullgraph=True), q, k, v)
    want, _ = grads_of(loss, q, k, v)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, atol=0, rtol=0)


@pytest.mark.parametrize("device", DEVICES)
def test_repeated_backward_with_new_data_and_strides(device):
    """The eager backward keeps the problem made on the first call and passes only pointers later:
    new tensors of the same shapes must give their own gradients, and an upstream gradient with other
    strides (same shape) must not reuse the first call's problem."""
    need_backward(device)
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    lay = random_layout(torch.Generator().manual_seed(6), 1, 2, 2, 2, block=64, density=0.7, device=device)
    tol = dict(atol=1e-4, rtol=1e-4) if device == "cpu" else dict(atol=3e-2, rtol=3e-2)
    for seed, strided in ((7, False), (8, False), (9, True)):
        gen = torch.Generator().manual_seed(seed)
        q, k, v = qkv(gen, 1, 2, 2, 128, 128, 64, dtype, device)
        dout = torch.randn(1, 2, 128, 96 if strided else 64, generator=gen).to(device=device, dtype=dtype)
        dout = dout[..., :64]  # strided: rows 96 elements apart
        got, _ = grads_of(lambda q, k, v: sparsek.attention(q, k, v, lay)[0], q, k, v, dout=dout)
        want, _ = grads_of(lambda q, k, v: reference(q, k, v, lay, False)[0], q.double(), k.double(), v.double(),
                           dout=dout.double())
        for g, w, n in zip(got, want, "qkv"):
            torch.testing.assert_close(g.double(), w, **tol, msg=lambda m: f"seed {seed} d{n}: {m}")


def test_lse_carries_no_gradient():
    need_backward()
    q, k, v = (x.requires_grad_(True) for x in qkv(torch.Generator().manual_seed(5), 1, 1, 1, 64, 64, 64))
    lay = random_layout(torch.Generator().manual_seed(5), 1, 1, 1, 1, block=64, density=1.0)
    o, lse = sparsek.attention(q, k, v, lay)
    assert o.requires_grad and not lse.requires_grad


def test_eager_gradients_skip_the_custom_op_dispatch():
    """Eager calls that record autograd run through a torch.autograd.Function, not the custom op's
    dispatch (~0.1 ms of host time per call), and give the op's output and gradients bit for bit."""
    need_backward()
    gen = torch.Generator().manual_seed(10)
    q, k, v = qkv(gen, 1, 2, 2, 128, 96, 64)
    lay = random_layout(gen, 1, 2, 2, 2, block=64, density=0.6)
    dout = torch.randn(1, 2, 128, 64, generator=gen)
    xs = [x.clone().requires_grad_(True) for x in (q, k, v)]
    o = sparsek.attention(*xs, lay, causal=True)[0]
    assert type(o.grad_fn).__name__ == "_AttentionFunctionBackward"
    got = torch.autograd.grad(o, xs, dout)
    ys = [x.clone().requires_grad_(True) for x in (q, k, v)]
    o_op = torch.ops.sparsek.attention(*ys, *lay.arrays(), 64, True, 0.0, True)[0]
    assert "Function" not in type(o_op.grad_fn).__name__
    want = torch.autograd.grad(o_op, ys, dout)
    assert torch.equal(o, o_op)
    for g, w in zip(got, want):
        assert torch.equal(g, w)


def test_second_derivative_raises():
    """The backward records no graph of its own: asking for a second derivative is an error, not a
    silent zero."""
    need_backward()
    gen = torch.Generator().manual_seed(11)
    q, k, v = (x.requires_grad_(True) for x in qkv(gen, 1, 1, 1, 64, 64, 64))
    lay = random_layout(gen, 1, 1, 1, 1, block=64, density=1.0)
    o = sparsek.attention(q, k, v, lay)[0]
    (gq,) = torch.autograd.grad((o ** 2).sum(), q, create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable"):
        gq.sum().backward()


# ---------------------------------------------------------------- GPU

@cuda_only
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", list(BWD_CASES))
def test_gpu_gradients_within_twice_naive_error(name, dtype):
    need_backward("cuda")
    q, k, v, lay, causal, dout = _bwd_case(name, "cuda", dtype)
    got, _ = grads_of(lambda q, k, v: sparsek.attention(q, k, v, lay, causal=causal)[0], q, k, v, dout=dout)
    want, _ = grads_of(lambda q, k, v: reference(q, k, v, lay, causal)[0], q.double(), k.double(), v.double(),
                       dout=dout.double())
    naive, _ = grads_of(lambda q, k, v: reference(q, k, v, lay, causal, dtype=dtype)[0], q, k, v, dout=dout)
    for g, w, nv, n in zip(got, want, naive, "qkv"):
        err = float((g.double() - w).abs().max())
        naive_err = float((nv.double() - w).abs().max())
        assert err <= 2 * naive_err, f"{name} d{n}: error {err:.3g} vs naive {dtype} {naive_err:.3g}"


@cuda_only
def test_gpu_backward_is_bit_identical_run_to_run():
    need_backward("cuda")
    q, k, v, lay, causal, dout = _bwd_case("causal + full blocks", "cuda", torch.bfloat16)
    runs = [grads_of(lambda q, k, v: sparsek.attention(q, k, v, lay, causal=causal)[0], q, k, v, dout=dout)[0]
            for _ in range(3)]
    for r in runs[1:]:
        for a, b in zip(runs[0], r):
            assert torch.equal(a, b)


@cuda_only
def test_backward_on_two_streams_at_once_uses_a_workspace_per_stream():
    """A backward problem's workspace (dQ's accumulator, the transposed layout) is used in one
    stream's order. Backward passes of the same shapes running at once on two streams must each get
    their own problem, and the gradients of a run alone (bit-identical)."""
    need_backward("cuda")
    from sparsek import _torch_attention
    S = 8192  # a backward of ~0.4 ms on an H100: the two streams' passes overlap
    lay = random_layout(torch.Generator().manual_seed(21), 1, 4, S // 128, S // 128, block=128, density=0.5,
                        device="cuda")
    cases = []
    for seed in (22, 23):
        g = torch.Generator().manual_seed(seed)
        q, k, v = qkv(g, 1, 4, 4, S, S, 128, torch.bfloat16, "cuda")
        cases.append((q, k, v, torch.randn(1, 4, S, 128, generator=g).to("cuda", torch.bfloat16)))

    def grads(q, k, v, dout):
        return grads_of(lambda q, k, v: sparsek.attention(q, k, v, lay)[0], q, k, v, dout=dout)[0]

    want = [grads(*c) for c in cases]  # one at a time, on the current stream
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    for _ in range(3):
        got = [None, None]
        for i, s in enumerate(streams):
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                torch.cuda._sleep(1_000_000)  # both streams' work queued before either starts
                got[i] = grads(*cases[i])
        torch.cuda.synchronize()
        for i in range(2):
            for a, b, n in zip(got[i], want[i], "qkv"):
                assert torch.equal(a, b), f"stream {i}: d{n} differs from the run alone"
    used = {e[2] for e in _torch_attention._backward_problems.values()}
    assert {s.cuda_stream for s in streams} <= used, "each stream has a backward problem of its own"


@cuda_only
def test_cuda_graph_capture_of_forward_and_backward():
    """Forward and backward captured in one CUDA graph after a warm-up on another stream (the plans
    and the backward problem are made there): replays with new inputs give the eager gradients bit
    for bit."""
    need_backward("cuda")
    lay = random_layout(torch.Generator().manual_seed(31), 1, 2, 4, 4, block=128, density=0.6, device="cuda")
    gen = torch.Generator().manual_seed(32)
    q, k, v = (x.requires_grad_(True) for x in qkv(gen, 1, 2, 2, 512, 512, 128, torch.bfloat16, "cuda"))
    dout = torch.randn(1, 2, 512, 128, generator=gen).to("cuda", torch.bfloat16)

    def step():
        o = sparsek.attention(q, k, v, lay)[0]
        return torch.autograd.grad(o, (q, k, v), dout)

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static = step()
    for seed in (33, 34):
        with torch.no_grad():
            for x, new in zip((q, k, v), qkv(torch.Generator().manual_seed(seed), 1, 2, 2, 512, 512, 128,
                                             torch.bfloat16, "cuda")):
                x.copy_(new)
        for t in static:
            t.fill_(float("nan"))
        g.replay()
        want = step()
        for a, b, n in zip(static, want, "qkv"):
            assert torch.equal(a, b), f"seed {seed}: the replay's d{n} differs from the eager one"


@cuda_only
def test_cuda_graph_keeps_its_plans_when_the_tables_drop_them(monkeypatch):
    """The plans a capture used (the forward's and the backward's, with their GPU workspace) stay
    alive after calls with other shapes push them out of the plan tables, and replays stay right."""
    need_backward("cuda")
    from collections import OrderedDict
    from sparsek import _torch_attention, _torch_ops
    monkeypatch.setattr(_torch_attention, "_MAX_PLANS", 1)  # fresh tables of one entry each
    monkeypatch.setattr(_torch_attention, "_plans", OrderedDict())
    monkeypatch.setattr(_torch_attention, "_backward_problems", OrderedDict())
    lay = random_layout(torch.Generator().manual_seed(41), 1, 2, 2, 2, block=128, density=1.0, device="cuda")
    gen = torch.Generator().manual_seed(42)
    q, k, v = (x.requires_grad_(True) for x in qkv(gen, 1, 2, 2, 256, 256, 128, torch.bfloat16, "cuda"))
    dout = torch.randn(1, 2, 256, 128, generator=gen).to("cuda", torch.bfloat16)

    def step(q, k, v, lay, dout):
        o = sparsek.attention(q, k, v, lay)[0]
        return (o.detach(),) + torch.autograd.grad(o, (q, k, v), dout)

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        step(q, k, v, lay, dout)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static = step(q, k, v, lay, dout)
    captured = [e[0] for e in list(_torch_attention._plans.values()) +
                list(_torch_attention._backward_problems.values())]
    assert len(captured) == 2, "one forward plan and one backward problem were used by the capture"
    for n in (384, 512):  # other shapes: each call's plan pushes the previous one out (table of 1)
        lay_n = random_layout(torch.Generator().manual_seed(n), 1, 2, n // 128, n // 128, block=128, density=1.0,
                              device="cuda")
        xs = [x.requires_grad_(True) for x in qkv(torch.Generator().manual_seed(n), 1, 2, 2, n, n, 128,
                                                  torch.bfloat16, "cuda")]
        step(*xs, lay_n, torch.ones(1, 2, n, 128, device="cuda", dtype=torch.bfloat16))
    left = [e[0] for e in list(_torch_attention._plans.values()) + list(_torch_attention._backward_problems.values())]
    assert not any(p is c for p in left for c in captured), "the tables dropped the captured plans"
    kept = list(_torch_ops._graph_plans.values())
    assert all(any(p is c for p in kept) for c in captured), "a plan the graph uses was not kept"
    with torch.no_grad():
        for x, new in zip((q, k, v), qkv(torch.Generator().manual_seed(43), 1, 2, 2, 256, 256, 128,
                                         torch.bfloat16, "cuda")):
            x.copy_(new)
    for t in static:
        t.fill_(float("nan"))
    g.replay()
    want = step(q, k, v, lay, dout)
    for a, b, n in zip(static, want, ("o", "dq", "dk", "dv")):
        assert torch.equal(a, b), f"the replay's {n} differs from the eager one"


@cuda_only
def test_backward_planning_during_capture_says_to_run_first():
    need_backward("cuda")
    lay = random_layout(torch.Generator().manual_seed(35), 1, 2, 2, 2, block=128, density=1.0, device="cuda")
    q, k, v = (x.requires_grad_(True) for x in qkv(torch.Generator().manual_seed(36), 1, 2, 2, 256, 256, 128,
                                                   torch.bfloat16, "cuda"))
    with torch.no_grad():
        sparsek.attention(q, k, v, lay)  # the forward's plan exists, the backward's problem does not
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="attention backward has no plan yet.*Run the same call once"):
        with torch.cuda.graph(g):
            o = sparsek.attention(q, k, v, lay)[0]
            torch.autograd.grad(o, (q, k, v), torch.ones_like(o))


# ---------------------------------------------------------------- a tiny transformer block that trains

def masked_attention(q, k, v, layout, causal):
    """The dense masked reference in float32 (float64 for float32 inputs), cast back to q's dtype."""
    dt = F64 if q.dtype == torch.float32 else torch.float32
    return reference(q, k, v, layout, causal, dtype=dt)[0].to(q.dtype)


class Block(torch.nn.Module):
    def __init__(self, d_model, heads, kv_heads, head_dim, block, topk, mlp_block):
        super().__init__()
        self.h, self.hkv, self.dh = heads, kv_heads, head_dim
        self.norm1 = torch.nn.LayerNorm(d_model)
        self.qkv = torch.nn.Linear(d_model, (heads + 2 * kv_heads) * head_dim)
        self.proj = torch.nn.Linear(heads * head_dim, d_model)
        self.gate = sparsek.nn.TopKGate(head_dim, block=block, topk=topk, causal=True)
        self.norm2 = torch.nn.LayerNorm(d_model)
        g = torch.Generator().manual_seed(0)
        self.up = sparsek.nn.BlockSparseLinear(d_model, 2 * d_model, block=mlp_block, density=0.5, generator=g,
                                               method="dds")
        self.down = sparsek.nn.BlockSparseLinear(2 * d_model, d_model, block=mlp_block, density=0.5, generator=g,
                                                 method="dds")

    def forward(self, x, use_sparsek, layout=None):
        B, S, _ = x.shape
        qkv = self.qkv(self.norm1(x)).view(B, S, self.h + 2 * self.hkv, self.dh).transpose(1, 2)
        q, k, v = qkv.split([self.h, self.hkv, self.hkv], dim=1)
        if layout is None:
            layout = self.gate(q, k)  # no gradient through the selection
        if use_sparsek:
            o = sparsek.attention(q, k, v, layout, causal=True)[0]
        else:
            o = masked_attention(q, k, v, layout, True)
        x = x + self.proj(o.transpose(1, 2).reshape(B, S, -1))
        x = x + self.down(torch.nn.functional.gelu(self.up(self.norm2(x))))
        return x, layout, q, k


@pytest.mark.parametrize("device", DEVICES)
def test_transformer_block_trains_and_matches_dense_reference(device):
    need_backward(device)
    torch.manual_seed(0)
    if device == "cpu":
        cfg = dict(d_model=128, heads=2, kv_heads=1, head_dim=64, block=64, topk=1, mlp_block=(32, 32))
        B, S, tol, amp = 1, 256, 1e-4, torch.float32
    else:
        cfg = dict(d_model=256, heads=4, kv_heads=2, head_dim=128, block=128, topk=2, mlp_block=(64, 64))
        B, S, tol, amp = 2, 1024, 5e-2, torch.bfloat16
    model = Block(**cfg).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=2e-3)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(B, S, cfg["d_model"], generator=gen).to(device)
    y = torch.roll(x, 1, dims=1) * 0.5 + torch.randn(B, S, cfg["d_model"], generator=gen).to(device) * 0.1
    losses = []
    for step in range(12):
        grads = {}
        for use_sparsek in (False, True):
            opt.zero_grad()
            with torch.autocast(device, dtype=amp, enabled=amp != torch.float32):
                out, layout, q, k = model(x, use_sparsek, layout=None if not use_sparsek else ref_layout)
                loss = torch.nn.functional.mse_loss(out.float(), y)
                total = loss + 0.1 * model.gate.distill_loss(q, k, n_sample_blocks=2,
                                                             generator=torch.Generator().manual_seed(step))
            total.backward()
            if not use_sparsek:
                ref_layout = layout  # the same layout for both runs of the step
            grads[use_sparsek] = {n: p.grad.detach().clone() for n, p in model.named_parameters()
                                  if p.grad is not None}
        assert grads[True].keys() == grads[False].keys()
        for n, g in grads[True].items():
            w = grads[False][n]
            rel = float((g - w).norm() / w.norm().clamp_min(1e-30))
            assert rel <= tol, f"step {step}: grad of {n} differs from the dense reference by {rel:.3g} (rel. norm)"
        opt.step()
        losses.append(float(loss))
    assert losses[-1] < 0.8 * losses[0], losses
