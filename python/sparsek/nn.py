"""torch modules: ``BlockSparseLinear``, a linear layer whose weight is block-sparse, and
``TopKGate``, a learnable scorer for the top-k block gate of block-sparse attention.

    import torch, sparsek.nn
    layer = sparsek.nn.BlockSparseLinear(4096, 14336, block=(64, 64), density=0.25,
                                         device="cuda", dtype=torch.bfloat16)
    y = layer(x)                                   # x: (..., 4096) -> y: (..., 14336)
    layer = sparsek.nn.BlockSparseLinear.from_dense(dense_linear, block=(64, 64), density=0.25)

The weight (out_features x in_features) stores only its chosen blocks: ``values`` is one
``nn.Parameter`` of shape (nnzb, bm, bk), the pattern (``row_ptr``, ``col_idx``, int32) is a pair of
buffers, so optimizers, ``state_dict``, ``.to()``, DDP and ``torch.compile`` see a plain module.
Importing this module imports torch.
"""
import math
import statistics

import torch
from torch import nn

from . import _arrays as A
from . import _sparsek as _ext
from ._attention import gate as _gate
from ._bsr import BSRMatrix
from ._fp8 import check_group as _check_group
from ._fp8 import quantize_e4m3
from ._ops import bsr_mm, dense_bsr_mm
from ._torch_attention import pool_blocks

A.torch_loaded()

METHODS = ("auto", "dds", "dsd")


def _mask_pattern(mask):
    """row_ptr, col_idx (int32, CPU) of a (mb, kb) boolean mask, row-major order."""
    r, c = torch.nonzero(mask, as_tuple=True)
    row_ptr = torch.zeros(mask.shape[0] + 1, dtype=torch.int32)
    row_ptr[1:] = torch.cumsum(mask.sum(1), 0)
    return row_ptr, c.to(torch.int32)


def _density(density):
    d = A.scalar(density, "density")
    if not 0 < d <= 1:
        raise ValueError(f"density must be in (0, 1], got {density!r}")
    return d


