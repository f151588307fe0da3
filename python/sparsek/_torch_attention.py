"""torch integration of attention and the gate: custom ops with fake kernels and autograd, cached
plans, and the eager launch-only path.

    torch.ops.sparsek.attention(q, k, v, kv_num_blocks, kv_indices, full_kv_num_blocks,
                                full_kv_indices, block, causal, scale, check,
                                cu_seqlens=None) -> (o, lse)
    torch.ops.sparsek.attention_backward(q, k, v, o, lse, dout, kv_num_blocks, kv_indices,
                                         full_kv_num_blocks, full_kv_indices, block, causal,
                                         scale, cu_seqlens=None) -> (dq, dk, dv)
    torch.ops.sparsek.gate(q, k, topk, block, causal, sink, local, scale, cand_num, cand_idx,
                           cand_full_num, cand_full_idx, given_scores, return_scores)
        -> (kv_num_blocks, kv_indices, scores)

Plans: one attention plan per problem (shapes, strides, dtypes, device, the layout's extents,
causal, scale, whether there are packed sequences and how many; the stream when the plan holds
workspace), in a small module-level cache: a plan never depends on the layout's contents or the
offsets in cu_seqlens, so a gate making a new layout every step reuses it. Later
calls pass only data pointers (no synchronization; capturable in a CUDA graph). Planning under
capture raises, saying to run once before capturing.

The layout's contents (and cu_seqlens) are checked (a device layout is copied to the host: one
synchronization) when its tensors are new or modified in place since the last check (their
version counters), never
during a CUDA graph capture; the gate's layouts are correct by construction and marked checked.
"""
from collections import OrderedDict
from typing import Optional

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from . import _sparsek as _ext
from ._attention import BlockLayout
from ._torch_ops import _capturing, _direct, _eager, _entry, _ptr, _remember, _sig, _stream

_plans: "OrderedDict[tuple, tuple]" = OrderedDict()
_backward_problems: "OrderedDict[tuple, tuple]" = OrderedDict()  # as _plans; pointers per call
_gate_ws: dict = {}  # gate workspace bytes per problem


def _versions(*ts):
    return tuple(None if t is None else t._version for t in ts)


# The check is recorded on kv_indices: the tensors it was made with (cu_seqlens too: new offsets
# with the same layout are checked again) and their version counters.
def _mark_checked(num, idx, fnum, fidx, cu=None):
    idx.__dict__["_sparsek_checked"] = ((num, fnum, fidx, cu), _versions(num, idx, fnum, fidx, cu))


def _is_checked(num, idx, fnum, fidx, cu=None):
    c = idx.__dict__.get("_sparsek_checked")
    return (c is not None and all(a is b for a, b in zip(c[0], (num, fnum, fidx, cu)))
            and c[1] == _versions(num, idx, fnum, fidx, cu))


def _launch(q, k, v, o, lse, num, idx, fnum, fidx, block, causal, scale, check, cu=None):
    stream = _stream(q)
    capturing = _capturing(q)
    if check and not capturing and not _is_checked(num, idx, fnum, fidx, cu):
        _ext.check_attention(q.detach(), k.detach(), v.detach(), o, lse, num, idx, fnum, fidx, block,
                             causal, scale, stream, cu)
        _mark_checked(num, idx, fnum, fidx, cu)
    # cu_seqlens' signature: whether there are packed sequences, and num_seqs + 1 (its shape).
    key = (_sig(q), _sig(k), _sig(v), _sig(o), _sig(num), _sig(idx), _sig(fnum), _sig(fidx), block,
           causal, scale, _sig(cu))
    key, e = _entry(_plans, key, stream, capturing, "attention")
    if e is None:
        p = _ext.plan_attention(q.detach(), k.detach(), v.detach(), o, lse, num, idx, fnum, fidx, block,
                                causal, scale, stream, cu)
        e = _remember(_plans, key, (p, p.workspace_bytes > 0, stream))
    e[0].run(q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), lse.data_ptr(), num.data_ptr(),
             idx.data_ptr(), _ptr(fnum), _ptr(fidx), stream, _ptr(cu))


