"""torch integration of decode attention and page selection: custom ops with fake kernels, and the
eager launch-only path.

    torch.ops.sparsek.decode_attention(q, k_cache, v_cache, page_table, seq_lens, cu_seqlens_q,
                                       sel_indices, sel_counts, causal_new, scale, check_indices)
        -> (o [T, Hq, D] like q, lse float32 [T, Hq])
    torch.ops.sparsek.select_pages(q, summaries, page_table, seq_lens, cu_seqlens_q, page_size, topk,
                                   sink, local, kmax, check_indices)
        -> (sel_indices int32 [B, Hkv, kmax], sel_counts int32 [B, Hkv])
    torch.ops.sparsek.update_page_summaries(summaries!, k_cache, page_table, seq_lens, cu_seqlens_q,
                                            all_pages, check_indices) -> ()

decode_attention and select_pages are functional (fresh outputs); update_page_summaries writes
`summaries` in place (declared: torch.compile functionalizes it). Under torch.compile they are
opaque nodes whose output shapes come from the fake kernels, which read no tensor data: the one
host read of the calls (update_page_summaries' cu_seqlens_q[-1] with check_indices, and the index
checks in the library) happens in the real implementations only.

Each real implementation runs on the current CUDA stream of the tensors' device (CPU tensors: the
CPU backend). With check_indices it is one call of the library's one-shot entry point (the same as
for NumPy and CuPy arrays: validation, the index contents, a plan, the run). Without, the serving
loop's case, a plan (decode attention; one per stream when it has a workspace, as attention's) or
a checked problem (the page operations) is made once per signature (shapes, strides, dtypes,
device) and later calls pass only data pointers: no array conversions, no allocation, no host read,
so the calls can be captured in a CUDA graph after a first call. Eager calls on plain tensors outside
torch.compile, with nothing requiring grad, skip the custom-op dispatch and call the
implementations directly (as attention's do).

No gradients: decode is inference, and gradients are not defined. The ops have no autograd formula
(a backward through one raises, naming the op: inputs that require grad go through the op even in
eager mode). Inputs that require grad are read through detached views.

Imported on the first decode call with torch tensors (sparsek itself never imports torch).
"""
from collections import OrderedDict
from typing import Optional

import torch
from torch import Tensor

from . import _sparsek as _ext
from ._decode import _step_tokens
from ._torch_ops import _capturing, _direct, _entry, _ptr, _remember, _sig, _stream

# Made once per signature for the calls without check_indices: decode plans (entries (plan, has
# workspace, stream), _entry's per-stream rule) and page-operation problems (nothing allocated).
_decode_plans: "OrderedDict[tuple, tuple]" = OrderedDict()
_page_problems: "OrderedDict[tuple, object]" = OrderedDict()


def _page_problem(key, make):
    p = _page_problems.get(key)
    if p is None:
        p = _remember(_page_problems, key, make())
    return p


def _read(t):
    """t for the library to read: torch refuses DLPack export of tensors that require grad."""
    return t.detach() if t is not None and t.requires_grad else t


# ---------------------------------------------------------------- decode attention

def _decode_impl(q, k_cache, v_cache, page_table, seq_lens, cu_seqlens_q, sel_indices, sel_counts, causal_new,
                 scale, check_indices):
    o = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device)
    stream = _stream(q)
    if check_indices:
        _ext.decode_attention(_read(q), _read(k_cache), _read(v_cache), o, lse, page_table, seq_lens, cu_seqlens_q,
                              sel_indices, sel_counts, causal_new, scale, stream, True)
        return o, lse
    # o and lse are new tensors like q: q's signature pins theirs.
    key = (_sig(q), _sig(k_cache), _sig(v_cache), _sig(page_table), _sig(seq_lens), _sig(cu_seqlens_q),
           _sig(sel_indices), _sig(sel_counts), causal_new, scale)
    key, e = _entry(_decode_plans, key, stream, _capturing(q), "decode attention")
    if e is None:
        p = _ext.plan_decode(_read(q), _read(k_cache), _read(v_cache), o, lse, page_table, seq_lens, cu_seqlens_q,
                             sel_indices, sel_counts, causal_new, scale)
        e = _remember(_decode_plans, key, (p, p.workspace_bytes > 0, stream))
    e[0].run_pointers(q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), o.data_ptr(), lse.data_ptr(),
                      page_table.data_ptr(), seq_lens.data_ptr(), cu_seqlens_q.data_ptr(), _ptr(sel_indices),
                      _ptr(sel_counts), stream)
    return o, lse


# None of the three ops registers an autograd formula: gradients are not defined (decode is
# inference). Calls on tensors that do not require grad (serving: no_grad or inference_mode, or
# plain tensors) run as any op; a backward through one raises.
@torch.library.custom_op("sparsek::decode_attention", mutates_args=())
def _decode_op(q: Tensor, k_cache: Tensor, v_cache: Tensor, page_table: Tensor, seq_lens: Tensor,
               cu_seqlens_q: Tensor, sel_indices: Optional[Tensor], sel_counts: Optional[Tensor], causal_new: bool,
               scale: float, check_indices: bool) -> tuple[Tensor, Tensor]:
    return _decode_impl(q, k_cache, v_cache, page_table, seq_lens, cu_seqlens_q, sel_indices, sel_counts,
                        causal_new, scale, check_indices)


@_decode_op.register_fake
def _(q, k_cache, v_cache, page_table, seq_lens, cu_seqlens_q, sel_indices, sel_counts, causal_new, scale,
      check_indices):
    return q.new_empty(q.shape), q.new_empty(q.shape[:2], dtype=torch.float32)


