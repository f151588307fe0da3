"""A sparsek block layout as FlashAttention-4's block-sparse lists (for bench/torch_peers.py).

FlashAttention-4 (flash_attn.cute) takes block sparsity as FlexAttention-style count/index lists,
split in two kinds:
  mask blocks  the element mask applies inside them (its causal, the end of the keys)
  full blocks  attended whole
and, for the backward, the same blocks listed the other way round (per key block, the query blocks
that attend it). Every list is int32: counts [B, H, rows], indices [B, H, rows, width] with a row's
indices ascending in its first `count` entries (the rest ignored, zero here); H is the query heads.

sparsek's layout says only WHICH blocks are attended (its kv lists get the element mask: causal and
the end of the keys; its optional full lists are attended whole). Here every attended block is
classified by geometry alone:
  - a block the causal diagonal cuts (query block m, key block n with n == m, square blocks,
    q_len == kv_len) or that runs past the last key is a mask block;
  - every other attended block is a full block (no mask would change it);
  - with causal, blocks wholly above the diagonal attend nothing and are dropped.
So sparsek's random top-k layouts (non-causal, S a multiple of the block) are all full blocks, and
causal ones have their diagonal blocks as mask blocks. Pure torch, runs on any device.
"""
from typing import NamedTuple

import torch


class Fa4Lists(NamedTuple):
    """Forward lists (per query block) and backward lists (per key block), all int32."""
    mask_cnt: torch.Tensor      # [B, H, q_blocks]
    mask_idx: torch.Tensor      # [B, H, q_blocks, width]   key block indices
    full_cnt: torch.Tensor
    full_idx: torch.Tensor
    bwd_mask_cnt: torch.Tensor  # [B, H, kv_blocks]
    bwd_mask_idx: torch.Tensor  # [B, H, kv_blocks, width]  query block indices
    bwd_full_cnt: torch.Tensor
    bwd_full_idx: torch.Tensor


def lists_from_dense(m):
    """(counts, indices) of a boolean [B, H, rows, cols] mask: each row's True columns, ascending,
    packed left, zeros after; width = cols (at least 1). FA4 expects index lists as wide as the
    block count: narrower ones are broadcast when they are one wide, and its Hopper backward then
    refuses them (a stride-0 last dimension), so every list is given at full width."""
    cnt = m.sum(-1, dtype=torch.int32)
    width = max(1, m.shape[-1])
    # A stable descending sort of 0/1 keys puts the True columns first in their original order.
    idx = torch.argsort(m.to(torch.int8), dim=-1, descending=True, stable=True)[..., :width]
    valid = torch.arange(idx.shape[-1], device=m.device) < cnt[..., None]
    idx = torch.where(valid, idx, torch.zeros_like(idx)).to(torch.int32)
    if idx.shape[-1] < width:  # (fewer columns than the width of 1: a 0-column mask)
        idx = torch.nn.functional.pad(idx, (0, width - idx.shape[-1]))
    # Fresh row-major strides: `.contiguous()` keeps a view whose odd stride sits on a size-1
    # dimension (a column of the transposed mask), and FA4 checks that stride.
    return (torch.empty(cnt.shape, dtype=torch.int32, device=m.device).copy_(cnt),
            torch.empty(idx.shape, dtype=torch.int32, device=m.device).copy_(idx))


def fa4_lists(partial, full=None, *, q_len, kv_len, block=128, causal=False, q_heads=None):
    """FlashAttention-4's forward and backward block lists for the attended blocks of a layout.

    partial, full: boolean [B, H, q_blocks, kv_blocks] (sparsek's kv lists and full lists as dense
    masks, e.g. BlockLayout.to_dense); H is 1, the query heads, or (with q_heads) a divisor of them
    (one row per key/value head: repeated to every query head of the group).
    """
    if partial.dtype != torch.bool or partial.ndim != 4:
        raise ValueError(f"partial must be a 4-D bool mask [B, H, q_blocks, kv_blocks], got "
                         f"{partial.dtype} {tuple(partial.shape)}")
    if full is not None and (full.dtype != torch.bool or full.shape != partial.shape):
        raise ValueError(f"full must be a bool mask of partial's shape {tuple(partial.shape)}, got "
                         f"{full.dtype} {tuple(full.shape)}")
    nq, nk = -(-q_len // block), -(-kv_len // block)
    if tuple(partial.shape[2:]) != (nq, nk):
        raise ValueError(f"mask has {tuple(partial.shape[2:])} blocks but q_len={q_len}, kv_len={kv_len} "
                         f"make {(nq, nk)} of {block}")
    if causal and q_len != kv_len:
        # FA4 aligns causal to the bottom-right corner, sparsek and FlexAttention to the top-left:
        # they agree only on square problems.
        raise ValueError(f"causal needs q_len == kv_len for FA4 to mask like sparsek, got {q_len} and {kv_len}")
    attended = partial if full is None else partial | full
    if q_heads is not None and attended.shape[1] not in (1, q_heads):
        if q_heads % attended.shape[1]:
            raise ValueError(f"q_heads={q_heads} is not a multiple of the mask's heads={attended.shape[1]}")
        rep = q_heads // attended.shape[1]
        attended = attended.repeat_interleave(rep, 1)
        full = None if full is None else full.repeat_interleave(rep, 1)
    dev = attended.device
    m = torch.arange(nq, device=dev)[:, None]
    n = torch.arange(nk, device=dev)[None, :]
    cut = (n + 1) * block > kv_len  # the block past the last key
    if causal:
        if full is not None and (full & (n >= m)).any():
            # sparsek attends a full block whole; FA4's causal masks every block it visits.
            raise ValueError("a full block on or above the causal diagonal cannot be expressed for FA4")
        attended = attended & (n <= m)
        cut = cut | (n == m)
    is_mask = attended & cut
    is_full = attended & ~cut
    fwd = lists_from_dense(is_mask) + lists_from_dense(is_full)
    bwd = lists_from_dense(is_mask.transpose(-1, -2)) + lists_from_dense(is_full.transpose(-1, -2))
    return Fa4Lists(*fwd, *bwd)


def fa4_lists_from_layout(layout, *, q_len, kv_len, causal=False, q_heads=None):
    """fa4_lists for a sparsek.BlockLayout of torch tensors."""
    partial, full = layout.to_dense(-(-kv_len // layout.block))
    return fa4_lists(partial, full, q_len=q_len, kv_len=kv_len, block=layout.block, causal=causal,
                     q_heads=q_heads)


def fa4_block_sparse_tensors(lists, block=128):
    """(forward, backward) BlockSparseTensorsTorch for flash_attn.cute.interface.flash_attn_func's
    block_sparse_tensors and block_sparse_tensors_bwd (needs flash-attn-4)."""
    from flash_attn.cute.block_sparsity import BlockSparseTensorsTorch
    fwd = BlockSparseTensorsTorch(lists.mask_cnt, lists.mask_idx, lists.full_cnt, lists.full_idx,
                                  block_size=(block, block))
    bwd = BlockSparseTensorsTorch(lists.bwd_mask_cnt, lists.bwd_mask_idx, lists.bwd_full_cnt,
                                  lists.bwd_full_idx, block_size=(block, block))
    return fwd, bwd
