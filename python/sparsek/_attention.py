"""Block-sparse attention and the top-k block gate: ``attention``, ``gate``, ``BlockLayout`` and
the conversions to and from FlexAttention's ``BlockMask``.

NumPy arrays run the library's one-shot calls (the CPU backend; the layout's contents are checked
on every call); torch tensors go through ``_torch_attention`` (custom ops with fake kernels and
autograd, cached plans).
"""
import math

import numpy as np

from . import _arrays as A
from . import _sparsek as _ext

BLOCKS = (64, 128)


def _torch_attention():
    from . import _torch_attention
    return _torch_attention


def _cdiv(a, b):
    return (a + b - 1) // b


class BlockLayout:
    """Which key/value blocks each query block attends (FlexAttention's BlockMask, without the
    transposed lists and the mask_mod).

    Query block ``i`` of batch ``b`` and query head ``h`` attends the key blocks
    ``kv_indices[b', h', i, :kv_num_blocks[b', h', i]]`` (element masks applied: causal, keys past
    the sequence) and ``full_kv_indices[b', h', i, :full_kv_num_blocks[b', h', i]]`` (attended
    whole), where ``b'`` is ``b`` or 0 (batch extent 1) and ``h'`` is ``h`` (extent Hq), the query
    head's key/value head (extent Hkv) or 0 (extent 1). Indices of a row are ascending and unique;
    entries past a row's count are ignored. Arrays are int32, ``kv_num_blocks`` [batch, heads,
    q_blocks] and ``kv_indices`` [batch, heads, q_blocks, kmax]; NumPy arrays or torch tensors.
    Blocks are ``block`` x ``block`` with block 64 or 128.
    """

    def __init__(self, kv_num_blocks, kv_indices, full_kv_num_blocks=None, full_kv_indices=None,
                 block=128):
        for x, n in ((kv_num_blocks, "kv_num_blocks"), (kv_indices, "kv_indices")):
            if x is None:  # (only the full lists are optional)
                raise TypeError(f"{n} is required, got None")
        A.same_framework([("kv_num_blocks", kv_num_blocks), ("kv_indices", kv_indices),
                          ("full_kv_num_blocks", full_kv_num_blocks), ("full_kv_indices", full_kv_indices)])
        if (full_kv_num_blocks is None) != (full_kv_indices is None):
            raise ValueError("full_kv_num_blocks and full_kv_indices must be given both or neither")
        block = A.dim(block, "block")
        if block not in BLOCKS:
            raise ValueError(f"block must be 64 or 128, got {block}")
        for num, idx, n in ((kv_num_blocks, kv_indices, "kv"), (full_kv_num_blocks, full_kv_indices, "full_kv")):
            if num is None:
                continue
            if num.ndim != 3:
                raise ValueError(f"{n}_num_blocks must be 3-D [batch, heads, q_blocks], got shape "
                                 f"{A.shape_of(num)}")
            if idx.ndim != 4 or A.shape_of(idx)[:3] != A.shape_of(num):
                raise ValueError(f"{n}_indices must be 4-D [batch, heads, q_blocks, kmax] with "
                                 f"{n}_num_blocks' {A.shape_of(num)} first, got shape {A.shape_of(idx)}")
            for x, xn in ((num, f"{n}_num_blocks"), (idx, f"{n}_indices")):
                if A.dtype_name(x) != "int32":
                    raise ValueError(f"{xn} dtype {A.dtype_name(x)} must be int32")
        if full_kv_num_blocks is not None and A.shape_of(full_kv_num_blocks) != A.shape_of(kv_num_blocks):
            raise ValueError(f"full_kv_num_blocks has shape {A.shape_of(full_kv_num_blocks)} but "
                             f"kv_num_blocks has shape {A.shape_of(kv_num_blocks)}")
        self.kv_num_blocks = kv_num_blocks
        self.kv_indices = kv_indices
        self.full_kv_num_blocks = full_kv_num_blocks
        self.full_kv_indices = full_kv_indices
        self.block = block

    @property
    def batch(self):
        return int(self.kv_num_blocks.shape[0])

    @property
    def heads(self):
        return int(self.kv_num_blocks.shape[1])

    @property
    def q_blocks(self):
        return int(self.kv_num_blocks.shape[2])

    @property
    def kmax(self):
        return int(self.kv_indices.shape[3])

    @property
    def has_full(self):
        return self.full_kv_num_blocks is not None

    def arrays(self):
        """(kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices)."""
        return self.kv_num_blocks, self.kv_indices, self.full_kv_num_blocks, self.full_kv_indices

    @classmethod
    def from_dense(cls, mask, full=None, block=128):
        """A layout from boolean block masks [batch, heads, q_blocks, kv_blocks]: ``mask`` the
        element-masked blocks, ``full`` (optional, disjoint from ``mask``) the blocks attended
        whole. NumPy arrays or torch tensors (the layout's arrays are of the same kind)."""
        def lists(m):
            if A.is_torch(m):
                t = A.torch
                m = m.to(t.int32)
                num = m.sum(-1, dtype=t.int32)
                idx = t.argsort(m, dim=-1, descending=True, stable=True).to(t.int32)
                return num.contiguous(), idx.contiguous()
            m = np.asarray(m).astype(np.int32)
            if m.ndim != 4:
                raise ValueError(f"mask must be 4-D [batch, heads, q_blocks, kv_blocks], got shape {m.shape}")
            num = m.sum(-1).astype(np.int32)
            idx = np.argsort(-m, axis=-1, kind="stable").astype(np.int32)
            return np.ascontiguousarray(num), np.ascontiguousarray(idx)
        num, idx = lists(mask)
        fnum, fidx = lists(full) if full is not None else (None, None)
        return cls(num, idx, fnum, fidx, block)

    def to_dense(self, kv_blocks):
        """(partial, full): boolean masks [batch, heads, q_blocks, kv_blocks] of the blocks listed
        (full is None without full lists), in the layout's framework."""
        def dense(num, idx):
            if A.is_torch(num):
                t = A.torch
                valid = t.arange(idx.shape[-1], device=idx.device) < num[..., None].long()
                out = t.zeros(*num.shape, kv_blocks + 1, dtype=t.bool, device=num.device)
                out.scatter_(-1, t.where(valid, idx.long().clamp(0, kv_blocks), kv_blocks), True)
                return out[..., :kv_blocks]
            num, idx = np.asarray(num), np.asarray(idx)
            valid = np.arange(idx.shape[-1]) < num[..., None]
            out = np.zeros(num.shape + (kv_blocks + 1,), dtype=bool)
            np.put_along_axis(out, np.where(valid, np.clip(idx, 0, kv_blocks), kv_blocks).astype(np.int64),
                              True, axis=-1)
            return out[..., :kv_blocks]
        full = dense(self.full_kv_num_blocks, self.full_kv_indices) if self.has_full else None
        return dense(self.kv_num_blocks, self.kv_indices), full

    def to(self, *args, **kwargs):
        """torch layouts: a copy on another device (``layout.to("cuda")``)."""
        if not A.is_torch(self.kv_num_blocks):
            raise TypeError("BlockLayout.to() is for layouts of torch tensors")
        mv = lambda x: None if x is None else x.to(*args, **kwargs)  # noqa: E731
        return BlockLayout(*(mv(x) for x in self.arrays()), block=self.block)

    def __repr__(self):
        full = f", full_kmax={self.full_kv_indices.shape[3]}" if self.has_full else ""
        return (f"BlockLayout(batch={self.batch}, heads={self.heads}, q_blocks={self.q_blocks}, "
                f"kmax={self.kmax}{full}, block={self.block})")