def decode_attention(q, k_cache, v_cache, page_table, seq_lens, cu_seqlens_q, sel_indices, sel_counts, causal_new,
                     scale, check_indices):
    args = (q, k_cache, v_cache, page_table, seq_lens, cu_seqlens_q, sel_indices, sel_counts, causal_new, scale,
            check_indices)
    if _direct(q, k_cache, v_cache, page_table, seq_lens, cu_seqlens_q, sel_indices, sel_counts):
        return _decode_impl(*args)
    return torch.ops.sparsek.decode_attention(*args)


# ---------------------------------------------------------------- page selection

def _select_impl(q, summaries, page_table, seq_lens, cu_seqlens_q, page_size, topk, sink, local, kmax,
                 check_indices):
    batch, hkv = page_table.shape[0], summaries.shape[1]
    sel_indices = torch.empty((batch, hkv, kmax), dtype=torch.int32, device=q.device)
    sel_counts = torch.empty((batch, hkv), dtype=torch.int32, device=q.device)
    if check_indices:
        _ext.select_pages(_read(q), _read(summaries), page_table, seq_lens, cu_seqlens_q, sel_indices, sel_counts,
                          page_size, topk, sink, local, _stream(q), True)
        return sel_indices, sel_counts
    key = ("select", _sig(q), _sig(summaries), _sig(page_table), _sig(seq_lens), _sig(cu_seqlens_q), page_size,
           topk, sink, local, kmax)
    p = _page_problem(key, lambda: _ext.select_pages_problem(_read(q), _read(summaries), page_table, seq_lens,
                                                             cu_seqlens_q, sel_indices, sel_counts, page_size, topk,
                                                             sink, local))
    p.run_select(q.data_ptr(), summaries.data_ptr(), page_table.data_ptr(), seq_lens.data_ptr(),
                 cu_seqlens_q.data_ptr(), sel_indices.data_ptr(), sel_counts.data_ptr(), _stream(q))
    return sel_indices, sel_counts


@torch.library.custom_op("sparsek::select_pages", mutates_args=())
def _select_op(q: Tensor, summaries: Tensor, page_table: Tensor, seq_lens: Tensor, cu_seqlens_q: Tensor,
               page_size: int, topk: int, sink: int, local: int, kmax: int,
               check_indices: bool) -> tuple[Tensor, Tensor]:
    return _select_impl(q, summaries, page_table, seq_lens, cu_seqlens_q, page_size, topk, sink, local, kmax,
                        check_indices)


@_select_op.register_fake
def _(q, summaries, page_table, seq_lens, cu_seqlens_q, page_size, topk, sink, local, kmax, check_indices):
    batch, hkv = page_table.shape[0], summaries.shape[1]
    return (q.new_empty((batch, hkv, kmax), dtype=torch.int32),
            q.new_empty((batch, hkv), dtype=torch.int32))


def select_pages(q, summaries, page_table, seq_lens, cu_seqlens_q, page_size, topk, sink, local, kmax,
                 check_indices):
    args = (q, summaries, page_table, seq_lens, cu_seqlens_q, page_size, topk, sink, local, kmax, check_indices)
    if _direct(q, summaries, page_table, seq_lens, cu_seqlens_q):
        return _select_impl(*args)
    return torch.ops.sparsek.select_pages(*args)


def _update_impl(summaries, k_cache, page_table, seq_lens, cu_seqlens_q, all_pages, check_indices):
    # The step's token count: with check_indices cu_seqlens_q[-1], read on the host (here, never
    # in a traced graph); else an upper bound.
    tokens = _step_tokens(cu_seqlens_q, check_indices)
    if check_indices:
        _ext.update_page_summaries(summaries, _read(k_cache), page_table, seq_lens, cu_seqlens_q, tokens, all_pages,
                                   _stream(k_cache), True)
        return
    # (tokens is then the bound the batch gives: cu_seqlens_q's signature pins it.)
    key = ("update", _sig(summaries), _sig(k_cache), _sig(page_table), _sig(seq_lens), _sig(cu_seqlens_q), all_pages)
    p = _page_problem(key, lambda: _ext.update_page_summaries_problem(summaries, _read(k_cache), page_table, seq_lens,
                                                                      cu_seqlens_q, tokens, all_pages))
    p.run_update(summaries.data_ptr(), k_cache.data_ptr(), page_table.data_ptr(), seq_lens.data_ptr(),
                 cu_seqlens_q.data_ptr(), _stream(k_cache))


@torch.library.custom_op("sparsek::update_page_summaries", mutates_args=("summaries",))
def _update_op(summaries: Tensor, k_cache: Tensor, page_table: Tensor, seq_lens: Tensor, cu_seqlens_q: Tensor,
               all_pages: bool, check_indices: bool) -> None:
    _update_impl(summaries, k_cache, page_table, seq_lens, cu_seqlens_q, all_pages, check_indices)


@_update_op.register_fake
def _(summaries, k_cache, page_table, seq_lens, cu_seqlens_q, all_pages, check_indices):
    return None


def update_page_summaries(summaries, k_cache, page_table, seq_lens, cu_seqlens_q, all_pages, check_indices):
    args = (summaries, k_cache, page_table, seq_lens, cu_seqlens_q, all_pages, check_indices)
    if _direct(summaries, k_cache, page_table, seq_lens, cu_seqlens_q):
        _update_impl(*args)
    else:
        torch.ops.sparsek.update_page_summaries(*args)
    return summaries