class BlockSparseLinear(nn.Module):
    """``y = x @ W.T + bias`` with W (out_features x in_features) stored as (bm x bk) blocks.

    Give the pattern as ``density=`` (every block row keeps the same number of random blocks,
    ``round(density * in_features / bk)``, at least one; seeded by ``generator``) or ``mask=``
    (a boolean (out_features/bm, in_features/bk) array of the blocks to store).

    ``method`` chooses how the product runs: ``"dds"`` (``x @ W.T`` with W sparse, op = transpose),
    ``"dsd"`` (``(W @ x.T).T``, which can use a faster sparse x dense kernel at the cost of
    transposing x), or ``"auto"`` (default): on the first forward on a CUDA device outside
    torch.compile, both are timed on that input (forward, plus backward in training) and the faster
    one is kept (``layer.method`` then says which); on the CPU and when never measured, ``"dds"``.

    Under ``torch.autocast`` the product runs in the autocast dtype (float16/bfloat16) with the
    float32 parameters cast per call, as ``nn.Linear`` does. On a CUDA device the weights and
    inputs must be float16 or bfloat16 (the GPU kernels are tensor-core kernels), or autocast on.

    ``to_fp8()`` turns a trained layer into an fp8 (e4m3) inference layer: see there.
    """

    def __init__(self, in_features, out_features, block=(64, 64), *, density=None, mask=None,
                 bias=True, device=None, dtype=None, generator=None, method="auto"):
        super().__init__()
        self.in_features = A.dim(in_features, "in_features")
        self.out_features = A.dim(out_features, "out_features")
        self.block = A.pair(block, "block", A.INT32_MAX)
        bm, bk = self.block
        _ext.check_block_shape(self.out_features, self.in_features, bm, bk)
        if method not in METHODS:
            raise ValueError(f"method must be one of {', '.join(METHODS)}, got {method!r}")
        self.method = method
        mb, kb = self.out_features // bm, self.in_features // bk
        if (density is None) == (mask is None):
            raise ValueError("give exactly one of density= or mask= (the stored blocks)")
        if mask is None:
            d = _density(density)
            k = min(kb, max(1, round(d * kb)))
            cols = torch.rand(mb, kb, generator=generator).argsort(dim=1)[:, :k]
            mask = torch.zeros(mb, kb, dtype=torch.bool)
            mask.scatter_(1, cols, True)
        else:
            mask = torch.as_tensor(mask, device="cpu")
            if tuple(mask.shape) != (mb, kb):
                raise ValueError(f"mask must have shape (out_features/bm, in_features/bk)=({mb}, {kb}), "
                                 f"got {tuple(mask.shape)}")
            mask = mask != 0
        bias = A.flag(bias, "bias")
        row_ptr, col_idx = _mask_pattern(mask)
        self.register_buffer("row_ptr", row_ptr.to(device))
        self.register_buffer("col_idx", col_idx.to(device))
        self.values = nn.Parameter(torch.empty((col_idx.numel(), bm, bk), device=device, dtype=dtype))
        if bias:
            self.bias = nn.Parameter(torch.empty(self.out_features, device=device, dtype=dtype))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self):
        """Uniform in +-1/sqrt(fan_in), fan_in = the stored inputs per output (as nn.Linear's
        default, counting only stored blocks)."""
        mb = self.out_features // self.block[0]
        fan_in = self.values.shape[0] * self.block[1] / max(mb, 1)
        bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0
        with torch.no_grad():
            self.values.uniform_(-bound, bound)
            if self.bias is not None:
                self.bias.uniform_(-bound, bound)

    @classmethod
    def from_dense(cls, linear, block, density=None, *, mask=None, per_row=True, method="auto"):
        """A BlockSparseLinear keeping the blocks of ``linear.weight`` with the largest magnitude
        (Frobenius norm): ``round(density * in/bk)`` per block row (``per_row=True``, balanced rows)
        or ``round(density * all blocks)`` over the whole matrix (``per_row=False``); or exactly
        the blocks of ``mask``. The kept blocks and the bias are copied."""
        if not isinstance(linear, nn.Linear):
            raise TypeError(f"from_dense expects a torch.nn.Linear, got {type(linear).__name__}")
        per_row = A.flag(per_row, "per_row")
        w = linear.weight.detach()
        out_f, in_f = w.shape
        bm, bk = A.pair(block, "block", A.INT32_MAX)
        _ext.check_block_shape(out_f, in_f, bm, bk)
        mb, kb = out_f // bm, in_f // bk
        blocks = w.reshape(mb, bm, kb, bk).permute(0, 2, 1, 3)  # (mb, kb, bm, bk)
        if mask is None:
            if density is None:
                raise ValueError("give density= or mask= (the blocks to keep)")
            d = _density(density)
            norms = blocks.float().pow(2).sum((2, 3)).cpu()
            keep = torch.zeros(mb, kb, dtype=torch.bool)
            if per_row:
                k = min(kb, max(1, round(d * kb)))
                keep.scatter_(1, norms.topk(k, dim=1).indices, True)
            else:
                k = min(mb * kb, max(1, round(d * mb * kb)))
                keep.view(-1)[norms.view(-1).topk(k).indices] = True
            mask = keep
        layer = cls(in_f, out_f, (bm, bk), mask=mask, bias=linear.bias is not None, device=w.device,
                    dtype=w.dtype, method=method)
        with torch.no_grad():
            layer.values.copy_(blocks[torch.as_tensor(mask, device=w.device) != 0])
            if linear.bias is not None:
                layer.bias.copy_(linear.bias)
        return layer

    @property
    def weight(self):
        """The weight as a sparsek.BSRMatrix over this layer's tensors (no copy; e4m3 with its
        scales after to_fp8())."""
        return BSRMatrix(self.row_ptr, self.col_idx, self.values, (self.out_features, self.in_features),
                         scales=self.scales if self.fp8 else None, check=False)

    @property
    def fp8(self):
        """Whether to_fp8() made this an e4m3 inference layer."""
        return "scales" in self._buffers

    @torch.no_grad()
    def to_fp8(self, group=0):
        """Make this layer an fp8 (e4m3) inference layer, in place; returns self.

        The stored blocks are quantized once (one float32 scale per block: ``weight.quantize()``)
        and kept as buffers ``values`` (float8_e4m3fn) and ``scales``; each forward quantizes its
        input per token (per row of x, one scale each, or per 128-wide group of in_features with
        ``group=128``) and computes ``x @ W.T`` in fp8 with fp32 accumulation, giving the dtype the
        weights had (the bias stays in it too). Forward only: a backward through the layer raises
        (an fp8 product has no gradient), so train first, then convert. ``method`` is kept when it
        is "dds" or "dsd" ("auto" becomes "dds"). On a GPU the fp8 kernel needs Hopper (sm_90a).
        Convert the layer's dtype before, not after: ``.to(device)`` moves an fp8 layer, while a
        dtype cast would turn its codes into floats (the next forward then refuses them).
        """
        if self.fp8:
            raise ValueError("to_fp8(): the layer is fp8 already")
        group = _check_group(group)
        w = BSRMatrix(self.row_ptr, self.col_idx, self.values.detach(), (self.out_features, self.in_features),
                      check=False).quantize()
        self.fp8_out_dtype = self.values.dtype
        self.fp8_group = group
        del self.values  # the Parameter becomes a buffer of codes: nothing to train
        self.register_buffer("values", w.values)
        # NOTE: the scales are marked as requiring grad so that, with grad mode on, the output is
        # part of an autograd graph whose backward reaches the fp8 op and raises saying why; without
        # it a backward would stop at "does not require grad", or train the bias alone.
        self.register_buffer("scales", w.scales.requires_grad_(True))
        if self.bias is not None:
            self.bias.requires_grad_(False)
        if self.method == "auto":
            self.method = "dds"
        return self

    @property
    def density(self):
        return self.weight.density

    def to_dense(self):
        """The dense weight (out_features x in_features)."""
        return self.weight.to_dense()

    def forward(self, x):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"input must be a torch tensor, got {type(x).__name__}")
        if x.dim() < 1 or x.shape[-1] != self.in_features:
            raise ValueError(f"input must have in_features={self.in_features} as its last dimension, "
                             f"got shape {tuple(x.shape)}")
        if self.fp8:
            return self._forward_fp8(x)
        values = self.values
        if torch.is_autocast_enabled(x.device.type):
            dt = torch.get_autocast_dtype(x.device.type)
            x, values = x.to(dt), values.to(dt)
        x2 = x.reshape(-1, self.in_features)
        w = BSRMatrix(self.row_ptr, self.col_idx, values, (self.out_features, self.in_features),
                      check=False)
        method = self.method
        if method == "auto":
            method = "dds"
            if x.is_cuda and not torch.compiler.is_compiling():
                method = self.method = self._measure(x2, w)
        y = _product(method, x2, w)
        if self.bias is not None:
            y = y + self.bias.to(y.dtype)
        return y.reshape(*x.shape[:-1], self.out_features)

    def _forward_fp8(self, x):
        x2 = x.reshape(-1, self.in_features)
        xq, xs = quantize_e4m3(x2, per="row", group=self.fp8_group)  # per token: x's rows
        w = self.weight
        if self.method == "dsd":  # (W @ x^T)^T: x^T's columns are x's rows, so the same scales
            y = bsr_mm(w, xq.mT, b_scales=xs, out_dtype=self.fp8_out_dtype).mT
        else:
            y = dense_bsr_mm(xq, w.T, a_scales=xs, out_dtype=self.fp8_out_dtype)
        if self.bias is not None:
            y = y + self.bias.to(y.dtype)
        return y.reshape(*x.shape[:-1], self.out_features)

    def _measure(self, x2, w, reps=5):
        """The faster of "dds" and "dsd" on this input (median of `reps` timings after a warm-up
        call that also plans), forward plus backward when the layer trains."""
        train = torch.is_grad_enabled() and (self.values.requires_grad or x2.requires_grad)
        x = x2.detach().requires_grad_(train)
        v = w.values.detach().requires_grad_(train)
        wd = BSRMatrix(w.row_ptr, w.col_idx, v, w.shape, check=False)
        times = {}
        for m in ("dds", "dsd"):
            def step():
                y = _product(m, x, wd)
                if train:
                    torch.autograd.grad(y, (x, v), torch.ones_like(y))
            step()
            samples = []
            for _ in range(reps):
                start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                step()
                stop.record()
                stop.synchronize()
                samples.append(start.elapsed_time(stop))
            times[m] = statistics.median(samples)
        self.measured_ms = times
        return min(times, key=times.get)

    def extra_repr(self):
        fp8 = f", fp8=e4m3 (group={self.fp8_group}, out={self.fp8_out_dtype})" if self.fp8 else ""
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"block={self.block}, nnzb={self.values.shape[0]}, density={self.density:.4g}, "
                f"bias={self.bias is not None}, method={self.method!r}{fp8}")