def _is_block_mask(x):
    return type(x).__name__ == "BlockMask" and hasattr(x, "kv_num_blocks") and hasattr(x, "BLOCK_SIZE")


def layout_from_block_mask(block_mask):
    """The BlockLayout of a FlexAttention ``BlockMask`` (its kv lists, no copy when contiguous).

    Only the block structure is taken: the BlockMask's ``mask_mod`` is not read. Inside the
    partial blocks sparsek masks keys past the sequence and, with ``attention(..., causal=True)``,
    keys after the query (FlexAttention's ``q_idx >= kv_idx``); a BlockMask made with another
    mask_mod gives a different result. Blocks must be square, 64 or 128.
    """
    if not _is_block_mask(block_mask):
        raise TypeError(f"block_mask must be a torch.nn.attention.flex_attention.BlockMask, got "
                        f"{type(block_mask).__name__}")
    bq, bk = block_mask.BLOCK_SIZE
    if bq != bk or bq not in BLOCKS:
        raise ValueError(f"block_mask.BLOCK_SIZE = {tuple(block_mask.BLOCK_SIZE)}: sparsek takes square "
                         "64x64 or 128x128 blocks")
    c = lambda x: None if x is None else x.contiguous()  # noqa: E731
    return BlockLayout(c(block_mask.kv_num_blocks), c(block_mask.kv_indices),
                       c(block_mask.full_kv_num_blocks), c(block_mask.full_kv_indices), block=int(bq))


