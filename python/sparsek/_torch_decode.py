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

Each real implementation is one call of the library's one-shot entry point (the same as for NumPy
and CuPy arrays: validation, the index contents with check_indices, the run) on the current CUDA
stream of the tensors' device (CPU tensors: the CPU backend). Eager calls on plain tensors outside
torch.compile, with nothing requiring grad, skip the custom-op dispatch and call the
implementations directly (as attention's do).

No gradients: decode is inference, and gradients are not defined. The ops have no autograd formula
(a backward through one raises, naming the op: inputs that require grad go through the op even in
eager mode). Inputs that require grad are read through detached views.

Imported on the first decode call with torch tensors (sparsek itself never imports torch).
"""
from typing import Optional

import torch
from torch import Tensor

from . import _sparsek as _ext
from ._decode import _step_tokens
from ._torch_ops import _direct, _stream


def _read(t):
    """t for the library to read: torch refuses DLPack export of tensors that require grad."""
    return t.detach() if t is not None and t.requires_grad else t


# ---------------------------------------------------------------- decode attention

def _decode_impl(q, k_cache, v_cache, page_table, seq_lens, cu_seqlens_q, sel_indices, sel_counts, causal_new,
                 scale, check_indices):
    o = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty(q.shape[:2], dtype=torch.float32, device=q.device)
    _ext.decode_attention(_read(q), _read(k_cache), _read(v_cache), o, lse, page_table, seq_lens, cu_seqlens_q,
                          sel_indices, sel_counts, causal_new, scale, _stream(q), check_indices)
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
    _ext.select_pages(_read(q), _read(summaries), page_table, seq_lens, cu_seqlens_q, sel_indices, sel_counts,
                      page_size, topk, sink, local, _stream(q), check_indices)
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
    _ext.update_page_summaries(summaries, _read(k_cache), page_table, seq_lens, cu_seqlens_q, tokens, all_pages,
                               _stream(k_cache), check_indices)


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