def _product(method, x2, w):
    """x2 @ w.T by one of the two formulations."""
    if method == "dsd":
        return bsr_mm(w, x2.mT.contiguous()).mT
    return dense_bsr_mm(x2, w.T)


class TopKGate(nn.Module):
    """A learnable top-k block gate: ``layout = gate(q, k)`` for ``sparsek.attention``.

    Scores key block j for query block i as ``(pooled_q_i Wq) . (pooled_k_j Wk) / sqrt(d_gate)``
    on the block means of Q and K (pooled as ``sparsek.gate`` pools; GQA: one score row per
    key/value head), then the library keeps ``sink`` first blocks, ``local`` blocks up to the
    diagonal and the ``topk`` best others (``causal``: at or before the diagonal). Wq and Wk
    (d x d_gate) start as the identity when d_gate == d, so an untrained gate is the plain
    pooled-dot-product gate.

    There is no gradient through the top-k selection: the layout is not differentiable. Train the
    scorer with the auxiliary loss ``distill_loss(q, k)`` (KL divergence from the block-pooled true
    attention), added to the task loss::

        layout = gate(q, k)                               # no gradient: selection only
        o, _ = sparsek.attention(q, k, v, layout, causal=True)
        loss = task_loss(o) + 0.1 * gate.distill_loss(q, k)   # trains gate.wq, gate.wk only

    ``distill_loss`` detaches q and k: it trains the scorer and leaves the attention to the task.
    """

    def __init__(self, d, block=128, topk=8, *, causal=False, sink=1, local=1, d_gate=None, device=None,
                 dtype=None):
        super().__init__()
        self.d = A.dim(d, "d")
        self.d_gate = self.d if d_gate is None else A.dim(d_gate, "d_gate")
        self.block = A.dim(block, "block")
        if self.block not in (64, 128):
            raise ValueError(f"block must be 64 or 128, got {block}")
        self.topk, self.sink, self.local = A.dim(topk, "topk"), A.dim(sink, "sink"), A.dim(local, "local")
        self.causal = A.flag(causal, "causal")
        self.wq = nn.Parameter(torch.empty(self.d, self.d_gate, device=device, dtype=dtype))
        self.wk = nn.Parameter(torch.empty(self.d, self.d_gate, device=device, dtype=dtype))
        self.reset_parameters()

    def reset_parameters(self):
        with torch.no_grad():
            if self.d_gate == self.d:
                for w in (self.wq, self.wk):
                    w.copy_(torch.eye(self.d))
            else:
                for w in (self.wq, self.wk):
                    nn.init.normal_(w, std=1 / math.sqrt(self.d))

    def score(self, pooled_q, pooled_k):
        """Block scores [B, Hkv, Mq, Nk] (float32) of pooled_q [B, Hkv, Mq, d], pooled_k [B, Hkv, Nk, d]."""
        dt = torch.promote_types(self.wq.dtype, torch.float32)  # float64 parameters stay float64
        pq, pk = pooled_q.to(dt), pooled_k.to(dt)
        return (pq @ self.wq.to(dt)) @ (pk @ self.wk.to(dt)).mT / math.sqrt(self.d_gate)

    def forward(self, q, k, layout=None, return_scores=False):
        """The BlockLayout for q [B, Hq, Sq, d], k [B, Hkv, Skv, d] (``layout``: candidates)."""
        return _gate(q, k, self.topk, self.block, self.causal, self.sink, self.local, scorer=self.score,
                     layout=layout, return_scores=return_scores)

    def distill_loss(self, q, k, n_sample_blocks=8, generator=None, scale=None):
        """KL(target || gate) averaged over ``n_sample_blocks`` random query blocks (all when fewer),
        batches and key/value heads. target: the true attention ``softmax(scale * q k^T)`` (causal
        when the gate is; scale 1/sqrt(d) by default) summed per key block and averaged over the
        block's rows and the group's query heads; gate: ``softmax`` of the scores over the allowed
        key blocks. Memory: one query block's full score rows at a time."""
        q, k = q.detach(), k.detach()
        B, Hq, Sq, D = q.shape
        Hkv, Skv = k.shape[1], k.shape[2]
        G, bs = Hq // Hkv, self.block
        Mq, Nk = -(-Sq // bs), -(-Skv // bs)
        scale = 1 / math.sqrt(D) if scale is None else float(scale)
        n = min(A.dim(n_sample_blocks, "n_sample_blocks"), Mq)
        sel = torch.randperm(Mq, generator=generator)[:n].tolist()
        pq, pk = pool_blocks(q, k, bs)
        logits = self.score(pq[:, :, sel], pk)  # [B, Hkv, n, Nk]
        kf = k.to(logits.dtype).repeat_interleave(G, 1)
        key_block = torch.arange(Skv, device=q.device) // bs
        targets, allowed = [], []
        for i in sel:
            r0, r1 = i * bs, min(Sq, (i + 1) * bs)
            s = (q[:, :, r0:r1].to(kf.dtype) @ kf.mT) * scale  # [B, Hq, rows, Skv]
            blocks_ok = torch.ones(Nk, dtype=torch.bool, device=q.device)
            if self.causal:
                rows = torch.arange(r0, r1, device=q.device)
                s = s.masked_fill(torch.arange(Skv, device=q.device)[None] > rows[:, None], float("-inf"))
                blocks_ok = torch.arange(Nk, device=q.device) * bs <= r1 - 1
            p = torch.softmax(s, -1)
            pooled = p.new_zeros(B, Hq, r1 - r0, Nk).index_add_(-1, key_block, p)
            targets.append(pooled.mean(2).reshape(B, Hkv, G, Nk).mean(2))
            allowed.append(blocks_ok)
        target = torch.stack(targets, 2)  # [B, Hkv, n, Nk]
        ok = torch.stack(allowed)  # [n, Nk]
        logq = torch.log_softmax(logits.masked_fill(~ok, float("-inf")), -1)
        kl = torch.xlogy(target, target) - torch.where(target > 0, target * logq, torch.zeros_like(target))
        return kl.sum(-1).mean()

    def extra_repr(self):
        return (f"d={self.d}, d_gate={self.d_gate}, block={self.block}, topk={self.topk}, "
                f"causal={self.causal}, sink={self.sink}, local={self.local}")