def block_mask_from_layout(layout, q_len, kv_len, *, causal=False, q_heads=None):
    """A FlexAttention ``BlockMask`` with the layout's blocks, for sequences of q_len queries and
    kv_len keys; ``causal=True`` gives it the causal mask_mod (what sparsek's causal applies inside
    the partial blocks). A layout with one row per key/value head (heads = Hkv < Hq, as the gate
    makes) needs ``q_heads=Hq``: FlexAttention wants 1 or Hq rows."""
    torch = A.torch_loaded()
    if torch is None or not A.is_torch(layout.kv_num_blocks):
        raise TypeError("block_mask_from_layout needs a layout of torch tensors")
    from torch.nn.attention.flex_attention import BlockMask
    q_len, kv_len = A.dim(q_len, "q_len"), A.dim(kv_len, "kv_len")
    causal = A.flag(causal, "causal")
    if q_heads is not None:
        q_heads = A.dim(q_heads, "q_heads")
    if layout.q_blocks != _cdiv(q_len, layout.block):
        raise ValueError(f"layout has {layout.q_blocks} query blocks but q_len={q_len} makes "
                         f"{_cdiv(q_len, layout.block)} of {layout.block}")
    nk = _cdiv(kv_len, layout.block)
    rep = 1
    if q_heads is not None and layout.heads not in (1, q_heads):
        if q_heads % layout.heads:
            raise ValueError(f"q_heads={q_heads} is not a multiple of the layout's heads={layout.heads}")
        rep = q_heads // layout.heads

    def prep(num, idx):
        if num is None:
            return None, None
        if idx.shape[-1] < nk:  # FlexAttention's lists are kv_blocks wide
            idx = torch.nn.functional.pad(idx, (0, nk - idx.shape[-1]))
        if rep > 1:
            num, idx = num.repeat_interleave(rep, 1), idx.repeat_interleave(rep, 1)
        return num.contiguous(), idx[..., :max(nk, 1)].contiguous()

    num, idx = prep(layout.kv_num_blocks, layout.kv_indices)
    fnum, fidx = prep(layout.full_kv_num_blocks, layout.full_kv_indices)
    mask_mod = None
    if causal:
        def mask_mod(b, h, q_idx, kv_idx):
            return q_idx >= kv_idx
    return BlockMask.from_kv_blocks(num, idx, fnum, fidx, BLOCK_SIZE=layout.block, mask_mod=mask_mod,
                                    seq_lengths=(q_len, kv_len))


def as_layout(layout):
    if isinstance(layout, BlockLayout):
        return layout
    if _is_block_mask(layout):
        return layout_from_block_mask(layout)
    raise TypeError(f"layout must be a sparsek.BlockLayout or a FlexAttention BlockMask, got "
                    f"{type(layout).__name__}")


def _scale(scale):
    if scale is None:
        return 0.0  # the library's 1/sqrt(D)
    s = A.scalar(scale, "scale")
    if not (math.isfinite(s) and s != 0):
        raise ValueError(f"scale must be a finite non-zero number, got {scale!r}")
    return s


