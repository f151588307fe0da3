"""Decode attention over a paged KV cache: ``decode_attention``.

NumPy arrays run the library's CPU backend; torch and CuPy CUDA tensors run on the GPU on the
framework's current stream (torch CPU tensors on the CPU). The index arrays' contents are checked on
every one-shot call (``check_indices=False`` skips that); ``plan_decode`` makes a plan whose
``run`` allocates nothing and may be captured in a CUDA graph.
"""
from . import _arrays as A
from . import _sparsek as _ext
from ._attention import _scale


def _arrays(q, k_cache, v_cache, page_table, seq_lens, cu_seqlens_q, selection):
    for name, x in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("page_table", page_table),
                    ("seq_lens", seq_lens), ("cu_seqlens_q", cu_seqlens_q)):
        if x is None:
            raise TypeError(f"{name} is required, got None")
    sel_idx = sel_cnt = None
    if selection is not None:
        if not isinstance(selection, (tuple, list)) or len(selection) != 2:
            raise TypeError("selection must be None or a pair (sel_indices [B, Hkv, kmax], sel_counts [B, Hkv])")
        sel_idx, sel_cnt = selection
    A.same_framework([("q", q), ("k_cache", k_cache), ("v_cache", v_cache), ("page_table", page_table),
                      ("seq_lens", seq_lens), ("cu_seqlens_q", cu_seqlens_q), ("sel_indices", sel_idx),
                      ("sel_counts", sel_cnt)])
    if q.ndim != 3:
        raise ValueError(f"q must be a 3-D array [T, Hq, D], got shape {A.shape_of(q)}")
    A.check_value_dtype(q, "q")
    return sel_idx, sel_cnt


def decode_attention(q, k_cache, v_cache, page_table, seq_lens, cu_seqlens_q, selection=None, causal_new=True,
                     scale=None, *, check_indices=True):
    """Attention of a batch of requests' new tokens over their paged KV cache: ``(O, LSE)``.

    q [T, Hq, D]: request b's new tokens are rows ``cu_seqlens_q[b] : cu_seqlens_q[b+1]`` (1 to 16
    per request), the last of its ``seq_lens[b]`` tokens. k_cache, v_cache [num_pages, page_size,
    Hkv, D] (page_size a multiple of 16 in [16, 128]); ``page_table`` int32 [B, max_pages] maps a
    request's logical pages to physical ones; ``seq_lens`` int32 [B]; ``cu_seqlens_q`` int32 [B+1].
    ``selection``: None, or ``(sel_indices int32 [B, Hkv, kmax], sel_counts int32 [B, Hkv])``, the
    sorted unique logical pages each key/value head sees. With ``causal_new`` new token j of n sees
    the positions up to its own (``< seq_len - n + j + 1``). Hq a multiple of Hkv; D 64 or 128;
    float16/bfloat16 (float32 too on the CPU). Returns O [T, Hq, D] like q and LSE float32 [T, Hq]
    (natural log; -inf for a row that sees no key, whose O is 0).
    """
    sel_idx, sel_cnt = _arrays(q, k_cache, v_cache, page_table, seq_lens, cu_seqlens_q, selection)
    causal_new = A.flag(causal_new, "causal_new")
    check_indices = A.flag(check_indices, "check_indices")
    s = _scale(scale)
    o = A.empty(q, A.shape_of(q), q.dtype)
    lse = A.empty(q, A.shape_of(q)[:2], _f32(q))
    _ext.decode_attention(q, k_cache, v_cache, o, lse, page_table, seq_lens, cu_seqlens_q, sel_idx, sel_cnt,
                          causal_new, s, A.stream_of(q), check_indices)
    return o, lse


def plan_decode(q, k_cache, v_cache, o, lse, page_table, seq_lens, cu_seqlens_q, selection=None, causal_new=True,
                scale=None, kv_splits=0):
    """A plan for these arrays' shapes (as decode_attention's, with the outputs o [T, Hq, D] and lse
    [T, Hq] or None given by the caller). ``plan.run(q, k_cache, v_cache, o, lse, page_table, seq_lens,
    cu_seqlens_q, sel_indices, sel_counts, stream)`` runs it on arrays of the same shapes without
    checking the index contents (malformed ones give wrong values, never an out-of-bounds read);
    on the GPU it allocates nothing and may be captured in a CUDA graph."""
    sel_idx, sel_cnt = _arrays(q, k_cache, v_cache, page_table, seq_lens, cu_seqlens_q, selection)
    return _ext.plan_decode(q, k_cache, v_cache, o, lse, page_table, seq_lens, cu_seqlens_q, sel_idx, sel_cnt,
                            A.flag(causal_new, "causal_new"), _scale(scale), int(A.dim(kv_splits, "kv_splits", 64)))


def _f32(like):
    if A.is_torch(like):
        import torch
        return torch.float32
    import numpy as np
    return np.float32
