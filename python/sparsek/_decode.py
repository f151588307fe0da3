"""Decode attention over a paged KV cache: ``decode_attention``; and the choice of the pages it
reads: ``page_summaries``, ``update_page_summaries``, ``select_pages``.

NumPy arrays run the library's CPU backend; torch and CuPy CUDA tensors run on the GPU on the
framework's current stream (torch CPU tensors on the CPU). The index arrays' contents are checked on
every one-shot call (``check_indices=False`` skips that); ``plan_decode`` makes a plan whose
``run`` allocates nothing and may be captured in a CUDA graph. torch tensors go through
``_torch_decode`` (the ``torch.ops.sparsek`` custom ops with fake kernels that torch.compile
traces; eager calls skip their dispatch); the checks here read no tensor data, so they trace too.
"""
from . import _arrays as A
from . import _sparsek as _ext
from ._attention import _scale


def _torch_decode():
    from . import _torch_decode
    return _torch_decode


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

    torch tensors run through ``torch.ops.sparsek.decode_attention`` under torch.compile (a fake
    kernel gives the output shapes; eager calls skip the op's dispatch); no gradients (inference).
    ``select_pages`` and ``update_page_summaries`` are ops the same way.
    """
    sel_idx, sel_cnt = _arrays(q, k_cache, v_cache, page_table, seq_lens, cu_seqlens_q, selection)
    causal_new = A.flag(causal_new, "causal_new")
    check_indices = A.flag(check_indices, "check_indices")
    s = _scale(scale)
    if A.is_torch(q):
        return _torch_decode().decode_attention(q, k_cache, v_cache, page_table, seq_lens, cu_seqlens_q, sel_idx,
                                                sel_cnt, causal_new, s, check_indices)
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


# ---------------------------------------------------------------- page selection (the decode gate)

_MAX_NEW = 16  # new tokens per request and step


def _required(pairs):
    for name, x in pairs:
        if x is None:
            raise TypeError(f"{name} is required, got None")
    return A.same_framework(pairs)


def _ndim(x, name, n, what):
    if x.ndim != n:
        raise ValueError(f"{name} must be a {n}-D array {what}, got shape {A.shape_of(x)}")


def page_summaries(k_cache):
    """Zeroed page summaries for ``k_cache`` [num_pages, page_size, Hkv, D]: an array
    [num_pages, Hkv, 2, D] of k_cache's dtype, framework and device, for
    ``update_page_summaries`` to fill."""
    _required([("k_cache", k_cache)])
    _ndim(k_cache, "k_cache", 4, "[num_pages, page_size, Hkv, D]")
    A.check_value_dtype(k_cache, "k_cache")
    pages, _, hkv, d = A.shape_of(k_cache)
    s = A.empty(k_cache, (pages, hkv, 2, d), k_cache.dtype)
    s[...] = 0
    return s


def update_page_summaries(summaries, k_cache, page_table, seq_lens, cu_seqlens_q, all_pages=False, *,
                          check_indices=True):
    """Recomputes, in place, the summaries of the pages that hold each request's new tokens; returns
    ``summaries``.

    ``summaries`` [num_pages, Hkv, 2, D] (k_cache's dtype, contiguous; ``page_summaries(k_cache)``
    makes one): for physical page p and key/value head h, ``[p, h, 0]`` is the per-channel minimum
    and ``[p, h, 1]`` the maximum of the keys in the page's stored slots (those below the owning
    request's ``seq_lens``), exact cache values. k_cache [num_pages, page_size, Hkv, D],
    ``page_table``, ``seq_lens``, ``cu_seqlens_q`` as for ``decode_attention``: request b's new
    tokens are its positions ``seq_lens[b] - n_b .. seq_lens[b] - 1`` with
    ``n_b = cu_seqlens_q[b+1] - cu_seqlens_q[b]``. Call it once the step's keys are in the cache:
    only the pages holding those positions are recomputed (from all their stored slots), or every
    page below ``seq_lens[b]`` with ``all_pages=True`` (after a prefill; ``cu_seqlens_q`` must still
    be valid, e.g. one token per request: ``arange(B + 1)``). Requests sharing a physical page must
    agree on its stored slots.

    With ``check_indices`` (the default) the index arrays' contents are checked (for CUDA arrays
    that reads them on the host, which waits for the stream); ``check_indices=False`` neither checks
    nor synchronizes (malformed contents give wrong summaries, never a write outside them), for CUDA
    graphs.
    """
    _required([("summaries", summaries), ("k_cache", k_cache), ("page_table", page_table),
               ("seq_lens", seq_lens), ("cu_seqlens_q", cu_seqlens_q)])
    all_pages = A.flag(all_pages, "all_pages")
    check_indices = A.flag(check_indices, "check_indices")
    _ndim(k_cache, "k_cache", 4, "[num_pages, page_size, Hkv, D]")
    A.check_value_dtype(k_cache, "k_cache")
    if A.dtype_name(summaries) != A.dtype_name(k_cache):
        raise ValueError(f"summaries dtype {A.dtype_name(summaries)} differs from k_cache dtype "
                         f"{A.dtype_name(k_cache)}")
    _ndim(cu_seqlens_q, "cu_seqlens_q", 1, "[batch + 1]")
    if A.dtype_name(cu_seqlens_q) != "int32":
        raise ValueError(f"cu_seqlens_q dtype {A.dtype_name(cu_seqlens_q)} must be int32")
    A.check_writable(summaries, "summaries")
    if A.is_torch(summaries):
        # _step_tokens reads cu_seqlens_q on the host: in the op's implementation, not while tracing.
        return _torch_decode().update_page_summaries(summaries, k_cache, page_table, seq_lens, cu_seqlens_q,
                                                     all_pages, check_indices)
    tokens = _step_tokens(cu_seqlens_q, check_indices)
    _ext.update_page_summaries(summaries, k_cache, page_table, seq_lens, cu_seqlens_q, tokens, all_pages,
                               A.stream_of(k_cache), check_indices)
    return summaries


def _step_tokens(cu_seqlens_q, check_indices):
    """The step's token count T (the rows of its q), which the library checks cu_seqlens_q against:
    with check_indices cu_seqlens_q[-1] read on the host (a device array waits for its stream),
    checked against the batch; else an upper bound (the offsets are only clamped to it)."""
    batch = A.shape_of(cu_seqlens_q)[0] - 1
    if check_indices and batch >= 1:
        tokens = int(cu_seqlens_q[-1])
        if not batch <= tokens <= _MAX_NEW * batch:
            raise ValueError(f"cu_seqlens_q[{batch}] = {tokens}: a batch of {batch} requests has 1 to "
                             f"{_MAX_NEW} new tokens each (between {batch} and {_MAX_NEW * batch})")
        return tokens
    return _MAX_NEW * max(batch, 1)


def select_pages(q, summaries, page_table, seq_lens, cu_seqlens_q, topk, sink=1, local=1, *, page_size, kmax=None,
                 check_indices=True):
    """The pages each key/value head attends in this decode step: ``(sel_indices, sel_counts)``,
    int32 [B, Hkv, kmax] and [B, Hkv], the ``selection`` ``decode_attention`` takes.

    q [T, Hq, D]: the step's new tokens (rows ``cu_seqlens_q[b] : cu_seqlens_q[b+1]`` are request
    b's); ``summaries`` [num_pages, Hkv, 2, D] of q's dtype, kept by ``update_page_summaries``;
    ``page_table``, ``seq_lens``, ``cu_seqlens_q`` as for ``decode_attention``; ``page_size``: the
    cache's tokens per page (the summaries give the rest of its shape). For request b and key/value
    head hk every page p < ceil(seq_lens[b] / page_size) gets the bound of Quest (Tang et al. 2024)
    on the largest q . k over its keys that a query of the group reaches (query heads hk*G ..
    hk*G+G-1, G = Hq / Hkv, of the request's new tokens)::

        score = max over those q of  sum over d of  q_d * (max_d if q_d >= 0 else min_d)

    (float32 sums: fused multiply-adds in ascending d on the CPU, tensor-core products on the GPU,
    so the two can choose differently between pages whose scores are within rounding of each other;
    each is deterministic). Kept: pages ``0 .. sink-1``, the ``local`` newest pages (with ``local >= 1`` the page
    holding the newest tokens) and the ``topk`` best-scoring others (equal scores: the lower page;
    NaN and -inf scores are never picked). Row ``sel_indices[b, hk, :sel_counts[b, hk]]`` lists them
    in ascending order; entries past the count are 0. ``kmax`` (default ``min(max_pages, topk +
    sink + local)``, max_pages = page_table.shape[1]) must lie in that value .. max_pages.
    ``check_indices`` as for ``update_page_summaries``.
    """
    _required([("q", q), ("summaries", summaries), ("page_table", page_table), ("seq_lens", seq_lens),
               ("cu_seqlens_q", cu_seqlens_q)])
    _ndim(q, "q", 3, "[T, Hq, D]")
    A.check_value_dtype(q, "q")
    _ndim(summaries, "summaries", 4, "[num_pages, Hkv, 2, D]")
    if A.dtype_name(summaries) != A.dtype_name(q):
        raise ValueError(f"summaries dtype {A.dtype_name(summaries)} differs from q dtype {A.dtype_name(q)}")
    _ndim(page_table, "page_table", 2, "[batch, max_pages]")
    topk = A.dim(topk, "topk", A.INT32_MAX)
    sink = A.dim(sink, "sink", A.INT32_MAX)
    local = A.dim(local, "local", A.INT32_MAX)
    page_size = A.dim(page_size, "page_size")
    if page_size < 16 or page_size > 128 or page_size % 16:
        raise ValueError(f"page_size = {page_size} is not supported (a multiple of 16 in [16, 128])")
    check_indices = A.flag(check_indices, "check_indices")
    batch, max_pages = A.shape_of(page_table)
    least = min(max_pages, topk + sink + local)
    kmax = least if kmax is None else A.dim(kmax, "kmax")
    if not least <= kmax <= max_pages:
        raise ValueError(f"kmax = {kmax} is out of range [min(max_pages, topk + sink + local) = {least}, "
                         f"max_pages = {max_pages}]")
    if A.is_torch(q):
        return _torch_decode().select_pages(q, summaries, page_table, seq_lens, cu_seqlens_q, page_size, topk,
                                            sink, local, kmax, check_indices)
    hkv = A.shape_of(summaries)[1]
    sel_indices = A.empty(q, (batch, hkv, kmax), _i32(q))
    sel_counts = A.empty(q, (batch, hkv), _i32(q))
    _ext.select_pages(q, summaries, page_table, seq_lens, cu_seqlens_q, sel_indices, sel_counts, page_size, topk,
                      sink, local, A.stream_of(q), check_indices)
    return sel_indices, sel_counts


# The dtypes of the NumPy and CuPy paths' outputs (torch tensors go through _torch_decode).
def _i32(like):
    import numpy as np
    return np.int32


def _f32(like):
    import numpy as np
    return np.float32