def _need_4d(x, name, nonempty=False):
    if x.ndim != 4:
        raise ValueError(f"{name} must be a 4-D array [B, H, S, D], got shape {A.shape_of(x)}")
    if nonempty:  # attention's extents are at least 1 (the gate takes an empty batch or sequence)
        for e, what in enumerate(("batch", "heads", "sequence length", "D")):
            if x.shape[e] == 0:
                raise ValueError(f"{name} has shape {A.shape_of(x)}: its {what} (dimension {e}) is 0; "
                                 "attention needs every extent to be at least 1")


def _check_cu_seqlens(cu, q):
    """Packed sequences' offsets: a 1-D, contiguous int32 array of num_seqs + 1 >= 2 entries, of
    q's framework and on q's device (where the layout is). Their values are the library's to check."""
    A.same_framework([("q", q), ("cu_seqlens", cu)])
    if cu.ndim != 1:
        raise ValueError(f"cu_seqlens must be a 1-D array of num_seqs + 1 offsets, got shape {A.shape_of(cu)}")
    if A.dtype_name(cu) != "int32":
        raise ValueError(f"cu_seqlens dtype {A.dtype_name(cu)} must be int32")
    if cu.shape[0] < 2:
        raise ValueError(f"cu_seqlens has shape {A.shape_of(cu)}: it holds num_seqs + 1 >= 2 offsets "
                         "(0, the ends of the sequences, T)")
    if A.is_torch(cu):
        if not cu.is_contiguous():
            raise ValueError(f"cu_seqlens must be contiguous, got stride {cu.stride(0)}; pass cu_seqlens.contiguous()")
        if cu.device != q.device:
            raise ValueError(f"cu_seqlens is on {cu.device} but q is on {q.device}")
    elif not cu.flags.c_contiguous:
        raise ValueError(f"cu_seqlens must be contiguous, got strides {cu.strides} bytes; pass a contiguous copy")


def attention(q, k, v, layout, causal=False, scale=None, *, check_layout=True, cu_seqlens=None):
    """Block-sparse attention: ``(O, LSE)`` with ``O = softmax(scale * Q K^T on the layout) V``.

    q [B, Hq, Sq, D]; k, v [B, Hkv, Skv, D] with Hq a multiple of Hkv (GQA/MQA); D 64 or 128;
    any strides with D contiguous. float16/bfloat16 (float32 too on the CPU). Returns O like q
    (contiguous) and LSE float32 [B, Hq, Sq] (natural log; -inf for a row that attends nothing,
    whose O is 0). ``layout``: a BlockLayout or a FlexAttention BlockMask (see
    layout_from_block_mask). ``causal`` masks key j > query i inside the partial blocks;
    ``scale`` defaults to 1/sqrt(D).

    NumPy arrays run on the CPU and check the layout on every call. torch tensors run on their
    device (CUDA: the current stream) through ``torch.ops.sparsek.attention`` (torch.compile,
    autograd for q, k and v; LSE carries no gradient; a second derivative raises). Eager calls
    that record autograd skip the op's dispatch (a torch.autograd.Function with the same forward
    and backward). The layout's contents are checked when its tensors are new or were modified in
    place (``check_layout=False`` skips that).

    Packed sequences (varlen): ``cu_seqlens``, an int32 array of ``num_seqs + 1`` offsets on q's
    device, makes q, k and v one packed sequence (B = 1, Sq = Skv = T) of num_seqs sequences,
    sequence i at rows ``cu_seqlens[i]:cu_seqlens[i + 1]`` (0 first, T last, never decreasing). A
    query attends only keys of its own sequence (causal: within it); the layout is over the packed
    sequence's blocks, and the blocks it names from other sequences are masked. The offsets are
    checked with the layout's contents.
    """
    layout = as_layout(layout)
    causal = A.flag(causal, "causal")
    check_layout = A.flag(check_layout, "check_layout")
    s = _scale(scale)
    A.same_framework([("q", q), ("k", k), ("v", v), ("layout", layout.kv_num_blocks)])
    for x, n in ((q, "q"), (k, "k"), (v, "v")):
        _need_4d(x, n, nonempty=True)
        A.check_value_dtype(x, n)
    if cu_seqlens is not None:
        _check_cu_seqlens(cu_seqlens, q)
    if A.is_torch(q):
        return _torch_attention().attention(q, k, v, layout, causal, s, check_layout, cu_seqlens)
    o = A.empty(q, A.shape_of(q), q.dtype)
    lse = A.empty(q, A.shape_of(q)[:3], np.float32)
    _ext.attention(q, k, v, o, lse, *layout.arrays(), layout.block, causal, s, A.stream_of(q), True,
                   cu_seqlens)
    return o, lse