def _check_inputs(q, k, v, layout_tensors):
    for x, n in ((q, "q"), (k, "k"), (v, "v")):
        if not isinstance(x, Tensor):
            raise TypeError(f"{n} must be a torch tensor like q, got {type(x).__name__}")
        if x.dim() != 4:
            raise ValueError(f"{n} must be a 4-D tensor [B, H, S, D], got shape {tuple(x.shape)}")
    for x, n in layout_tensors:
        if x is not None and not isinstance(x, Tensor):
            raise TypeError(f"the layout's {n} must be a torch tensor like q, got {type(x).__name__}")
        if x is not None and x.device != q.device:
            raise ValueError(f"the layout's {n} is on {x.device} but q is on {q.device}")


def _unit_d(x):
    return x if x.shape[-1] <= 1 or x.stride(-1) == 1 else x.contiguous()


def _attention(q, k, v, num, idx, fnum, fidx, block, causal, scale, check, cu=None):
    q, k, v = _unit_d(q), _unit_d(k), _unit_d(v)
    o = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)
    _launch(q, k, v, o, lse, num, idx, fnum, fidx, block, causal, scale, check, cu)
    return o, lse


@torch.library.custom_op("sparsek::attention", mutates_args=())
def _attention_op(q: Tensor, k: Tensor, v: Tensor, kv_num_blocks: Tensor, kv_indices: Tensor,
                  full_kv_num_blocks: Optional[Tensor], full_kv_indices: Optional[Tensor], block: int,
                  causal: bool, scale: float, check: bool,
                  cu_seqlens: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
    return _attention(q, k, v, kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices, block,
                      causal, scale, check, cu_seqlens)


@_attention_op.register_fake
def _(q, k, v, kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices, block, causal, scale, check,
      cu_seqlens=None):
    return q.new_empty(q.shape), q.new_empty(q.shape[:3], dtype=torch.float32)


def _backward_impl(q, k, v, o, lse, dout, num, idx, fnum, fidx, block, causal, scale, cu=None):
    q, k, v, o, dout = (_unit_d(x) for x in (q, k, v, o, dout))
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    # The problem (shapes, strides, dtypes) is made once; later calls pass only data pointers. The
    # gradients are new contiguous tensors, so q's, k's and v's signatures pin theirs. The layout was
    # checked by the forward.
    key = (_sig(q), _sig(k), _sig(v), _sig(o), _sig(lse), _sig(dout), _sig(num), _sig(idx), _sig(fnum), _sig(fidx),
           block, causal, scale, _sig(cu))
    stream = _stream(q)
    # The problem's plan has a GPU workspace (dQ's accumulator, the transposed layout): one per stream.
    key, e = _entry(_backward_problems, key, stream, _capturing(q), "the attention backward")
    if e is None:
        p = _ext.attention_backward_problem(q.detach(), k.detach(), v.detach(), o.detach(), lse.detach(),
                                            dout.detach(), dq, dk, dv, num, idx, fnum, fidx, block, causal, scale,
                                            cu_seqlens=cu)
        e = _remember(_backward_problems, key, (p, q.is_cuda, stream))
    e[0].run(q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(), lse.data_ptr(), dout.data_ptr(), dq.data_ptr(),
             dk.data_ptr(), dv.data_ptr(), num.data_ptr(), idx.data_ptr(), _ptr(fnum), _ptr(fidx), stream, _ptr(cu))
    return dq, dk, dv


@torch.library.custom_op("sparsek::attention_backward", mutates_args=())
def _attention_backward_op(q: Tensor, k: Tensor, v: Tensor, o: Tensor, lse: Tensor, dout: Tensor,
                           kv_num_blocks: Tensor, kv_indices: Tensor, full_kv_num_blocks: Optional[Tensor],
                           full_kv_indices: Optional[Tensor], block: int, causal: bool, scale: float,
                           cu_seqlens: Optional[Tensor] = None) -> tuple[Tensor, Tensor, Tensor]:
    return _backward_impl(q, k, v, o, lse, dout, kv_num_blocks, kv_indices, full_kv_num_blocks,
                          full_kv_indices, block, causal, scale, cu_seqlens)


@_attention_backward_op.register_fake
def _(q, k, v, o, lse, dout, kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices, block, causal,
      scale, cu_seqlens=None):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _attention_setup(ctx, inputs, output):
    q, k, v, num, idx, fnum, fidx, block, causal, scale, check, cu = inputs
    o, lse = output
    ctx.mark_non_differentiable(lse)
    # LSE's gradient is never used: not materialized, autograd passes None instead of a zero tensor
    # (a fill kernel and its host time on every backward).
    ctx.set_materialize_grads(False)
    ctx.save_for_backward(q, k, v, o, lse, num, idx, fnum, fidx, cu)
    ctx.block, ctx.causal, ctx.scale = block, causal, scale


def _attention_backward(ctx, do, dlse):
    # dlse: LSE is marked non-differentiable, its gradient is never used.
    if do is None:  # o did not reach the loss (grads are not materialized)
        return (None,) * 12
    q, k, v, o, lse, num, idx, fnum, fidx, cu = ctx.saved_tensors
    do = do.to(q.dtype)
    # Eager: straight to the launch (the custom-op dispatch costs ~0.1 ms of host time per call);
    # under torch.compile (and for tensor subclasses) through the op, which it can trace.
    impl = _backward_impl if _direct(q, k, v, o, lse, do) else torch.ops.sparsek.attention_backward
    dq, dk, dv = impl(q, k, v, o, lse, do, num, idx, fnum, fidx, ctx.block, ctx.causal, ctx.scale, cu)
    return (dq, dk, dv) + (None,) * 9


torch.library.register_autograd("sparsek::attention", _attention_backward, setup_context=_attention_setup)


class _AttentionFunction(torch.autograd.Function):
    """Eager calls that record autograd: the op's forward, setup and backward above without the
    custom-op dispatch, whose layers cost ~0.1 ms of host time per call before the first kernel.
    In a training step the GPU waits for that time between the forward and the backward."""

    @staticmethod
    def forward(ctx, q, k, v, num, idx, fnum, fidx, block, causal, scale, check, cu):
        out = _attention(q, k, v, num, idx, fnum, fidx, block, causal, scale, check, cu)
        _attention_setup(ctx, (q, k, v, num, idx, fnum, fidx, block, causal, scale, check, cu), out)
        return out

    @staticmethod
    @once_differentiable  # the backward records no graph (as the op's): a second derivative raises
    def backward(ctx, do, dlse):
        return _attention_backward(ctx, do, dlse)


def attention(q, k, v, layout: BlockLayout, causal, scale, check, cu_seqlens=None):
    num, idx, fnum, fidx = layout.arrays()
    _check_inputs(q, k, v, ((num, "kv_num_blocks"), (idx, "kv_indices"), (fnum, "full_kv_num_blocks"),
                            (fidx, "full_kv_indices")))
    cu = cu_seqlens
    if _direct(q, k, v):
        return _attention(q, k, v, num, idx, fnum, fidx, layout.block, causal, scale, check, cu)
    if _eager(q, k, v):
        return _AttentionFunction.apply(q, k, v, num, idx, fnum, fidx, layout.block, causal, scale, check, cu)
    return torch.ops.sparsek.attention(q, k, v, num, idx, fnum, fidx, layout.block, causal, scale, check, cu)


# ---------------------------------------------------------------- the gate

def pool_blocks(q, k, block):
    """The library's pooling in torch (float32, float64 for float64 input): pooled_q [B, Hkv, Mq, D], the mean of each query
    block's valid rows over the query heads of the key/value head's group; pooled_k [B, Hkv, Nk, D],
    the mean of each key block's valid rows."""
    def pool(x, groups):
        B, H, S, D = x.shape
        m = -(-S // block)
        x = torch.nn.functional.pad(x.to(torch.promote_types(x.dtype, torch.float32)), (0, 0, 0, m * block - S))
        x = x.reshape(B, H // groups, groups, m, block, D).sum((2, 4))
        rows = (S - torch.arange(m, device=x.device) * block).clamp(max=block)
        return x / (rows * groups).to(x.dtype)[:, None]
    return pool(q, q.shape[1] // k.shape[1]), pool(k, 1)


def _gate_impl(q, k, topk, block, causal, sink, local, scale, cnum, cidx, cfnum, cfidx, given, return_scores,
               cu_seqlens=None):
    B, Hq, Sq, D = q.shape
    Hkv, Skv = k.shape[1], k.shape[2]
    Mq, Nk = -(-Sq // block), -(-Skv // block)
    kmax = min(Nk, topk + sink + local)
    dev = q.device
    num = torch.empty((B, Hkv, Mq), dtype=torch.int32, device=dev)
    idx = torch.empty((B, Hkv, Mq, kmax), dtype=torch.int32, device=dev)
    scores = torch.empty((B, Hkv, Mq, Nk), dtype=torch.float32, device=dev) if return_scores else None
    args = (q, k, num, idx, topk, block, causal, sink, local, scale, cnum, cidx, cfnum, cfidx, given, scores)
    ws = None
    if q.is_cuda:
        key = (_sig(q), _sig(k), topk, block, causal, sink, local, _sig(cnum), _sig(cidx), _sig(cfnum),
               given is not None, return_scores, _sig(cu_seqlens))
        nbytes = _gate_ws.get(key)
        if nbytes is None:
            nbytes = _gate_ws[key] = _ext.gate_workspace_bytes(*args, cu_seqlens)
        ws = torch.empty(max(nbytes, 1), dtype=torch.uint8, device=dev)
    _ext.gate(*args, ws, _stream(q), cu_seqlens)
    _mark_checked(num, idx, None, None)
    return num, idx, scores if scores is not None else num.new_empty(0, dtype=torch.float32)


@torch.library.custom_op("sparsek::gate", mutates_args=())
def _gate_op(q: Tensor, k: Tensor, topk: int, block: int, causal: bool, sink: int, local: int, scale: float,
             cand_num: Optional[Tensor], cand_idx: Optional[Tensor], cand_full_num: Optional[Tensor],
             cand_full_idx: Optional[Tensor], given_scores: Optional[Tensor],
             return_scores: bool, cu_seqlens: Optional[Tensor] = None) -> tuple[Tensor, Tensor, Tensor]:
    return _gate_impl(q, k, topk, block, causal, sink, local, scale, cand_num, cand_idx, cand_full_num,
                      cand_full_idx, given_scores, return_scores, cu_seqlens)


@_gate_op.register_fake
def _(q, k, topk, block, causal, sink, local, scale, cand_num, cand_idx, cand_full_num, cand_full_idx,
      given_scores, return_scores, cu_seqlens=None):
    B, Sq = q.shape[0], q.shape[2]
    Hkv, Skv = k.shape[1], k.shape[2]
    Mq, Nk = (Sq + block - 1) // block, (Skv + block - 1) // block
    kmax = min(Nk, topk + sink + local)
    num = q.new_empty((B, Hkv, Mq), dtype=torch.int32)
    idx = q.new_empty((B, Hkv, Mq, kmax), dtype=torch.int32)
    scores = q.new_empty((B, Hkv, Mq, Nk) if return_scores else (0,), dtype=torch.float32)
    return num, idx, scores


def gate(q, k, topk, block, causal, sink, local, scorer, cand, return_scores, scale, cu_seqlens=None):
    for x, n in ((q, "q"), (k, "k")):
        if not isinstance(x, Tensor):
            raise TypeError(f"{n} must be a torch tensor like q, got {type(x).__name__}")
        if x.dim() != 4:
            raise ValueError(f"{n} must be a 4-D tensor [B, H, S, D], got shape {tuple(x.shape)}")
    if cand is not None and cand.block != block:
        raise ValueError(f"layout block {cand.block} differs from block={block}")
    c = (None,) * 4 if cand is None else cand.arrays()
    given = None
    if scorer is not None:
        if not callable(scorer):
            raise TypeError(f"scorer must be a callable (pooled_q, pooled_k) -> scores, got "
                            f"{type(scorer).__name__}")
        if q.dim() == 4 and k.dim() == 4 and k.shape[1] > 0 and q.shape[1] % k.shape[1]:
            raise ValueError(f"q has {q.shape[1]} heads, not a multiple of k's {k.shape[1]}")
        pq, pk = pool_blocks(q.detach(), k.detach(), block)
        given = scorer(pq, pk)
        want = (pq.shape[0], pq.shape[1], pq.shape[2], pk.shape[2])
        if not isinstance(given, Tensor) or tuple(given.shape) != want:
            got = tuple(given.shape) if isinstance(given, Tensor) else type(given).__name__
            raise ValueError(f"scorer returned {got}, expected scores of shape [B, Hkv, Mq, Nk] = {want}")
        given = given.detach().float().contiguous()
    # No gradient through the selection: the op sees detached inputs.
    args = (q.detach(), k.detach(), topk, block, causal, sink, local, scale, *c, given, return_scores, cu_seqlens)
    if torch.compiler.is_compiling():
        num, idx, scores = torch.ops.sparsek.gate(*args)
    else:
        num, idx, scores = _gate_impl(*args)
    layout = BlockLayout(num, idx, block=block)
    return (layout, scores) if return_scores else layout