def gate(q, k, topk, block=128, causal=False, sink=1, local=1, scorer=None, layout=None,
         return_scores=False, scale=None, *, cu_seqlens=None):
    """The top-k block gate: a BlockLayout (one row per key/value head) chosen from the content.

    Q and K are mean-pooled per block (rows past the sequence excluded; the query heads of a GQA
    group pooled together); each query block scores the key blocks ``scale * pooled_q . pooled_k``
    (scale 1/sqrt(D) by default) and keeps ``sink`` first blocks, ``local`` blocks up to its
    diagonal and the ``topk`` best others (ties: the lower index), among the allowed blocks:
    ``causal`` (at or before the diagonal) and, with ``layout`` (a BlockLayout/BlockMask of the
    same block size), that layout's blocks only. ``kmax = min(key blocks, topk + sink + local)``.

    ``scorer`` (torch only): a callable ``(pooled_q [B, Hkv, Mq, D], pooled_k [B, Hkv, Nk, D]) ->
    scores [B, Hkv, Mq, Nk]`` (e.g. ``sparsek.nn.TopKGate.score``) replacing the dot product;
    pooled_q/pooled_k are float32 and computed as the library pools. The selection is not
    differentiable: train a scorer with an auxiliary loss (``TopKGate.distill_loss``).

    ``cu_seqlens`` (packed sequences, as ``attention``'s: B = 1, Sq = Skv): query block i selects
    only among the blocks holding keys of its rows' sequences, its sink blocks counted from the
    first of them; a block holding two sequences' tokens is pooled across the boundary.

    ``return_scores=True`` returns ``(layout, scores)``, scores float32 [B, Hkv, Mq, Nk] with -inf
    on the blocks not allowed. torch CUDA tensors run on the GPU (allocation by torch, the current
    stream, CUDA-graph capturable); NumPy arrays and CPU tensors on the CPU reference.
    """
    for n, x in (("topk", topk), ("sink", sink), ("local", local), ("block", block)):
        A.dim(x, n, A.INT32_MAX)  # the library keeps them in an int
    causal = A.flag(causal, "causal")
    return_scores = A.flag(return_scores, "return_scores")
    if block not in BLOCKS:
        raise ValueError(f"block must be 64 or 128, got {block}")
    cand = None if layout is None else as_layout(layout)
    s = _scale(scale)
    if cu_seqlens is not None:
        _check_cu_seqlens(cu_seqlens, q)
    if A.is_torch(q):
        return _torch_attention().gate(q, k, int(topk), int(block), causal, int(sink), int(local),
                                       scorer, cand, return_scores, s, cu_seqlens)
    if scorer is not None:
        raise TypeError("scorer= needs torch tensors (a scorer is a torch callable)")
    A.same_framework([("q", q), ("k", k), ("layout", None if cand is None else cand.kv_num_blocks)])
    _need_4d(q, "q")
    _need_4d(k, "k")
    B, Hkv, Mq, Nk = int(q.shape[0]), int(k.shape[1]), _cdiv(int(q.shape[2]), block), _cdiv(int(k.shape[2]), block)
    kmax = min(Nk, int(topk) + int(sink) + int(local))
    num = A.empty(q, (B, Hkv, Mq), np.int32)
    idx = A.empty(q, (B, Hkv, Mq, kmax), np.int32)
    scores = A.empty(q, (B, Hkv, Mq, Nk), np.float32) if return_scores else None
    c = (None,) * 4 if cand is None else cand.arrays()
    if cand is not None and cand.block != block:
        raise ValueError(f"layout block {cand.block} differs from block={block}")
    _ext.gate(q, k, num, idx, int(topk), int(block), causal, int(sink), int(local), s, *c, None,
              scores, None, A.stream_of(q), cu_seqlens)
    out = BlockLayout(num, idx, block=block)
    return (out, scores) if return_scores else out
